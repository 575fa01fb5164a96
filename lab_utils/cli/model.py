"""`model fetch`: the model onto every serving node."""

from __future__ import annotations

from lab_utils.cluster import model_fetch
from lab_utils.config import load_config


def run(args) -> int:
    cfg = load_config(args.config)
    for node, snap in model_fetch(cfg).items():
        print(f"{node:<12} {cfg.model.name} at {cfg.model_path_on(node)}  snapshot {snap[:16]}")
    return 0
