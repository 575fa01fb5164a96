"""The results in formats other tools load: every run (one repeat of one load point of one
architecture's sweep) as a JSON file in the layout `vllm bench serve --save-result`
writes (`vllm_result`: its field names and units, milliseconds for latencies, seconds for
the duration, its `date`, `backend`, `model_id`, `num_prompts`, `request_rate`,
`max_concurrency` and so on, named as vLLM names its files), and every run as one row of
one CSV (`runs_frame`), with its label, model and date, the architecture, workload, load
point, repeat (from 1, as in the file names), validity and prefix-cache hit share beside
vLLM's fields. A run's date is when it was measured (older results files, which did not
record it, give their notebook's). `request_goodput` is null where no SLO was set; the
SLOs are recorded beside it where one was. `write_exports` writes both under
`<results>/export/`.

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

from lab_utils.report.data import ARCH_NOTEBOOK, ReportData
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult, RepeatSummary
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


def run_date(point: BenchmarkPoint, when: str | None = None) -> str | None:
    """When the run was measured, as vLLM writes dates ("20261128-134500"): the run's own
    (`date` in its summary), else `when` (its notebook's, for results that lack it)."""
    stamp = point.summary.date or when
    try:
        return datetime.fromisoformat(stamp).strftime("%Y%m%d-%H%M%S") if stamp else None
    except ValueError:
        return None


def slos(result: BenchmarkResult) -> dict[str, float]:
    """The SLOs the run's goodput counted against (ms; vLLM's `--goodput` names), {} if none."""
    slo = result.workload.get("slo") or {}
    return {k.removesuffix("_ms"): float(v) for k, v in slo.items() if v is not None}


def file_name(result: BenchmarkResult, point: BenchmarkPoint, label: str,
              when: str | None = None) -> str:
    """vLLM's name for a saved run, `{label}-{rate}qps[-concurrency{n}]-{model}-{date}.json`,
    with the repeat (from 1) before the date, so that repeats of one point do not collide."""
    rate = f"{point.value:g}" if point.mode == "rate" else "inf"
    conc = f"-concurrency{int(point.value)}" if point.mode == "concurrency" else ""
    model = result.model.rstrip("/").split("/")[-1]
    return (f"{label}-{rate}qps{conc}-{model}-repeat{point.repeat + 1}-"
            f"{run_date(point, when) or 'undated'}.json")


def vllm_result(result: BenchmarkResult, point: BenchmarkPoint, *, label: str,
                when: str | None = None) -> dict[str, Any]:
    """One run in the layout of `vllm bench serve --save-result` (without
    `--save-detailed`: no per-request lists but the latencies, in seconds as vLLM's)."""
    s, w = point.summary, result.workload
    date = run_date(point, when)
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
        **{k: _finite(getattr(s, k, None)) for k in VLLM_FIELDS},
        "latencies": [r["e2el_ms"] / 1000.0 for r in ok if r.get("e2el_ms") is not None],
    }
    if goal := slos(result):
        out["lab_goodput_slo_ms"] = goal  # the SLOs request_goodput counted against
    out.update({f"lab_{k}": getattr(s, k, None) for k in LAB_FIELDS})
    return out


def _runs(data: ReportData):
    """(architecture, workload, result, point) for every run of every sweep."""
    for workload, results in (("standard", data.sweeps), ("mixed", data.mixed)):
        for arch, result in results.items():
            for p in result.points:
                yield arch, workload, result, p


def label_of(arch: str, workload: str) -> str:
    """A run's label, as `vllm bench serve --label` would carry it."""
    return f"{arch}-{workload}"


def runs_frame(data: ReportData) -> pd.DataFrame:
    """Every run as one row, vLLM's fields beside the lab's, repeats counted from 1."""
    stamps = _stamps(data)
    rows = [{"label": label_of(arch, workload), "model": result.model,
             "date": run_date(p, stamps.get(arch)), "architecture": arch, "workload": workload,
             "mode": p.mode, "value": p.value, "repeat": p.repeat + 1,
             "slo_ms": json.dumps(slos(result)) if slos(result) else None,
             **{k: _finite(getattr(p.summary, k, None)) for k in VLLM_FIELDS},
             **{k: getattr(p.summary, k, None) for k in LAB_FIELDS}}
            for arch, workload, result, p in _runs(data)]
    return pd.DataFrame(rows, columns=["label", "model", "date", "architecture", "workload",
                                       "mode", "value", "repeat", "slo_ms", *VLLM_FIELDS,
                                       *LAB_FIELDS])


def _stamps(data: ReportData) -> dict[str, str]:
    """Each architecture's results file's date (for runs that did not record their own)."""
    return {arch: env.timestamp for arch, nb in ARCH_NOTEBOOK.items()
            if (env := data.envelopes.get(nb)) is not None}


# vllm bench serve's per-point fields, in the order it prints them (the report's fold)
SHOWN = ("completed", "failed", "duration", "request_throughput", "output_throughput",
         "total_token_throughput",
         *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el")
           for stat in ("mean", "median", "p99")))


def fields_table(data: ReportData) -> pd.DataFrame:
    """Every point of every sweep, one row, with the fields `vllm bench serve` prints
    (counts, duration, the three throughputs, mean, median and p99 of TTFT, TPOT, ITL and
    E2E latency): the median over the point's repeats of each, in vLLM's names."""
    groups: dict[tuple, list[RepeatSummary]] = {}
    for arch, workload, _, p in _runs(data):
        groups.setdefault((arch, workload, p.mode, p.value), []).append(p.summary)
    rows = []
    for (arch, workload, mode, value), summaries in groups.items():
        row: dict[str, Any] = {"architecture": arch, "workload": workload,
                               "load": f"{mode} {value:g}", "repeats": len(summaries)}
        for k in SHOWN:
            got = [float(v) for s in summaries if isinstance(v := getattr(s, k, None), (int, float))
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
    stamps = _stamps(data)
    for arch, workload, result, p in _runs(data):
        label = label_of(arch, workload)
        path = out / file_name(result, p, label, stamps.get(arch))
        atomic_write_text(path, json.dumps(vllm_result(result, p, label=label,
                                                       when=stamps.get(arch)), indent=1))
        paths.append(path)
    for old in set(out.glob("*.json")) - set(paths):
        old.unlink()
    return paths
