"""The report's pandas tables. `points_table` is the one everything else is computed from:
one row per architecture, workload and load point, raw numbers (median and min-max over
the repeats, NaN where absent), invalid points kept with their reason. `display_table`
formats it for people; the others turn the payloads of notebooks 00 and 02 (checks, KV
transfer times, NIXL probe rows), the nodes' calibration records (estimated against
measured) and nested records into tables.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lab_utils.forecast.inputs import GB10
from lab_utils.kv import memory
from lab_utils.kv.probe import planning_rates
from lab_utils.measure.benchmark import read_late, read_together_share
from lab_utils.report.data import (
    ARCHITECTURES,
    PER_STREAM,
    ReportData,
    num_or_nan,
)
from lab_utils.results import EnvironmentPayload, calibration
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.points import COMPARED, Point
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.util.numbers import fmt_num, join_words

CHECK_COLUMNS = ["check", "node", "status", "summary", "fix"]


def _invalid_reason(result: BenchmarkResult, mode: str, value: float) -> str:
    """The reasons the repeats of a point were invalid, each once with its repeats."""
    reasons: dict[str, list[str]] = {}
    for p in result.points:
        if p.mode == mode and p.value == value and not p.summary.valid:
            why = p.summary.invalid_reason or "marked invalid"
            reasons.setdefault(why, []).append(str(p.repeat + 1))
    parts = [f"repeat{'s' if len(reps) > 1 else ''} {join_words(reps)}: {why}"
             for why, reps in reasons.items()]
    return "; ".join(parts) or "marked invalid"


def _repeat_note(result: BenchmarkResult, mode: str, value: float) -> str:
    """The repeats of a point whose latencies include more than the serving: the machine
    stood still (lab_utils.measure.stalls), or the load generator got many tokens in one read
    (`benchmark.read_together_share`)."""
    notes = []
    for p in result.points:
        if p.mode != mode or p.value != value:
            continue
        said = []
        if p.summary.held_up_s:
            said.append(f"the machine stood still {p.summary.held_up_s:.1f} s")
        if share := read_together_share(p.summary):
            said.append(f"{share:.0%} of tokens read together")
        if said:
            notes.append(f"repeat {p.repeat + 1}: {', '.join(said)}")
    return "; ".join(notes)


P99_AS_MAX = 100  # a p99 over fewer samples than this is (close to) the largest one


def _samples(result: BenchmarkResult, mode: str, value: float) -> tuple[float, float]:
    """The fewest requests completed, and inter-token gaps measured, in any repeat of a
    point: the n behind its percentiles (NaN when the run recorded neither)."""
    reqs, gaps = [], []
    for p in result.points:
        if p.mode == mode and p.value == value:
            if isinstance(n := p.summary.completed, int) and not isinstance(n, bool):
                reqs.append(n)
            ok = [r for r in p.requests if r.get("error") is None]
            if ok:
                gaps.append(sum(len(r.get("itl_ms") or []) for r in ok))
    return (float(min(reqs)) if reqs else math.nan, float(min(gaps)) if gaps else math.nan)


def percentile_text(m_key: str, text: str, row: pd.Series) -> str:
    """A percentile's value with the n it is over ("812.4 (n=24, ~max)"): ITL's over the
    inter-token gaps, the others' over the requests; "~max" when n is under P99_AS_MAX."""
    if not m_key.startswith("p99_"):
        return text
    n = row.get("n_gaps" if "_itl_" in m_key else "n_requests")
    if n is None or not math.isfinite(n):
        return text
    return f"{text} (n={n:.0f}{', ~max' if n < P99_AS_MAX else ''})"


def _metric_cells(entry: Point) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in COMPARED:
        got = entry.of(m)
        out[m.key] = num_or_nan(got.median if got else None)
        out[f"{m.key}_min"] = num_or_nan(got.min if got else None)
        out[f"{m.key}_max"] = num_or_nan(got.max if got else None)
    tpot = out["median_tpot_ms"], out["median_tpot_ms_max"], out["median_tpot_ms_min"]
    rates = [1000.0 / t if t > 0 else math.nan for t in tpot]
    out[PER_STREAM], out[f"{PER_STREAM}_min"], out[f"{PER_STREAM}_max"] = rates
    return out


def _spread(cells: dict[str, float], repeats: int) -> tuple[float, str | None]:
    """The widest (max - min) / median over the repeats among the compared metrics (%), and
    that metric's label."""
    if repeats < 2:
        return math.nan, None
    spreads = [((cells[f"{m.key}_max"] - cells[f"{m.key}_min"]) / abs(cells[m.key]) * 100,
                m.label) for m in COMPARED if cells[m.key]]
    spreads = [s for s in spreads if math.isfinite(s[0])]
    return max(spreads) if spreads else (math.nan, None)


def _row(arch: str, workload: str, result: BenchmarkResult, entry: Point) -> dict[str, Any]:
    mode, value, valid, repeats = entry.mode, float(entry.value), entry.valid, entry.repeats
    cells = _metric_cells(entry)
    n_requests, n_gaps = _samples(result, mode, value)
    return {"architecture": arch, "workload": workload, "mode": mode, "value": value,
            "load": f"concurrency {value:g}" if mode == "concurrency" else f"rate {value:g} req/s",
            "repeats": repeats, "valid": valid,
            "invalid_reason": None if valid else _invalid_reason(result, mode, value),
            "repeat_note": _repeat_note(result, mode, value),
            "read_together": read_late(result, mode, value),
            "prefix_cache_hit_pct": num_or_nan(entry.prefix_cache_hit_pct),
            **cells, "spread_pct": (spread := _spread(cells, repeats))[0],
            "spread_metric": spread[1], "n_requests": n_requests, "n_gaps": n_gaps}


def points_table(data: ReportData) -> pd.DataFrame:
    """Every architecture x workload x load point, one row, raw numbers (NaN where absent)."""
    rows = [_row(arch, workload, result, entry)
            for workload, results in (("standard", data.sweeps), ("mixed", data.mixed))
            for arch, result in results.items() for entry in result.combined]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    order = {"architecture": {a: i for i, a in enumerate(ARCHITECTURES)},
             "mode": {"concurrency": 0, "rate": 1}, "workload": {"standard": 0, "mixed": 1}}
    df = df.sort_values(["workload", "mode", "value", "architecture"], key=lambda col: (
        col.map(order[col.name]).fillna(2) if col.name in order else col))
    return df.reset_index(drop=True)


def workload_rows(table: pd.DataFrame, workload: str) -> pd.DataFrame:
    """The rows of one workload ("standard" or "mixed") of a points table."""
    return table if table.empty else table[table["workload"] == workload]


def headline_table(data: ReportData, workload: str = "standard") -> pd.DataFrame:
    """The points of one workload ("standard" or "mixed"), raw numbers."""
    return workload_rows(points_table(data), workload).reset_index(drop=True)


def _spread_text(row: pd.Series) -> str:
    if not row["valid"]:
        return "–"
    if row["repeats"] < 2:
        return "unknown (1 repeat)"
    pct = row["spread_pct"]
    on = f", {row['spread_metric']}" if row.get("spread_metric") else ""
    return f"{pct:.1f}% ({row['repeats']} repeats{on})" if math.isfinite(pct) else "–"


SPREAD = "spread (widest metric)"  # (max - min) / median over the repeats, the row's widest


def display_table(df: pd.DataFrame) -> pd.DataFrame:
    """The headline table for people: formatted numbers, invalid points as INVALID with
    their reason, spread as (max-min)/median of the widest metric over the repeats; the
    note names the repeats a machine stall fell in or whose tokens were read together."""
    out = []
    for _, row in df.iterrows():
        rec = {"architecture": row["architecture"], "load": row["load"],
               "valid": "yes" if row["valid"] else "INVALID"}
        for m in COMPARED:
            rec[m.heading] = (percentile_text(m.key, m.text(row[m.key], unit=False), row)
                              if row["valid"] else "INVALID")
        rec[SPREAD] = _spread_text(row)
        notes = [row.get(k) for k in ("invalid_reason", "repeat_note")]
        rec["note"] = "; ".join(n for n in notes if isinstance(n, str) and n)
        out.append(rec)
    cols = ["architecture", "load", "valid", *(m.heading for m in COMPARED), SPREAD, "note"]
    return pd.DataFrame(out, columns=cols)


def kv_table(payload02: KvTransferPayload | None) -> pd.DataFrame:
    """Notebook 02's predicted vs measured KV transfer time per prompt length."""
    cols = ["prompt_tokens", "kv_bytes", "predicted_ms", "measured_ms"]
    rows = [{c: num_or_nan(getattr(r, c)) for c in cols}
            for r in (payload02.predicted_vs_measured if payload02 else [])]
    df = pd.DataFrame(rows, columns=cols)
    df["measured_over_predicted"] = df["measured_ms"] / df["predicted_ms"]
    return df.sort_values("prompt_tokens").reset_index(drop=True)


def checks_table(payload00: EnvironmentPayload | None) -> pd.DataFrame:
    """Notebook 00's checklist: what each check found on each node, and the fix."""
    rows = [{c: getattr(r, c) or "" for c in CHECK_COLUMNS} for r in (payload00.checks if payload00 else [])]
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def _listed(v: list | dict, shown: int = 4) -> str:
    """A nested value in one cell: a list's first items and how many there are, else how
    many entries ("12, 57, 903, 4 ... (16 entries)")."""
    if isinstance(v, list) and v and all(not isinstance(x, (dict, list)) for x in v):
        head = ", ".join(str(fmt_num(x)) for x in v[:shown])
        return head if len(v) <= shown else f"{head} ... ({len(v)} entries)"
    return f"({len(v)} entries)"


def scalar_table(rows: list[dict], limit: int = 50) -> pd.DataFrame:
    """A list of records as a table of its scalar fields (nested values summarised)."""
    return pd.DataFrame([{k: _listed(v) if isinstance(v, (dict, list)) else fmt_num(v)
                          for k, v in r.items()} for r in rows[:limit]])


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _listed(v) if isinstance(v, list) else v
    return out


def key_value_table(d: dict) -> pd.DataFrame:
    return pd.DataFrame([{"field": k, "value": fmt_num(v)} for k, v in _flatten(d).items()],
                        columns=["field", "value"])


def calibration_table(data: ReportData) -> pd.DataFrame:
    """Per node: each figure the plan, the probe's plan, the forecasts and the workshop
    estimate, beside what this profile's real runs measured (`results.calibration`):
    memory and start times on the serving nodes, the NIXL probe's rate per memory type on
    the probe's initiator, the proxy's cost per request on its node; empty without a
    record."""

    gib = 2**30
    starts = {
        "activations, CUDA graphs, CUDA context (GiB)": ("cuda_overhead", memory.CUDA_OVERHEAD, gib),
        "API server and engine processes (GiB)": ("process", memory.PROCESS_HOST, gib),
        "OS and other processes (GiB)": ("os_reserve", memory.OS_RESERVE[data.device], gib),
        "first start (s)": ("first_start_s", calibration.STARTUP_ALLOWANCE_S, 1),
        "later start (s)": ("later_start_s", calibration.STARTUP_ALLOWANCE_S, 1)}
    rates, _ = planning_rates(data.device)
    rows = []
    for cal in calibration.load_all(data.results_dir, data.profile):
        m = cal.measured()
        figures = dict(starts) if cal.instances or cal.starts else {}
        figures.update({f"NIXL probe, {seg}, one whole pass (GB/s: every size, READ and WRITE, "
                        "the rate its plan divides by)": (f"probe_GBps:{seg}", rates[seg], 1)
                        for seg in cal.probe})
        if cal.proxy:
            figures["proxy, per request (ms)"] = ("proxy_ms", GB10["hop_ms"][0], 1)
        for figure, (key, estimate, scale) in figures.items():
            if key == "cuda_overhead" and cal.device != "cuda":
                continue
            value, label = m.get(key, (None, "not measured yet"))
            rows.append({"node": cal.node, "figure": figure, "estimate": round(estimate / scale, 2),
                         "measured": None if value is None else round(value / scale, 2),
                         "source": label})
    return pd.DataFrame(rows, columns=["node", "figure", "estimate", "measured", "source"])
