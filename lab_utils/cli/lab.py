"""`lab`: the main job: the notebooks and the audit, or the demo while there are none."""

from __future__ import annotations

from lab_utils.cli import audit, demo
from lab_utils.cli import run as run_notebooks
from lab_utils.config import load_config
from lab_utils.runner import find_notebooks


def run(args) -> int:
    if find_notebooks(args.notebooks_dir):
        ran = run_notebooks.run(args)
        if ran == 0 and args.start is None and args.stop is None:
            print("audit: every result sentence of the run against its results files")
            args.results_dir = None
            audit.run(args)  # an unbacked sentence is reported; a false claim fails the run
            return 1 if audit.audit(load_config(args.config).results_dir).false else 0
        return ran
    print("no notebooks yet: running the prefill/decode proof of transfer instead")
    return demo.run(args)
