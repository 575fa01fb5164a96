"""The triage sheet for failures while serving is generated from the failures the lab
recognises, so it lists every one; the committed docs/TRIAGE.md is what the command prints."""

from __future__ import annotations

from pathlib import Path

from lab_utils.cli import main
from lab_utils.known_failures import KNOWN_FAILURES
from lab_utils.notebook.triage import triage_text

SHEET = Path(__file__).resolve().parents[1] / "docs" / "TRIAGE.md"


def test_the_sheet_lists_every_known_failure_with_its_fix():
    text = triage_text()
    for f in KNOWN_FAILURES:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{f.name}`"))
        assert f.fix.replace("|", "\\|") in row and ("(warning)" in row) == f.warning


def test_the_committed_sheet_is_the_generated_one(capsys):
    assert main(["triage"]) == 0
    assert SHEET.read_text() == capsys.readouterr().out, (
        "docs/TRIAGE.md is stale: python -m lab_utils triage > docs/TRIAGE.md")
