"""A Ctrl-C that is never lost.

Python raises `KeyboardInterrupt` wherever the main thread happens to be when SIGINT
arrives. If that is inside a `__del__` method or a weakref callback (paramiko closes a
garbage-collected SSH channel in its `__del__`), Python prints "Exception ignored in ..."
and carries on as if nothing had happened: the interrupt is lost. A `serve` interrupted
at such a moment went on to start everything and reported success.

Inside `watched()`, an interrupt lost that way is remembered instead of printed, and raised
again by the next `check()` or at the end of the block, whichever comes first.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_lost = [False]
_depth = [0]


def check() -> None:
    """Raise the interrupt a `__del__` swallowed since `watched()` began, if one did."""
    if _lost[0]:
        _lost[0] = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def watched() -> Iterator[None]:
    """Remember interrupts that would be lost, and raise them by the end of the block.
    Nested blocks share what was lost; the outermost forgets it when the block ends."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _lost[0] = True
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    _depth[0] += 1
    try:
        yield
        check()
    finally:
        sys.unraisablehook = previous
        _depth[0] -= 1
        if not _depth[0]:
            _lost[0] = False
