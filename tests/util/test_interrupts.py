"""A Ctrl-C that lands in a `__del__` is swallowed by Python ("Exception ignored in ...");
inside `interrupts.watched()` it is raised again, by `check()` or at the block's end."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from lab_utils.util import interrupts


class _ClosesOnDelete:
    """Like paramiko's Channel: work in `__del__`, where a Ctrl-C may land."""

    def __init__(self, exc: BaseException | None = None):
        self.exc = exc

    def __del__(self):
        if self.exc is None:  # a real SIGINT, arriving while __del__ runs
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the handler raises here, inside __del__
        else:
            raise self.exc


def _drop(obj) -> None:
    del obj
    gc.collect()


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler for the test, whatever started the suite: a shell that
    runs it in the background leaves SIGINT ignored, and the handler is what is tested."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_real_sigint_in_a_del_is_raised_at_the_next_check(default_sigint):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt), interrupts.watched():
        _drop(_ClosesOnDelete())  # swallowed by Python here: no exception
        reached_after_the_del = True
        interrupts.check()
        pytest.fail("check() did not raise the lost interrupt")
    assert reached_after_the_del
    interrupts.check()  # raised once, then forgotten


def test_a_lost_interrupt_is_raised_at_the_end_of_the_block():
    with pytest.raises(KeyboardInterrupt), interrupts.watched():
        _drop(_ClosesOnDelete(KeyboardInterrupt()))
    with interrupts.watched():  # nothing left over for the next block
        pass


def test_other_unraisable_errors_still_reach_the_hook_before(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value)))
    before = sys.unraisablehook
    with interrupts.watched():
        _drop(_ClosesOnDelete(ValueError("not an interrupt")))
        interrupts.check()  # nothing to raise
    assert seen == [ValueError]
    assert sys.unraisablehook is before


def test_nested_blocks_share_what_was_lost():
    with pytest.raises(KeyboardInterrupt), interrupts.watched():
        with interrupts.watched():
            _drop(_ClosesOnDelete(KeyboardInterrupt()))
            interrupts.check()
        pytest.fail("the inner block did not raise it")
