"""The forecast's error band: how far the model itself missed on this machine today, added
to the interval of the forecasts that come after.

The interval from the edges of 01's and 02's curves (`model.ranged`) only says how much
the *inputs* varied; it says nothing of what the model leaves out (docstring of
`model`), so on its own it rarely holds the measurement. The series grades the model
as it goes: notebook 01 forecasts its own sweep from its profile, measured before the
sweep, and grades it; 03 grades its forecast of replicated serving. Each graded value
gives a relative error, the log of measured / predicted. For the next forecast, every
metric's interval [lo, hi] becomes [lo / f, hi x f], f = exp(b), where b is the
`QUANTILE` of |log error| over the graded values of the same metric family so far in
this series, and never below `FLOOR` (log(1 + MARGIN): the lab's 10% margin for "differs";
a model that was exact on three points is not exact everywhere). A family with no
graded value yet takes the widest band of the others.

`coverage` counts how many graded values fell inside their interval and how wide the
intervals were (median of (hi - lo) / predicted): an interval that always holds because it
is always enormous says nothing, so both figures are printed together.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

import numpy as np

from lab_utils.results.forecast import ForecastPoint, GradeRow, Interval
from lab_utils.results.points import MARGIN, METRICS

QUANTILE = 0.9
FLOOR = math.log(1 + MARGIN)

# metric -> family (the metric table's): metrics the model gets right or wrong for the same
# reason share a band (the tails miss for reasons of their own: a stall, a late read, one
# slow request)
FAMILY = {m.key: m.family for m in METRICS if m.family}


def error_band(graded: dict[str, list[GradeRow]]) -> dict[str, Any]:
    """The band from the graded rows of earlier forecasts of this series
    (`{what was forecast: its graded rows}`): per family its log half-width, the factor
    exp(log) and how many values it came from, and the source in words."""
    errs: dict[str, list[float]] = {}  # per family, |log(measured / predicted)|
    counts = {}
    for name, rows in graded.items():
        counts[name] = 0
        for r in rows:
            fam, pred, meas = FAMILY.get(r.metric), r.predicted, r.measured
            if fam is None or not r.graded or not pred or not meas or pred <= 0 or meas <= 0:
                continue
            errs.setdefault(fam, []).append(abs(math.log(meas / pred)))
            counts[name] += 1
    fams: dict[str, dict[str, Any]] = {}
    for fam in dict.fromkeys(FAMILY.values()):
        v = errs.get(fam, [])
        if v:
            b = max(float(np.quantile(v, QUANTILE)), FLOOR)
            fams[fam] = {"log": b, "factor": math.exp(b), "n": len(v)}
    widest = max((f["log"] for f in fams.values()), default=FLOOR)
    for fam in dict.fromkeys(FAMILY.values()):
        fams.setdefault(fam, {"log": widest, "factor": math.exp(widest), "n": 0})
    used = [f"{name} ({n} graded values)" if n else f"{name} (no graded value)"
            for name, n in counts.items()]
    source = ("the model's own error on " + ", ".join(used) if any(counts.values())
              else "no graded forecast earlier in this series (" + (", ".join(used) or "none")
              + "): the floor only")
    return {"families": fams, "quantile": QUANTILE, "floor_pct": round((math.exp(FLOOR) - 1) * 100),
            "source": source, "graded_values": sum(counts.values())}


def widen(point: ForecastPoint, band: dict[str, Any]) -> ForecastPoint:
    """A forecast point with every metric's interval widened by the band."""
    metrics = dict(point.metrics)
    for k, fam in FAMILY.items():
        got, f = point.interval(k), band["families"][fam]["factor"]
        if k in metrics:
            metrics[k] = Interval(median=got.median,
                                  lo=None if got.lo is None else got.lo / f,
                                  hi=None if got.hi is None else got.hi * f)
    return point.model_copy(update={"metrics": metrics})


def coverage(rows: Iterable[GradeRow]) -> dict[str, Any]:
    """Over the graded rows of every metric: how many, how many inside their interval, and
    the median interval width relative to the prediction ((hi - lo) / predicted)."""
    graded = [r for r in rows if r.graded]
    widths = [(r.hi - r.lo) / r.predicted for r in graded
              if r.lo is not None and r.hi is not None and r.predicted]
    return {"graded": len(graded), "inside": sum(1 for r in graded if r.inside),
            "median_width": statistics.median(widths) if widths else None}


def coverage_sentence(c: dict[str, Any]) -> str:
    if not c["graded"]:
        return "no graded value"
    width = ("" if c["median_width"] is None
             else f"; median interval width {c['median_width']:.0%} of the prediction")
    return (f"{c['inside']} of {c['graded']} graded values ({c['inside'] / c['graded']:.0%}) "
            f"inside the forecast's interval{width}")


def band_sentence(band: dict[str, Any] | None) -> str:
    if not band:
        return "no error band (recorded before the lab measured the model's own error)"
    fams = ", ".join(f"{fam} by a factor of {f['factor']:.2f} either way ({f['n']} graded "
                     f"value{'s' if f['n'] != 1 else ''})" for fam, f in band["families"].items())
    return (f"widened by how far the model's own forecasts missed so far: {fams}. Each factor "
            f"is the one that {band['quantile']:.0%} of those misses stayed within (measured "
            f"over predicted, or its inverse), and at least {1 + band['floor_pct'] / 100:.2f}; "
            f"from {band['source']}")
