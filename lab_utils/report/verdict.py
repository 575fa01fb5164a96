"""The report's verdict: one computed sentence (`verdict_claim`, `verdict_sentence`) that
says, for each workload and headline metric (`HEADLINE`), which architecture beat every
other measured at each load by the lab's rule, by how much, what it lost on the same
metric's tail, and how 03's other routing policy stood against it; where none did, which
sides nothing beat, with what each measured.
"""

from __future__ import annotations

from lab_utils.report.conclusions import Conclusions
from lab_utils.report.data import ARCH_NOTEBOOK, ReportData
from lab_utils.results.claims import Claim, Comparison, claim, comparison
from lab_utils.results.points import BY_KEY, MetricKey, Point
from lab_utils.util.numbers import join_words

HEADLINE: tuple[MetricKey, ...] = ("output_throughput", "median_ttft_ms", "p99_itl_ms")  # the verdict's
NAMES = {"baseline": "the single instance", "replicated": "replicated serving",
         "disaggregated": "disaggregated serving", "tensor-parallel": "the model split over the nodes"}


def _best(fs: list[Comparison]) -> tuple[str | None, list[str], list[Comparison]]:
    """At one load point on one metric: the architecture that beats every other measured
    there by the lab's rule, else None; the ones nothing beats (tied at the top); and the
    comparisons that show it."""
    archs = list(dict.fromkeys(n for f in fs for n in (f.subject.name, f.reference.name)))
    for a in archs:
        mine = [f for f in fs if a in (f.subject.name, f.reference.name)]
        if len(mine) == len(archs) - 1 and all(f.winner == a for f in mine):
            return a, [a], mine
    beaten = {n for f in fs if f.winner for n in (f.subject.name, f.reference.name)
              if n != f.winner}
    return None, [a for a in archs if a not in beaten], fs


def _join_loads(loads: list[str]) -> str:
    """"concurrency 1, 2 and 4" from "concurrency 1", "concurrency 2", "concurrency 4"."""
    by_mode: dict[str, list[str]] = {}
    for load in loads:
        mode, _, value = load.partition(" ")
        by_mode.setdefault(mode, []).append(value)
    return " and ".join(f"{mode} {join_words(v)}" for mode, v in by_mode.items())


def names_of(data: ReportData | None) -> dict[str, str]:
    """How the verdict names each architecture: replicated serving with the routing policy
    its sweeps used, since 03 also measured another."""
    rep = data.replicated if data is not None else None
    if rep is None or not rep.policy:
        return NAMES
    return {**NAMES, "replicated": f"{rep.policy.replace('_', '-')} replicated serving"}


def _tail_cost(best: str, key: MetricKey, loads: list[str], mine: list[Comparison],
               names: dict[str, str], used: list[Comparison]) -> str:
    """A median's winner that lost the same metric's 99th percentile there: who beat it on
    the tail (a median can land on the fast side of a two-humped spread)."""
    tail = f"p99_{key.removeprefix('median_')}"
    if not key.startswith("median_") or tail not in BY_KEY:
        return ""
    lost = [f for f in mine if f.metric == tail and f.load in loads and f.winner
            and best in (f.subject.name, f.reference.name) and f.winner != best]
    if not lost:
        return ""
    used += lost
    return (f", though on {BY_KEY[tail].label} "
            f"{join_words(list(dict.fromkeys(names[f.winner or ''] for f in lost)))} beat it")


def _point_of(data: ReportData, arch: str, key: MetricKey, load: str,
              mine: list[Comparison]) -> tuple[str, Point] | None:
    """The run ("sweep" or "mixed") and point a finding of `arch` at `load` on `key` used."""
    f0 = next((f for f in mine if f.metric == key and f.load == load
               and arch in (f.subject.name, f.reference.name)), None)
    if f0 is None:
        return None
    side = f0.subject if f0.subject.name == arch else f0.reference
    runs = (data.sweeps if side.run == "sweep" else data.mixed).get(arch)
    point = runs.point_at(side.load, side.mode, side.run != "sweep") if runs else None
    return None if point is None else (side.run, point)


def _routed_otherwise(data: ReportData | None, leaders: list[str], key: MetricKey, load: str,
                      mine: list[Comparison], used: list[Comparison]) -> str:
    """Where 03 also ran the replicas with another routing policy at this load (one run of
    the mixed workload): whether that run beat every leader by the rule, or matched the one
    winner, with the values; the verdict's replicated serving is the configured policy's."""
    rep = data.replicated if data is not None else None
    if data is None or rep is None or rep.policies is None:
        return ""
    out = []
    for name, p in rep.policies.runs.items():
        cs = []
        for arch in leaders:
            at = _point_of(data, arch, key, load, mine)
            if (at is None or name == rep.policy or (p.mode, p.value) != (at[1].mode, at[1].value)
                    or p.mixed != at[1].mixed or p.of(key) is None or at[1].of(key) is None):
                break
            cs.append(comparison(key, (f"replicated, {name}", "03", f"policy {name}", p),
                                 (arch, ARCH_NOTEBOOK[arch], at[0], at[1])))
        if len(cs) != len(leaders):
            continue
        routed = f"03's replicas routed {name.replace('_', '-')}"
        if all(c.better == "subject" for c in cs):
            used.extend(cs)
            them = "it" if len(cs) == 1 else "them"
            out.append(f"{routed} beat {them} at {load} in their one run ("
                       + "; ".join(f"{c.values()}, {c.margin()}" for c in cs) + ")")
        elif len(cs) == 1 and cs[0].better is None:
            used.extend(cs)
            out.append(f"{routed} matched it at {load} in their one run ({cs[0].values()}, no "
                       "difference by the lab's rule)")
    return "; ".join(out)


def _runs(arch: str, key: MetricKey, loads: list[str],
          cells: dict[str, list[Comparison]]) -> str:
    """What `arch` measured on `key` at `loads`, as the rule read it: "15.0 ms (14.1-15.9)";
    several loads joined by "/"."""
    m = BY_KEY[key]
    out = []
    for load in loads:
        side = next((c.subject if c.subject.name == arch else c.reference
                     for c in cells.get(load, []) if arch in (c.subject.name, c.reference.name)),
                    None)
        if side is not None:
            v = side.value
            out.append(m.text(v.median) + (f" ({m.text(v.min, unit=False)}-"
                                           f"{m.text(v.max, unit=False)})" if v.ranged else ""))
    return " / ".join(out)


def _metric_verdict(key: MetricKey, cells: dict[str, list[Comparison]], one: bool,
                    used: list[Comparison], mine: list[Comparison],
                    data: ReportData | None = None) -> str:
    """"output throughput: the single instance at concurrency 2 and 4 (up to 1.6x higher
    than the next); no single best at concurrency 1 (replicated serving and the single
    instance tie at the top)"; a median's winner that lost the tail says who beat it there,
    and a winner that 03's other routing policy beat says so."""
    m = BY_KEY[key]
    names = names_of(data)
    said: dict[tuple[str | None, tuple[str, ...]], list[tuple[str, float]]] = {}
    for load, fs in cells.items():
        best, leaders, why = _best(fs)
        used += why
        lead = min(f.ratio for f in why) if best else 0.0
        said.setdefault((best, tuple(leaders)), []).append((load, lead))
    bits = []
    for (best, top), where in said.items():
        loads = [w for w, _ in where]
        at = "" if one else f" at {_join_loads(loads)}"
        # top is (best,) where there is a best
        routed = [r for w in loads if (r := _routed_otherwise(data, list(top), key, w,
                                                               mine, used))]
        if best:
            lead = max(r for _, r in where)
            ahead = m.times(lead, 1) if m.higher_is_better else m.times(1, lead)
            text = (f"{names[best]}{at} ("
                    + ("" if one or len(where) == 1 else "up to ") + f"{ahead} than the next)"
                    + _tail_cost(best, key, loads, mine, names, used))
        else:
            # unbeaten is not tied: a side whose runs spread wide beats nothing and loses to
            # nothing, so each is shown with its runs
            shown = join_words([f"{names[a]} {_runs(a, key, loads, cells)}" for a in top])
            text = (f"no single best{at} (beaten by none, by the lab's rule: {shown})"
                    if len(top) > 1 else f"no single best{at}")
        bits.append(text + (f", but {'; '.join(routed)}" if routed else ""))
    return f"{m.label}: " + "; ".join(bits)


def verdict_claim(concl: Conclusions, data: ReportData | None = None) -> Claim:
    """The report's first sentence: for each workload and headline metric (`HEADLINE`),
    the architecture that was best at each load point by the lab's rule against every other
    one measured there (the single instance included), with its margin over the closest,
    or that none was and which tie at the top; the loads named, a single one said to be
    one. With `data`: replicated serving named with its routing policy, and 03's run with
    the other policy set against the winner where it beat it."""
    if not concl.findings:
        return claim("report", "No verdict: no two architectures were measured at a common "
                     "valid load point (run notebooks 01, 03 and 04).")
    parts: list[str] = []
    used: list[Comparison] = []
    for workload in dict.fromkeys(f.workload for f in concl.findings):
        mine = [f for f in concl.findings if f.workload == workload]
        loads = list(dict.fromkeys(f.load for f in mine))
        one = len(loads) == 1
        per_metric = []
        for key in HEADLINE:
            cells: dict[str, list[Comparison]] = {}
            for f in mine:
                if f.metric == key:
                    cells.setdefault(f.load, []).append(f)
            if cells:
                per_metric.append(_metric_verdict(key, cells, one, used, mine, data))
        where = f"{loads[0]} only, one load point" if one else _join_loads(loads)
        parts.append(f"{workload.capitalize()} workload ({where}): " + "; ".join(per_metric))
    names = names_of(data)
    archs = join_words([names[a] for a in dict.fromkeys(
        n for f in concl.findings for n in (f.subject.name, f.reference.name))])
    return claim("report", f"Best of {archs}, each against every other measured at the same "
                 f"load by the lab's rule. {'. '.join(parts)}.", *used)


def verdict_sentence(concl: Conclusions, data: ReportData | None = None) -> str:
    """`verdict_claim`'s sentence."""
    return verdict_claim(concl, data).text
