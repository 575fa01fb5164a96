"""The workshop kit holds together: the cluster example's workload, predicted by the
forecast model on published GB10 figures, fits the agenda's serving slots with the
start-up allowance, the agenda fits three hours with margin, and the triage table names
every check the checklist can report."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from lab_utils.config import parse_config
from lab_utils.notebook import eta_inputs
from lab_utils.notebook.agenda import AGENDA, agenda_table, timetable

ROOT = Path(__file__).resolve().parents[1]
KIT = (ROOT / "docs" / "FACILITATOR.md").read_text()
STARTUP_MIN = 5  # the agenda's allowance to start a topology (a guess, stated in the kit)
MARGIN_MIN = 15


def agenda() -> dict[str, int]:
    return {p.name: p.minutes for p in AGENDA}


def test_the_agenda_fits_three_hours_with_margin_and_the_kit_shows_it():
    parts = agenda()
    assert sum(parts.values()) <= 180 - MARGIN_MIN
    assert f"adds up to {sum(parts.values())} minutes" in KIT
    assert "\n".join(agenda_table()) in KIT


def test_the_serving_notebooks_fit_their_slots_on_two_sparks(tmp_path):
    from lab_utils.forecast.timing import notebook_seconds

    data = json.loads((ROOT / "environment_config.json.example").read_text())
    data["results_root"] = str(tmp_path)  # no calibration record: the published figures alone
    cfg = parse_config(data, str(ROOT / "environment_config.json.example"))
    inputs, cores, source = eta_inputs(cfg)
    assert source == "published GB10 figures"
    predicted = notebook_seconds(inputs, cfg, cores)
    parts = agenda()
    for nb, secs in predicted.items():
        assert secs / 60 <= 10, (nb, secs)  # each serving notebook measures ~10 min at most
        assert secs / 60 + STARTUP_MIN <= parts[f"notebook {nb}"], (nb, secs)
        print(f"notebook {nb}: {secs / 60:.1f} min predicted, slot {parts[f'notebook {nb}']} min")


def check_names() -> set[str]:
    names = set()
    for path in (ROOT / "lab_utils" / "checks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CheckResult"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
    return names


def test_the_triage_table_names_every_check():
    names = check_names()
    assert len(names) > 15
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", KIT, re.M))
    assert names <= listed, sorted(names - listed)


def test_the_timetable_sets_a_dress_runs_times_beside_each_slot(tmp_path):
    (tmp_path / "executed").mkdir()
    (tmp_path / "executed" / "times.json").write_text(json.dumps(
        {"00_a.ipynb": 120.0, "01_b.ipynb": 600.0, "04_c.ipynb": 1500.0}))
    rows = timetable(tmp_path, {"04": 300.0})
    row = {r.split(" | ")[2]: r for r in rows if r.startswith("| ")}
    assert row["notebook 00"] == "| 0:15 | 20 | notebook 00 | 2.0 | 18.0 | 20 |"
    assert row["notebook 02"].endswith("| not run | – | 15 |")
    # 25 min of run leaves 5 to read in 04's 30: the slot grows to run + 10, later ones move
    assert row["notebook 04"] == ("| 1:50 | 30 | notebook 04 | 25.0 (5.0 optional) | 5.0 | "
                                  "35 (was 30) |")
    assert row["notebook 05"].startswith("| 2:25 |")
    assert rows[-1] == "Total with the rebuilt slots: 170 min of 180"
    assert timetable(tmp_path / "none")[0].startswith("no dress run in")


def test_the_timetable_names_the_start_ups_the_dress_run_measured(tmp_path):
    from lab_utils.notebook.agenda import start_lines
    from lab_utils.results.calibration import Calibration

    results = tmp_path / "pair-01"
    assert "none measured" in start_lines(results)[0]  # before the dress run: the allowance
    (results / "calibration").mkdir(parents=True)
    cal = Calibration(node="spark-01", profile="pair-01", device="cuda", starts=[
        {"role": "baseline", "s": 240.0, "first": True}, {"role": "replica", "s": 90.0},
        {"role": "prefill", "s": 70.0}])
    (results / "calibration" / "spark-01.json").write_text(cal.to_json())
    lines = start_lines(results)
    assert "instead of the agenda's 5 min per topology" in lines[0]
    assert lines[1:] == ["  spark-01: first start 240 s, later starts 80 s (median)"]
