"""What the notebooks' side experiments say, as claims (`results.claims`) built from their
typed records: 01's two switches (`Switches`) and 03's routing policies (`Policies`). The
notebook that runs an experiment says them under its table; the report says them again in
that notebook's section; the audit checks their comparisons against the results file.
"""

from __future__ import annotations

from lab_utils.results.claims import RUNS_JOINED, Claim, Comparison, Located, claim, comparison
from lab_utils.results.payloads import PrefixTwice, Switches, SwitchRun
from lab_utils.results.points import BY_KEY, COMPARED, Measured, Point, differs, pooled
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.util.numbers import fmt_num

SMALL_BUDGET = 256  # tokens per step of 01's chunked-prefill switch: a long prompt takes many


def _at(r: SwitchRun) -> Located:
    return (r.label, "01", f"switch {r.suffix}", r.point)


def _ms(m: Measured | None) -> float | None:
    return None if m is None else m.median


def _apart(mine: Measured, theirs: Measured) -> str:
    """Two settings' first tokens over their repeats: the ratio where the lab's rule sees a
    difference, else that it does not, with the ranges it held apart (a 7% gap is not "1.1x
    lower", nor an 11% one whose runs overlap)."""
    if differs(mine, theirs):
        return BY_KEY["median_ttft_ms"].times(mine.median, theirs.median)
    gap = abs(mine.median - theirs.median) / min(mine.median, theirs.median)
    ranges = (f"; {fmt_num(mine.min)}-{fmt_num(mine.max)} ms over {mine.n} runs against "
              f"{fmt_num(theirs.min)}-{fmt_num(theirs.max)} ms over {theirs.n}"
              if mine.ranged and theirs.ranged else "")
    return f"{gap:.0%} apart: no difference by the lab's rule{ranges}"


def _ranked(c: Comparison, won: str, lost: str) -> str:
    """`won` (the subject better) or `lost` with the margin, or why the rule saw no difference."""
    if c.better is None:
        return c.no_difference()
    return f"{won if c.better == 'subject' else lost} ({c.margin()})"


def chunking_claim(sw: Switches, where: str = "01") -> Claim:
    """What the chunked-prefill runs showed: ITL p99 with small steps against chunking off
    and as served (the lab's rule), and, for each pair ranked, the first tokens of the
    setting with the lower tail against the other's: what that tail cost."""
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
           + _ranked(c, "the small steps cut the streams' tail",
                     "the small steps did not shorten the tail")
           + ("" if not also else "; against the instance as served "
              + _ranked(also[0], "they cut it", "they did not")))
    # chunking off against as served too: the setting with the lowest tail is also held
    # against the instance as served, where its cost in first tokens shows
    bare = [comparison("p99_itl_ms", _at(off), _at(served))] if served else []
    if bare:
        itl += ("; chunking off against as served: "
                + _ranked(bare[0], "off cut the tail", "off did not cut it"))
    # for each pair the rule ranked on the tail: the first tokens of the lower tail's setting
    # against the other's (a higher one is what the lower tail cost)
    ranked = [((mine, r) if x.better == "subject" else (r, mine))
              for x, mine, r in ((c, small, off), *((also[0], small, served) for _ in also),
                                 *((bare[0], off, served) for _ in bare))
              if x.better is not None and r is not None]
    figures: dict[str, float | None] = {}
    for low, high in ranked:
        firsts = [f"{what} {fmt_num(mine.median)} ms against {fmt_num(theirs.median)} ms "
                  f"({_apart(mine, theirs)})"
                  for what, mine, theirs in (
                      ("the long prompts' first token", low.first_token(True),
                       high.first_token(True)),
                      ("the short prompts' median first token", low.first_token(False),
                       high.first_token(False))) if mine and theirs]
        if firsts:
            itl += (f"; first tokens with the lower tail ({low.label} against {high.label}): "
                    + ", ".join(firsts))
        for r in (low, high):
            figures.update({f"long_ttft_{r.suffix}_ms": _ms(r.first_token(True)),
                            f"other_ttft_{r.suffix}_ms": _ms(r.first_token(False))})
    a, b = small.first_token(True), off.first_token(True)
    if not ranked and a and b:
        itl += (f"; the long prompts' first token took {fmt_num(a.median)} ms against "
                f"{fmt_num(b.median)} ms with chunking off ({_apart(a, b)})")
        figures.update({"long_ttft_steps_ms": a.median, "long_ttft_off_ms": b.median})
    return claim(where, itl + ".", c, *also, *bare, figures=figures)


def others_claim(sw: Switches, where: str = "01") -> Claim | None:
    """The short prompts' first token under each setting, as measured (no direction claimed:
    it depends on how often they arrive while a long prompt is being prefilled)."""
    said = [f"{r.label} {fmt_num(m.median)} ms"
            + (f" (each run's: {fmt_num(m.min)}-{fmt_num(m.max)} ms)" if m.ranged else "")
            for r in sw.chunked_prefill if (m := r.first_token(False)) is not None]
    return claim(where, "The short prompts' median first token: " + "; ".join(said) + ".",
                 figures={r.suffix: _ms(r.first_token(False)) for r in sw.chunked_prefill}
                 ) if said else None


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


def policy_sides(runs: dict[str, Point], mixed: BenchmarkResult | None = None,
                 configured: str | None = None) -> dict[str, tuple[str, Point]]:
    """Each policy's run name and point, the configured policy's pooled with the mixed
    sweep's point at the same load (the same configuration, run twice: its two runs show
    how much one configuration moves between runs, which the rule then holds a
    difference against)."""
    out = {name: (f"policy {name}", p) for name, p in runs.items()}
    same = next((p for p in (mixed.combined if mixed else []) if configured in runs
                 and p.valid and (p.mode, p.value) == (runs[configured].mode,
                                                       runs[configured].value)), None)
    if same is not None and configured is not None:
        run, p = out[configured]
        out[configured] = (f"{run}{RUNS_JOINED}mixed", pooled([p, same]))
    return out


def policy_claims(runs: dict[str, Point], where: str = "03", mixed: BenchmarkResult | None = None,
                  configured: str | None = None) -> list[Claim]:
    """What 03's routing policies did (`runs`: round_robin and least_outstanding, one run
    each of the mixed workload at one load; the `configured` one also measured by the
    `mixed` sweep, see `policy_sides`): least-outstanding against round-robin on the ITL
    tail and on TTFT, each by the lab's rule, the cost named beside the win."""
    if set(runs) != {"round_robin", "least_outstanding"}:
        return []
    sides = policy_sides(runs, mixed, configured)
    (lo_run, lo), (rr_run, rr) = sides["least_outstanding"], sides["round_robin"]
    if not (lo.valid and rr.valid):
        return [claim(where, "The policy comparison has an invalid run: no policy "
               "is named better.")]
    def runs_of(name: str) -> str:
        own, all_ = runs[name].repeats, sides[name][1].repeats
        said = f"{name.replace('_', '-')} {all_} run{'s' if all_ > 1 else ''}"
        return said + (f" ({own} its own, {all_ - own} the mixed sweep's)" if all_ > own else "")
    each = (", one run each" if {p.repeats for _, p in sides.values()} == {1} else
            ", " + " and ".join(runs_of(n) for n in sides))
    at = f"mixed workload at {lo.load}{each} (one load point)"
    cmps = [comparison(m.key, ("least-outstanding", "03", lo_run, lo),
                       ("round-robin", "03", rr_run, rr))
            for m in COMPARED if lo.of(m) is not None and rr.of(m) is not None]
    parts = []
    for c in cmps:
        m = BY_KEY[c.metric]
        why = (c.no_difference() if c.better is None else  # else the runs the rule held apart
               f"{c.margin()}, {'better' if c.better == 'subject' else 'worse'}: {c.spans()}")
        parts.append(f"{m.label} {m.text(c.subject.value.median)} against "
                     f"{m.text(c.reference.value.median)} ({why})")
    won = [BY_KEY[c.metric].label for c in cmps if c.better == "subject"]
    lost = [BY_KEY[c.metric].label for c in cmps if c.better == "reference"]
    head = ("Least-outstanding against round-robin, " + at + ": " + "; ".join(parts) + ".")
    tail = (f" Least-outstanding won on {', '.join(won)}" if won else
            " Least-outstanding won on nothing") + (
        f" and cost {', '.join(lost)}." if lost else (" at no cost measured here." if won else "."))
    return [claim(where, head + tail, *cmps)]


__all__ = ["SMALL_BUDGET", "chunking_claim", "others_claim", "policy_claims", "policy_sides",
           "prefix_claim",
           "switch_claims"]
