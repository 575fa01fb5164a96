"""`audit`: every saved claim against the results files, and the sentences no claim backs."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.report import audit


def run(args) -> int:
    found = audit(args.results_dir or load_config(args.config).results_dir)
    print("\n".join(found.lines()))
    return 0 if found.ok else 1
