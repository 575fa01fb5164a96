"""Grade a forecast against what was then measured.

For every metric at every load point of a forecast: the predicted median, its interval,
the measured median, the error in percent of the measurement, whether the measurement
fell inside the interval (which includes the model's own error measured earlier in the
series, `band`), and whether the two differ by the lab's one rule
(`points.compare`, the prediction's interval standing for its min-max range; a value
measured once must stand beyond the 10% margin from that interval). A point is not graded (it is shown, with the
reason) when it is invalid, when the machine stood still during one of its repeats (its
latencies include the stall), or, for ITL and TPOT only, when the load generator read many
tokens together, late (their gaps are the client's, not the server's).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from lab_utils.forecast.band import coverage, coverage_sentence
from lab_utils.measure.benchmark import read_late
from lab_utils.results.claims import Claim, Graded, claim
from lab_utils.results.forecast import Forecast, GradeRow
from lab_utils.results.points import BY_KEY, FORECAST, MARGIN, Measured, compare
from lab_utils.results.sweep import BenchmarkResult

HEADLINE_GRADE = ("median_ttft_ms", "median_tpot_ms")  # the yardstick
GOAL_PCT = 25.0


def grade_rows(fc: Forecast, measured: dict[str, BenchmarkResult | None],
               not_graded: str | None = None) -> list[GradeRow]:
    """One row per metric and load point. `measured`: {"standard": sweep, "mixed": run}.
    `not_graded`: why no row is graded (the run measured something else than the forecast
    was fed, e.g. `results.payloads.TensorParallelPayload.not_graded`)."""
    out = []
    for row in fc.rows:
        result = measured.get(row.workload)
        if result is None:
            continue
        entry = next((c for c in result.combined if c.mode == row.mode
                      and float(c.value) == row.value), None)
        if entry is None:
            continue
        held = sum(p.summary.held_up_s for p in result.points
                   if p.mode == row.mode and float(p.value) == row.value)
        stall = f"the machine stood still {held:.1f} s" if held else None
        late = read_late(result, row.mode, row.value)
        for m in FORECAST:
            k = m.key
            got = entry.of(m)
            pred, meas = row.median(k), None if got is None else got.median
            lo, hi = row.interval(k).lo, row.interval(k).hi
            why = not_graded or ("invalid point" if not entry.valid else stall
                   or ("tokens read together, late" if late and m.per_token else None))
            if pred is None or meas is None:
                why = why or "not predicted or not measured"
            spread = (got.min, got.max) if got is not None and got.ranged else (None, None)
            out.append(GradeRow(
                metric=k, predicted=pred, measured=meas, lo=lo, hi=hi,
                architecture=fc.architecture, workload=row.workload, load=row.load,
                measured_lo=spread[0], measured_hi=spread[1],
                differs=compare(got, predicted(pred, lo, hi), b_is_interval=True).differs,
                not_graded=why))
    return out


def predicted(median: float | None, lo: float | None, hi: float | None) -> Measured | None:
    """A forecast's value as the lab's rule reads it: its interval [lo, hi] stands for a
    min-max range over repeats; without one it is a single value."""
    if median is None:
        return None
    if lo is None or hi is None:
        return Measured.one(median)
    return Measured(median=median, min=lo, max=hi, n=2)


def summary(rows: list[GradeRow], metrics=HEADLINE_GRADE) -> dict[str, Any]:
    """Median absolute error (%) over the graded points of `metrics`, how many points, how
    many inside the interval and how many differ from the forecast by the lab's rule."""
    mine = [r for r in rows if r.graded and r.metric in metrics]
    errs = [abs(r.error_pct) for r in mine if r.error_pct is not None]
    return {"median_abs_error_pct": statistics.median(errs) if errs else None,
            "points": len(errs), "in_interval": sum(r.inside for r in mine),
            "differ": sum(r.differs for r in mine),
            "within_goal": bool(errs) and statistics.median(errs) <= GOAL_PCT,
            "ungraded": sum(1 for r in rows if not r.graded and r.metric in metrics)}


TALLY = ("median_abs_error_pct", "points", "in_interval", "differ")


def grade_claims(where: str, notebook: str, arch: str, rows: list[GradeRow]) -> list[Claim]:
    """`sentences` as claims: the first carries the tally the audit re-derives from
    `notebook`'s results file (its forecast against its sweep and mixed run)."""
    said = sentences(arch, rows)
    s = summary(rows)
    tally = [Graded(notebook=notebook, tally={k: s[k] for k in TALLY})] if s["points"] else []
    return [claim(where, said[0], graded=tally)] + [claim(where, t) for t in said[1:]]


def grade_frame(rows: list[GradeRow]):
    import pandas as pd

    return pd.DataFrame([{
        "architecture": r.architecture, "workload": r.workload, "load": r.load,
        "metric": BY_KEY[r.metric].heading, "predicted": r.predicted,
        "interval from": r.lo, "interval to": r.hi, "measured": r.measured,
        "error % (predicted - measured, of measured)": r.error_pct,
        "measured min": r.measured_lo, "measured max": r.measured_hi, "in interval": r.inside,
        "differs by the rule": r.differs, "graded": r.graded,
        "not graded because": r.not_graded} for r in rows]).round(2)


def _over(rows: list[GradeRow]) -> str:
    """Which runs the values come from, so counts of different sizes read right."""
    loads = {w: len({r.load for r in rows if r.workload == w})
             for w in dict.fromkeys(r.workload for r in rows)}
    said = " and ".join(f"{n} load point{'s' if n > 1 else ''} of the {w} workload"
                        for w, n in loads.items())
    return f"; from {said}" + ("" if "mixed" in loads else " (no mixed point was forecast)")


def sentences(arch: str, rows: list[GradeRow]) -> list[str]:
    """What the grading says, in words, with the numbers."""
    s = summary(rows)
    reasons = {r.not_graded for r in rows}
    if not s["points"] and len(reasons) == 1 and None not in reasons:
        return [f"{arch}: not graded: {reasons.pop()}"]
    if not s["points"]:
        return [f"{arch}: no graded point (the forecast or the measurement is missing, or "
                "every point was flagged)"]
    err = s["median_abs_error_pct"]
    shown = f"{err:.1f}" if abs(err - GOAL_PCT) < 1 else f"{err:.0f}"  # never "25%, outside 25%"
    said = [f"{arch}: TTFT p50 and TPOT predicted with a median absolute error of "
            f"{shown}% over {s['points']} graded values "
            f"({'within' if s['within_goal'] else 'outside'} the {GOAL_PCT:g}% goal); "
            f"{s['in_interval']} of them inside the forecast's interval, {s['differ']} "
            f"different from it by the lab's rule (measured twice or more: the measured median "
            f"more than {MARGIN:.0%} from the predicted one and the range of the runs clear of "
            f"the interval; measured once: more than {MARGIN:.0%} beyond the interval's nearer "
            "end)" + (f"; {s['ungraded']} not graded (flagged)" if s["ungraded"] else "")
            + _over(rows),
            f"  every metric: {coverage_sentence(coverage(rows))}"]
    pairs = [(r, r.predicted, r.measured, r.error_pct) for r in rows if r.graded]
    graded = [(r, p, m, e) for r, p, m, e in pairs
              if p is not None and m is not None and e is not None and p > 0 and m > 0]
    if graded:
        # furthest off as a factor either way: the error % is bounded at -100% below and
        # unbounded above, so ranking by it would favour over-predictions
        r, p, m, e = max(graded, key=lambda g: abs(math.log(g[1] / g[2])))
        said.append(f"  furthest off: {BY_KEY[r.metric].heading} at {r.workload} {r.load}: "
                    f"predicted {p:.3g}, measured {m:.3g} (the forecast "
                    f"{max(p, m) / min(p, m):.2f}x {'over' if p > m else 'under'} the "
                    f"measurement, error {e:+.0f}% of it; ranked by that factor)")
    return said
