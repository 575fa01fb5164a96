"""`check`: the bring-up checklist."""

from __future__ import annotations

import json

from lab_utils.checks import run_checks
from lab_utils.config import load_config


def run(args) -> int:
    cfg = load_config(args.config)
    report = run_checks(cfg, show_progress=not args.json)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 1 if report.failed else 0
