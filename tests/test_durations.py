"""`make test`'s timing: each test's duration recorded (setup + call + teardown) with its
phase and outcome, the slow phase's summary beside the reference durations, the budget's
warning naming what grew, and the reference written from a run's log."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.durations import DurationRecorder, read_log

RUN_PHASES = Path(__file__).resolve().parent / "run_phases.py"


@pytest.fixture
def run_phases(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("run_phases_under_test", RUN_PHASES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "REFERENCE", tmp_path / "durations.json")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module


def report(nodeid: str, when: str, seconds: float, outcome: str = "passed"):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=seconds, outcome=outcome,
                           failed=outcome == "failed", skipped=outcome == "skipped")


def test_a_tests_line_sums_its_phases_and_keeps_a_failure(tmp_path):
    log = tmp_path / "d.jsonl"
    rec = DurationRecorder(log, "slow")
    for r in (report("a", "setup", 30.0), report("a", "call", 2.0), report("a", "teardown", 0.5),
              report("b", "setup", 0.1), report("b", "call", 1.0, "failed"),
              report("b", "teardown", 0.2),
              report("c", "setup", 0.1, "skipped"), report("c", "teardown", 0.0)):
        rec.pytest_runtest_logreport(r)
    (log.open("a")).write('{"cut by a ki')  # a line a killed run left half-written
    assert read_log(log) == [
        {"phase": "slow", "test": "a", "outcome": "passed", "seconds": 32.5},
        {"phase": "slow", "test": "b", "outcome": "failed", "seconds": 1.3},
        {"phase": "slow", "test": "c", "outcome": "skipped", "seconds": 0.1}]


def test_under_budget_each_slow_test_with_its_change_and_no_warning(run_phases):
    rows = [{"phase": "slow", "test": "t::a", "outcome": "passed", "seconds": 100.0},
            {"phase": "slow", "test": "t::b", "outcome": "failed", "seconds": 5.0},
            {"phase": "fast", "test": "f::x", "outcome": "passed", "seconds": 1.0}]
    ref = {"measured": "2026-01-01", "tests": {"t::a": 90.0}}
    text = "\n".join(run_phases.slow_summary(rows, "slow", 110.0, ref))
    assert "  100.0 s    +10.0  t::a" in text and "    5.0 s      new  t::b  [failed]" in text
    assert "f::x" not in text and "WARNING" not in text
    assert "105.0 s  in 2 tests" in text and "of its budget 25:00" in text


def test_over_budget_a_loud_warning_names_the_tests_that_grew(run_phases, monkeypatch):
    monkeypatch.setattr(run_phases, "SLOW_BUDGET_S", 600.0)
    measured = {"t::grew": 400.0, "t::jitter": 115.0, "t::small": 30.0, "t::new": 90.0,
                "t::new_small": 5.0}
    rows = [{"phase": "slow", "test": k, "outcome": "passed", "seconds": v}
            for k, v in measured.items()]
    ref = {"tests": {"t::grew": 200.0, "t::jitter": 100.0, "t::small": 5.0}}
    assert [t for t, _, _ in run_phases.grown(measured, ref["tests"])] == [
        "t::grew", "t::new", "t::small"]
    text = "\n".join(run_phases.slow_summary(rows, "slow", 640.0, ref))
    assert "!! WARNING: the slow tests took 10:40 (min:s), over their budget of 10:00" in text
    assert "(was 200.0 s, +200.0 s)  t::grew" in text and "(new)  t::new" in text
    assert "t::jitter" not in text.split("WARNING")[1]
    # nothing grew on its own: the machine was slower
    rows = [{"phase": "slow", "test": "t::a", "outcome": "passed", "seconds": 700.0}]
    text = "\n".join(run_phases.slow_summary(rows, "slow", 700.0, {"tests": {"t::a": 650.0}}))
    assert "no single test grew" in text


def test_the_ten_slowest_over_all_phases(run_phases):
    rows = [{"phase": "fast" if i % 2 else "slow", "test": f"t{i}", "outcome": "passed",
             "seconds": float(i)} for i in range(15)] + [{"phase": "slow", "phase_seconds": 99}]
    lines = run_phases.slowest(rows)
    assert len(lines) == 11 and lines[1].split()[-2] == "t14" and "t5 " in lines[-1]


def test_the_reference_is_written_from_a_passing_runs_slow_phase(run_phases, tmp_path):
    slow = next(name for name, cmd in run_phases.PHASES if run_phases.is_slow(cmd))
    fast = next(name for name, cmd in run_phases.PHASES if not run_phases.is_slow(cmd))
    log = tmp_path / "run.jsonl"
    lines = [{"phase": fast, "test": "f", "outcome": "passed", "seconds": 1.0},
             {"phase": slow, "test": "s1", "outcome": "passed", "seconds": 10.0},
             {"phase": slow, "test": "s2", "outcome": "passed", "seconds": 20.5},
             {"phase": slow, "phase_seconds": 33.0, "exit": 0}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert run_phases.save_durations(log, "2 cores") == 0
    saved = json.loads((tmp_path / "durations.json").read_text())
    assert saved["tests"] == {"s1": 10.0, "s2": 20.5} and saved["slow_phase_s"] == 33.0
    assert saved["machine"] == "2 cores" and run_phases.load_reference(tmp_path / "durations.json")
    lines[1]["outcome"] = "failed"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert run_phases.save_durations(log, "") == 1  # a failing run is no reference
