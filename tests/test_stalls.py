"""Deadlines that do not count the time the machine stood still."""

from __future__ import annotations

import pytest

from lab_utils import stalls


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


def test_plain_wait_expires_on_time(clock):
    d = stalls.Deadline(1.0)
    sleeps = 0
    while not d.expired():
        d.sleep(0.1)
        sleeps += 1
    assert sleeps == 11 and d.held_up_s == 0.0


def test_a_stall_does_not_use_up_the_budget(clock):
    d = stalls.Deadline(1.0)
    d.sleep(0.1)
    clock.stall = 30.0  # the box stood still for 30 s during this sleep
    d.sleep(0.1)
    assert d.held_up_s == pytest.approx(30.0)
    assert not d.expired() and d.waited() == pytest.approx(0.2)
    while not d.expired():
        d.sleep(0.1)
    assert d.waited() == pytest.approx(1.1)


def test_small_lateness_is_not_a_stall(clock):
    d = stalls.Deadline(1.0)
    clock.stall = stalls.HELD_UP_S * 0.9
    d.sleep(0.1)
    assert d.held_up_s == 0.0 and d.expired() is False
    clock.stall = 0.5
    d.sleep(0.1)
    assert d.expired()  # 0.1 + 0.9 + 0.1 + 0.5 s of waiting, none of it a stall


def test_wall_time_is_capped(clock):
    d = stalls.Deadline(1.0, most_s=10.0)
    for _ in range(3):
        clock.stall = 4.0
        d.sleep(0.1)
    assert d.held_up_s == pytest.approx(12.0) and d.waited() < 1.0
    assert d.expired(), "stalls may stretch a deadline only up to most_s of wall time"


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
