"""`cleanup`: stop everything recorded for the profile, on every node."""

from __future__ import annotations

from lab_utils.config import load_config
from lab_utils.serve import cleanup


def run(args) -> int:
    cfg = load_config(args.config)
    stopped = cleanup(cfg)
    print(f"profile {cfg.profile}: stopped {len(stopped)} process group(s)"
          + (f": {', '.join(stopped)}" if stopped else ""))
    return 0
