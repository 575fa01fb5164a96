"""`serve`: start a topology's vLLM instances and the proxy, or print the plan (`--dry-run`)."""

from __future__ import annotations

from lab_utils.cluster import Cluster
from lab_utils.config import load_config, with_model
from lab_utils.errors import LabError
from lab_utils.notebook import kv_buffer_device
from lab_utils.serve import make_plan, serve


def run(args) -> int:
    cfg = load_config(args.config)
    if args.model and not args.dry_run:
        raise LabError("--model is for --dry-run (the plan of another model); to serve it, "
                       "set model.name in the profile")
    if args.model:
        cfg = with_model(cfg, args.model)
    if args.dry_run:
        total = int(args.mem_total_gib * 2**30) if args.mem_total_gib else None
        with Cluster(cfg) as cluster:
            plan = make_plan(cluster, args.topology, kv_buffer_device=kv_buffer_device(cfg),
                             mem_total=total, read_nodes=not args.offline)
        print(plan.text())
        return 0 if plan.fits else 1
    with Cluster(cfg) as cluster:
        records = serve(cluster, args.topology, with_proxy=not args.no_proxy,
                        kv_buffer_device=kv_buffer_device(cfg))
    for rec in records:
        print(f"{rec.name:<12} {rec.node:<12} {rec.url or '(headless rank)'}  pid {rec.pid}  "
              f"log {rec.log_path}")
    print(f"stop with: python -m lab_utils cleanup --config {cfg.source}")
    return 0
