"""Where notebook 04's time went, from its own run.

- **CPU seconds** each process group used during the sweep (each instance with its engine
  core and worker, the proxy), NIXL's progress threads' own, and the notebook's kernel,
  which runs the load generator (`steps.run_sweep` records them; local nodes only, where
  /proc is read directly).
- **ITL at one request at a time** through the pair against notebook 01's single instance.
- **TTFT, split**: a few requests one at a time through the pair, with the prefill and the
  decode instance's `/metrics` read before and after, divide each request's TTFT into
  the prefill (the prefill instance's own TTFT: queue and prompt), the KV move (NIXL's
  transfer time on the decode instance), the first decode step (the decode instance's TTFT
  less the KV move: scheduling the request and its first step) and the proxy hop (what
  is left: the proxy's two round trips, its relay, and the client's reading).

`split_sentence` says which part dominated, from whatever the run measured.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pandas as pd

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig, api_key
from lab_utils.forecast.profile import settled_step_ms
from lab_utils.measure.loadgen import run_point, run_sync
from lab_utils.measure.workload import build_requests
from lab_utils.notebook.session import tokenizer_of
from lab_utils.on_node import nixl_threads
from lab_utils.on_node.proctools import group_cpu_seconds, thread_cpu_seconds
from lab_utils.results.claims import Claim, claim, comparison, save_claims
from lab_utils.results.forecast import TimedProfile
from lab_utils.results.points import Measured, differs
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.serve.metrics import MetricsSnapshot, fetch_metrics
from lab_utils.serve.topology import Served

PARTS = ("prefill", "proxy hop", "KV move", "first decode step")
# requests timed one at a time (after the workload's warm-up ones): in four runs of six,
# the pair's median ms per token read 0.6x to 1.4x what its sweep measured right after
SPLIT_REQUESTS = 12
BUSY_NIXL = "NIXL progress threads found busy"
_TTFT = "vllm:time_to_first_token_seconds"
_XFER = "vllm:nixl_xfer_time_seconds"




def cpu_now(cfg: LabConfig, served: Served) -> dict[str, float] | None:
    """CPU seconds so far of each process group of `served` less its NIXL progress
    threads found busy (`serve.topology.quiet_nixl_threads`; a thread that waits between polls is
    not found and counts with its instance), those threads together, and this process
    (the load generator); None when an instance is on a node reached over SSH (its /proc
    is not read from here)."""
    if any(cfg.nodes[r.node].connection != "local" for r in served.records):
        return None
    with Cluster(cfg) as cluster:  # not the worker main threads the lab put back
        recorded = {r.name: nixl_threads.busy_only(r.extra.get("nixl_threads", []))
                    for r in cluster.running()}
    out: dict[str, float] = {BUSY_NIXL: 0.0}
    for r in served.records:
        threads = sum(thread_cpu_seconds(t["pid"], t["tid"])
                      for t in recorded.get(r.name, []) if "pid" in t)
        out[r.name if r.kind == "proxy" else f"{r.name} (engine, worker)"] = (
            group_cpu_seconds(r.pgid) - threads)
        out[BUSY_NIXL] += threads
    out["notebook kernel (load generator)"] = time.process_time()
    return out


def _hist(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> tuple[float, float]:
    a, b = after.histogram(name), before.histogram(name)
    return a.sum - b.sum, a.count - b.count


def ttft_parts(client_ttft_ms: float, prefill: tuple[MetricsSnapshot, MetricsSnapshot],
               decode: tuple[MetricsSnapshot, MetricsSnapshot]) -> dict[str, float]:
    """The mean TTFT's parts in ms (PARTS), from /metrics read before and after the
    requests on the prefill and the decode instance."""
    p_sum, p_n = _hist(*prefill, _TTFT)
    d_sum, d_n = _hist(*decode, _TTFT)
    x_sum, _ = _hist(*decode, _XFER)
    n = max(p_n, d_n, 1.0)
    pre, dec, move = p_sum / n * 1e3, d_sum / n * 1e3, x_sum / n * 1e3
    return {"prefill": pre, "proxy hop": max(client_ttft_ms - pre - dec, 0.0),
            "KV move": move, "first decode step": max(dec - move, 0.0)}


def split_sentence(parts: dict[str, float], client_ttft_ms: float, requests: int | None = None,
                   sweep_median_ms: float | None = None, when: str = "after") -> str:
    """Which part of TTFT dominated, with every part's share, from this run's figures. The
    pair against the single instance is the "through the pair" sentence, on the sweeps'
    medians; this one describes its own requests, and says so where their mean differs from the
    sweep's median at concurrency 1 (`sweep_median_ms`) by the lab's rule. `when`:
    "before" or "after" the sweep."""
    ranked = sorted(PARTS, key=lambda k: -parts[k])
    top = ranked[0]
    total = sum(parts[k] for k in PARTS) or 1.0
    # a part no different from the largest by the lab's rule: a tie, not a ranking
    tied = [k for k in ranked[1:]
            if not differs(Measured.one(parts[k]), Measured.one(parts[top]))]
    others = ", ".join(f"{k} {parts[k]:.1f} ms" for k in PARTS if k != top and k not in tied)
    over = f"over {requests} fresh requests" if requests else "over a few fresh requests"
    said = (f"Where TTFT went: {over} sent one at a time {when} the sweep, the mean TTFT "
            f"through the pair was {client_ttft_ms:.1f} ms; "
            + (f"the {top} took the most, {parts[top]:.1f} ms ({parts[top] / total:.0%} of it)"
               if not tied else
               f"the {' and the '.join([top, *tied])} took the most, within 10% of each "
               "other: " + ", ".join(f"{parts[k]:.1f} ms ({parts[k] / total:.0%})"
                                     for k in [top, *tied]))
            + (f"; {others}." if others else "."))
    if sweep_median_ms and differs(Measured.one(client_ttft_ms), Measured.one(sweep_median_ms)):
        said += (f" The sweep's own median at concurrency 1 was {sweep_median_ms:.1f} ms: these "
                 "requests were " + ("slower" if client_ttft_ms > sweep_median_ms else "faster")
                 + " than the sweep's, so their parts describe them, not the sweep.")
    return said


def _warmed_requests(cfg: LabConfig, served: Served, n: int):
    """Send the workload's warm-up requests one at a time (not measured, as a sweep's point
    starts); return the `n` to time (fresh prompts of their own)."""
    tokenize, detokenize = tokenizer_of(served, cfg)
    both = build_requests(cfg.workload, cfg.workload.warmup + n, tokenize, detokenize,
                          seed=cfg.workload.seed + 404)
    _one_at_a_time(cfg, served, both[:cfg.workload.warmup])
    return both[cfg.workload.warmup:]


def _one_at_a_time(cfg: LabConfig, served: Served, requests) -> list:
    records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, requests, concurrency=1,
                                    chat=cfg.workload.chat, show_progress=False,
                                    api_key=api_key(cfg, "proxy")))
    return [r for r in records if r.ok and r.ttft_ms is not None]


def _timed(cfg: LabConfig, ok: list, parts: dict[str, float]) -> TimedProfile | None:
    if not ok:
        return None
    steps = [settled_step_ms(r.itl_ms) for r in ok if len(r.itl_ms) >= 2]
    return TimedProfile(requests=len(ok), prompt_tokens=cfg.workload.input_len,
                        ttft_ms=statistics.median(r.ttft_ms for r in ok),
                        step_ms=statistics.median(steps) if steps else None, parts=parts)


def measure_split(cfg: LabConfig, served: Served, n: int = SPLIT_REQUESTS) -> dict[str, Any]:
    """`n` fresh requests one at a time through the pair with both instances' /metrics
    read around them: the client's mean TTFT and its parts (`ttft_parts`), and the pair's
    profile for the forecast (`TimedProfile`: median TTFT, settled ms per token)."""
    prefill_url, decode_url = served.urls("prefill")[0], served.urls("decode")[0]
    requests = _warmed_requests(cfg, served, n)
    before = fetch_metrics(prefill_url), fetch_metrics(decode_url)
    ok = _one_at_a_time(cfg, served, requests)
    after = fetch_metrics(prefill_url), fetch_metrics(decode_url)
    client = sum(r.ttft_ms for r in ok) / len(ok) if ok else 0.0
    parts = ttft_parts(client, (before[0], after[0]), (before[1], after[1]))
    return {"client_ttft_ms": client, "requests": len(ok), "parts": parts,
            "timed": _timed(cfg, ok, parts)}


def itl_claim(baseline: BenchmarkResult, disaggregated: BenchmarkResult) -> Claim:
    """ITL p50 at concurrency 1 through the pair against 01's single instance, by the rule."""
    one, two = (next((p for p in res.combined if p.mode == "concurrency" and p.value == 1
                      and p.valid and p.median("median_itl_ms") is not None), None)
                for res in (baseline, disaggregated))
    if one is None or two is None:
        return claim("04", "ITL at one request at a time: not compared (01 or 04 has no "
                     "concurrency-1 point).")
    c = comparison("median_itl_ms", ("disaggregated", "04", "sweep", two),
                   ("single instance", "01", "sweep", one))
    return claim("04", f"ITL p50 at one request at a time: {c.subject.value.median:.1f} ms "
                 f"through the pair against {c.reference.value.median:.1f} ms on 01's single "
                 f"instance (" + ("no difference by the lab's rule" if c.better is None
                                  else c.margin()) + ").", c)


def cpu_frame(cpu_s: dict[str, float] | None) -> pd.DataFrame:
    """CPU seconds per process group during the sweep, largest first."""
    rows = sorted((cpu_s or {}).items(), key=lambda kv: -kv[1])
    return pd.DataFrame([{"during the sweep": k, "CPU s": round(v, 1)} for k, v in rows],
                        columns=["during the sweep", "CPU s"])


def time_instances(cfg: LabConfig, served: Served, n: int = SPLIT_REQUESTS) -> dict[str, Any]:
    """03 and 04, before their forecasts: `n` fresh requests one at a time through the
    front door (03: the replicas in turn; 04: the pair, with `measure_split`'s TTFT split),
    with one line that says what was measured; the forecast calibrates on its `"timed"`
    (`forecast.timed`)."""
    if served.topology == "disaggregated":
        found = measure_split(cfg, served, n)
    else:
        ok = _one_at_a_time(cfg, served, _warmed_requests(cfg, served, n))
        found = {"requests": len(ok), "timed": _timed(cfg, ok, {})}
    timed = found["timed"]
    if timed is None:
        print("the instances answered none of the timing requests: the forecast goes without")
    else:
        served.timed[served.topology] = timed  # for the ETAs of the cells after it
        step = f", {timed.step_ms:.2f} ms per token" if timed.step_ms else ""
        print(f"{served.topology}, one request at a time: {timed.requests} fresh prompts of "
              f"{timed.prompt_tokens} tokens, TTFT median {timed.ttft_ms:.1f} ms{step}")
    return found


def where_time_went(cfg: LabConfig, served: Served, baseline: BenchmarkResult,
                    result: BenchmarkResult, split: dict[str, Any] | None = None) -> dict[str, Any]:
    """Notebook 04's account of its own time: the CPU table of the sweep (None on SSH
    nodes), the TTFT split of a few fresh requests one at a time (`split`: `time_instances`',
    measured before the sweep; None: measured now, after it), and the sentences."""
    when = "before" if split is not None else "after"
    split = split if split is not None else measure_split(cfg, served)
    cpu = None if result.cpu is None else result.cpu.by_process
    c1 = result.point_at(1)
    said = [itl_claim(baseline, result),
            claim("04", split_sentence(split["parts"], split["client_ttft_ms"], split["requests"],
                                       c1.median("median_ttft_ms") if c1 else None, when))]
    if cpu is None:
        said.append(claim("04", "CPU seconds per process: not read (an instance is on a node "
                          "reached over SSH, or no sweep ran in this kernel)."))
    else:
        top = max(cpu, key=lambda k: cpu[k])
        said.append(claim("04", f"CPU during the sweep: {sum(cpu.values()):.1f} s in all; {top} "
                          f"used the most, {cpu[top]:.1f} s.", figures=cpu))
    save_claims(cfg.results_dir, "04:time", said)
    return {"cpu": cpu_frame(cpu) if cpu is not None else None, "split": split,
            "parts": pd.DataFrame([{"part": k, "ms": round(split["parts"][k], 1)} for k in PARTS]),
            "said": [c.text for c in said]}
