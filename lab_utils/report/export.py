"""The results in formats other tools load: every run (one repeat of one load point of one
architecture's sweep) as a JSON file in the layout `vllm bench serve --save-result`
writes (`vllm_result`: its field names and units, milliseconds for latencies, seconds for
the duration, its `date`, `backend`, `model_id`, `num_prompts`, `request_rate`,
`max_concurrency` and so on), and every run as one row of one CSV (`runs_frame`), with
the architecture, workload, load point, repeat, validity and prefix-cache hit share
beside vLLM's fields. `write_exports` writes both under `<results>/export/`.

What vLLM records and the lab does not (its per-second peaks, `rtfx`) is absent, not
made up; the lab adds p90 next to vLLM's default p99 and its own fields, prefixed `lab_`.
"""

from __future__ import annotations

import json
import math
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from lab_utils.report.data import ReportData
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult
from lab_utils.util.atomic import atomic_write_text

# vLLM's names for the run's aggregate numbers, as `measure.benchmark.summarize` writes them
VLLM_FIELDS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el")
      for stat in ("mean", "median", "std", "p90", "p99")),
)
LAB_FIELDS = ("valid", "invalid_reason", "prefix_cache_hit_pct", "seed", "run", "held_up_s")


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def vllm_result(result: BenchmarkResult, point: BenchmarkPoint, *, label: str,
                when: str | None = None) -> dict[str, Any]:
    """One run in the layout of `vllm bench serve --save-result` (without
    `--save-detailed`: no per-request lists but the latencies, in seconds as vLLM's)."""
    s, w = point.summary, result.workload
    try:
        date = datetime.fromisoformat(when).strftime("%Y%m%d-%H%M%S") if when else None
    except ValueError:
        date = None
    ok = [r for r in point.requests if r.get("error") is None]
    # vLLM's name for the endpoint the run used: /v1/chat/completions or /v1/completions
    backend = "openai-chat" if w.get("chat") else "openai"
    out: dict[str, Any] = {
        "date": date, "endpoint_type": backend, "backend": backend, "label": label,
        "model_id": result.model, "tokenizer_id": result.model,
        "num_prompts": w.get("num_prompts"),
        "request_rate": point.value if point.mode == "rate" else "inf",
        "burstiness": w.get("burstiness", 1.0),
        "max_concurrency": int(point.value) if point.mode == "concurrency" else None,
        **{k: _finite(s.get(k)) for k in VLLM_FIELDS},
        "latencies": [r["e2el_ms"] / 1000.0 for r in ok if r.get("e2el_ms") is not None],
    }
    out.update({f"lab_{k}": s.get(k) for k in LAB_FIELDS})
    return out


def _runs(data: ReportData):
    """(architecture, workload, result, point) for every run of every sweep."""
    for workload, results in (("standard", data.sweeps), ("mixed", data.mixed)):
        for arch, result in results.items():
            for p in result.points:
                yield arch, workload, result, p


def runs_frame(data: ReportData) -> pd.DataFrame:
    """Every run as one row: architecture, workload, mode, value, repeat, vLLM's fields and
    the lab's (validity, prefix-cache hit share, seed, stall time)."""
    rows = [{"architecture": arch, "workload": workload, "mode": p.mode, "value": p.value,
             "repeat": p.repeat, **{k: _finite(p.summary.get(k)) for k in VLLM_FIELDS},
             **{k: p.summary.get(k) for k in LAB_FIELDS}}
            for arch, workload, _, p in _runs(data)]
    return pd.DataFrame(rows, columns=["architecture", "workload", "mode", "value", "repeat",
                                       *VLLM_FIELDS, *LAB_FIELDS])


# vllm bench serve's per-point fields, in the order it prints them (the report's fold)
SHOWN = ("completed", "failed", "duration", "request_throughput", "output_throughput",
         "total_token_throughput",
         *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el")
           for stat in ("mean", "median", "p99")))


def fields_table(data: ReportData) -> pd.DataFrame:
    """Every point of every sweep, one row, with the fields `vllm bench serve` prints
    (counts, duration, the three throughputs, mean, median and p99 of TTFT, TPOT, ITL and
    E2E latency): the median over the point's repeats of each, in vLLM's names."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for arch, workload, _, p in _runs(data):
        groups.setdefault((arch, workload, p.mode, p.value), []).append(p.summary)
    rows = []
    for (arch, workload, mode, value), summaries in groups.items():
        row: dict[str, Any] = {"architecture": arch, "workload": workload,
                               "load": f"{mode} {value:g}", "repeats": len(summaries)}
        for k in SHOWN:
            got = [float(v) for s in summaries if isinstance(v := s.get(k), (int, float))
                   and not isinstance(v, bool) and math.isfinite(v)]
            row[k] = statistics.median(got) if got else None
        rows.append(row)
    return pd.DataFrame(rows, columns=["architecture", "workload", "load", "repeats", *SHOWN])


def write_exports(data: ReportData, out: Path) -> list[Path]:
    """Write `out/runs.csv` and one `vllm bench serve`-layout JSON per run; a JSON file of
    an earlier report that this one did not write is removed."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "runs.csv"]
    atomic_write_text(paths[0], runs_frame(data).to_csv(index=False))
    stamps = {arch: env.timestamp for arch, env in
              ((a, data.envelopes.get(nb)) for a, nb in
               (("baseline", "01"), ("replicated", "03"), ("disaggregated", "04")))
              if env is not None}
    for arch, workload, result, p in _runs(data):
        label = f"{arch}-{workload}-{p.mode}{p.value:g}-repeat{p.repeat + 1}"
        path = out / f"{label}.json"
        atomic_write_text(path, json.dumps(vllm_result(result, p, label=label,
                                                       when=stamps.get(arch)), indent=1))
        paths.append(path)
    for old in set(out.glob("*.json")) - set(paths):
        old.unlink()
    return paths
