"""Each test's duration, for tests/run_phases.py's summary and the slow phase's budget.

A pytest plugin (tests/conftest.py registers it when `DURATIONS_ENV` names a file): when a
test's teardown is over, one JSON line is appended to that file with the test's id, the
phase it ran in (`PHASE_ENV`, set by run_phases.py), its outcome and its seconds:
setup + call + teardown, so what a fixture costs shows, on the test that paid for it (a
session fixture's start-up on the first test that asked for it, its teardown on the
last test of the session). A line per test, written as it ends: a run stopped halfway
still has the durations of what ran.

    {"phase": "slow tests (real vLLM + NIXL)", "test": "tests/system/test_series.py::
     test_every_notebook_ran", "outcome": "passed", "seconds": 184.9}

The reference durations the budget compares with (tests/durations.json) are read and
written here too; run_phases.py says when.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DURATIONS_ENV = "LAB_TEST_DURATIONS"
PHASE_ENV = "LAB_TEST_PHASE"


class DurationRecorder:
    """Sums each test's setup, call and teardown and appends the line at teardown."""

    def __init__(self, path: str | os.PathLike, phase: str):
        self.path, self.phase = Path(path), phase
        self.seconds: dict[str, float] = {}
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:
        nodeid = report.nodeid
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration
        # the call's outcome (the setup's, when there was no call); a failure anywhere sticks
        if self.outcome.get(nodeid) != "failed" and (report.failed or report.when != "teardown"):
            self.outcome[nodeid] = report.outcome
        if report.when != "teardown":
            return
        line = {"phase": self.phase, "test": nodeid, "outcome": self.outcome.pop(nodeid),
                "seconds": round(self.seconds.pop(nodeid), 2)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def register(config) -> None:
    """Record the durations of this pytest run when `DURATIONS_ENV` names a file."""
    path = os.environ.get(DURATIONS_ENV)
    # under pytest-xdist the controller receives every worker's reports: it alone writes
    worker = hasattr(config, "workerinput")
    if path and not worker and not config.pluginmanager.has_plugin("lab-durations"):
        config.pluginmanager.register(DurationRecorder(path, os.environ.get(PHASE_ENV, "")),
                                      "lab-durations")


def read_log(path: str | os.PathLike) -> list[dict]:
    """The lines a run appended (an unreadable line, e.g. cut by a kill, is skipped)."""
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows
