"""`triage`: the triage sheet for failures while serving."""

from __future__ import annotations

from lab_utils.notebook import triage_text


def run(_args) -> int:
    print(triage_text(), end="")
    return 0
