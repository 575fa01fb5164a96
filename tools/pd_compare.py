"""P/D against one instance and the replicated pair, as vLLM leaves it and with the lab's
settings for NIXL's progress threads, measured in one run with the lab's own ruler.

`python -m tools.pd_stall --compare` starts, one after another, the baseline,
the replicated and the disaggregated topology of a local profile, the last three times
(`VARIANTS`): as vLLM leaves it (NIXL's threads poll without pause at normal priority, both
workers' model threads on the last core); with those threads lowered to nice 19 with a 0.1
ms slice and the workers back on their binds (`kv_transfer.lower_nixl_threads`, the lab's
setting before the progress delay); and with the lab's progress delay on top
(`kv_transfer.nixl_progress_delay_us`: the threads wait in poll() between rounds). Each
runs with the lab proxy in front and is measured the way notebooks 01, 03 and 04 do
(`workload.build_requests`, `loadgen.run_point`, the same prompts for every topology):

- **one at a time**: `--prompts` requests at concurrency 1: median TPOT, median ITL;
- **mixed**: the mixed long/short workload at the workload's highest concurrency: ITL p99;
- for both, how long this process stood still (`stalls.Watch`), and during the mixed run
  the CPU seconds each process group used (instances, proxy), busy NIXL threads' own, and
  this process's (the load generator);
- the machine's 1-minute load average before and after, since other work on the same
  cores moves every figure.

It prints one markdown row per run and the two verdicts docs/REHEARSAL.md quotes: P/D's
TPOT at concurrency 1 within `TPOT_TARGET`x of the single instance's, and P/D's ITL p99
under the mixed workload the lowest of the three.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from lab_utils import config as labconfig
from lab_utils.cluster import Cluster
from lab_utils.measure import stalls
from lab_utils.measure.benchmark import summarize
from lab_utils.measure.loadgen import run_point, run_sync
from lab_utils.measure.workload import build_requests, server_tokenizer
from lab_utils.on_node import nixl_threads
from lab_utils.on_node.proctools import group_cpu_seconds, thread_cpu_seconds
from lab_utils.serve.topology import Served, cleanup, quiet_nixl_threads, serve

TPOT_TARGET = 1.5
# P/D's variants: name, what the row says, the kv_transfer settings
VARIANTS = {
    "as vLLM leaves it": ("NIXL threads poll without pause at normal priority; both workers on "
                          "the last core", {"lower_nixl_threads": False,
                                            "nixl_progress_delay_us": 0}),
    "lowered": ("NIXL threads poll without pause at nice 19, 0.1 ms slice; workers on their "
                "binds", {"lower_nixl_threads": True, "nixl_progress_delay_us": 0}),
    "the lab's setting": ("NIXL threads wait in poll() up to 1 ms; workers on their binds",
                          {"lower_nixl_threads": True, "nixl_progress_delay_us": 1000}),
}
RUNS = (("baseline", None), ("replicated", None),
        *(("disaggregated", name) for name in VARIANTS))


def cpu_snapshot(served: Served, threads: list[dict]) -> dict[str, float]:
    """CPU seconds so far: each process group of `served` (NIXL's threads included),
    NIXL's threads alone, this process."""
    out = {r.name: group_cpu_seconds(r.pgid) for r in served.records}
    out["NIXL threads"] = sum(thread_cpu_seconds(t["pid"], t["tid"]) for t in threads if "pid" in t)
    out["load generator"] = time.process_time()
    return out


def measure_point(cfg: labconfig.LabConfig, served: Served, tokenize, detokenize, *,
                  mixed: bool, concurrency: int, n: int) -> dict[str, Any]:
    w = cfg.workload
    requests = build_requests(w, n + w.warmup, tokenize, detokenize, mixed=mixed,
                              seed=w.seed + (1 if mixed else 0))
    with stalls.Watch() as watch:
        records, wall = run_sync(run_point(served.proxy_url, cfg.model.name, requests,
                                           concurrency=concurrency, warmup=w.warmup,
                                           chat=w.chat, show_progress=False,
                                           api_key=labconfig.api_key(cfg, "proxy")))
    s = summarize(records, wall, w).model_dump()
    return {"tpot_ms": s["median_tpot_ms"], "itl_p50_ms": s["median_itl_ms"],
            "itl_p99_ms": s["p99_itl_ms"], "ttft_ms": s["median_ttft_ms"],
            "read_together": s["itl_read_together_fraction"], "failed": s["failed"],
            "duration_s": round(wall, 1), "held_up_s": round(watch.held_up_s, 2)}


def measure_topology(cfg: labconfig.LabConfig, topology: str, prompts: int) -> dict[str, Any]:
    """Start `topology` with the proxy, measure both points, stop it."""
    w = cfg.workload
    load_before = os.getloadavg()[0]
    with Cluster(cfg) as cluster:
        try:
            records = serve(cluster, topology, with_proxy=True, show_progress=False)
            served = Served(topology, records)
            # busy NIXL threads: recorded at start, now again; none when they wait
            threads = nixl_threads.busy_only(quiet_nixl_threads(cluster, records))
            if not cfg.lower_nixl_threads():  # the same threads, left as they are
                threads = [t for r in records if r.extra.get("role") in ("prefill", "decode")
                           for t in nixl_threads.spinning(r.pgid)]
            tokenize, detokenize = server_tokenizer(served.instance_urls()[0], cfg.model.name,
                                                    labconfig.api_key(cfg, "vllm"))
            one = measure_point(cfg, served, tokenize, detokenize, mixed=False,
                                concurrency=1, n=prompts)
            before = cpu_snapshot(served, threads)
            mixed = measure_point(cfg, served, tokenize, detokenize, mixed=True,
                                  concurrency=max(w.concurrency or [1]), n=w.num_prompts)
            after = cpu_snapshot(served, threads)
        finally:
            cleanup(cluster)
    return {"topology": topology, "one": one, "mixed": mixed,
            "load_avg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "threads": [{k: t.get(k) for k in ("instance", "tid", "thread", "policy")}
                        for t in threads],
            "cpu_s": {k: round(after[k] - before[k], 1) for k in after}}


def _variant(config: Path, variant: str | None, tmp: str) -> labconfig.LabConfig:
    raw = json.loads(config.read_text())
    if variant is not None:
        raw.setdefault("kv_transfer", {}).update(VARIANTS[variant][1])
    path = Path(tmp) / f"config-{len(os.listdir(tmp))}.json"
    path.write_text(json.dumps(raw))
    return labconfig.load_config(path)


def compare(config: Path, prompts: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="pd-compare-") as tmp:
        for topology, variant in RUNS:
            cfg = _variant(config, variant, tmp)
            row = measure_topology(cfg, topology, prompts)
            row["variant"] = variant
            rows.append(row)
    return rows


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def label(row: dict[str, Any]) -> str:
    if row["topology"] != "disaggregated" or not row.get("variant"):
        return row["topology"]
    return f"disaggregated, {row['variant']}: {VARIANTS[row['variant']][0]}"


HEADER = ("| run | c=1 TPOT p50 ms | c=1 ITL p50 ms | mixed ITL p99 ms | mixed TTFT p50 ms "
          "| mixed s | stood still s (c=1 / mixed) | failed | load avg |\n"
          "|---|---|---|---|---|---|---|---|---|")


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [HEADER]
    for r in rows:
        one, mixed = r["one"], r["mixed"]
        load = "-" if "load_avg" not in r else "{:.0f} to {:.0f}".format(*r["load_avg"])
        lines.append(f"| {label(r)} | {_f(one['tpot_ms'])} | {_f(one['itl_p50_ms'])} | "
                     f"{_f(mixed['itl_p99_ms'])} | {_f(mixed['ttft_ms'], '{:.0f}')} | "
                     f"{mixed['duration_s']:.1f} | "
                     f"{one['held_up_s']:.1f} / {mixed['held_up_s']:.1f} | "
                     f"{one['failed'] + mixed['failed']} | {load} |")
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """The targets, each met or not, for each disaggregated row."""
    by = {label(r): r for r in rows}
    single = by.get("baseline")
    pair = by.get("replicated")
    pd_rows = [r for r in rows if r["topology"] == "disaggregated"]
    if not single or not pair or not pd_rows:
        return ["not every topology was measured"]
    out = []
    for pd in pd_rows:
        name = label(pd)
        tpot, base = pd["one"]["tpot_ms"], single["one"]["tpot_ms"]
        if tpot is None or not base:
            out.append(f"{name}: no TPOT at concurrency 1 to compare")
        else:
            ratio = tpot / base
            out.append(f"{name}: TPOT at concurrency 1 {ratio:.2f}x the single instance's "
                       f"({'within' if ratio <= TPOT_TARGET else 'over'} the {TPOT_TARGET}x target)")
        p99 = pd["mixed"]["itl_p99_ms"]
        others = (single["mixed"]["itl_p99_ms"], pair["mixed"]["itl_p99_ms"])
        if p99 is None or None in others:
            out.append(f"{name}: no mixed ITL p99 to compare")
        else:
            lowest = p99 < min(others)
            out.append(f"{name}: mixed ITL p99 {p99:.1f} ms against {others[0]:.1f} (single) and "
                       f"{others[1]:.1f} (replicated): {'the lowest' if lowest else 'not the lowest'}")
    still = [(label(r), k) for r in rows for k in ("one", "mixed") if r[k]["held_up_s"] > 0]
    out.append("no point stood still" if not still else
               "stood still: " + ", ".join(f"{n} ({k})" for n, k in still))
    return out
