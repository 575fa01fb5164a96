"""Catching up from a reference run: `python -m lab_utils reference DIR` lets notebook N
run without N-1 having run here, every reader is told the results are a reference run's,
the report says so, and the serving notebooks show "yours vs reference"."""

from __future__ import annotations

import subprocess
import sys

from lab_utils import report
from lab_utils.notebook import versus_reference
from lab_utils.results import load_reference, load_results, write_results

from support.payloads import baseline_dict, kv_dict, model, sweep_dict
from support.profiles import make_profile_data, write_profile

POINT = {"mode": "concurrency", "value": 1.0, "valid": True, "repeats": 1,
         "output_throughput": 100.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 12.0,
         "median_itl_ms": 2.0, "p99_itl_ms": 3.0}


def reference_run(tmp_path):
    """Notebooks 01 and 02 of another profile (the rehearsal's, the day before)."""
    data = make_profile_data(str(tmp_path / "elsewhere"))
    data["profile"] = "yesterday"
    (tmp_path / "y").mkdir()
    cfg = write_profile(tmp_path / "y", data)
    write_results(cfg, "01", model("01", baseline_dict(sweep_dict(combined=[POINT]))),
                  software={}, hardware={})
    write_results(cfg, "02", model("02", kv_dict()), software={}, hardware={})
    return cfg


def test_reference_results_stand_in_labelled(test_cfg, tmp_path, capsys):
    ref = reference_run(tmp_path)
    done = load_reference(test_cfg, ref.results_dir)
    assert [d[:2] for d in done] == ["01", "02"] and all("labelled" in d for d in done)
    env = load_results(test_cfg, "01")  # notebook 03 can now read "its" 01
    assert env.profile == test_cfg.profile and env.reference["profile"] == "yesterday"
    out = capsys.readouterr().out
    assert "NOTE: notebook 01's results here are a REFERENCE run's" in out
    assert "profile 'yesterday'" in out
    md = report.build_report(test_cfg).md.read_text()
    assert "REFERENCE run's, loaded to catch up" in md and "notebook 01 (profile 'yesterday'" in md


def test_own_results_are_kept_and_compared_with_the_reference(test_cfg, tmp_path):
    mine = model("01", baseline_dict(sweep_dict(combined=[{**POINT, "median_ttft_ms": 20.0}])))
    write_results(test_cfg, "01", mine, software={}, hardware={})
    ref = reference_run(tmp_path)
    r = subprocess.run([sys.executable, "-m", "lab_utils", "reference", str(ref.results_dir),
                        "--config", str(test_cfg.source)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "01: baseline_metrics.json kept as reference only (this profile has its own)" in r.stdout
    assert load_results(test_cfg, "01").reference is None  # ours, untouched
    frame = versus_reference(test_cfg, "01", mine.sweep)
    assert {"reference", "yours", "better"} <= set(frame.columns)
    row = frame[frame["metric"] == "TTFT p50 (ms)"].iloc[0]
    assert (row["reference"], row["yours"], row["better"]) == (10.0, 20.0, "reference")


def test_no_reference_says_so_and_how_to_load_one(test_cfg, capsys):
    assert versus_reference(test_cfg, "03", model("01", baseline_dict()).sweep) is None
    out = capsys.readouterr().out  # one line, so that a cell that shows no table is not a puzzle
    assert out.startswith("No reference run loaded for notebook 03")
    assert "python -m lab_utils reference DIR --compare-only" in out and out.count("\n") == 1


def test_a_results_file_nested_too_deep_is_named_not_a_traceback(test_cfg, tmp_path):
    ref = tmp_path / "deep"
    ref.mkdir()
    (ref / "baseline_metrics.json").write_text("[" * 100_000 + "]" * 100_000)
    r = subprocess.run([sys.executable, "-m", "lab_utils", "reference", str(ref),
                        "--config", str(test_cfg.source)], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "baseline_metrics.json: not a results file (nested too deep to read)" in r.stderr
