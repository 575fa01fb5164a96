"""The notebook series, run once per test session: the `series` fixture (registered by
tests/conftest.py), for every test that checks what a whole run of the lab produced.

It runs 00-05 headless on the CPU rehearsal as `make lab` does, on a profile of its own
(ports apart from the other tests' profiles) with a workload sized for checking rather
than teaching (`CHECK_WORKLOAD`). Tests that check a notebook's results, the report, the
forecast grading or the reference mechanism read this run's results instead of making a
run of their own; the simulated cluster takes 01-03 from it as a reference run.

Tests that use it are ordered first among the slow tests (tests/conftest.py: the marker
`series`), so it measures on a quiet machine; any other test that asks for it gets the
same run (or starts it, when run alone).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab_utils.config import LabConfig

from support.profiles import make_profile_data, show, write_profile

SERIES_SHIFT = 3000  # ports apart from the other tests' profiles (+1000, +2000)

# The workshop's workload (configs/local-cpu.json: concurrency 1, 2, 4; 24 prompts; 2
# warm-up requests; 2 repeats) is sized for teaching. The series checks that every step
# works and its results hold together, not what the numbers are, so it measures less:
# - concurrency 1, 2, 4 kept: 03's and 04's forecasts are graded per load point, and a
#   point is graded only where the machine did not stand still in any repeat; with fewer
#   points a slow day can leave none graded. 2 is also the load the simulated cluster
#   measures, so its notebook 04 has this run's 03 to compare with at that point.
# - 2 repeats kept: the report's verdicts and the notebooks' comparisons take the
#   min-max ranges over the repeats (with one repeat they fall back to a noise floor, a
#   path the unit tests cover), and the plots draw error bars from them.
# - 12 prompts per point (24) and 1 warm-up request (2): the sweeps take half as long.
CHECK_WORKLOAD = {"num_prompts": 12, "warmup": 1, "concurrency": [1, 2, 4], "repeats": 2}


@dataclass
class SeriesRun:
    """A finished run of notebooks 00-05: its profile, the executed copies, each
    notebook's wall time and what the run added to the temporary directory."""

    cfg: LabConfig
    executed: list[Path]
    times: dict[str, float]
    tmp_added: list[str]
    seconds: float

    def __iter__(self):  # cfg, executed = series
        return iter((self.cfg, self.executed))


def series_profile(root: Path) -> LabConfig:
    data = make_profile_data(str(root / "results"))
    data["profile"] = "test-series"
    for role in ("baseline", "replica", "prefill", "decode"):
        data["vllm"][role]["port"] += SERIES_SHIFT
        if data["vllm"][role].get("side_channel_port"):
            data["vllm"][role]["side_channel_port"] += SERIES_SHIFT
    data["proxy"]["port"] += SERIES_SHIFT
    data["kv_transfer"]["probe_port"] += SERIES_SHIFT
    data["workload"].update(CHECK_WORKLOAD)
    return write_profile(root, data)


@pytest.fixture(scope="session")
def series(tmp_path_factory, request) -> SeriesRun:
    """Notebooks 00-05 run once for the session, headless (the runner stops whatever a
    notebook left running); its wall time per notebook is printed."""
    from lab_utils.runner import run_notebooks

    cfg = series_profile(tmp_path_factory.mktemp("series"))
    t0 = time.monotonic()
    tmp_before = set(os.listdir(tempfile.gettempdir()))
    executed = run_notebooks(cfg)
    seconds = time.monotonic() - t0
    tmp_added = sorted(set(os.listdir(tempfile.gettempdir())) - tmp_before)
    times = json.loads((cfg.results_dir / "executed" / "times.json").read_text())
    show(request, f"[series] 00-05 in {seconds:.0f} s: "
         + ", ".join(f"{name[:2]} {t:.0f} s" for name, t in times.items()))
    return SeriesRun(cfg, executed, times, tmp_added, seconds)
