"""The report's conclusions, computed from the numbers, nothing assumed: every pair
of architectures (disaggregated vs replicated, disaggregated vs baseline, replicated vs
baseline) compared on every metric at every valid load point both measured, a winner only
when the lab's one rule says the two differ (`points.compare`: more than 10% of the
smaller value and, with repeats on both sides, min-max ranges apart), then plain
sentences: verdicts on disaggregation, one summary per pair and metric, warnings (failed
proof of transfer, workloads that differ) and the invalid points left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

from lab_utils.measure.benchmark import READ_TOGETHER_NOTE, read_together_share
from lab_utils.report.data import ARCHITECTURES, ReportData, join_words, run_hint
from lab_utils.report.tables import points_table
from lab_utils.results.points import BY_KEY, COMPARED, MARGIN, Measured, Metric, with_caches
from lab_utils.results.points import compare as judge
from lab_utils.results.sweep import BenchmarkResult

WORKLOADS = {"standard": "", "mixed": "Mixed long/short workload, "}
# Pairs compared in the conclusions: (subject, reference).
PAIRS = (("disaggregated", "replicated"), ("disaggregated", "baseline"),
         ("replicated", "baseline"), ("tensor-parallel", "replicated"),
         ("tensor-parallel", "disaggregated"), ("tensor-parallel", "baseline"))
REFERENCE_NAMES = {"replicated": "replicated serving (the same two nodes)",
                   "disaggregated": "disaggregated serving (the same two nodes)",
                   "baseline": "the single-instance baseline (half the hardware)"}
THROUGHPUT_KEYS = ("request_throughput", "output_throughput")
# Timed between tokens: not compared at a point where either side's load generator got
# many tokens in one read (their gaps are 0 ms there; benchmark.read_together_share).
PER_TOKEN_KEYS = ("median_itl_ms", "p99_itl_ms", "median_tpot_ms")


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
    winner: str | None  # None: no difference by the lab's rule (points.compare)
    difference_pct: float  # the better one's advantage, in % of the worse one's value
    beyond_spread: bool  # the two differ by the lab's rule
    basis: str
    sentence: str

    @property
    def ratio(self) -> float:
        """The larger value over the smaller (inf when one is 0): the margin, symmetric."""
        big = max(abs(self.subject_value), abs(self.reference_value))
        small = min(abs(self.subject_value), abs(self.reference_value))
        return big / small if small else (1.0 if big == small else math.inf)

    @property
    def margin(self) -> str:
        """The margin in words: the winner's value against the loser's as a ratio ("1.7x
        lower"); without a winner, how far apart they are ("1.05x apart")."""
        m = BY_KEY[self.metric]
        if self.winner is None:
            return f"{times(self.ratio)} apart"
        win, lose = ((self.subject_value, self.reference_value) if self.winner == self.subject
                     else (self.reference_value, self.subject_value))
        return m.times(win, lose)


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


def measured(row: pd.Series, m: Metric) -> Measured:
    """A points-table row's `m` (median and min-max over the row's repeats), as the rule
    reads it; a missing min or max counts as the median."""
    v = float(row[m.key])
    lo, hi = float(row[f"{m.key}_min"]), float(row[f"{m.key}_max"])
    return Measured(median=v, min=lo if math.isfinite(lo) else v,
                    max=hi if math.isfinite(hi) else v, n=int(row["repeats"]))


def _hits(row: pd.Series) -> float | None:
    """A points-table row's prefix-cache hit share (%), None when not recorded."""
    v = row.get("prefix_cache_hit_pct")
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _finding(workload: str, m: Metric, a: pd.Series, b: pd.Series) -> Finding:
    av, bv = float(a[m.key]), float(b[m.key])
    a_better = m.better(av, bv)
    win, lose = (av, bv) if a_better else (bv, av)
    pct = abs(win - lose) / abs(lose) * 100 if lose else (0.0 if win == lose else math.inf)
    verdict = with_caches(judge(measured(a, m), measured(b, m), m), _hits(a), _hits(b))
    beyond, basis = verdict.differs, verdict.basis
    names = (a["architecture"], b["architecture"])
    winner = {"a": names[0], "b": names[1]}.get(verdict.better or "")
    sentence = _finding_sentence(workload, m, a["load"], names, (av, bv), winner, basis)
    return Finding(workload, m.key, m.label, a["mode"], float(a["value"]), a["load"],
                   names[0], names[1], av, bv, winner, pct, beyond, basis, sentence)


def times(r: float) -> str:
    """A ratio as the margins are written: "1.7x", "12x", "∞"."""
    return "∞" if not math.isfinite(r) else (f"{r:.1f}x" if r < 10 else f"{r:.0f}x")


def _finding_sentence(workload: str, m: Metric, load: str, names: tuple[str, str],
                      values: tuple[float, float], winner: str | None, basis: str) -> str:
    head = f"{WORKLOADS[workload]}{load}, {m.label}"
    head = head[0].upper() + head[1:]
    shown = {n: m.text(v) for n, v in zip(names, values, strict=True)}
    if winner is None:
        return (f"{head}: no difference between {names[0]} ({shown[names[0]]}) and "
                f"{names[1]} ({shown[names[1]]}) ({basis}).")
    loser = names[1] if winner == names[0] else names[0]
    win, lose = values if winner == names[0] else values[::-1]
    return (f"{head}: {winner} wins, {m.times(win, lose)} than {loser} ({shown[winner]} vs "
            f"{shown[loser]}; {basis}).")


def _pairs(table: pd.DataFrame):
    """(workload, subject row, reference row) for every pair in PAIRS at every valid load
    point both measured."""
    if table.empty:
        return
    ok = table[table["valid"]]
    for (workload, _mode, _value), group in ok.groupby(["workload", "mode", "value"],
                                                       sort=False):
        rows = {r["architecture"]: r for _, r in group.iterrows()}
        for subject, reference in PAIRS:
            if subject in rows and reference in rows:
                yield str(workload), rows[subject], rows[reference]


def _read_together(row: pd.Series) -> bool:
    return bool(row.get("read_together", False))


def compare(table: pd.DataFrame) -> list[Finding]:
    """Every pair in PAIRS, on every metric, at every valid load point both measured;
    the per-token metrics only where neither side's tokens were read together."""
    findings = []
    for workload, a, b in _pairs(table):
        for m in COMPARED:
            if m.key in PER_TOKEN_KEYS and (_read_together(a) or _read_together(b)):
                continue
            if math.isfinite(a[m.key]) and math.isfinite(b[m.key]):
                findings.append(_finding(workload, m, a, b))
    return findings


def _not_compared_per_token(table: pd.DataFrame) -> list[str]:
    """The pairs left out of the ITL and TPOT comparisons by `compare`, in one sentence."""
    left: dict[tuple[str, str, str], list[_Load]] = {}
    for workload, a, b in _pairs(table):
        if _read_together(a) or _read_together(b):
            key = (workload, a["architecture"], b["architecture"])
            left.setdefault(key, []).append(_Load(a["mode"], float(a["value"])))
    if not left:
        return []
    where = "; ".join(f"{WORKLOADS[w].lower()}{subject} vs {reference} at {_loads(loads)}"
                      for (w, subject, reference), loads in left.items())
    labels = join_words([BY_KEY[k].label for k in PER_TOKEN_KEYS])
    return [f"Not compared on {labels} where the load generator got many tokens in one read "
            f"on either side (the headline table's notes name the runs): {where}."]


class _Load(NamedTuple):
    mode: str
    value: float


def _loads(fs: list[Finding] | list[_Load]) -> str:
    """"concurrency 1, 2 and 4" (and "rate 2 and 4 req/s" for rate points)."""
    parts = []
    for mode, unit in (("concurrency", ""), ("rate", " req/s")):
        values = [f"{f.value:g}" for f in fs if f.mode == mode]
        if values:
            parts.append(f"{mode} {join_words(values)}{unit}")
    return " and at ".join(parts)


def _ratio_range(fs: list[Finding]) -> str:
    """"1.4x" or "1.4-1.7x": the margins of `fs` as ratios."""
    lo, hi = times(min(f.ratio for f in fs)), times(max(f.ratio for f in fs))
    return hi if lo == hi else f"{lo.removesuffix('x')}-{hi}"


def _summary_sentence(fs: list[Finding]) -> str:
    f0 = fs[0]
    m = BY_KEY[f0.metric]
    parts = []
    for who in (f0.subject, f0.reference):
        wins = [f for f in fs if f.winner == who]
        if wins:
            parts.append(f"{who} better at {_loads(wins)} ({_ratio_range(wins)} {m.way})")
    ties = [f for f in fs if f.winner is None]
    if ties:
        parts.append(f"no difference at {_loads(ties)}")
    head = f"{WORKLOADS[f0.workload]}{m.label} ({m.way} is better), {f0.subject} vs {f0.reference}"
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
    for m in COMPARED:
        way = m.way
        lost = [f for f in fs if f.metric == m.key and f.winner == reference]
        won = [f for f in fs if f.metric == m.key and f.winner == "disaggregated"]
        if lost:
            out.append(f"{pre}disaggregation lost on {m.label} to {ref} at {_loads(lost)} "
                       f"({reference} up to {times(max(f.ratio for f in lost))} {way}).")
        if won:
            won_any = True
            out.append(f"{pre}disaggregation won on {m.label} against {ref} at {_loads(won)} "
                       f"(up to {times(max(f.ratio for f in won))} {way}).")
    if not won_any:
        out.append(f"{pre}disaggregation won on no metric against {ref} at any valid load "
                   "point of this run.")
    return [s[0].upper() + s[1:] for s in out]


def _spread_sentence(table: pd.DataFrame) -> str:
    ok = table[table["valid"]] if not table.empty else table
    once = [a for a in ARCHITECTURES
            if not ok.empty and ((ok["architecture"] == a) & (ok["repeats"] < 2)).any()]
    reps = sorted({int(r) for r in ok["repeats"] if r > 1}) if not ok.empty else []
    parts = [f"a difference counts only when it is larger than {MARGIN:.0%} of the smaller "
             "value (the run-to-run variation of the CPU rehearsal is several percent, and "
             f"{MARGIN:.0%} is the margin at which the lab's load generator agrees with "
             "vllm bench serve)."]
    if reps:
        times = join_words([str(r) for r in reps])
        parts.append(f"where both sides were measured {times} times, it must also be outside "
                     "the run-to-run spread: their min-max ranges over the repeats must not "
                     "overlap.")
    if once or not reps:
        who = f" ({', '.join(once)})" if once else ""
        parts.append(f"points measured once{who} have an unknown spread, so against them the "
                     f"{MARGIN:.0%} margin alone decides; set workload.repeats above 1 to "
                     "measure the spread.")
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
    proof = data.disaggregated.proof if data.disaggregated else None
    if proof is not None and not proof.ok:
        out.append("Notebook 04's proof that the KV cache really moved did not pass: the "
                   "disaggregated numbers may not measure KV transfer; see its section.")
    if data.device == "cpu" and "disaggregated" in data.sweeps:
        out.append("CPU rehearsal: "
                   + ("each prefill or decode instance's NIXL progress thread waited in poll() "
                      "between rounds (the lab's kv_transfer.nixl_progress_delay_us; as vLLM "
                      "gets it, it polls without pause and takes a core of this small machine), "
                      if data.nixl_waited else
                      "each prefill or decode instance also runs NIXL's busy-polling progress "
                      "thread, which takes a core of this small machine, ")
                   + "and low-load requests can stall until the prefill's KV lease expires "
                   "(docs/REHEARSAL.md, 'What the rehearsal can and cannot show'). The "
                   "disaggregated numbers here say how the mechanics behave on this box, not "
                   "on a Spark.")
    out += _stall_warning(data)
    out += _read_together_warning(data)
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


def _runs(data: ReportData) -> list[tuple[str, BenchmarkResult]]:
    """Every measured sweep, named as the report's sentences name them."""
    return ([(arch, r) for arch, r in data.sweeps.items()]
            + [(f"{arch} (mixed workload)", r) for arch, r in data.mixed.items()])


def _listed(hit: list, say) -> str:
    return "; ".join(f"{arch} {p.mode} {p.value:g} #{p.repeat + 1}: {say(p)}"
                     for arch, p in hit[:6]) + ("; ..." if len(hit) > 6 else "")


def _read_together_warning(data: ReportData) -> list[str]:
    """Runs in which the load generator got many tokens in one read (benchmark.sweep)."""
    results = _runs(data)
    hit = [(arch, p) for arch, result in results for p in result.points
           if read_together_share(p.summary)]
    if not hit:
        return []
    runs = sum(len(result.points) for _, result in results)
    where = _listed(hit, lambda p: f"{read_together_share(p.summary):.0%}")
    return [f"In {len(hit)} of {runs} measured runs, at least {READ_TOGETHER_NOTE:.0%} of the "
            f"tokens after the first reached the load generator in the same read as the token "
            f"before ({where}). Their inter-token gaps are recorded as 0 ms, so these runs' ITL "
            "figures say when the client read the tokens, not how fast they were decoded: the "
            "client was late to read (starved of CPU) or the tokens were sent together."]


def _stall_warning(data: ReportData) -> list[str]:
    """Runs during which the benchmark's own process was held up (lab_utils.measure.stalls)."""
    results = _runs(data)
    hit = [(arch, p) for arch, result in results for p in result.points if p.summary.get("held_up_s")]
    if not hit:
        return []
    runs = sum(len(result.points) for _, result in results)
    total = sum(p.summary["held_up_s"] for _, p in hit)
    where = _listed(hit, lambda p: f"{p.summary['held_up_s']:.1f} s")
    return [f"The machine running the benchmark stood still during {len(hit)} of {runs} measured "
            f"runs, {total:.1f} s in all ({where}). Latencies measured across a stall include "
            "it; the runs are in the numbers as measured."]


def conclusions(data: ReportData, table: pd.DataFrame | None = None) -> Conclusions:
    """Plain sentences and structured findings computed from the numbers; invalid points
    are excluded and named."""
    table = points_table(data) if table is None else table
    findings = compare(table)
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
    sentences += _not_compared_per_token(table)
    sentences.append(_spread_sentence(table))
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

