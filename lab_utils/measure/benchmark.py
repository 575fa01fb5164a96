"""Benchmark summaries and records: what a load point measured, in vLLM's field names.

`summarize` turns a point's request records into the flat record `vllm bench serve`
writes (`completed`, `request_throughput`, `median_ttft_ms`, `p99_itl_ms`, ...), plus
goodput under the configured SLOs, the first errors, and a verdict: a point where more
than `max_failed_fraction` of requests failed is marked invalid, loudly, and must not be
shown as a result. `combine` gives the typed `Point` (`lab_utils.results.points`): the
median over repeats of every headline metric, with its min-max range. `sweep` runs a
workload over concurrency levels and request rates. Its records (`RequestRecord`,
`BenchmarkPoint`, `BenchmarkResult`, in `lab_utils.results.sweep`) travel inside the
results envelope.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lab_utils.config import WorkloadConfig
from lab_utils.measure import stalls
from lab_utils.measure.loadgen import RequestSpec, run_point, run_sync
from lab_utils.results.points import KEYS, Measured, Point
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult, RequestRecord
from lab_utils.util.progress import log_progress

PERCENTILES = (90, 99)
HEADLINE = KEYS  # the metric table's keys (lab_utils.results.points.METRICS)


def _stats(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{k}_{name}_ms": None for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))}
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
           f"std_{name}_ms": float(arr.std())}
    out.update({f"p{p}_{name}_ms": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def summarize(records: list[RequestRecord], wall_s: float, w: WorkloadConfig) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    total_in = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    total_out = sum(r.completion_tokens or 0 for r in ok)
    slo = w.slo
    good = sum(1 for r in ok
               if (slo.ttft_ms is None or (r.ttft_ms is not None and r.ttft_ms <= slo.ttft_ms))
               and (slo.tpot_ms is None or (r.tpot_ms or 0.0) <= slo.tpot_ms)
               and (slo.e2el_ms is None or (r.e2el_ms is not None and r.e2el_ms <= slo.e2el_ms)))
    dur = max(wall_s, 1e-9)
    out: dict[str, Any] = {
        "duration": wall_s, "completed": len(ok), "failed": failed,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if any((slo.ttft_ms, slo.tpot_ms, slo.e2el_ms)) else None,
        "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
    }
    out.update(_stats("ttft", [r.ttft_ms for r in ok if r.ttft_ms is not None]))
    out.update(_stats("tpot", [r.tpot_ms for r in ok if r.tpot_ms is not None]))
    out.update(_stats("itl", [x for r in ok for x in r.itl_ms]))
    gaps = sum(len(r.itl_ms) for r in ok)
    out["itl_read_together_fraction"] = sum(r.read_together for r in ok) / gaps if gaps else None
    out.update(_stats("e2el", [r.e2el_ms for r in ok if r.e2el_ms is not None]))
    lags = [(r.sent_s - r.scheduled_s) * 1000.0 for r in records]
    out["p99_send_lag_ms"] = float(np.percentile(lags, 99)) if lags else None
    out["errors"] = list(dict.fromkeys(r.error for r in records if r.error))[:5]
    share = failed / len(records) if records else 1.0
    out["failed_fraction"] = share
    out["valid"] = bool(records) and bool(ok) and share <= w.max_failed_fraction
    out["invalid_reason"] = None if out["valid"] else (
        f"{failed} of {len(records)} requests failed ({share:.0%}, allowed "
        f"{w.max_failed_fraction:.0%}); first errors: {out['errors'][:2]}")
    return out


def combine(summaries: list[dict[str, Any]], mode: str, value: float,
            mixed: bool = False) -> Point:
    """One load point's repeats (`summarize`'s records) as one Point: the median over the
    repeats of every headline metric, with its min and max."""
    return Point(mode=mode, value=value, mixed=mixed, repeats=len(summaries),
                 valid=all(s["valid"] for s in summaries),
                 **{k: Measured.of(s.get(k) for s in summaries) for k in HEADLINE})


READ_TOGETHER_NOTE = 0.10


def read_together_share(summary: dict[str, Any]) -> float | None:
    """The share of a run's inter-token gaps that were between tokens the load generator
    got in one read, when it is at least `READ_TOGETHER_NOTE`; else None."""
    share = summary.get("itl_read_together_fraction")
    return share if share is not None and share >= READ_TOGETHER_NOTE else None


def read_late(result: BenchmarkResult, mode: str, value: float) -> bool:
    """Whether, in any repeat of one load point, the load generator got enough tokens in
    one read with the token before to be noted (`read_together_share`)."""
    return any(read_together_share(p.summary) for p in result.points
               if p.mode == mode and float(p.value) == float(value))


def _say(text: str) -> None:
    """Printed in the notebook, and on the terminal when the notebooks run headless."""
    print(text)
    log_progress(text)


def sweep(url: str, model: str, make_requests, w: WorkloadConfig, *, mixed: bool = False,
          show_progress: bool = True, api_key: str | None = None) -> BenchmarkResult:
    """Run the workload at every configured concurrency and rate, `w.repeats` times
    (`api_key`: the endpoint's, sent as a bearer token).
    `make_requests(n, seed)` returns n RequestSpecs; each repeat uses its own seed so
    the prefix cache cannot turn repeats into cache hits."""
    plan = [("concurrency", c) for c in w.concurrency] + [("rate", r) for r in w.request_rates]
    points, combined = [], []
    for mode, value in plan:
        summaries, label = [], f"{'mixed ' if mixed else ''}{mode} {value:g}"
        for rep in range(w.repeats):
            specs: list[RequestSpec] = make_requests(w.warmup + w.num_prompts, w.seed + 1000 * rep + int(value * 10))
            with stalls.Watch() as watch:
                records, wall = run_sync(run_point(
                    url, model, specs, warmup=w.warmup, seed=w.seed + rep, chat=w.chat,
                    concurrency=int(value) if mode == "concurrency" else None,
                    rate=value if mode == "rate" else None, burstiness=w.burstiness,
                    duration_s=w.duration_s, timeout_s=w.request_timeout_s,
                    show_progress=show_progress, desc=f"{label} #{rep + 1}", api_key=api_key))
            s = summarize(records, wall, w)
            s.update(mode=mode, value=value, repeat=rep, mixed=mixed,
                     held_up_s=round(watch.held_up_s, 2), stalls=len(watch.stalls))
            if watch.stalls:
                _say(f"note ({label}, repeat {rep + 1}): the machine stood still "
                     f"{watch.held_up_s:.1f} s during this run (longest {max(watch.stalls):.1f} s); "
                     "its latencies include that")
            if share := read_together_share(s):
                _say(f"note ({label}, repeat {rep + 1}): {share:.0%} of the tokens "
                     "came in one read with the token before (ITL 0 ms): the load generator read "
                     "late or they were sent together; the report will not compare this point on "
                     "ITL and TPOT")
            if not s["valid"]:
                _say(f"INVALID POINT ({label}, repeat {rep + 1}): {s['invalid_reason']}")
            summaries.append(s)
            points.append(BenchmarkPoint(mode=mode, value=value, repeat=rep, summary=s,
                                         requests=[r.as_dict() for r in records]))
        combined.append(combine(summaries, mode, value, mixed))
    return BenchmarkResult(target=url, model=model, workload={**w.model_dump(), "mixed": mixed},
                           points=points, combined=combined)
