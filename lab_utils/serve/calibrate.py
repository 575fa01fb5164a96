"""Calibrating the lab from a real start: `serve` reads each serving node's memory before
it starts anything (`before_start`), and once the instances it started are healthy
records what they measured (`record`) in the node's calibration record
(`results.calibration`): the figures vLLM logged at start (`serve.startup.figures`), the
memory their processes hold, the seconds to healthy, and the OS's share of the node.
The plan (`serve --dry-run`) then uses them instead of its estimates and says so.

The memory of an instance's processes is the PSS of its process group
(/proc/<pid>/smaps_rollup), read on its node, and kept per role. Host memory holding the
KV cache is in that PSS and is not the processes' own: on the CPU build the KV cache
itself, and on a GPU a prefill or decode instance's NIXL host copy (`kv_buffer_device`
"cpu": vLLM allocates it on the host at start-up and registers it with NIXL, which pins
it), as large as the KV cache vLLM logs. The record keeps the raw PSS and that host KV
share; the per-process share is what is left (the plan counts the host copy as its own
line). Whether GPU allocations themselves show in a GB10 process's PSS is not known here
(no GB10 was measured): if they do, this share is too high, and the plan says
"measured" beside it.
"""

from __future__ import annotations

from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.errors import LabError
from lab_utils.results import calibration
from lab_utils.results.calibration import Calibration, now_utc
from lab_utils.serve import startup
from lab_utils.serve.launcher import buffer_device

# run by the node's Python: PSS (kB) of every process in one process group
_PSS = """
import os, sys
pgid, kb = int(sys.argv[1]), 0
for d in os.listdir('/proc'):
    if not d.isdigit():
        continue
    try:
        if os.getpgid(int(d)) != pgid:
            continue
        with open(f'/proc/{d}/smaps_rollup') as f:
            kb += sum(int(ln.split()[1]) for ln in f if ln.startswith('Pss:'))
    except (OSError, ValueError, IndexError):
        pass
print(kb)
"""
LOG_LINES = 5000  # enough of a log to reach back to its start-up lines


def meminfo(cluster: Cluster, node: str) -> dict[str, int]:
    """/proc/meminfo of a node in bytes ({} when it cannot be read)."""
    try:
        return cluster.node(node).meminfo()
    except (LabError, OSError):
        return {}


def before_start(cluster: Cluster, nodes: list[str]) -> dict[str, dict[str, int]]:
    """Each node's memory before this start, for the nodes where no instance of the lab
    runs now (only there is MemTotal - MemAvailable the OS's and other processes' share)."""
    cfg = cluster.cfg
    busy = {cfg.nodes[r.node].machine(r.node) for r in cluster.running() if r.kind == "vllm"}
    return {n: meminfo(cluster, n) for n in dict.fromkeys(nodes)
            if cfg.nodes[n].machine(n) not in busy}


def group_pss(cluster: Cluster, rec: ProcessRecord) -> int | None:
    node = cluster.node(rec.node)
    try:
        r = node.run([node.python, "-c", _PSS, str(rec.pgid)], timeout=30)
    except (LabError, OSError):
        return None
    try:
        return int(r.stdout.strip()) * 1024 if r.ok and int(r.stdout.strip()) > 0 else None
    except ValueError:
        return None


def record(cluster: Cluster, started: list[ProcessRecord], ready_s: dict[str, float],
           before: dict[str, dict[str, int]]) -> list[str]:
    """Write what the `started` instances (healthy now) measured into their nodes'
    calibration records; return the files written. Never fails a start: a figure that
    cannot be read is left out."""
    cfg = cluster.cfg
    written = []
    for node in dict.fromkeys(r.node for r in started):
        cal = calibration.load(cfg, node) or Calibration(node, cfg.profile, cfg.vllm.device)
        mem = meminfo(cluster, node)
        cal.mem_total_bytes = mem.get("MemTotal") or cal.mem_total_bytes
        was = before.get(node, {})
        if "MemTotal" in was and "MemAvailable" in was:
            cal.os_reserve_bytes = was["MemTotal"] - was["MemAvailable"]
            cal.os_reserve_at = now_utc()
        for rec in (r for r in started if r.node == node):
            figures = startup.figures(cluster.node(node).log_tail(rec, LOG_LINES))
            role = str(rec.extra.get("role", rec.name))
            spec = next((s for s in cfg.instances(str(rec.extra.get("topology")))
                         if s.name == rec.name), None)
            pss = group_pss(cluster, rec)
            host_kv = (figures.get("kv_bytes", 0) if cfg.vllm.device == "cpu"
                       or buffer_device(rec.argv) == "cpu" else 0)
            process = None if pss is None else max(0, pss - host_kv)
            first = (figures.get("compile_cache") == "miss" if "compile_cache" in figures
                     else not any(s["role"] == role for s in cal.starts))
            at = now_utc()
            cal.instances[role] = {
                "instance": rec.name, "at": at, "figures": figures, "pss_bytes": pss,
                "host_kv_bytes": host_kv, "process_bytes": process,
                "start_s": ready_s.get(rec.name),
                "utilization": spec.settings.gpu_memory_utilization if spec else None}
            if rec.name in ready_s:
                cal.starts.append({"instance": rec.name, "role": role, "at": at,
                                   "s": round(ready_s[rec.name], 1), "first": first})
        written.append(str(calibration.save(cfg, cal)))
    return written
