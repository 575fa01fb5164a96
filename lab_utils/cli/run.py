"""`run`: execute the notebooks headless."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.runner import run_notebooks


def run(args) -> int:
    cfg = load_config(args.config)
    run_notebooks(cfg, start=args.start, stop=args.stop, notebooks_dir=args.notebooks_dir,
                  skip_optional=args.skip_optional)
    print(f"results, executed notebooks and logs: {cfg.results_dir}")
    if (cfg.results_dir / "report.html").exists():
        print(f"report: {cfg.results_dir / 'report.html'} (open it in a browser)")
    return 0
