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

Fair runs: every run of a series draws its prompts from a seed of its own (`run_seed`:
the workload's seed, the run's name such as "replicated/mixed" or "replicated/policy
round_robin", the load point and the repeat), so no run replays another's prompts on the
same instances; and, given the instances' counters (`cache_meter`), each repeat records
the share of its prompt tokens the instances served from their prefix cache
(`prefix_cache_hit_pct`). Hits where none were intended make the repeat invalid, with
the reason: a cache hit skips the prefill, so its TTFT is not a prefill's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np

from lab_utils.config import WorkloadConfig
from lab_utils.measure import stalls
from lab_utils.measure.loadgen import RequestSpec, run_point, run_sync
from lab_utils.results.points import KEYS, Measured, Point
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult, RepeatSummary, RequestRecord
from lab_utils.util.progress import log_progress

PERCENTILES = (90, 99)
HEADLINE = KEYS  # the metric table's keys (lab_utils.results.points.METRICS)


def _stats(name: str, values: list[float]) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float)
    stats: dict[str, Callable[[Any], Any]] = {
        "mean": np.mean, "median": np.median, "std": np.std,
        **{f"p{p}": partial(np.percentile, q=p) for p in PERCENTILES}}
    return {f"{k}_{name}_ms": float(stat(arr)) if values else None for k, stat in stats.items()}


def summarize(records: list[RequestRecord], wall_s: float, w: WorkloadConfig) -> RepeatSummary:
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    total_in = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    total_out = sum(r.completion_tokens or 0 for r in ok)
    slo = w.slo
    good = sum(1 for r in ok
               if (slo.ttft_ms is None or (r.ttft_ms is not None and r.ttft_ms <= slo.ttft_ms))
               and (slo.tpot_ms is None or (r.tpot_ms or 0.0) <= slo.tpot_ms)
               and (slo.e2el_ms is None or (r.e2el_ms is not None and r.e2el_ms <= slo.e2el_ms))
               and (slo.itl_ms is None or max(r.itl_ms, default=0.0) <= slo.itl_ms))
    dur = max(wall_s, 1e-9)
    out: dict[str, Any] = {
        "duration": wall_s, "completed": len(ok), "failed": failed,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if any((slo.ttft_ms, slo.tpot_ms, slo.e2el_ms, slo.itl_ms))
        else None,
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
    return RepeatSummary(**out)


def combine(summaries: list[RepeatSummary], mode: str, value: float,
            mixed: bool = False) -> Point:
    """One load point's repeats (`summarize`'s records) as one Point: the median over the
    repeats of every headline metric, with its min and max."""
    hits = [s.prefix_cache_hit_pct for s in summaries if s.prefix_cache_hit_pct is not None]
    return Point(mode=mode, value=value, mixed=mixed, repeats=len(summaries),
                 valid=all(s.valid for s in summaries),
                 invalid_reason=next((s.invalid_reason for s in summaries if not s.valid), None),
                 prefix_cache_hit_pct=max(hits) if hits else None,
                 **{k: Measured.of(getattr(s, k) for s in summaries) for k in HEADLINE})


# Instance name -> (prompt tokens, of them served from the prefix cache), counters since
# the instance started (`lab_utils.serve.metrics.InstanceCounters`).
CacheCounts = dict[str, tuple[float, float]]


def run_seed(base: int, run: str, mode: str, value: float, repeat: int) -> int:
    """The prompt seed of one repeat of one load point of the run named `run`: `base`
    (the workload's seed) plus a number drawn from the run's name, load point and repeat,
    so that two runs of a series (a sweep, its mixed run, a comparison after them) never
    share prompts."""
    digest = hashlib.sha256(f"{run}|{mode}|{value:g}|{repeat}".encode()).digest()
    return base + int.from_bytes(digest[:6], "big")


def cache_hits(before: CacheCounts, after: CacheCounts) -> tuple[float | None, dict[str, float]]:
    """The share (%) of the prompt tokens between two readings that the instances served
    from their prefix cache, over all of them and per instance (None: nothing read)."""
    per, total, hit = {}, 0.0, 0.0
    for name, (prompt_after, hit_after) in after.items():
        if name not in before:
            continue
        d_prompt, d_hit = prompt_after - before[name][0], hit_after - before[name][1]
        if d_prompt > 0:
            per[name] = round(100 * d_hit / d_prompt, 2)
        total, hit = total + d_prompt, hit + d_hit
    return (round(100 * hit / total, 2) if total > 0 else None), per


READ_TOGETHER_NOTE = 0.10


def read_together_share(summary: RepeatSummary) -> float | None:
    """The share of a run's inter-token gaps that were between tokens the load generator
    got in one read, when it is at least `READ_TOGETHER_NOTE`; else None."""
    share = summary.itl_read_together_fraction
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
          show_progress: bool = True, api_key: str | None = None, run: str = "sweep",
          cache_meter: Callable[[], CacheCounts] | None = None,
          hits_expected: bool = False) -> BenchmarkResult:
    """Run the workload at every configured concurrency and rate, `w.repeats` times
    (`api_key`: the endpoint's, sent as a bearer token).
    `make_requests(n, seed)` returns n RequestSpecs; each repeat of each point of the run
    named `run` uses its own seed (`run_seed`), so the prefix cache cannot turn repeats or
    other runs into cache hits. `cache_meter()`, when given, reads the instances' counters
    before and after each repeat (`mark_cache_hits`)."""
    plan = [("concurrency", c) for c in w.concurrency] + [("rate", r) for r in w.request_rates]
    points, combined = [], []
    for mode, value in plan:
        summaries, label = [], f"{'mixed ' if mixed else ''}{mode} {value:g}"
        for rep in range(w.repeats):
            seed = run_seed(w.seed, f"{run}/{'mixed' if mixed else 'standard'}", mode, value, rep)
            specs: list[RequestSpec] = make_requests(w.warmup + w.num_prompts, seed)
            before = cache_meter() if cache_meter else None
            with stalls.Watch() as watch:
                records, wall = run_sync(run_point(
                    url, model, specs, warmup=w.warmup, seed=w.seed + rep, chat=w.chat,
                    concurrency=int(value) if mode == "concurrency" else None,
                    rate=value if mode == "rate" else None, burstiness=w.burstiness,
                    duration_s=w.duration_s, timeout_s=w.request_timeout_s,
                    show_progress=show_progress, desc=f"{label} #{rep + 1}", api_key=api_key))
            s = summarize(records, wall, w).model_copy(update=dict(
                mode=mode, value=value, repeat=rep, mixed=mixed, run=run, seed=seed,
                held_up_s=round(watch.held_up_s, 2), stalls=len(watch.stalls),
                date=datetime.now(UTC).isoformat(timespec="seconds")))
            if cache_meter is not None and before is not None:
                s.mark_cache_hits(*cache_hits(before, cache_meter()), hits_expected)
            if watch.stalls:
                _say(f"note ({label}, repeat {rep + 1}): the machine stood still "
                     f"{watch.held_up_s:.1f} s during this run (longest {max(watch.stalls):.1f} s); "
                     "its latencies include that")
            if share := read_together_share(s):
                _say(f"note ({label}, repeat {rep + 1}): {share:.0%} of the tokens "
                     "came in one read with the token before (ITL 0 ms): the load generator read "
                     "late or they were sent together; the report will not compare this point on "
                     "ITL and TPOT")
            if not s.valid:
                _say(f"INVALID POINT ({label}, repeat {rep + 1}): {s.invalid_reason}")
            summaries.append(s)
            points.append(BenchmarkPoint(mode=mode, value=value, repeat=rep, summary=s,
                                         requests=[r.as_dict() for r in records]))
        combined.append(combine(summaries, mode, value, mixed))
    return BenchmarkResult(target=url, model=model, workload={**w.model_dump(), "mixed": mixed},
                           points=points, combined=combined)
