"""Waiting in the harness when the machine itself stands still.

On the 2-core rehearsal machine every process is sometimes held up for seconds at once
(DESIGN.md, "The rehearsal machine stalls": up to 30 s, while vLLM instances start or make
their first NIXL connection). A timer that runs out during such a stall fires the moment
the process runs again, and reports a timeout that the thing it guarded did not cause.

The lab's harness (reading counters, waiting for them to settle; never a measured figure)
therefore uses a `Deadline` that does not count time the process overslept, and repeats an
idempotent request that timed out (`fetch_metrics` does). The proxy logs the same kind of
stall for the requests it carries (`lab_utils.proxy._report_stalls`).
"""

from __future__ import annotations

import time

# A sleep that ends this much later than asked was a stall, not scheduling noise.
HELD_UP_S = 1.0


class Deadline:
    """`seconds` of waiting, not counting the time `sleep` overslept by more than
    `HELD_UP_S`; never more than `most_s` of wall time in all."""

    def __init__(self, seconds: float, most_s: float | None = None):
        self.seconds = seconds
        self.most_s = most_s if most_s is not None else seconds + 120.0
        self.start = time.monotonic()
        self.held_up_s = 0.0

    def sleep(self, seconds: float) -> None:
        t0 = time.monotonic()
        time.sleep(seconds)
        late = time.monotonic() - t0 - seconds
        if late > HELD_UP_S:
            self.held_up_s += late

    def waited(self) -> float:
        """Seconds waited so far, stalls excluded."""
        return time.monotonic() - self.start - self.held_up_s

    def expired(self) -> bool:
        wall = time.monotonic() - self.start
        return wall > self.most_s or wall - self.held_up_s > self.seconds
