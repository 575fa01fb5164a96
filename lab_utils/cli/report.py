"""`report`: write the benchmark report from the notebooks' results."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.report import build_report


def run(args) -> int:
    paths = build_report(load_config(args.config))
    for sentence in paths.conclusions:
        print(f"- {sentence}")
    if paths.missing:
        print(f"not in the report (run them first): {', '.join(paths.missing)}")
    print(f"written: {paths.html}\n         {paths.md}\n         {len(paths.plots)} plots in "
          f"{paths.html.parent / 'plots'}")
    return 0
