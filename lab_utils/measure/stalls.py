"""Waiting in the harness when the machine itself stands still.

On a small machine a process can be held up for seconds: on the 2-core rehearsal, while
a prefill holds KV blocks no decode has read, processes outside the instances' session
got no CPU for the whole KV lease (docs/REHEARSAL.md, "What the rehearsal can and cannot
show"). A timer that runs out during such a stall fires the moment the process runs again,
and reports a timeout that the thing it guarded did not cause.

The lab's harness (reading counters, waiting for them to settle; never a measured figure)
therefore uses a `Deadline` that does not count the time a `Watch` thread saw the process
held up, and repeats an idempotent request that timed out (`fetch_metrics` does). The proxy logs the same kind of
stall for the requests it carries (`lab_utils.serve.proxy._report_stalls`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from lab_utils.util.background import Background

# A sleep that ends this much later than asked was a stall, not scheduling noise.
HELD_UP_S = 1.0


class Watch(Background):
    """While in the `with` block, a thread notes each time this process was held up
    (woke more than `HELD_UP_S` late from a `period_s` sleep). A measurement made across
    a stall includes it; the benchmark records what this saw next to each run."""

    def __init__(self, period_s: float = 0.1):
        super().__init__("stall-watch")
        self.period_s = period_s
        self.stalls: list[float] = []

    def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            if self._stop.wait(self.period_s):
                return
            late = time.monotonic() - t0 - self.period_s
            if late > HELD_UP_S:
                self.stalls.append(late)

    @property
    def held_up_s(self) -> float:
        return sum(self.stalls)



class Deadline:
    """`seconds` of waiting, not counting the time this process was held up meanwhile
    (seen by a `Watch` thread, whether it was sleeping or waiting for an answer); never
    more than `most_s` of wall time in all. Use it as a context manager."""

    def __init__(self, seconds: float, most_s: float | None = None, watch: Watch | None = None):
        self.seconds = seconds
        self.most_s = most_s if most_s is not None else seconds + 120.0
        self.watch = watch or Watch()
        self._own_watch = watch is None
        self.start = time.monotonic()

    def __enter__(self) -> Deadline:
        if self._own_watch:
            self.watch.__enter__()
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        if self._own_watch:
            self.watch.__exit__(*exc)

    @property
    def held_up_s(self) -> float:
        return self.watch.held_up_s

    def waited(self) -> float:
        """Seconds waited so far, stalls excluded."""
        return time.monotonic() - self.start - self.held_up_s

    def expired(self) -> bool:
        wall = time.monotonic() - self.start
        return wall > self.most_s or wall - self.held_up_s > self.seconds

def _cpu_ticks() -> list[int]:
    """user, nice, system, idle, iowait, irq, softirq, steal: the `cpu` line of /proc/stat."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def watch(seconds: float, period_s: float = 0.1, out=print) -> list[float]:
    """Sleep `period_s` at a time for `seconds`; report every wake-up more than `HELD_UP_S`
    late, with where the CPUs' time went meanwhile. Returns the stalls' lengths."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    found: list[float] = []
    end = time.monotonic() + seconds
    before = _cpu_ticks()
    while time.monotonic() < end:
        t0 = time.monotonic()
        time.sleep(period_s)
        late = time.monotonic() - t0 - period_s
        now = _cpu_ticks()
        if late > HELD_UP_S:
            found.append(late)
            spent = [b - a for a, b in zip(before, now, strict=True)]
            total = sum(spent) or 1
            share = ", ".join(f"{n} {100 * s / total:.0f}%" for n, s in zip(names, spent, strict=True) if s)
            out(f"{time.strftime('%H:%M:%S')}  held up {late:5.1f} s  (CPU time meanwhile: {share})")
        before = now
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lab_utils.measure.stalls",
        description="report when this machine stands still: a process that sleeps 0.1 s at a "
                    "time and says when it woke more than 1 s late")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to watch (default 60)")
    ap.add_argument("--fifo", action="store_true",
                    help="watch under the real-time SCHED_FIFO policy (root only). If such a "
                         "watcher never stands still while a normal one does, the CPUs kept "
                         "running and the scheduler left the normal one waiting")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    a = ap.parse_args(argv)
    policy = "normal"
    if a.fifo:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
            policy = "SCHED_FIFO"
        except PermissionError:
            raise SystemExit("--fifo needs root (or CAP_SYS_NICE): run without it") from None
    found = watch(a.seconds)
    print(f"watched {a.seconds:.0f} s ({policy}): {len(found)} stall(s)"
          + (f", longest {max(found):.1f} s, {sum(found):.1f} s in all" if found else ""))
    if a.json:
        print(json.dumps({"seconds": a.seconds, "policy": policy,
                          "stalls_s": [round(x, 2) for x in found],
                          "held_up_s": round(sum(found), 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
