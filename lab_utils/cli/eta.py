"""`eta`: how long notebooks 01, 03 and 04 should take to measure."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.notebook import eta_lines, optional_lines, whole_notebook_lines


def run(args) -> int:
    cfg = load_config(args.config)
    lines = eta_lines(cfg)
    print("\n".join(lines + whole_notebook_lines(cfg) + optional_lines(cfg)))
    return 0 if len(lines) > 1 else 1
