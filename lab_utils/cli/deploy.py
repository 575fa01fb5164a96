"""`deploy`: the lab's code onto the SSH nodes."""

from __future__ import annotations

from lab_utils.cluster import deploy
from lab_utils.config import load_config


def run(args) -> int:
    for line in deploy(load_config(args.config), force=args.force):
        print(line)
    return 0
