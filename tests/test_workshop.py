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

ROOT = Path(__file__).resolve().parents[1]
KIT = (ROOT / "docs" / "FACILITATOR.md").read_text()
STARTUP_MIN = 5  # the agenda's allowance to start a topology (a guess, stated in the kit)
MARGIN_MIN = 15


def agenda() -> dict[str, int]:
    rows = re.findall(r"^\| (\d:\d\d) \| (\d+) \| ([^|]+?) \|", KIT, re.M)
    assert rows, "the agenda table is missing"
    return {part.strip(): int(minutes) for _, minutes, part in rows}


def test_the_agenda_fits_three_hours_with_margin():
    parts = agenda()
    assert sum(parts.values()) <= 180 - MARGIN_MIN
    assert f"adds up to {sum(parts.values())} minutes" in KIT


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
