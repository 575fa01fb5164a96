"""The benchmark report (notebook 05 and `python -m lab_utils report`): reads the results of
notebooks 00-04 from the profile's results directory, builds pandas tables (one row per
architecture and load point, invalid points shown as INVALID with their reason), draws
matplotlib plots with the Agg canvas (pyplot is never touched, so notebooks keep their own
backend), computes conclusions from the numbers (who wins each metric at each load point,
by how much, and whether that exceeds the run-to-run spread), compares a real cluster's
figures with the expected ones for two DGX Sparks, and writes `report.html` (self-contained:
plots embedded as data URIs), `report.md` (plots linked) and `plots/*.png`, atomically.
Only notebook 01 is required; what is missing is named with the notebook to run.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from pydantic import ValidationError

from lab_utils.atomic import atomic_write_text
from lab_utils.benchmark import BenchmarkResult
from lab_utils.config import LabConfig
from lab_utils.errors import ResultsMissingError
from lab_utils.results import RESULTS, ResultsEnvelope, load_results

ARCHITECTURES = ("baseline", "replicated", "disaggregated")
ARCH_NOTEBOOK = {"baseline": "01", "replicated": "03", "disaggregated": "04"}
OPTIONAL_NOTEBOOKS = ("00", "02", "03", "04")
WORKLOADS = {"standard": "", "mixed": "Mixed long/short workload, "}
# With one repeat the spread is unknown: differences below this fraction count as none.
NOISE_FLOOR = 0.05
FAR_OFF = 2.0  # a measured figure this many times above or below the expected one is flagged
# Pairs compared in the conclusions: (subject, reference).
PAIRS = (("disaggregated", "replicated"), ("disaggregated", "baseline"),
         ("replicated", "baseline"))
REFERENCE_NAMES = {"replicated": "replicated serving (the same two nodes)",
                   "baseline": "the single-instance baseline (half the hardware)"}
COLORS = {"baseline": "tab:blue", "replicated": "tab:orange", "disaggregated": "tab:green"}
PLOT_NAMES = ("throughput", "ttft", "itl", "kv_transfer", "roofline", "mixed_itl")
PER_STREAM = "decode_tokens_per_s_per_stream"

# Expected figures for a two-Spark cluster, from public sources collected in DESIGN.md
# section 8. Verify them on the cluster; the report flags a real run more than FAR_OFF away.
EXPECTED_TWO_SPARK: dict[str, Any] = {
    "source": "DESIGN.md section 8 (public figures for GB10 / DGX Spark; verify on the cluster)",
    "memory_bandwidth_GBps": 273.0,  # GB10 unified LPDDR5x
    "decode_tokens_per_s_per_stream": 17.0,  # 273 GB/s / 16 GB: an 8B model in bf16
    "decode_weight_bytes": 16e9,
    "nixl_dram_GBps": (11.0, 13.0),  # NIXL DRAM to DRAM over the ConnectX-7 link
    "link_Gbps_per_rail": (92.0, 97.0),  # ib_write_bw per PCIe x4 half of the ConnectX-7
}
LINK_KEYS = ("link_Gbps_per_rail", "rail_Gbps", "ib_write_bw_Gbps")
BANDWIDTH_KEYS = ("bandwidth_GBps", "GBps", "bw_GBps")
MEMORY_KEYS = ("memory", "mem", "memory_kind", "segment", "device", "buffer")

FILE_MEANINGS = {
    "00": "the bring-up checklist on every node: SSH, GPU, CUDA, vLLM build, NIXL and UCX, "
          "RDMA devices and link rate, MTU, ports, model presence, disk, clock skew",
    "01": "one vLLM instance behind the proxy: one request timed in detail, the load sweep "
          "(per-request records, per-point summaries in `vllm bench serve` field names, "
          "median and spread over repeats) and the inputs of the decode roofline",
    "02": "KV bytes per token of the model, the NIXL probe (bandwidth and latency per size), "
          "predicted vs measured transfer time per prompt length, the kv_buffer_device choice",
    "03": "one instance per node behind the proxy's router, the same sweep as 01",
    "04": "prefill and decode instances joined by NixlConnector, the same sweep, and the proof "
          "that the KV cache really moved (decode-side counters, greedy output equal to 01's)",
}


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool


METRICS = (
    Metric("request_throughput", "request throughput", "req/s", True),
    Metric("output_throughput", "output throughput", "tok/s", True),
    Metric("median_ttft_ms", "TTFT p50", "ms", False),
    Metric("p99_ttft_ms", "TTFT p99", "ms", False),
    Metric("median_itl_ms", "ITL p50", "ms", False),
    Metric("p99_itl_ms", "ITL p99", "ms", False),
    Metric("median_tpot_ms", "TPOT p50", "ms", False),
)
METRIC_BY_KEY = {m.key: m for m in METRICS}
THROUGHPUT_KEYS = ("request_throughput", "output_throughput")


@dataclass
class ReportData:
    """Everything the report reads: the envelopes found, what is missing and why, and the
    parsed sweeps per architecture (standard and mixed long/short workload)."""

    profile: str
    device: str
    results_dir: Path
    envelopes: dict[str, ResultsEnvelope]
    missing: dict[str, str]
    sweeps: dict[str, BenchmarkResult]
    mixed: dict[str, BenchmarkResult]

    def payload(self, notebook: str) -> dict[str, Any]:
        env = self.envelopes.get(notebook)
        return env.payload if env else {}


@dataclass(frozen=True)
class Finding:
    """One comparison of two architectures on one metric at one load point."""

    workload: str
    metric: str
    label: str
    mode: str
    value: float
    load: str
    subject: str
    reference: str
    subject_value: float
    reference_value: float
    winner: str | None  # None: no difference (inside the spread)
    difference_pct: float  # the better one's advantage, in % of the worse one's value
    beyond_spread: bool
    basis: str
    sentence: str


@dataclass
class Conclusions:
    """`headline`: verdicts, warnings, exclusions and the spread rule; `by_metric`: one
    sentence per pair of architectures and metric; `findings`: every comparison."""

    headline: list[str]
    by_metric: list[str]
    findings: list[Finding]
    excluded: list[str]

    @property
    def sentences(self) -> list[str]:
        return self.headline + self.by_metric

    def table(self) -> pd.DataFrame:
        cols = ["workload", "load", "label", "subject", "reference", "subject_value",
                "reference_value", "winner", "difference_pct", "beyond_spread", "basis"]
        rows = [{c: getattr(f, c) for c in cols} for f in self.findings]
        return pd.DataFrame(rows, columns=cols)


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    caption: str
    png: bytes


@dataclass
class ReportPaths:
    html: Path
    md: Path
    plots: list[Path]
    conclusions: list[str]
    findings: list[Finding] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # notebooks whose results are absent


# ----- loading ---------------------------------------------------------------------------


def _benchmark(payload: dict, key: str, notebook: str, required: bool) -> BenchmarkResult | None:
    raw = payload.get(key)
    if raw is None and not required:
        return None
    spec = RESULTS[notebook]
    try:
        return BenchmarkResult.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(top level)"
        raise ResultsMissingError(
            f"{spec.file_name}: payload[{key!r}] is not a benchmark sweep ({where}: "
            f"{first['msg']}); re-run notebooks/{spec.notebook_file}") from None


def load_report_data(cfg: LabConfig) -> ReportData:
    """Load every results file; 01 is required (ResultsMissingError names the notebook),
    the others are optional and recorded in `missing` with the notebook to run."""
    envelopes = {"01": load_results(cfg, "01")}
    missing: dict[str, str] = {}
    for nb in OPTIONAL_NOTEBOOKS:
        try:
            envelopes[nb] = load_results(cfg, nb)
        except ResultsMissingError as e:
            missing[nb] = str(e)
    data = ReportData(cfg.profile, cfg.vllm.device, cfg.results_dir, {}, missing, {}, {})
    for nb in sorted(envelopes):
        data.envelopes[nb] = envelopes[nb]
    for arch, nb in ARCH_NOTEBOOK.items():
        if nb in data.envelopes:
            _add_sweeps(data, arch, nb)
    return data


def _add_sweeps(data: ReportData, arch: str, nb: str) -> None:
    payload = data.envelopes[nb].payload
    try:
        sweep = _benchmark(payload, "sweep", nb, required=True)
        mixed = _benchmark(payload, "mixed", nb, required=False)
    except ResultsMissingError as e:
        if nb == "01":
            raise
        del data.envelopes[nb]
        data.missing[nb] = str(e)
        return
    data.sweeps[arch] = sweep
    if mixed is not None:
        data.mixed[arch] = mixed


def run_hint(notebook: str) -> str:
    spec = RESULTS[notebook]
    return (f"run notebooks/{spec.notebook_file} "
            f"(or `python -m lab_utils run --from {notebook} --to {notebook}`)")


# ----- tables ----------------------------------------------------------------------------


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def load_label(mode: str, value: float) -> str:
    return f"concurrency {value:g}" if mode == "concurrency" else f"rate {value:g} req/s"


def _invalid_reason(result: BenchmarkResult, mode: str, value: float) -> str:
    """The reasons the repeats of a point were invalid, each once with its repeats."""
    reasons: dict[str, list[str]] = {}
    for p in result.points:
        if p.mode == mode and p.value == value and not p.summary.get("valid", True):
            why = p.summary.get("invalid_reason") or "marked invalid"
            reasons.setdefault(why, []).append(str(p.repeat + 1))
    parts = [f"repeat{'s' if len(reps) > 1 else ''} {_join(reps)}: {why}"
             for why, reps in reasons.items()]
    return "; ".join(parts) or "marked invalid"


def _entry_valid(result: BenchmarkResult, entry: dict) -> bool:
    if "valid" in entry:
        return bool(entry["valid"])
    return all(p.summary.get("valid", True) for p in result.points
               if p.mode == entry.get("mode") and p.value == entry.get("value"))


def _num_or_nan(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else math.nan


def _metric_cells(entry: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in METRICS:
        v = _num_or_nan(entry.get(m.key))
        out[m.key] = v
        out[f"{m.key}_min"] = _num_or_nan(entry.get(f"{m.key}_min", v))
        out[f"{m.key}_max"] = _num_or_nan(entry.get(f"{m.key}_max", v))
    tpot = out["median_tpot_ms"], out["median_tpot_ms_max"], out["median_tpot_ms_min"]
    rates = [1000.0 / t if t > 0 else math.nan for t in tpot]
    out[PER_STREAM], out[f"{PER_STREAM}_min"], out[f"{PER_STREAM}_max"] = rates
    return out


def _spread_pct(cells: dict[str, float], repeats: int) -> float:
    if repeats < 2:
        return math.nan
    spreads = [(cells[f"{m.key}_max"] - cells[f"{m.key}_min"]) / abs(cells[m.key]) * 100
               for m in METRICS if cells[m.key]]
    spreads = [s for s in spreads if math.isfinite(s)]
    return max(spreads) if spreads else math.nan


def _row(arch: str, workload: str, result: BenchmarkResult, entry: dict) -> dict[str, Any]:
    mode, value = str(entry.get("mode", "concurrency")), float(entry.get("value", 0))
    valid = _entry_valid(result, entry)
    repeats = int(entry.get("repeats", 1))
    cells = _metric_cells(entry)
    return {"architecture": arch, "workload": workload, "mode": mode, "value": value,
            "load": load_label(mode, value), "repeats": repeats, "valid": valid,
            "invalid_reason": None if valid else _invalid_reason(result, mode, value),
            **cells, "spread_pct": _spread_pct(cells, repeats)}


def points_table(data: ReportData) -> pd.DataFrame:
    """Every architecture x workload x load point, one row, raw numbers (NaN where absent)."""
    rows = [_row(arch, workload, result, entry)
            for workload, results in (("standard", data.sweeps), ("mixed", data.mixed))
            for arch, result in results.items() for entry in result.combined]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    order = {"arch": {a: i for i, a in enumerate(ARCHITECTURES)},
             "mode": {"concurrency": 0, "rate": 1}, "workload": {"standard": 0, "mixed": 1}}
    keys = (df["workload"].map(order["workload"]), df["mode"].map(order["mode"]).fillna(2),
            df["value"], df["architecture"].map(order["arch"]))
    df = df.assign(_k0=keys[0], _k1=keys[1], _k2=keys[2], _k3=keys[3])
    df = df.sort_values(["_k0", "_k1", "_k2", "_k3"]).drop(columns=["_k0", "_k1", "_k2", "_k3"])
    return df.reset_index(drop=True)


def headline_table(data: ReportData, workload: str = "standard") -> pd.DataFrame:
    """The points of one workload ("standard" or "mixed"), raw numbers."""
    df = points_table(data)
    return df if df.empty else df[df["workload"] == workload].reset_index(drop=True)


def fmt_num(value: Any) -> str:
    """A number for people: thousands separated, 3 significant figures for small values."""
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if not isinstance(value, (int, float, np.number)):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return "–"
    if float(v).is_integer() and abs(v) >= 1:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:,.1f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


DISPLAY_COLUMNS = {"request_throughput": "req/s", "output_throughput": "output tok/s",
                   "median_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms",
                   "median_itl_ms": "ITL p50 ms", "p99_itl_ms": "ITL p99 ms",
                   "median_tpot_ms": "TPOT p50 ms"}


def _spread_text(row: pd.Series) -> str:
    if not row["valid"]:
        return "–"
    if row["repeats"] < 2:
        return "unknown (1 repeat)"
    pct = row["spread_pct"]
    return f"{pct:.1f}% ({row['repeats']} repeats)" if math.isfinite(pct) else "–"


def display_table(df: pd.DataFrame) -> pd.DataFrame:
    """The headline table for people: formatted numbers, invalid points as INVALID with
    their reason, spread as (max-min)/median of the widest metric over the repeats."""
    out = []
    for _, row in df.iterrows():
        rec = {"architecture": row["architecture"], "load": row["load"],
               "valid": "yes" if row["valid"] else "INVALID"}
        for key, name in DISPLAY_COLUMNS.items():
            rec[name] = fmt_num(row[key]) if row["valid"] else "INVALID"
        rec["spread"] = _spread_text(row)
        rec["note"] = row["invalid_reason"] if isinstance(row["invalid_reason"], str) else ""
        out.append(rec)
    cols = ["architecture", "load", "valid", *DISPLAY_COLUMNS.values(), "spread", "note"]
    return pd.DataFrame(out, columns=cols)


def kv_table(payload02: dict) -> pd.DataFrame:
    """Notebook 02's predicted vs measured KV transfer time per prompt length."""
    cols = ["prompt_tokens", "kv_bytes", "predicted_ms", "measured_ms"]
    rows = [{c: _num_or_nan(r.get(c)) for c in cols}
            for r in payload02.get("predicted_vs_measured") or [] if isinstance(r, dict)]
    df = pd.DataFrame(rows, columns=cols)
    df["measured_over_predicted"] = df["measured_ms"] / df["predicted_ms"]
    return df.sort_values("prompt_tokens").reset_index(drop=True)


def _scalar_table(rows: list[dict], limit: int = 50) -> pd.DataFrame:
    """A list of records as a table of its scalar fields (nested values summarised)."""
    def cell(v: Any) -> Any:
        if isinstance(v, (dict, list)):
            return f"({len(v)} entries)"
        return fmt_num(v)
    return pd.DataFrame([{k: cell(v) for k, v in r.items()} for r in rows[:limit]
                         if isinstance(r, dict)])


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = f"({len(v)} entries)" if isinstance(v, list) else v
    return out


def key_value_table(d: dict) -> pd.DataFrame:
    return pd.DataFrame([{"field": k, "value": fmt_num(v)} for k, v in _flatten(d).items()],
                        columns=["field", "value"])


# ----- conclusions -----------------------------------------------------------------------


def _judge(m: Metric, a: pd.Series, b: pd.Series, pct: float,
           noise_floor: float) -> tuple[bool, str]:
    """Whether the difference of a and b on m (pct: the better one's advantage in %)
    exceeds the run-to-run spread, and on what basis."""
    lo_a, hi_a = a[f"{m.key}_min"], a[f"{m.key}_max"]
    lo_b, hi_b = b[f"{m.key}_min"], b[f"{m.key}_max"]
    if a["repeats"] > 1 and b["repeats"] > 1 and all(map(math.isfinite, (lo_a, hi_a, lo_b,
                                                                          hi_b))):
        overlap = lo_a <= hi_b and lo_b <= hi_a
        basis = (f"min-max ranges over {a['repeats']} and {b['repeats']} repeats "
                 f"{'overlap' if overlap else 'do not overlap'}")
        return not overlap, basis
    return pct > noise_floor * 100, (f"one repeat, spread unknown: {noise_floor:.0%} "
                                     "noise floor")


def _finding(workload: str, m: Metric, a: pd.Series, b: pd.Series,
             noise_floor: float) -> Finding:
    av, bv = float(a[m.key]), float(b[m.key])
    a_better = av > bv if m.higher_is_better else av < bv
    win, lose = (av, bv) if a_better else (bv, av)
    pct = abs(win - lose) / abs(lose) * 100 if lose else (0.0 if win == lose else math.inf)
    beyond, basis = _judge(m, a, b, pct, noise_floor)
    beyond = beyond and av != bv
    names = (a["architecture"], b["architecture"])
    winner = (names[0] if a_better else names[1]) if beyond else None
    sentence = _finding_sentence(workload, m, a["load"], names, (av, bv), winner, pct, basis)
    return Finding(workload, m.key, m.label, a["mode"], float(a["value"]), a["load"],
                   names[0], names[1], av, bv, winner, pct, beyond, basis, sentence)


def _finding_sentence(workload: str, m: Metric, load: str, names: tuple[str, str],
                      values: tuple[float, float], winner: str | None, pct: float,
                      basis: str) -> str:
    head = f"{WORKLOADS[workload]}{load}, {m.label}"
    head = head[0].upper() + head[1:]
    shown = {n: f"{fmt_num(v)} {m.unit}" for n, v in zip(names, values, strict=True)}
    if winner is None:
        return (f"{head}: no difference between {names[0]} ({shown[names[0]]}) and "
                f"{names[1]} ({shown[names[1]]}): {pct:.1f}% apart, inside the spread "
                f"({basis}).")
    loser = names[1] if winner == names[0] else names[0]
    way = "higher" if m.higher_is_better else "lower"
    return (f"{head}: {winner} wins, {pct:.1f}% {way} than {loser} ({shown[winner]} vs "
            f"{shown[loser]}), beyond the run-to-run spread ({basis}).")


def compare(table: pd.DataFrame, noise_floor: float = NOISE_FLOOR) -> list[Finding]:
    """Every pair in PAIRS, on every metric, at every valid load point both measured."""
    if table.empty:
        return []
    ok = table[table["valid"]]
    findings = []
    for (workload, _mode, _value), group in ok.groupby(["workload", "mode", "value"],
                                                       sort=False):
        rows = {r["architecture"]: r for _, r in group.iterrows()}
        for subject, reference in PAIRS:
            if subject not in rows or reference not in rows:
                continue
            for m in METRICS:
                a, b = rows[subject], rows[reference]
                if math.isfinite(a[m.key]) and math.isfinite(b[m.key]):
                    findings.append(_finding(str(workload), m, a, b, noise_floor))
    return findings


def _loads(fs: list[Finding]) -> str:
    """"concurrency 1, 2 and 4" (and "rate 2 and 4 req/s" for rate points)."""
    parts = []
    for mode, unit in (("concurrency", ""), ("rate", " req/s")):
        values = [f"{f.value:g}" for f in fs if f.mode == mode]
        if values:
            parts.append(f"{mode} {_join(values)}{unit}")
    return " and at ".join(parts)


def _pct_range(fs: list[Finding]) -> str:
    lo, hi = min(f.difference_pct for f in fs), max(f.difference_pct for f in fs)
    return f"{hi:.1f}%" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}%"


def _summary_sentence(fs: list[Finding]) -> str:
    f0 = fs[0]
    m = METRIC_BY_KEY[f0.metric]
    parts = []
    for who in (f0.subject, f0.reference):
        wins = [f for f in fs if f.winner == who]
        if wins:
            parts.append(f"{who} better at {_loads(wins)} (by {_pct_range(wins)})")
    ties = [f for f in fs if f.winner is None]
    if ties:
        parts.append(f"no difference at {_loads(ties)}")
    way = "higher" if m.higher_is_better else "lower"
    head = f"{WORKLOADS[f0.workload]}{m.label} ({way} is better), {f0.subject} vs {f0.reference}"
    return head[0].upper() + head[1:] + ": " + "; ".join(parts) + "."


def _summaries(findings: list[Finding]) -> list[str]:
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.workload, f.subject, f.reference, f.metric), []).append(f)
    return [_summary_sentence(fs) for fs in groups.values()]


THROUGHPUT_NOTE = ("That throughput loss is what vLLM's documentation leads one to expect: "
                   "disaggregated prefill does not raise throughput; its value is tuning TTFT "
                   "and ITL separately and protecting decode from long prefills.")


def _verdicts(findings: list[Finding], workload: str, reference: str) -> list[str]:
    """Plain statements on disaggregation against one reference architecture."""
    fs = [f for f in findings if f.workload == workload and f.subject == "disaggregated"
          and f.reference == reference]
    if not fs:
        return []
    pre, ref = WORKLOADS[workload], REFERENCE_NAMES[reference]
    out, won_any = [], False
    for m in METRICS:
        way = "higher" if m.higher_is_better else "lower"
        lost = [f for f in fs if f.metric == m.key and f.winner == reference]
        won = [f for f in fs if f.metric == m.key and f.winner == "disaggregated"]
        if lost:
            out.append(f"{pre}disaggregation lost on {m.label} to {ref} at {_loads(lost)} "
                       f"({reference} up to {max(f.difference_pct for f in lost):.1f}% {way}).")
        if won:
            won_any = True
            out.append(f"{pre}disaggregation won on {m.label} against {ref} at {_loads(won)} "
                       f"(up to {max(f.difference_pct for f in won):.1f}% {way}).")
    if not won_any:
        out.append(f"{pre}disaggregation won on no metric against {ref} at any valid load "
                   "point of this run.")
    return [s[0].upper() + s[1:] for s in out]


def _spread_sentence(table: pd.DataFrame, noise_floor: float) -> str:
    ok = table[table["valid"]] if not table.empty else table
    once = [a for a in ARCHITECTURES
            if not ok.empty and ((ok["architecture"] == a) & (ok["repeats"] < 2)).any()]
    reps = sorted({int(r) for r in ok["repeats"] if r > 1}) if not ok.empty else []
    parts = []
    if reps:
        parts.append(f"where both sides were measured {_join([str(r) for r in reps])} times, a "
                     "difference counts only when their min-max ranges over the repeats do not "
                     "overlap.")
    if once or not reps:
        who = f" ({', '.join(once)})" if once else ""
        parts.append(f"points measured once{who} have an unknown spread, so against them "
                     f"differences under {noise_floor:.0%} (a stated noise floor, not a "
                     "measurement) are reported as no difference; set workload.repeats above 1 "
                     "to measure it.")
    return "Run-to-run spread: " + " ".join(x[0].upper() + x[1:] if i else x
                                            for i, x in enumerate(parts))


def _excluded(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return []
    bad = table[~table["valid"]]
    return [f"{WORKLOADS[r['workload']]}{r['architecture']} at {r['load']}: "
            f"{r['invalid_reason']}" for _, r in bad.iterrows()]


WORKLOAD_KEYS = ("input_len", "output_len", "num_prompts", "duration_s", "warmup", "chat",
                 "burstiness", "mixed_long_len", "mixed_long_every")


def _warnings(data: ReportData) -> list[str]:
    out = []
    proof = data.payload("04").get("proof")
    if isinstance(proof, dict) and not proof.get("ok", False):
        out.append("Notebook 04's proof that the KV cache really moved did not pass: the "
                   "disaggregated numbers may not measure KV transfer; see its section.")
    base = data.sweeps.get("baseline")
    for arch, result in data.sweeps.items():
        if base is None or arch == "baseline":
            continue
        diffs = [f"{k} {base.workload.get(k)!r} vs {result.workload.get(k)!r}"
                 for k in WORKLOAD_KEYS if base.workload.get(k) != result.workload.get(k)]
        if result.model != base.model:
            diffs.insert(0, f"model {base.model!r} vs {result.model!r}")
        if diffs:
            out.append(f"The {arch} sweep did not run the baseline's workload ({'; '.join(diffs)}):"
                       " its comparisons are not like for like.")
    return out


def conclusions(data: ReportData, table: pd.DataFrame | None = None,
                noise_floor: float = NOISE_FLOOR) -> Conclusions:
    """Plain sentences and structured findings computed from the numbers; invalid points
    are excluded and named."""
    table = points_table(data) if table is None else table
    findings = compare(table, noise_floor)
    excluded = _excluded(table)
    sentences = _warnings(data) + _absent(data)
    for workload in WORKLOADS:
        ref = "replicated" if any(f.workload == workload and f.subject == "disaggregated"
                                  and f.reference == "replicated" for f in findings) else "baseline"
        sentences += _verdicts(findings, workload, ref)
    if any(f.subject == "disaggregated" and f.metric in THROUGHPUT_KEYS
           and f.winner == f.reference for f in findings):
        sentences.append(THROUGHPUT_NOTE)
    if excluded:
        sentences.append("Excluded from the conclusions as invalid: " + "; ".join(excluded) + ".")
    sentences.append(_spread_sentence(table, noise_floor))
    return Conclusions(sentences, _summaries(findings), findings, excluded)


def _absent(data: ReportData) -> list[str]:
    out = []
    if "disaggregated" not in data.sweeps:
        out.append("No disaggregated results, so nothing can be said about disaggregation yet: "
                   f"{run_hint('04')}.")
    if "replicated" not in data.sweeps:
        out.append("No replicated results, so nothing is compared with the same two nodes "
                   f"serving as replicas: {run_hint('03')}.")
    return out


# ----- expected figures for two Sparks ---------------------------------------------------


def _find_numbers(value: Any, keys: tuple[str, ...]) -> list[float]:
    if isinstance(value, dict):
        found = [float(v) for k, v in value.items()
                 if k in keys and isinstance(v, (int, float)) and not isinstance(v, bool)]
        return found + [x for v in value.values() for x in _find_numbers(v, keys)]
    if isinstance(value, list):
        return [x for v in value for x in _find_numbers(v, keys)]
    return []


def _is_dram(row: dict) -> bool:
    return any(str(row.get(k, "")).lower() in ("dram", "cpu") for k in MEMORY_KEYS)


def measured_nixl_dram_GBps(payload02: dict) -> tuple[float | None, str]:
    """Best DRAM bandwidth in 02's probe rows, else the largest prompt's KV transfer."""
    rows = [r for r in (payload02.get("probe") or {}).get("rows") or [] if isinstance(r, dict)]
    best = _find_numbers([r for r in rows if _is_dram(r)], BANDWIDTH_KEYS)
    if best:
        return max(best), "best DRAM row of 02's NIXL probe"
    kv = kv_table(payload02).dropna(subset=["kv_bytes", "measured_ms"])
    kv = kv[kv["measured_ms"] > 0]
    if kv.empty:
        return None, "not measured (no 02 probe rows or measured transfers)"
    top = kv.iloc[-1]
    return top["kv_bytes"] / top["measured_ms"] / 1e6, (
        f"02's KV transfer of {top['prompt_tokens']:g} prompt tokens (includes latency)")


def measured_decode_per_stream(table: pd.DataFrame) -> tuple[float | None, str]:
    """Decode tokens/s of one stream: 1000 / TPOT p50 at the baseline's lowest concurrency."""
    if table.empty:
        return None, "not measured"
    rows = table[(table["architecture"] == "baseline") & (table["workload"] == "standard")
                 & (table["mode"] == "concurrency") & table["valid"]].dropna(subset=[PER_STREAM])
    if rows.empty:
        return None, "no valid baseline concurrency point"
    row = rows.sort_values("value").iloc[0]
    return float(row[PER_STREAM]), f"01, 1000 / TPOT p50 at {row['load']}"


def _ratio(measured: float | None, expected: float | tuple[float, float]) -> float | None:
    if measured is None or not math.isfinite(measured):
        return None
    lo, hi = expected if isinstance(expected, tuple) else (expected, expected)
    if lo <= measured <= hi:
        return 1.0
    return measured / (lo if measured < lo else hi)


def _verdict(ratio: float | None) -> str:
    if ratio is None:
        return "not measured"
    if ratio > FAR_OFF or ratio < 1 / FAR_OFF:
        way = f"{ratio:.1f}x above" if ratio > 1 else f"{1 / ratio:.1f}x below"
        return f"WARNING: {way} the expected figure"
    return f"ok (within {FAR_OFF:g}x)"


def _expected_decode(data: ReportData) -> tuple[float, str]:
    roof = data.payload("01").get("roofline") or {}
    e = EXPECTED_TWO_SPARK
    weights = roof.get("weight_bytes")
    if isinstance(weights, (int, float)) and weights > 0:
        return e["memory_bandwidth_GBps"] * 1e9 / weights, (
            f"273 GB/s / {weights / 1e9:.1f} GB of weights (this model)")
    return e["decode_tokens_per_s_per_stream"], "273 GB/s / 16 GB (an 8B model in bf16)"


def _show(v: float | tuple[float, float]) -> str:
    return f"{fmt_num(v[0])}-{fmt_num(v[1])}" if isinstance(v, tuple) else fmt_num(v)


def expected_figures(data: ReportData, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """DESIGN section 8's figures for two Sparks beside this run's (real cluster only)."""
    table = points_table(data) if table is None else table
    e = EXPECTED_TWO_SPARK
    roof = data.payload("01").get("roofline") or {}
    bw = roof.get("memory_bandwidth_GBps")
    dec_exp, dec_basis = _expected_decode(data)
    link = _find_numbers(data.payload("00"), LINK_KEYS)
    rows = [
        ("memory bandwidth (GB/s)", e["memory_bandwidth_GBps"], "GB10 LPDDR5x",
         (_num_or_nan(bw) if bw is not None else None, "01's roofline record")),
        ("decode tokens/s per stream", dec_exp, dec_basis, measured_decode_per_stream(table)),
        ("NIXL DRAM-to-DRAM (GB/s)", e["nixl_dram_GBps"], "nixlbench over ConnectX-7",
         measured_nixl_dram_GBps(data.payload("02"))),
        ("link per rail (Gb/s)", e["link_Gbps_per_rail"], "ib_write_bw, one PCIe x4 half",
         (min(link), "00's link check (worst rail)") if link else (None, "not recorded by 00")),
    ]
    comparable = data.device == "cuda"
    out = []
    for name, expected, basis, (measured, source) in rows:
        rec = {"figure": name, "expected (two Sparks)": _show(expected), "basis": basis}
        if comparable:
            ratio = _ratio(measured, expected)
            rec.update({"this run": fmt_num(measured) if measured is not None else "–",
                        "measured from": source, "verdict": _verdict(ratio)})
        else:
            rec["this run"] = "not comparable (CPU rehearsal)"
        out.append(rec)
    return pd.DataFrame(out)


# ----- plots -----------------------------------------------------------------------------


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _figure(nrows: int, ncols: int, title: str) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(7.6 * ncols, 3.6 * nrows + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    fig.suptitle(title)
    return fig, axes


def _legend(ax) -> None:
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _setup_x(ax, mode: str, values: list[float]) -> None:
    values = sorted(set(values))
    if values and values[0] > 0 and values[-1] / values[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)" if mode == "concurrency"
                  else "request rate (req/s)")
    ax.grid(True, alpha=0.3)


def plot_values(rows: pd.DataFrame, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y and the y error bars of one series; invalid points are NaN (a gap, no value)."""
    rows = rows.sort_values("value")
    valid = rows["valid"].to_numpy(bool)
    x = rows["value"].to_numpy(float)
    y = np.where(valid, rows[key].to_numpy(float), np.nan)
    spread = valid & (rows["repeats"].to_numpy() > 1)
    lo = np.where(spread, rows[f"{key}_min"].to_numpy(float), y)
    hi = np.where(spread, rows[f"{key}_max"].to_numpy(float), y)
    err = np.nan_to_num(np.vstack([y - lo, hi - y]), nan=0.0).clip(min=0)
    return x, y, err


def _draw_arch(ax, rows: pd.DataFrame, arch: str, series: list[tuple[str, str, str]]) -> None:
    for key, style, suffix in series:
        x, y, err = plot_values(rows, key)
        ax.errorbar(x, y, yerr=err, fmt=style, color=COLORS[arch], capsize=3,
                    label=f"{arch}{suffix}")
    bad = rows.loc[~rows["valid"], "value"].to_numpy(float)
    if len(bad):
        ax.scatter(bad, np.full(len(bad), 0.03), transform=ax.get_xaxis_transform(),
                   marker="x", s=90, linewidths=2.5, color=COLORS[arch], zorder=5,
                   clip_on=False, label=f"{arch}: invalid, no value")


def _metric_plot(table: pd.DataFrame, name: str, title: str, panels: list[tuple[str, list]],
                 archs: tuple[str, ...] = ARCHITECTURES) -> Plot | None:
    table = table[table["architecture"].isin(archs)] if not table.empty else table
    if table.empty:
        return None
    modes = [m for m in ("concurrency", "rate") if (table["mode"] == m).any()]
    fig, axes = _figure(len(panels), len(modes), title)
    for c, mode in enumerate(modes):
        part = table[table["mode"] == mode]
        for r, (ylabel, series) in enumerate(panels):
            ax = axes[r][c]
            for arch in archs:
                rows = part[part["architecture"] == arch]
                if not rows.empty:
                    _draw_arch(ax, rows, arch, series)
            _setup_x(ax, mode, list(part["value"]))
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            _legend(ax)
    return Plot(name, title, _invalid_caption(table), _png(fig))


def _invalid_caption(table: pd.DataFrame) -> str:
    bad = table[~table["valid"]]
    text = ("Error bars: min-max over repeats (none with one repeat). Invalid points are never "
            "drawn as values: the line has a gap there and a cross on the x axis marks the load.")
    if bad.empty:
        return text + " No point here is invalid."
    names = [f"{r['architecture']} at {r['load']}" for _, r in bad.iterrows()]
    return text + " Invalid here: " + ", ".join(names) + "."


def _roofline_plot(data: ReportData, table: pd.DataFrame) -> Plot | None:
    rows = table[(table["workload"] == "standard") & (table["mode"] == "concurrency")]
    if rows.empty:
        return None
    fig, axes = _figure(1, 1, "Decode tokens/s per stream vs concurrency")
    ax = axes[0][0]
    for arch in ARCHITECTURES:
        part = rows[rows["architecture"] == arch]
        if not part.empty:
            _draw_arch(ax, part, arch, [(PER_STREAM, "-o", "")])
    roof = roofline_limit(data)
    if roof is not None:
        ax.axhline(roof, color="black", linestyle=":",
                   label=f"memory-bandwidth roofline ({fmt_num(roof)} tok/s)")
    else:
        ax.text(0.5, 0.95, "roofline unknown for this hardware", transform=ax.transAxes,
                ha="center", va="top", fontsize="small")
    _setup_x(ax, "concurrency", list(rows["value"]))
    ax.set_ylabel("tokens/s per stream (1000 / TPOT p50)")
    ax.set_ylim(bottom=0)
    _legend(ax)
    return Plot("roofline", "Decode tokens/s per stream vs the memory-bandwidth roofline",
                roofline_text(data) + " " + _invalid_caption(rows), _png(fig))


def roofline_limit(data: ReportData) -> float | None:
    v = (data.payload("01").get("roofline") or {}).get("max_tokens_per_s_per_stream")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def roofline_text(data: ReportData) -> str:
    roof = roofline_limit(data)
    if roof is None:
        return ("The memory-bandwidth roofline is unknown for this hardware (notebook 01 "
                "recorded no memory bandwidth or weight size), so the curve is shown alone.")
    return (f"Roofline (dotted line): at most {fmt_num(roof)} tokens/s per stream, memory "
            "bandwidth / bytes read per decode step (every weight once per step). Batching "
            "shares that read among streams, so per-stream speed falls slowly while the total "
            "grows.")


def _kv_plot(payload02: dict) -> Plot | None:
    kv = kv_table(payload02)
    if kv.empty:
        return None
    fig, axes = _figure(1, 1, "KV transfer time vs prompt length")
    ax = axes[0][0]
    ax.plot(kv["prompt_tokens"], kv["predicted_ms"], "-o", label="predicted")
    meas = kv.dropna(subset=["measured_ms"])
    ax.plot(meas["prompt_tokens"], meas["measured_ms"], "s", markersize=8, label="measured")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("transfer time (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    unmeasured = len(kv) - len(meas)
    caption = ("Predicted: bytes moved (whole blocks) / probe bandwidth + latency. Measured: "
               "the transfer in notebook 02.")
    if unmeasured:
        caption += f" {unmeasured} prompt length(s) have no measurement and show no square."
    return Plot("kv_transfer", "KV transfer: predicted vs measured", caption, _png(fig))


def render_plots(data: ReportData, table: pd.DataFrame) -> list[Plot]:
    """Every plot the data allows, as PNG bytes (nothing written)."""
    if table.empty:
        return []
    std, mixed = table[table["workload"] == "standard"], table[table["workload"] == "mixed"]
    plots = [
        _metric_plot(std, "throughput", "Throughput vs load",
                     [("output tokens/s", [("output_throughput", "-o", "")]),
                      ("requests/s", [("request_throughput", "-o", "")])]),
        _metric_plot(std, "ttft", "TTFT p50 (solid) and p99 (dashed) vs load",
                     [("TTFT (ms)", [("median_ttft_ms", "-o", " p50"),
                                     ("p99_ttft_ms", "--s", " p99")])]),
        _metric_plot(std, "itl", "ITL p50 (solid) and p99 (dashed) vs load",
                     [("ITL (ms)", [("median_itl_ms", "-o", " p50"),
                                    ("p99_itl_ms", "--s", " p99")])]),
        _kv_plot(data.payload("02")),
        _roofline_plot(data, table),
        _metric_plot(mixed, "mixed_itl", "Mixed long/short workload: ITL p99 vs load",
                     [("ITL p99 (ms)", [("p99_itl_ms", "-o", "")])],
                     archs=("replicated", "disaggregated")),
    ]
    return [p for p in plots if p is not None]


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_plots(plots_dir: Path, plots: list[Plot]) -> list[Path]:
    """Write plots/*.png; a known plot not drawn this time is removed, not left stale."""
    paths = []
    for p in plots:
        path = plots_dir / f"{p.name}.png"
        _atomic_write_bytes(path, p.png)
        paths.append(path)
    drawn = {p.name for p in plots}
    for name in PLOT_NAMES:
        if name not in drawn:
            (plots_dir / f"{name}.png").unlink(missing_ok=True)
    return paths


# ----- the document ----------------------------------------------------------------------


@dataclass
class Block:
    """One piece of the report, rendered the same way to HTML and to Markdown."""

    kind: str  # h | p | warn | ul | table | img
    text: str = ""
    level: int = 2
    items: list[str] = field(default_factory=list)
    df: pd.DataFrame | None = None
    plot: Plot | None = None


def H(text: str, level: int = 2) -> Block:
    return Block("h", text, level)


def P(text: str) -> Block:
    return Block("p", text)


def W(text: str) -> Block:
    return Block("warn", text)


def UL(items: list[str]) -> Block:
    return Block("ul", items=list(items))


def T(df: pd.DataFrame) -> Block:
    return Block("table", df=df)


def _intro(data: ReportData) -> list[Block]:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    model = data.sweeps["baseline"].model
    return [H(f"Benchmark report: profile {data.profile}", 1),
            P(f"Written {now} from the results in {data.results_dir}. Model: {model}. "
              f"Engine device: {data.device}."),
            P("Architectures: baseline (one vLLM instance, notebook 01), replicated (one "
              "instance per node behind the proxy's router, 03) and disaggregated (prefill and "
              "decode instances joined by NIXL, 04). All three are measured by the same load "
              "generator through the same proxy, with vLLM bench serve's metric names.")]


def _missing_blocks(data: ReportData) -> list[Block]:
    if not data.missing:
        return [P("Every notebook's results were found.")]
    items = [f"Notebook {nb}: {msg}" for nb, msg in sorted(data.missing.items())]
    return [H("Missing results"),
            W("This report shows only what exists. To complete it: "
              + "; ".join(f"{run_hint(nb)}" for nb in sorted(data.missing)) + "."),
            UL(items)]


def _conclusion_blocks(concl: Conclusions) -> list[Block]:
    blocks = [H("Conclusions"), P("Computed from the numbers below; nothing here is assumed."),
              UL(concl.headline)]
    if concl.by_metric:
        blocks += [H("By metric", 3), UL(concl.by_metric)]
    return blocks


def _table_blocks(data: ReportData, table: pd.DataFrame) -> list[Block]:
    blocks = [H("Headline table"),
              P("One row per architecture and load point: median over repeats. Spread is the "
                "widest (max - min) / median over the repeats among the metrics shown. Invalid "
                "points (too many failed requests) show INVALID with the reason and are left "
                "out of plots and conclusions.")]
    std = table[table["workload"] == "standard"] if not table.empty else table
    blocks.append(T(display_table(std)))
    mixed = table[table["workload"] == "mixed"] if not table.empty else table
    if not mixed.empty:
        blocks += [H("Mixed long/short workload", 3),
                   P("Long prompts interleaved with short ones: the case where a long prefill "
                     "can stall other requests' decode steps."), T(display_table(mixed))]
    return blocks


def _plot_blocks(data: ReportData, plots: list[Plot]) -> list[Block]:
    blocks = [H("Plots"),
              P("Invalid points are not plotted as values: each line has a gap at an invalid "
                "point and a cross on the x axis marks it.")]
    for p in plots:
        blocks += [H(p.title, 3), Block("img", plot=p)]
    names = {p.name for p in plots}
    if "kv_transfer" not in names:
        blocks.append(P(f"No KV transfer plot: {run_hint('02')}."))
    if "mixed_itl" not in names:
        blocks.append(P("No mixed long/short workload plot: neither 03 nor 04 recorded a mixed "
                        "sweep (set workload.mixed_long_len and re-run them)."))
    return blocks


def _comparison_blocks(concl: Conclusions) -> list[Block]:
    if not concl.findings:
        return [H("Comparison at every load point"),
                P("No two architectures share a valid load point yet.")]
    df = concl.table()
    for col in ("subject_value", "reference_value", "difference_pct"):
        df[col] = df[col].map(fmt_num)
    df["winner"] = df["winner"].fillna("no difference")
    df["beyond_spread"] = df["beyond_spread"].map({True: "yes", False: "no"})
    df = df.rename(columns={"label": "metric", "subject_value": "subject value",
                            "reference_value": "reference value", "difference_pct": "difference %",
                            "beyond_spread": "beyond spread"})
    return [H("Comparison at every load point"),
            P("Difference: the better value's advantage in % of the worse one. It counts only "
              "beyond the run-to-run spread (basis column)."), T(df)]


def _expected_blocks(data: ReportData, table: pd.DataFrame) -> list[Block]:
    df = expected_figures(data, table)
    blocks = [H("Expected figures for two DGX Sparks"),
              P(f"Source: {EXPECTED_TWO_SPARK['source']}.")]
    if data.device != "cuda":
        blocks.append(P("This is the CPU rehearsal: its numbers are not comparable with a "
                        "Spark's, so none are compared."))
    else:
        bad = df[df["verdict"].str.startswith("WARNING")]
        for _, r in bad.iterrows():
            blocks.append(W(f"{r['figure']}: this run {r['this run']} vs expected "
                            f"{r['expected (two Sparks)']}: {r['verdict'].removeprefix('WARNING: ')}; check the "
                            "hardware (notebook 00) before trusting the comparison."))
    return blocks + [T(df)]


def _nb00_blocks(data: ReportData) -> list[Block]:
    env = data.envelopes.get("00")
    if env is None:
        return [P(f"Not run: {run_hint('00')}.")]
    return [P(f"Written {env.timestamp}."), T(key_value_table(env.payload))]


def _nb01_blocks(data: ReportData) -> list[Block]:
    p, sweep = data.payload("01"), data.sweeps["baseline"]
    blocks = [P(f"Target {sweep.target}; {_workload_text(sweep.workload)}.")]
    if isinstance(p.get("single_request"), dict):
        blocks += [H("Single request", 3), T(key_value_table(p["single_request"]))]
    blocks += [H("Roofline", 3), P(roofline_text(data)),
               T(key_value_table(p.get("roofline") or {}))]
    return blocks


def _workload_text(w: dict) -> str:
    parts = [f"input {w.get('input_len')} tokens", f"output {w.get('output_len')} tokens",
             f"{w.get('num_prompts')} prompts per point", f"{w.get('repeats', 1)} repeat(s)",
             f"concurrency {w.get('concurrency')}"]
    if w.get("request_rates"):
        parts.append(f"request rates {w.get('request_rates')}")
    return ", ".join(parts)


def _nb02_blocks(data: ReportData) -> list[Block]:
    p = data.payload("02")
    if not p:
        return [P(f"Not run: {run_hint('02')}.")]
    blocks = []
    per_token = p.get("kv_per_token_bytes")
    if isinstance(per_token, (int, float)):
        blocks.append(P(f"KV cache per token: {fmt_num(per_token)} bytes "
                        f"({per_token / 1024:.1f} KiB)."))
    rec = p.get("recommendation") or {}
    if rec:
        blocks.append(P(f"Recommended kv_buffer_device: {rec.get('kv_buffer_device')} "
                        f"({rec.get('reason', 'no reason recorded')})."))
    kv = kv_table(p)
    if not kv.empty:
        blocks += [H("Predicted vs measured transfer time", 3), T(kv.map(fmt_num))]
    rows = (p.get("probe") or {}).get("rows") or []
    if rows:
        blocks += [H("NIXL probe", 3), T(_scalar_table(rows))]
    return blocks


def _nb03_blocks(data: ReportData) -> list[Block]:
    p = data.payload("03")
    if "replicated" not in data.sweeps:
        return [P(f"Not run: {run_hint('03')}.")]
    sweep = data.sweeps["replicated"]
    return [P(f"Routing policy: {p.get('policy', 'not recorded')}. Target {sweep.target}; "
              f"{_workload_text(sweep.workload)}. Mixed workload: "
              f"{'measured' if 'replicated' in data.mixed else 'not measured'}.")]


def _nb04_blocks(data: ReportData) -> list[Block]:
    p = data.payload("04")
    if "disaggregated" not in data.sweeps:
        return [P(f"Not run: {run_hint('04')}.")]
    sweep = data.sweeps["disaggregated"]
    blocks = [P(f"kv_buffer_device: {p.get('kv_buffer_device', 'not recorded')}. Target "
                f"{sweep.target}; {_workload_text(sweep.workload)}.")]
    proof = p.get("proof") if isinstance(p.get("proof"), dict) else None
    if proof is None:
        return blocks + [W("No proof that the KV cache moved was recorded.")]
    prompts = [r for r in proof.get("prompts") or [] if isinstance(r, dict)]
    equal = sum(1 for r in prompts if r.get("tokens_equal"))
    verdict = "passed" if proof.get("ok") else "FAILED"
    text = (f"Proof that the KV cache moved: {verdict}. Greedy output equal to the baseline "
            f"for {equal} of {len(prompts)} prompts.")
    blocks.append(P(text) if proof.get("ok") else W(text))
    return blocks + ([T(_scalar_table(prompts))] if prompts else [])


def _files_blocks(data: ReportData) -> list[Block]:
    rows = []
    for nb, spec in RESULTS.items():
        env = data.envelopes.get(nb)
        status = f"found, written {env.timestamp}" if env else "missing"
        rows.append({"file": spec.file_name, "notebook": spec.notebook_file,
                     "holds": FILE_MEANINGS.get(nb, ""), "status": status})
    rows += [{"file": "report.html / report.md", "notebook": "05_Benchmark_Report.ipynb",
              "holds": "this report (HTML with embedded plots; Markdown linking plots/)",
              "status": "written"},
             {"file": "plots/*.png", "notebook": "05_Benchmark_Report.ipynb",
              "holds": "the plots above", "status": "written"}]
    return [H("What each result file means"),
            P("Every results file is one envelope: schema version, kind, notebook, UTC "
              "timestamp, profile, config snapshot (no secrets), software versions, hardware "
              "facts and the notebook's payload. The previous version of a file is kept under "
              "history/ when it is rewritten."), T(pd.DataFrame(rows))]


def _beyond_blocks() -> list[Block]:
    return [H("Beyond this lab"),
            P("Production systems add what this lab leaves out: KV-aware routing (send a "
              "request where its prefix is already cached), prefill and decode pools that "
              "scale on their own load, service discovery instead of a static config, and "
              "fault handling for lost transfers. Next reading: vLLM's disaggregated prefill "
              "and KV connector docs, NIXL's documentation, and llm-d or NVIDIA Dynamo for "
              "orchestrated disaggregated serving.")]


def report_blocks(data: ReportData, table: pd.DataFrame, concl: Conclusions,
                  plots: list[Plot]) -> list[Block]:
    """The whole report as a list of blocks."""
    blocks = _intro(data) + _missing_blocks(data) + _conclusion_blocks(concl)
    blocks += _table_blocks(data, table) + _plot_blocks(data, plots)
    blocks += _comparison_blocks(concl) + _expected_blocks(data, table)
    sections = [("00", "environment checklist", _nb00_blocks),
                ("01", "single-instance baseline", _nb01_blocks),
                ("02", "KV cache transfer", _nb02_blocks),
                ("03", "replicated serving", _nb03_blocks),
                ("04", "disaggregated serving", _nb04_blocks)]
    for nb, title, make in sections:
        blocks += [H(f"Notebook {nb}: {title}"), *make(data)]
    return blocks + _files_blocks(data) + _beyond_blocks()


# ----- rendering -------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
.warn { background: #fff4e5; border-left: 4px solid #e67e00; padding: 0.5em 1em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #555; }
"""


def _html_block(b: Block) -> str:
    if b.kind == "h":
        return f"<h{b.level}>{html.escape(b.text)}</h{b.level}>"
    if b.kind in ("p", "warn"):
        cls = ' class="warn"' if b.kind == "warn" else ""
        return f"<p{cls}>{html.escape(b.text)}</p>"
    if b.kind == "ul":
        return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in b.items) + "</ul>"
    if b.kind == "table":
        assert b.df is not None
        return b.df.to_html(index=False, escape=True, na_rep="–", border=0)
    assert b.plot is not None
    src = "data:image/png;base64," + base64.b64encode(b.plot.png).decode("ascii")
    return (f'<figure><img src="{src}" alt="{html.escape(b.plot.title)}">'
            f"<figcaption>{html.escape(b.plot.caption)}</figcaption></figure>")


def render_html(blocks: list[Block], title: str) -> str:
    body = "\n".join(_html_block(b) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")


def _md_cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(_md_cell(c) for c in df.columns) + " |",
             "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |"
              for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _md_block(b: Block) -> str:
    if b.kind == "h":
        return "#" * b.level + " " + b.text
    if b.kind == "p":
        return b.text
    if b.kind == "warn":
        return f"> **Warning:** {b.text}"
    if b.kind == "ul":
        return "\n".join(f"- {i}" for i in b.items)
    if b.kind == "table":
        assert b.df is not None
        return md_table(b.df) if not b.df.empty else "(empty)"
    assert b.plot is not None
    return f"![{b.plot.title}](plots/{b.plot.name}.png)\n\n*{b.plot.caption}*"


def render_markdown(blocks: list[Block]) -> str:
    return "\n\n".join(_md_block(b) for b in blocks) + "\n"


def build_report(cfg: LabConfig, noise_floor: float = NOISE_FLOOR) -> ReportPaths:
    """Read the results of 00-04, write report.html, report.md and plots/*.png in
    cfg.results_dir. Raises ResultsMissingError (naming notebook 01) without a baseline."""
    data = load_report_data(cfg)
    table = points_table(data)
    concl = conclusions(data, table, noise_floor)
    plots = render_plots(data, table)
    out = cfg.results_dir
    plot_paths = write_plots(out / "plots", plots)
    blocks = report_blocks(data, table, concl, plots)
    atomic_write_text(out / "report.md", render_markdown(blocks))
    atomic_write_text(out / "report.html",
                      render_html(blocks, f"Benchmark report: {cfg.profile}"))
    return ReportPaths(html=out / "report.html", md=out / "report.md", plots=plot_paths,
                       conclusions=concl.sentences, findings=concl.findings,
                       missing=sorted(data.missing))
