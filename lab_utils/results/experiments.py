"""What the notebooks' side experiments say, as claims (`results.claims`) built from their
typed records: 01's two switches (`Switches`) and 03's routing policies (`Policies`). The
notebook that runs an experiment says them under its table; the report says them again in
that notebook's section; the audit checks their comparisons against the results file.
"""

from __future__ import annotations

from lab_utils.results.claims import Claim, Located, claim, comparison
from lab_utils.results.payloads import PrefixTwice, Switches, SwitchRun
from lab_utils.results.points import BY_KEY, COMPARED, MetricKey, Point
from lab_utils.util.numbers import fmt_num

POLICY_METRICS: tuple[MetricKey, ...] = tuple(m.key for m in COMPARED)
SMALL_BUDGET = 256  # tokens per step of 01's chunked-prefill switch: a long prompt takes many


def _at(r: SwitchRun) -> Located:
    return (r.label, "01", f"switch {r.suffix}", r.point)


def chunking_claim(sw: Switches, where: str = "01") -> Claim:
    """What the chunked-prefill runs showed: ITL p99 with small steps against chunking off
    (the lab's rule), and what the small steps cost the long prompts' first token."""
    small = next((r for r in sw.chunked_prefill if r.budget == SMALL_BUDGET), None)
    off = next((r for r in sw.chunked_prefill if r.suffix == "unchunked"), None)
    if (not small or not off or small.point.median("p99_itl_ms") is None
            or off.point.median("p99_itl_ms") is None):
        return claim(where, "The chunked-prefill runs did not both measure ITL p99: nothing to "
                     "compare.")
    c = comparison("p99_itl_ms", _at(small), _at(off))
    served = next((r for r in sw.chunked_prefill if r.suffix == "served"
                   and r.point.median("p99_itl_ms") is not None), None)
    also = [comparison("p99_itl_ms", _at(small), _at(served))] if served else []
    itl = (f"ITL p99 was {fmt_num(c.subject.value.median)} ms with {SMALL_BUDGET}-token steps "
           f"against {fmt_num(c.reference.value.median)} ms with chunking off"
           + (f" and {fmt_num(also[0].reference.value.median)} ms as served" if also else "")
           + f" (one load point, concurrency {small.point.value:g}): against chunking off "
           + {"subject": f"the small steps cut the streams' tail ({c.margin()})",
              "reference": f"the small steps did not shorten the tail ({c.margin()})",
              None: "no difference by the lab's rule"}[c.better]
           + ("" if not also else "; against the instance as served "
              + {"subject": f"they cut it ({also[0].margin()})",
                 "reference": f"they did not ({also[0].margin()})",
                 None: "no difference by the lab's rule"}[also[0].better]))
    t_small, t_off = small.long_ttft_ms, off.long_ttft_ms
    if t_small and t_off:
        cost = BY_KEY["median_ttft_ms"].times(t_small, t_off)
        itl += (f"; the long prompts' first token took {fmt_num(t_small)} ms against "
                f"{fmt_num(t_off)} ms ({cost} with the small steps)")
    return claim(where, itl + ".", c, *also, figures={"long_ttft_small_ms": t_small,
                                              "long_ttft_off_ms": t_off})


def others_claim(sw: Switches, where: str = "01") -> Claim | None:
    """The short prompts' first token under each setting, as measured (no direction claimed:
    it depends on how often they arrive while a long prompt is being prefilled)."""
    said = [f"{r.label} {fmt_num(r.other_ttft_ms)} ms" for r in sw.chunked_prefill
            if r.other_ttft_ms is not None]
    return claim(where, "The short prompts' median first token: " + "; ".join(said) + ".",
                 figures={r.suffix: r.other_ttft_ms for r in sw.chunked_prefill}) if said else None


def prefix_claim(p: PrefixTwice | None, where: str = "01") -> Claim:
    if p is None or p.first_ttft_ms is None or p.second_ttft_ms is None:
        return claim(where, "The prefix-caching requests did not both complete.")
    first, second, hits = p.first_ttft_ms, p.second_ttft_ms, p.second_hits_pct
    figures = {"first_ttft_ms": first, "second_ttft_ms": second, "second_hits_pct": hits or 0.0}
    if not hits:
        return claim(where, f"Sent a second time, none of the {p.prompt_tokens:,}-token prompt came "
                     "from the prefix cache (is prefix caching off?): TTFT "
                     f"{fmt_num(first)} ms, then {fmt_num(second)} ms.", figures=figures)
    before = p.first_hits_pct or 0
    return claim(where, f"Sent a second time, {hits:.0f}% of the {p.prompt_tokens:,}-token prompt "
                 f"came from the prefix cache and its TTFT went from {fmt_num(first)} ms to "
                 f"{fmt_num(second)} ms ({BY_KEY['median_ttft_ms'].times(second, first)}; one "
                 "request each time). The first time, "
                 + ("0% hit: the prompt was fresh." if not before else
                    f"{before:.0f}% already hit: the instance had seen part of it."), figures=figures)


def switch_claims(sw: Switches, where: str = "01") -> list[Claim]:
    """Every sentence the switches' section says, as claims."""
    others = others_claim(sw, where)
    return [chunking_claim(sw, where), *([others] if others else []),
            prefix_claim(sw.prefix_caching, where)]


def policy_claims(runs: dict[str, Point], where: str = "03") -> list[Claim]:
    """What 03's routing policies did (`runs`: round_robin and least_outstanding, one run
    each of the mixed workload at one load): least-outstanding against round-robin on the
    ITL tail and on TTFT, each by the lab's rule, the cost named beside the win."""
    if set(runs) != {"round_robin", "least_outstanding"}:
        return []
    lo, rr = runs["least_outstanding"], runs["round_robin"]
    if not (lo.valid and rr.valid):
        return [claim(where, "The policy comparison has an invalid run: no policy "
               "is named better.")]
    at = f"mixed workload at {lo.load}, one run each (one load point)"
    cmps = [comparison(k, ("least-outstanding", "03", "policy least_outstanding", lo),
                       ("round-robin", "03", "policy round_robin", rr))
            for k in POLICY_METRICS
            if lo.of(k) is not None and rr.of(k) is not None]
    parts = []
    for c in cmps:
        m = BY_KEY[c.metric]
        verdict = ("no difference by the lab's rule" if c.better is None
                   else f"{c.margin()}, {'better' if c.better == 'subject' else 'worse'}")
        parts.append(f"{m.label} {m.text(c.subject.value.median)} against "
                     f"{m.text(c.reference.value.median)} ({verdict})")
    won = [BY_KEY[c.metric].label for c in cmps if c.better == "subject"]
    lost = [BY_KEY[c.metric].label for c in cmps if c.better == "reference"]
    head = ("Least-outstanding against round-robin, " + at + ": " + "; ".join(parts) + ".")
    tail = (f" Least-outstanding won on {', '.join(won)}" if won else
            " Least-outstanding won on nothing") + (
        f" and cost {', '.join(lost)}." if lost else (" at no cost measured here." if won else "."))
    return [claim(where, head + tail, *cmps)]




__all__ = ["SMALL_BUDGET", "chunking_claim", "others_claim", "policy_claims", "prefix_claim",
           "switch_claims"]
