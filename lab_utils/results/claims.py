"""Claims: what a sentence about a result says, as data the results can check.

One comparison engine (`comparison`) turns two measured points into a typed `Comparison`:
which metric, at which load and workload, the two sides (the architecture, the results
file and run it comes from, the value with its spread over the repeats), the lab's one rule's
verdict (`points.compare_points`) and the ratio. A `Claim` is a sentence with the
comparisons that make it true and the rule that ties them to it (`Claim.holds`: each
comparison's verdict as it was when the sentence was written). Its sentence is rendered
from them by the code that makes it; the claim is saved beside the results
(`claims.json`, one section per notebook and one for the report), and `audit` re-reads
every results file a comparison names, compares again and lists every claim that no longer
holds or whose numbers differ (`check`).

A claim with no comparison quotes figures (`Claim.figures`: a name and its value) that
the audit cannot re-derive from a results file; it is counted as backed, not as checked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from lab_utils.results.points import (
    BY_KEY,
    Measured,
    MetricKey,
    Point,
    compare_points,
    pooled,
)
from lab_utils.util.atomic import atomic_write_text

Run = str  # "sweep", "mixed", or a notebook's other run ("switch steps256", "policy round_robin")
Better = Literal["subject", "reference"]
CLAIMS_FILE = "claims.json"
WORKLOAD_OF: dict[str, str] = {"sweep": "standard", "mixed": "mixed"}


def workload_of(run: str) -> str:
    """The workload a run measured: the standard one for the sweep, mixed for the rest."""
    return WORKLOAD_OF.get(run, "mixed")


class Side(BaseModel):
    """One side of a comparison: who (as sentences name it), where it was measured (the
    notebook whose results file holds it and which of its runs), and the measured value."""

    name: str
    notebook: str  # "01", "03", "04", "tp": results.store.RESULTS
    run: Run = "sweep"
    mode: str = "concurrency"  # the side's own load: a comparison may set two loads apart
    load: float = 0.0
    value: Measured
    hits_pct: float | None = None  # prefix-cache hit share of the point (%)


class Comparison(BaseModel):
    """Two sides on one metric at one load, judged by the lab's one rule."""

    metric: MetricKey
    mode: str  # "concurrency" | "rate"
    value: float  # the load
    subject: Side
    reference: Side
    better: Better | None  # None: no difference by the rule
    gap_pct: float | None
    basis: str

    @property
    def workload(self) -> str:
        return workload_of(self.subject.run)

    @property
    def load(self) -> str:
        """"concurrency 4"."""
        return f"{self.mode} {self.value:g}"

    @property
    def winner(self) -> str | None:
        return None if self.better is None else getattr(self, self.better).name

    @property
    def ratio(self) -> float:
        """The larger median over the smaller (inf when one is 0)."""
        a, b = abs(self.subject.value.median), abs(self.reference.value.median)
        big, small = max(a, b), min(a, b)
        return big / small if small else (1.0 if big == small else math.inf)

    def margin(self) -> str:
        """The subject against the reference in words: "1.7x lower"."""
        return BY_KEY[self.metric].times(self.subject.value.median, self.reference.value.median)

    def no_difference(self) -> str:
        """Why the rule named no winner, with what each side measured: "no difference by
        the lab's rule (45.0-60.0 ms over 2 runs vs 140.0-220.0 ms over 2 runs: ...)"."""
        return f"no difference by the lab's rule ({self.spans()}: {self.basis})"

    def spans(self) -> str:
        """What each side measured, as the rule reads it: "45.0-60.0 ms over 2 runs vs
        140.0 ms in one run" (subject first)."""
        m = BY_KEY[self.metric]

        def span(v: Measured) -> str:
            if v.n < 2:
                return f"{m.text(v.median)} in one run"
            return f"{m.text(v.min, unit=False)}-{m.text(v.max)} over {v.n} runs"

        return f"{span(self.subject.value)} vs {span(self.reference.value)}"

    def values(self, subject: str = "", reference: str = "") -> str:
        """"12.3 ms vs 31.0 ms" (subject first), each value followed by its side's name where
        one is given ("12.3 ms disaggregated vs 31.0 ms on replicas")."""
        m = BY_KEY[self.metric]
        a, b = m.text(self.subject.value.median), m.text(self.reference.value.median)
        return " vs ".join(" ".join(filter(None, pair)) for pair in ((a, subject), (b, reference)))


Located = tuple[str, str, str, Point]
"""A point and where it was measured: (name, notebook, run: "sweep" | "mixed", point)."""


def comparison(metric: MetricKey, subject: Located, reference: Located) -> Comparison:
    """The engine: compare two located points on `metric` by the lab's one rule. Both
    points must have measured the metric."""
    (sn, _, srun, sp), (rn, _, rrun, rp) = subject, reference
    if sp.of(metric) is None or rp.of(metric) is None:
        raise ValueError(f"{metric} not measured on both sides ({sn} {srun}, {rn} {rrun})")
    s, r = (Side.model_validate(dict(name=n, notebook=nb, run=run, mode=p.mode,
                                     load=float(p.value), value=p.of(metric),
                                     hits_pct=p.prefix_cache_hit_pct))
            for n, nb, run, p in (subject, reference))
    v = compare_points(sp, rp, metric)
    return Comparison(metric=metric, mode=sp.mode, value=float(sp.value), subject=s, reference=r,
                      better={"a": "subject", "b": "reference"}.get(v.better or ""),
                      gap_pct=v.gap_pct, basis=v.basis)


class Graded(BaseModel):
    """What a sentence says of a forecast's grade (`forecast.grade`), re-derived by the
    audit from the forecast and the measurements the notebook's results file holds: one
    value (`metric` at `load` of `workload`: inside its interval or not), or the tally of
    the headline metrics (`tally`: median absolute error %, graded values, inside, differ)."""

    notebook: str
    workload: str | None = None
    load: str | None = None
    metric: str | None = None
    inside: bool | None = None
    tally: dict[str, float | int | None] | None = None


class Claim(BaseModel):
    """A sentence about this run's results and what makes it true: the comparisons behind
    it (each verdict by the lab's rule), the forecast grades it states, and other figures
    it quotes that no results file lets the audit re-derive."""

    where: str  # "01" ... "04", "tp", "report"
    text: str
    comparisons: list[Comparison] = []
    graded: list[Graded] = []
    figures: dict[str, float] = {}

    @property
    def checkable(self) -> bool:
        return bool(self.comparisons or self.graded)

    def __str__(self) -> str:
        return self.text


def claim(where: str, text: str, *comparisons: Comparison, graded: Sequence[Graded] = (),
          figures: Mapping[str, float | None] | None = None, **named: float) -> Claim:
    """A claim: its sentence, the comparisons and grades that make it true, and the other
    figures it quotes (`figures`, or by name)."""
    quoted = {**(figures or {}), **named}
    return Claim(where=where, text=text, comparisons=list(comparisons), graded=list(graded),
                 figures={k: float(v) for k, v in quoted.items() if v is not None})


# ---- saved beside the results, and checked again ------------------------------------------


def load_claims(results_dir: str | Path) -> dict[str, list[Claim]]:
    """Every section of `claims.json` ({} when there is none)."""
    path = Path(results_dir) / CLAIMS_FILE
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {k: [Claim.model_validate(c) for c in v] for k, v in raw.items()}


def save_claims(results_dir: str | Path, where: str, claims: list[Claim]) -> Path:
    """Replace section `where` of `claims.json` with `claims` (the others are kept)."""
    book = load_claims(results_dir)
    book[where] = list(claims)
    path = Path(results_dir) / CLAIMS_FILE
    atomic_write_text(path, json.dumps({k: [c.model_dump(mode="json") for c in v]
                                        for k, v in book.items()}, indent=1) + "\n")
    return path


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _problems_of_side(side: Side, point: Point | None, metric: MetricKey) -> list[str]:
    if point is None:
        return [f"{side.name}: no valid {side.run} point in notebook {side.notebook}'s results"]
    got = point.of(metric)
    if got is None:
        return [f"{side.name}: {metric} not in notebook {side.notebook}'s {side.run}"]
    if not (_same(got.median, side.value.median) and _same(got.min, side.value.min)
            and _same(got.max, side.value.max)):
        return [f"{side.name} {BY_KEY[metric].label}: the claim says "
                f"{side.value.median:.4g} ({side.value.min:.4g}-{side.value.max:.4g}), "
                f"the results {got.median:.4g} ({got.min:.4g}-{got.max:.4g})"]
    return []


# A side measured in several runs of one configuration names them joined by this
# ("policy round_robin + mixed"): checked against the runs pooled (`points.pooled`).
RUNS_JOINED = " + "


def _located(points: dict[tuple[str, str, str, float], Point], side) -> Point | None:
    found = [points.get((side.notebook, run, side.mode, side.load))
             for run in side.run.split(RUNS_JOINED)]
    if any(p is None for p in found):
        return None
    return found[0] if len(found) == 1 else pooled([p for p in found if p is not None])


def check(c: Claim, points: dict[tuple[str, str, str, float], Point]) -> list[str]:
    """What is wrong with claim `c` against the results (`points`: every valid combined
    point by notebook, run, mode and load): a side whose numbers differ, or a comparison
    whose verdict by the rule is not the one the sentence was written from."""
    out = []
    for cmp in c.comparisons:
        sides = [(s, _located(points, s)) for s in (cmp.subject, cmp.reference)]
        wrong = [p for s, pt in sides for p in _problems_of_side(s, pt, cmp.metric)]
        if wrong:
            out += wrong
            continue
        (_, sp), (_, rp) = sides
        assert sp is not None and rp is not None
        again = compare_points(sp, rp, cmp.metric)
        better = {"a": "subject", "b": "reference"}.get(again.better or "")
        if better != cmp.better:
            said = cmp.winner or "no difference"
            now = getattr(cmp, better).name if better else "no difference"
            out.append(f"{BY_KEY[cmp.metric].label} at {cmp.load} ({cmp.workload}), "
                       f"{cmp.subject.name} vs {cmp.reference.name}: the claim rests on "
                       f"{said}, the rule now says {now}")
    return out


__all__ = ["CLAIMS_FILE", "Claim", "Comparison", "Graded", "Located", "Side", "check", "claim", "comparison",
           "load_claims", "save_claims"]
