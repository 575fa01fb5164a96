"""The report's conclusions, computed from the numbers, nothing assumed: every pair
of architectures (disaggregated vs replicated, disaggregated vs baseline, replicated vs
baseline) compared on every metric at every valid load point both measured, a winner only
when the lab's one rule says the two differ (`points.compare`: more than 10% of the
smaller value and the runs' min-max ranges apart), then plain sentences: verdicts on
disaggregation, one summary per pair and metric, the documentation's claim beside the
run's, warnings (failed proof of transfer, workloads that differ) and the invalid points
left out.

Over 400 lines on purpose: every report sentence that judges one architecture against
another is built here from one list of comparisons and the same few phrase helpers
(`_loads`, `_up_to`); split, the pieces would pass both back and forth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd

from lab_utils.measure.benchmark import READ_TOGETHER_NOTE, read_late, read_together_share
from lab_utils.report.data import ARCH_NOTEBOOK, ARCHITECTURES, ReportData, run_hint
from lab_utils.report.tables import points_table
from lab_utils.results.claims import WORKLOAD_OF, Claim, Comparison, Located, claim, comparison
from lab_utils.results.points import BY_KEY, COMPARED, MARGIN, factor
from lab_utils.results.sweep import BenchmarkPoint
from lab_utils.util.numbers import join_words

WORKLOADS = {"standard": "", "mixed": "Mixed long/short workload, "}
# Pairs compared in the conclusions: (subject, reference).
PAIRS = (("disaggregated", "replicated"), ("disaggregated", "baseline"),
         ("replicated", "baseline"), ("tensor-parallel", "replicated"),
         ("tensor-parallel", "disaggregated"), ("tensor-parallel", "baseline"))


@dataclass
class Conclusions:
    """`headline`: verdicts, warnings, exclusions and the spread rule; `by_metric`: one
    sentence per pair of architectures and metric; `findings`: every comparison, as the
    one engine (`claims.comparison`) made it; `claims`: every sentence shown with the
    comparisons that make it true (saved beside the results, checked by `audit`)."""

    headline: list[str]
    by_metric: list[str]
    findings: list[Comparison]
    excluded: list[str]
    claims: list[Claim] = field(default_factory=list)

    @property
    def sentences(self) -> list[str]:
        return self.headline + self.by_metric

    def table(self) -> pd.DataFrame:
        rows = [{"workload": f.workload, "load": f.load, "label": BY_KEY[f.metric].label,
                 "subject": f.subject.name, "reference": f.reference.name,
                 "subject_value": f.subject.value.median,
                 "reference_value": f.reference.value.median, "winner": f.winner,
                 "ratio": margin(f), "differs": f.better is not None, "basis": f.basis}
                for f in self.findings]
        return pd.DataFrame(rows, columns=["workload", "load", "label", "subject", "reference",
                                           "subject_value", "reference_value", "winner",
                                           "ratio", "differs", "basis"])


def margin(f: Comparison) -> str:
    """The margin in words: the winner's value against the loser's as a ratio ("1.7x
    lower"); without a winner, how far apart they are ("1.05x apart")."""
    m = BY_KEY[f.metric]
    if f.winner is None:
        return f"{factor(f.ratio)} apart"
    win, lose = ((f.subject.value.median, f.reference.value.median) if f.better == "subject"
                 else (f.reference.value.median, f.subject.value.median))
    return m.times(win, lose)


def located(data: ReportData) -> dict[tuple[str, str, float], dict[str, Located]]:
    """Every valid combined point of every architecture, by (workload, mode, load)."""
    out: dict[tuple[str, str, float], dict[str, Located]] = {}
    for run, by_arch in (("sweep", data.sweeps), ("mixed", data.mixed)):
        for arch, result in by_arch.items():
            for p in result.combined:
                if p.valid:
                    out.setdefault((WORKLOAD_OF[run], p.mode, float(p.value)), {})[arch] = (
                        arch, ARCH_NOTEBOOK[arch], run, p)
    return out


def _read_late(data: ReportData, arch: str, run: str, mode: str, value: float) -> bool:
    result = (data.sweeps if run == "sweep" else data.mixed).get(arch)
    return result is not None and read_late(result, mode, value)


def _measured_pairs(data: ReportData):
    """(workload, load, subject, reference, late) for every pair in PAIRS at every valid load
    point both measured; late: either side's tokens were read together there."""
    for (workload, mode, value), at in located(data).items():
        for subject, reference in PAIRS:
            if subject in at and reference in at:
                a, b = at[subject], at[reference]
                late = any(_read_late(data, x[0], x[2], mode, value) for x in (a, b))
                yield workload, _Load(mode, value), a, b, late


def compare(data: ReportData) -> list[Comparison]:
    """Every pair in PAIRS, on every metric, at every valid load point both measured;
    the per-token metrics only where neither side's tokens were read together."""
    return [comparison(m.key, a, b) for _, _, a, b, late in _measured_pairs(data)
            for m in COMPARED if not (m.per_token and late)
            and a[3].median(m) is not None and b[3].median(m) is not None]


def _not_compared_per_token(data: ReportData) -> list[str]:
    """The pairs left out of the ITL and TPOT comparisons by `compare`, in one sentence."""
    left: dict[tuple[str, str, str], list[_Load]] = {}
    for workload, load, a, b, late in _measured_pairs(data):
        if late:
            left.setdefault((workload, a[0], b[0]), []).append(load)
    if not left:
        return []
    where = "; ".join(f"{WORKLOADS[w].lower()}{subject} vs {reference} at {_loads(loads)}"
                      for (w, subject, reference), loads in left.items())
    labels = join_words([m.label for m in COMPARED if m.per_token])
    return [f"Not compared on {labels} where the load generator got many tokens in one read "
            f"on either side (the headline table's notes name the runs): {where}."]


class _Load(NamedTuple):
    mode: str
    value: float


def _loads(fs: Sequence[Comparison | _Load]) -> str:
    """"concurrency 1, 2 and 4" (and "rate 2 and 4 req/s" for rate points)."""
    parts = []
    for mode, unit in (("concurrency", ""), ("rate", " req/s")):
        values = list(dict.fromkeys(f"{f.value:g}" for f in fs if f.mode == mode))
        if values:
            parts.append(f"{mode} {join_words(values)}{unit}")
    return " and at ".join(parts)


def _ratio_range(fs: list[Comparison]) -> str:
    """"1.4x" or "1.4-1.7x": the margins of `fs` as ratios."""
    lo, hi = factor(min(f.ratio for f in fs)), factor(max(f.ratio for f in fs))
    return hi if lo == hi else f"{lo.removesuffix('x')}-{hi}"


def _summary_claim(fs: list[Comparison]) -> Claim:
    f0 = fs[0]
    m = BY_KEY[f0.metric]
    parts = []
    for who in ("subject", "reference"):
        wins = [f for f in fs if f.better == who]
        if wins:
            parts.append(f"{getattr(f0, who).name} better at {_loads(wins)} "
                         f"({_ratio_range(wins)} {m.way})")
    ties = [f for f in fs if f.better is None]
    if ties:
        parts.append(f"no difference at {_loads(ties)}")
    head = (f"{WORKLOADS[f0.workload]}{m.label} ({m.way} is better), {f0.subject.name} vs "
            f"{f0.reference.name}")
    return claim("report", head[0].upper() + head[1:] + ": " + "; ".join(parts) + ".", *fs)


def _summaries(findings: list[Comparison]) -> list[Claim]:
    groups: dict[tuple, list[Comparison]] = {}
    for f in findings:
        groups.setdefault((f.workload, f.subject.name, f.reference.name, f.metric), []).append(f)
    return [_summary_claim(fs) for fs in groups.values()]


def documentation_claim(findings: list[Comparison], where: str = "report") -> Claim | None:
    """What vLLM's documentation says of disaggregation and throughput, beside what this
    run measured against each other architecture without it (replicated serving on the
    same nodes, the single instance), and whether the two agree."""
    against = {"replicated": "replicated serving", "baseline": "the single instance"}
    runs: list[str] = []
    won_over: list[str] = []
    held: list[str] = []  # the references it was nowhere higher than
    used: list[Comparison] = []
    for ref, name in against.items():
        fs = [f for f in findings if (f.subject.name, f.reference.name) == ("disaggregated", ref)
              and f.metric == "output_throughput" and f.workload == "standard"]
        if not fs:
            continue
        used += fs
        lost, won = ([f for f in fs if f.better == w] for w in ("reference", "subject"))
        ties = [f for f in fs if f.better is None]
        runs.append(f"against {name}, " + ", ".join(p for p in (
            f"lower at {_loads(lost)} ({ref} {_up_to(lost)} higher)" if lost else "",
            f"higher at {_loads(won)} ({_up_to(won)})" if won else "",
            f"no different at {_loads(ties)}" if ties else "") if p))
        if won:
            won_over.append(f"{name} at {_loads(won)}")
        else:
            held.append(name)
    if not used:
        return None
    verdict = ("So this run agrees with the documentation: nowhere was it higher by the lab's "
               "rule."
               if not won_over else
               f"So this run disagrees with the documentation only where disaggregated "
               f"serving's output throughput was higher: against {join_words(won_over)}"
               + (f"; against {join_words(held)} it agrees at every load." if held else "."))
    return claim(where, "vLLM's documentation (its page \"Disaggregated Prefilling\") says "
                 "disaggregated prefill does not raise throughput; its use is to tune TTFT and "
                 "ITL separately. In this run, disaggregated serving's output throughput was, "
                 f"{'; '.join(runs)}. {verdict}", *used)


def _up_to(fs: list[Comparison]) -> str:
    """The largest margin, "up to" only when there is more than one."""
    top = factor(max(f.ratio for f in fs))
    return top if len(fs) == 1 else f"up to {top}"


def _verdicts(findings: list[Comparison], workload: str, reference: str,
              ref_name: str) -> list[Claim]:
    """Plain statements on disaggregation against one reference architecture."""
    fs = [f for f in findings if f.workload == workload and f.subject.name == "disaggregated"
          and f.reference.name == reference]
    if not fs:
        return []
    pre = WORKLOADS[workload]
    out = []
    for m in COMPARED:
        lost = [f for f in fs if f.metric == m.key and f.better == "reference"]
        won = [f for f in fs if f.metric == m.key and f.better == "subject"]
        if lost:
            out.append(claim("report", f"{pre}disaggregation lost on {m.label} to {ref_name} at "
                             f"{_loads(lost)} ({reference} {_up_to(lost)} {m.way}).", *lost))
        if won:
            out.append(claim("report", f"{pre}disaggregation won on {m.label} against "
                             f"{ref_name} at {_loads(won)} ({_up_to(won)} {m.way}).", *won))
    if not any(f.better == "subject" for f in fs):
        out.append(claim("report", f"{pre}disaggregation won on no metric against {ref_name} "
                         "at any valid load point of this run.", *fs))
    for c in out:
        c.text = c.text[0].upper() + c.text[1:]
    return out


def _spread_sentence(table: pd.DataFrame) -> str:
    ok = table[table["valid"]] if not table.empty else table
    once = [a for a in ARCHITECTURES
            if not ok.empty and ((ok["architecture"] == a) & (ok["repeats"] < 2)).any()]
    reps = sorted({int(r) for r in ok["repeats"] if r > 1}) if not ok.empty else []
    spreads = ([float(v) for v in ok.loc[ok["repeats"] > 1, "spread_pct"] if math.isfinite(v)]
               if reps else [])
    seen = (f" (in this run the repeats of one point were up to {max(spreads):.0f}% apart on "
            f"the metric that varied most, {sorted(spreads)[len(spreads) // 2]:.0f}% at the median"
            " point)" if spreads else "")
    parts = [f"a difference counts only when it is larger than {MARGIN:.0%} of the smaller "
             f"value{seen}."]
    if reps:
        n = join_words([str(r) for r in reps])
        parts.append(f"where both sides were measured {n} times, it must also be outside "
                     "the run-to-run spread: their min-max ranges over the repeats must not "
                     "overlap, and the medians must be further apart than either side's "
                     "range is wide.")
    if once or not reps:
        who = f" ({', '.join(once)})" if once else ""
        parts.append(f"points measured once{who} have an unknown spread: one is held against "
                     f"the other side's range (more than {MARGIN:.0%} beyond it), and between "
                     f"two such points the {MARGIN:.0%} margin alone decides; set "
                     "workload.repeats above 1 to measure the spread.")
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
        env = data.envelopes.get("04")
        extra = ((env.config.get("kv_transfer") or {}).get("extra_config") or {}) if env else {}
        lease = extra.get("kv_lease_duration")
        out.append("CPU rehearsal: "
                   + ("each prefill or decode instance's NIXL progress thread (the background "
                      "thread that drives its transfers) waited in poll() between rounds, as "
                      "the lab set it (kv_transfer.nixl_progress_delay_us; left as vLLM starts "
                      "it, it polls without pause and takes a core of this small machine). "
                      if data.nixl_delay_us > 0 else
                      "each prefill or decode instance also runs NIXL's busy-polling progress "
                      "thread (the background thread that drives its transfers), which takes a "
                      "core of this small machine. ")
                   + "A request can also stall at low load: the prefill keeps a prompt's KV "
                   "blocks for the decode until they are read or their lease runs out"
                   + (f" ({lease} s here, kv_transfer.extra_config.kv_lease_duration)"
                      if lease else "")
                   + ", its engine stepping until then; the headline table's notes name any "
                   "run during which the machine stood still. "
                   "The disaggregated numbers here say how the mechanics behave on this box, "
                   "not on a Spark.")
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


def _runs(data: ReportData) -> list[tuple[str, BenchmarkPoint]]:
    """Every measured run (one repeat of one load point), with its sweep named as the
    report's sentences name it."""
    return ([(arch, p) for arch, r in data.sweeps.items() for p in r.points]
            + [(f"{arch} (mixed workload)", p) for arch, r in data.mixed.items() for p in r.points])


def _listed(hit: list, say) -> str:
    return "; ".join(f"{arch} {p.mode} {p.value:g} #{p.repeat + 1}: {say(p)}"
                     for arch, p in hit[:6]) + ("; ..." if len(hit) > 6 else "")


def _read_together_warning(data: ReportData) -> list[str]:
    """Runs in which the load generator got many tokens in one read (benchmark.sweep)."""
    runs = _runs(data)
    hit = [(arch, p) for arch, p in runs if read_together_share(p.summary)]
    if not hit:
        return []
    where = _listed(hit, lambda p: f"{read_together_share(p.summary):.0%}")
    return [f"In {len(hit)} of {len(runs)} measured runs, at least {READ_TOGETHER_NOTE:.0%} of the "
            f"tokens after the first reached the load generator in the same read as the token "
            f"before ({where}). Their inter-token gaps are recorded as 0 ms, so these runs' ITL "
            "figures say when the client read the tokens, not how fast they were decoded: the "
            "client was late to read (starved of CPU) or the tokens were sent together."]


def _stall_warning(data: ReportData) -> list[str]:
    """Runs during which the benchmark's own process was held up (lab_utils.measure.stalls)."""
    runs = _runs(data)
    hit = [(arch, p) for arch, p in runs if p.summary.held_up_s]
    if not hit:
        return []
    total = sum(p.summary.held_up_s for _, p in hit)
    where = _listed(hit, lambda p: f"{p.summary.held_up_s:.1f} s")
    return [f"The machine running the benchmark stood still during {len(hit)} of {len(runs)} "
            f"measured runs, {total:.1f} s in all ({where}). Latencies measured across a stall "
            "include it; the runs are in the numbers as measured."]


# Beside disaggregation's verdicts, one sentence per workload for these pairs: what a
# reader of the verdict table asks next (why the replicas lost to one instance, how the
# split model did), each metric it won or lost named with its loads and largest margin.
OTHER_PAIRS = (("replicated", "baseline"), ("tensor-parallel", "replicated"))
NAMES = {"replicated": "replicated serving", "tensor-parallel": "the split model (tensor-parallel)"}


def _pair_claim(findings: list[Comparison], workload: str, subject: str, reference: str,
                ref_name: str, why: str = "") -> Claim | None:
    """"Replicated serving against the single instance (...): lost on ... at ... (up to
    1.7x ...); won on none; no difference on ..." for one workload."""
    fs = [f for f in findings if f.workload == workload and f.subject.name == subject
          and f.reference.name == reference]
    if not fs:
        return None
    parts: dict[str, list[str]] = {"lost": [], "won": []}
    tied = []
    for m in COMPARED:
        mine = [f for f in fs if f.metric == m.key]
        for side, word in (("reference", "lost"), ("subject", "won")):
            hit = [f for f in mine if f.better == side]
            if hit:
                parts[word].append(f"{m.label} at {_loads(hit)} ({_up_to(hit)} "
                                   f"{'better' if side == 'subject' else 'worse'})")
        if mine and all(f.better is None for f in mine):
            tied.append(m.label)
    said = "; ".join(f"{word} on {join_words(items)}" if items else f"{word} on none"
                     for word, items in parts.items())
    text = (f"{WORKLOADS[workload]}{NAMES[subject]} against {ref_name}: {said}"
            + (f"; no difference on {join_words(tied)}" if tied else "") + f".{why}")
    return claim("report", text[0].upper() + text[1:], *fs)


def conclusions(data: ReportData, table: pd.DataFrame | None = None) -> Conclusions:
    """Plain sentences and the comparisons behind them, computed from the numbers; invalid
    points are excluded and named. `table`: the points table, when already built (for the
    exclusions and the spread rule; the comparisons are made from the points)."""
    table = points_table(data) if table is None else table
    findings = compare(data)
    excluded = _excluded(table)
    plain = _warnings(data) + _absent(data)
    verdicts: list[Claim] = []
    for workload in WORKLOADS:
        ref = "replicated" if any(f.workload == workload and f.subject.name == "disaggregated"
                                  and f.reference.name == "replicated" for f in findings) else "baseline"
        verdicts += _verdicts(findings, workload, ref, reference_name(data, ref))
    doc = documentation_claim(findings)
    verdicts += [doc] if doc else []
    why = (" On this machine the replicas shared the cores the single instance had to itself."
           if shared_machine(data) else "")
    for workload in WORKLOADS:
        for subject, reference in OTHER_PAIRS:
            c = _pair_claim(findings, workload, subject, reference,
                            reference_name(data, reference),
                            why if (subject, reference) == ("replicated", "baseline") else "")
            verdicts += [c] if c else []
    tail = []
    if excluded:
        tail.append("Excluded from the conclusions as invalid: " + "; ".join(excluded) + ".")
    tail += _not_compared_per_token(data)
    tail.append(_spread_sentence(table))
    summaries = _summaries(findings)
    claims = ([claim("report", t) for t in plain] + verdicts
              + [claim("report", t) for t in tail] + summaries)
    return Conclusions(plain + [c.text for c in verdicts] + tail, [c.text for c in summaries],
                       findings, excluded, claims)


def shared_machine(data: ReportData) -> bool:
    """Whether every node of the profile is this one machine (the rehearsal: loopback
    addresses of one host), by 01's config snapshot."""
    nodes = (data.envelopes["01"].config.get("nodes") or {}) if "01" in data.envelopes else {}
    return bool(nodes) and all((n or {}).get("connection", "local") == "local"
                               for n in nodes.values())


def reference_name(data: ReportData, arch: str) -> str:
    """How the verdicts name the reference: with the hardware it had."""
    rep = data.replicated
    routed = (f", routed {rep.policy.replace('_', '-')}"
              if arch == "replicated" and rep is not None and rep.policy else "")
    if shared_machine(data):
        return {"baseline": "the single instance (which had this machine's cores to itself)",
                "replicated": f"replicated serving (two replicas on this same machine{routed})"
                }.get(arch, f"{arch} serving (on this same machine)")
    return {"baseline": "the single-instance baseline (one of the two nodes)",
            "replicated": f"replicated serving (one replica per node{routed})"}.get(
        arch, f"{arch} serving (on the same two nodes)")


def _absent(data: ReportData) -> list[str]:
    out = []
    if "disaggregated" not in data.sweeps:
        out.append("No disaggregated results, so nothing can be said about disaggregation yet: "
                   f"{run_hint('04')}.")
    if "replicated" not in data.sweeps:
        out.append("No replicated results, so nothing is compared with the nodes "
                   f"serving as replicas: {run_hint('03')}.")
    return out

