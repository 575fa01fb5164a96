"""Deadlines that do not count the time the machine stood still."""

from __future__ import annotations

import pytest

from lab_utils.measure import stalls


class FakeClock:
    """monotonic() and sleep() on a clock the test moves; `stall` is added to the next sleep."""

    def __init__(self):
        self.now = 100.0
        self.stall = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.stall
        self.stall = 0.0


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(stalls.time, "monotonic", c.monotonic)
    monkeypatch.setattr(stalls.time, "sleep", c.sleep)
    return c


class FakeWatch:
    held_up_s = 0.0


def test_plain_wait_expires_on_time(clock):
    with stalls.Deadline(1.0, watch=FakeWatch()) as d:
        sleeps = 0
        while not d.expired():
            clock.sleep(0.1)
            sleeps += 1
    assert sleeps == 11 and d.held_up_s == 0.0


def test_time_held_up_does_not_use_up_the_budget(clock):
    watch = FakeWatch()
    with stalls.Deadline(1.0, watch=watch) as d:
        clock.sleep(0.2)
        clock.now += 30.0  # the process stood still for 30 s, in a sleep or a request
        watch.held_up_s = 30.0  # as the watch thread saw it
        assert not d.expired() and d.waited() == pytest.approx(0.2)
        while not d.expired():
            clock.sleep(0.1)
    assert d.waited() == pytest.approx(1.1)


def test_wall_time_is_capped(clock):
    watch = FakeWatch()
    with stalls.Deadline(1.0, most_s=10.0, watch=watch) as d:
        clock.now += 12.0
        watch.held_up_s = 11.9
        assert d.waited() < 1.0
        assert d.expired(), "stalls may stretch a deadline only up to most_s of wall time"


def test_deadline_runs_its_own_watch_thread():
    with stalls.Deadline(5.0) as d:
        assert d.watch._thread.is_alive() and not d.expired()
    assert not d.watch._thread.is_alive()


def test_watch_reports_a_late_wake_up_with_cpu_shares(clock, monkeypatch):
    ticks = iter([[10, 0, 5, 100, 0, 0, 0, 0], [10, 0, 5, 110, 0, 0, 0, 0],
                  [310, 0, 305, 110, 0, 0, 0, 0], [310, 0, 305, 120, 0, 0, 0, 0]])
    monkeypatch.setattr(stalls, "_cpu_ticks", lambda: next(ticks))
    stalls_at = iter([0.0, 6.0, 0.0])
    real_sleep = clock.sleep

    def sleep(seconds):
        clock.stall = next(stalls_at)
        real_sleep(seconds)

    monkeypatch.setattr(stalls.time, "sleep", sleep)
    lines = []
    found = stalls.watch(6.25, out=lines.append)
    assert found == [pytest.approx(6.0)]
    assert len(lines) == 1 and "held up   6.0 s" in lines[0]
    assert "user 50%, system 50%" in lines[0]


def test_watch_thread_notes_the_time_it_was_held_up(monkeypatch):
    import time as real_time

    jumps = iter([0.0, 5.0])  # the first wake-up reads the clock 5 s "late"
    offset = [0.0]

    def monotonic():
        offset[0] += next(jumps, 0.0)
        return real_time.perf_counter() + offset[0]

    monkeypatch.setattr(stalls.time, "monotonic", monotonic)
    with stalls.Watch(period_s=0.01) as w:
        real_time.sleep(0.2)
    assert len(w.stalls) == 1 and 5.0 <= w.held_up_s < 5.5
    assert not w._thread.is_alive()
