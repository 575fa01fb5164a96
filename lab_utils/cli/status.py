"""`status`: the processes recorded for the profile, and whether each is alive."""

from __future__ import annotations

from lab_utils.cluster import Cluster
from lab_utils.config import api_key, load_config
from lab_utils.serve import healthy, stop_lone_ranks


def run(args) -> int:
    cfg = load_config(args.config)
    keys = {"proxy": api_key(cfg, "proxy"), "vllm": api_key(cfg, "vllm")}
    with Cluster(cfg) as cluster:
        if said := stop_lone_ranks(cluster, cluster.running()):
            print(said)
        recs = cluster.running()
        if not recs:
            print(f"nothing recorded for profile {cfg.profile}")
        for rec in recs:
            alive = cluster.knows(rec.node) and cluster.node(rec.node).is_alive(rec)
            key = keys["proxy" if rec.kind == "proxy" else "vllm"]
            state = ("healthy" if rec.url and healthy(rec.url, api_key=key) else "alive") if alive else "dead"
            if not alive and cluster.knows(rec.node) and cluster.node(rec.node).stop(rec, 5.0):
                state = "dead (the processes it left running were stopped)"
            print(f"{rec.name:<12} {rec.node:<12} {rec.url or '':<28} pid {rec.pid:<8} {state}")
    return 0
