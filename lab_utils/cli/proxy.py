"""`proxy`: the front door in the foreground (the lab proxy, or vllm-router)."""

from __future__ import annotations

from lab_utils.config import load_config, with_proxy
from lab_utils.serve import proxy, router


def run(args) -> int:
    cfg = load_config(args.config)
    kind = args.kind if args.kind and args.kind != cfg.proxy.kind else None
    policy = args.policy if args.policy and args.policy != cfg.topology.replicated.policy else None
    if kind or policy:
        cfg = with_proxy(cfg, kind=kind, policy=policy)
    if cfg.proxy.kind == "vllm-router":
        router.run(cfg, args.mode)  # replaces this process

    proxy.run(cfg, args.mode)
    return 0
