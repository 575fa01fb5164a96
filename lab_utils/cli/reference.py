"""`reference`: load another run's results for comparison or to stand in."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.results import load_reference


def run(args) -> int:
    cfg = load_config(args.config)
    for line in load_reference(cfg, args.source, fill=not args.compare_only):
        print(line)
    print(f"in {cfg.results_dir}; every notebook that reads a reference's results says so")
    return 0
