"""One measured load point, the metric table, and the one rule for "this differs".

Imports nothing from lab_utils (the standard library and pydantic only): every layer that
measures, records, judges or shows a point can import it.

- `METRICS`: every headline metric once, in vLLM's field name (`Metric.key`), with its
  label, unit, the direction that is better and its display format. `COMPARED` are the
  ones the notebooks' tables and the report compare; `FORECAST` the ones a forecast shows.
- `Point`: one load point combined over its repeats (mode, value, mixed, repeats, valid),
  one `Measured` per metric (median, min, max and how many repeats measured it; None when
  not measured). Results files written before `Point` existed keep the flat form
  (`median_ttft_ms`, `median_ttft_ms_min`, `_max`, `_spread`); they load unchanged.
- `compare` / `differs`: the lab's single rule for whether two measurements differ,
  used by every place that judges (the notebooks' conclusions and comparison tables, the
  report's verdicts, the forecast grading and the load generator's agreement benchmark).
  `compare_points` applies it to two `Point`s, and names no winner when the two runs'
  prefix-cache hit shares differ (`unlike_caches`): a cache hit skips a prefill, so such
  runs did not do the same work. `metric_rows` sets two points side by side, metric by
  metric, with the margin and the better one: the rows of the notebooks' comparison tables.

Over 400 lines on purpose: the table, the point and the rule are read together by every
judge, and a split would put the rule's definition of a metric two files from the rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from pydantic import BaseModel, model_validator

# ---- the metric table ---------------------------------------------------------------------


MetricKey = Literal["request_throughput", "output_throughput", "total_token_throughput",
                    "request_goodput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                    "p99_itl_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms",
                    "p99_e2el_ms"]
"""A headline metric's name, as vLLM names it: what mypy checks every key against."""


@dataclass(frozen=True)
class Metric:
    """A headline metric: vLLM's field name, how people read it, and which way is better."""

    key: MetricKey  # vLLM's field name (`vllm bench serve`'s result JSON)
    label: str  # in sentences: "TTFT p50", "output throughput"
    unit: str
    higher_is_better: bool
    fmt: str  # format spec of a value shown to people
    # timed between tokens: its gaps are the client's where the load generator read many
    # tokens at once (`measure.benchmark.read_together_share`), so not compared or graded there
    per_token: bool = False
    # the forecast's error band it shares: metrics the model gets right or wrong for the
    # same reason (`forecast.band`); None: not forecast
    family: str | None = None

    @property
    def heading(self) -> str:
        """A table column's name: "TTFT p50 (ms)"."""
        return f"{self.label} ({self.unit})"

    @property
    def way(self) -> str:
        """The better direction, in words: "higher" or "lower"."""
        return "higher" if self.higher_is_better else "lower"

    def text(self, value: float | None, unit: bool = True) -> str:
        """A value for people ("12.3 ms"); "–" when there is none."""
        if value is None or not math.isfinite(value):
            return "–"
        return f"{value:{self.fmt}} {self.unit}" if unit else f"{value:{self.fmt}}"

    def better(self, x: float, y: float) -> bool:
        """Whether x is better than y on this metric."""
        return x > y if self.higher_is_better else x < y

    def times(self, x: float, y: float) -> str:
        """How far apart two values are, as a ratio with the direction in words, the larger
        over the smaller: "2.6x higher" (x against y), "1.3x lower"; "∞" when one is 0."""
        if x == y:
            return "the same"
        big, small = max(abs(x), abs(y)), min(abs(x), abs(y))
        return f"{factor(big / small if small else math.inf)} {'higher' if x > y else 'lower'}"


def factor(r: float) -> str:
    """A ratio of two values, the larger over the smaller, as the lab writes it: "1.7x",
    "12x", "∞"; two decimals near the rule's 10% margin, where one would round a gap across
    it ("1.06x" and "1.13x", not "1.1x" for both)."""
    return "∞" if not math.isfinite(r) else f"{r:.{2 if r < 1.2 else 1 if r < 10 else 0}f}x"


METRICS = (
    Metric("request_throughput", "request throughput", "req/s", True, ",.2f"),
    Metric("output_throughput", "output throughput", "tok/s", True, ",.1f", family="throughput"),
    Metric("total_token_throughput", "total token throughput", "tok/s", True, ",.1f"),
    Metric("request_goodput", "goodput", "req/s", True, ",.2f", family="throughput"),
    Metric("median_ttft_ms", "TTFT p50", "ms", False, ",.2f", family="TTFT p50"),
    Metric("p99_ttft_ms", "TTFT p99", "ms", False, ",.2f", family="tails"),
    Metric("median_itl_ms", "ITL p50", "ms", False, ",.2f", per_token=True, family="per-token"),
    Metric("p99_itl_ms", "ITL p99", "ms", False, ",.2f", per_token=True, family="tails"),
    Metric("median_tpot_ms", "TPOT p50", "ms", False, ",.2f", per_token=True, family="per-token"),
    Metric("p99_tpot_ms", "TPOT p99", "ms", False, ",.2f"),
    Metric("median_e2el_ms", "E2E latency p50", "ms", False, ",.1f"),
    Metric("p99_e2el_ms", "E2E latency p99", "ms", False, ",.1f"),
)
KEYS = tuple(m.key for m in METRICS)
assert get_args(MetricKey) == KEYS, "METRICS and MetricKey name the same metrics, in order"
BY_KEY = {m.key: m for m in METRICS}


def metric(key: MetricKey | Metric) -> Metric:
    """The table's entry for a key (a Metric is returned as it is)."""
    return key if isinstance(key, Metric) else BY_KEY[key]


def select(*keys: str) -> tuple[Metric, ...]:
    """The table's entries for `keys`, in the table's order."""
    unknown = set(keys) - set(KEYS)
    if unknown:
        raise KeyError(f"not in the metric table: {sorted(unknown)}")
    return tuple(m for m in METRICS if m.key in keys)


# Compared in the notebooks' tables, their comparisons and the report.
COMPARED = select("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                  "median_itl_ms", "p99_itl_ms", "median_tpot_ms")
# Shown and graded in a forecast.
FORECAST = select("output_throughput", "request_goodput", "median_ttft_ms", "p99_ttft_ms",
                  "median_itl_ms", "p99_itl_ms", "median_tpot_ms")


# ---- the measured point -------------------------------------------------------------------


class Measured(BaseModel):
    """One metric of one load point over its repeats: the median, the min-max range and
    `n`, the number of repeats that measured it (a range is known only from 2 on)."""

    median: float
    min: float
    max: float
    n: int = 1

    @property
    def spread(self) -> float:
        """max - min over the repeats (0 with one repeat)."""
        return self.max - self.min

    @property
    def ranged(self) -> bool:
        """Whether the min-max range says something: measured at least twice."""
        return self.n >= 2

    @property
    def runs(self) -> list[float] | None:
        """Each repeat's value where median and range pin them down (n <= 3), else None."""
        return {1: [self.median], 2: [self.min, self.max], 3: [self.min, self.median, self.max]}.get(self.n)

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Measured | None:
        """The median, min and max of `values`, one per repeat; None when there are none."""
        vals = [float(v) for v in values if v is not None]
        if not vals:
            return None
        return cls(median=statistics.median(vals), min=min(vals), max=max(vals), n=len(vals))

    @classmethod
    def one(cls, value: float | None) -> Measured | None:
        """A single value (one repeat, a prediction without an interval)."""
        return None if value is None else cls(median=value, min=value, max=value, n=1)


class Point(BaseModel):
    """One load point combined over its repeats: the median of each headline metric with
    its min-max range. `valid` is False when any repeat was invalid (too many failed
    requests, `benchmark.summarize`)."""

    mode: str  # "concurrency" | "rate"
    value: float
    mixed: bool = False
    repeats: int = 1
    valid: bool = True
    invalid_reason: str | None = None  # the first invalid repeat's reason
    # the highest share (%) of prompt tokens over the repeats that the instances served
    # from their prefix cache (their counters); None: not read (older results files)
    prefix_cache_hit_pct: float | None = None
    request_throughput: Measured | None = None
    output_throughput: Measured | None = None
    total_token_throughput: Measured | None = None
    request_goodput: Measured | None = None
    median_ttft_ms: Measured | None = None
    p99_ttft_ms: Measured | None = None
    median_itl_ms: Measured | None = None
    p99_itl_ms: Measured | None = None
    median_tpot_ms: Measured | None = None
    p99_tpot_ms: Measured | None = None
    median_e2el_ms: Measured | None = None
    p99_e2el_ms: Measured | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        """Accept the flat form results files were written in before this model:
        `median_ttft_ms: 12.0, median_ttft_ms_min: 11.0, median_ttft_ms_max: 13.5,
        median_ttft_ms_spread: 2.5`, every range over the point's `repeats`."""
        if not isinstance(data, dict):
            return data
        flat = [k for k in KEYS if _is_number(data.get(k))]
        if not flat:
            return data
        n = data.get("repeats", 1)
        out = {k: v for k, v in data.items()
               if not any(k in (f"{m}_min", f"{m}_max", f"{m}_spread") for m in flat)}
        for k in flat:
            v = data[k]
            lo, hi = data.get(f"{k}_min"), data.get(f"{k}_max")
            out[k] = {"median": v, "min": v if lo is None else lo,
                      "max": v if hi is None else hi, "n": n}
        return out

    def of(self, key: MetricKey | Metric) -> Measured | None:
        """The metric `key` (a key of the table, or its Metric)."""
        return getattr(self, metric(key).key)

    def median(self, key: MetricKey | Metric) -> float | None:
        """The metric's median over the repeats, None when not measured."""
        m = self.of(key)
        return None if m is None else m.median

    @property
    def load(self) -> str:
        """"concurrency 4", "rate 2.5"."""
        return f"{self.mode} {self.value:g}"


def pooled(points: list[Point]) -> Point:
    """One configuration measured in several runs (one `Point` each, at the same load) as
    one point: per metric the median over every repeat of them all (where each point's
    repeats are known: up to three each, `Measured.runs`; else the median of the points'
    medians), the min-max range over all of them and their repeats together; valid when
    every run was."""
    first = points[0]
    fields: dict[str, Any] = {}
    for k in KEYS:
        got = [m for p in points if (m := p.of(k)) is not None]
        if got:
            each = [m.runs for m in got]
            middle = (statistics.median(v for vs in each if vs for v in vs)
                      if all(each) else statistics.median(m.median for m in got))
            fields[k] = Measured(median=middle, min=min(m.min for m in got),
                                 max=max(m.max for m in got), n=sum(m.n for m in got))
    hits = [p.prefix_cache_hit_pct for p in points if p.prefix_cache_hit_pct is not None]
    return Point(mode=first.mode, value=first.value, mixed=first.mixed,
                 repeats=sum(p.repeats for p in points), valid=all(p.valid for p in points),
                 prefix_cache_hit_pct=max(hits) if hits else None, **fields)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---- the one rule -------------------------------------------------------------------------

MARGIN = 0.10
"""A difference counts only when it is larger than this fraction of the smaller value.

Why 10%: on the 2-core CPU rehearsal every instance, the proxy and the load generator
share the same two cores, and the run-to-run variation of one point is several percent;
10% is also the margin at which the lab's load generator was validated against
`vllm bench serve` (`python -m lab_utils.bench.loadgen`), so a smaller difference is not
one the lab's own ruler can vouch for. The report used to count, with one repeat, any
difference over a 5% noise floor: that called one-repeat noise a win.
"""


class Verdict(NamedTuple):
    """`compare`'s answer. `better`: "a" or "b", the better side by the metric's
    direction when they differ, else None; `gap_pct`: |a - b| in % of the smaller value
    (what MARGIN is held against; inf when the smaller is 0, None when not comparable);
    `beyond_margin`: the gap alone is larger than MARGIN; `basis`: why, in a few words."""

    differs: bool
    better: str | None
    gap_pct: float | None
    beyond_margin: bool
    basis: str


def compare(a: Measured | None, b: Measured | None, key: MetricKey | Metric | None = None,
            margin: float = MARGIN, *, b_is_interval: bool = False) -> Verdict:
    """Whether b differs from a, and which is better (with `key`, the metric's direction).

    The rule: a difference counts only when the medians are further apart than `margin`
    (10%) of the smaller one AND, when both sides were measured at least twice, their
    min-max ranges over the repeats do not overlap and the medians are further apart than
    either range is wide (ranges that miss each other by a hair are noise when one side's
    own runs moved further than the gap; `b_is_interval`: b's range is a forecast's
    interval, not runs, so only the overlap counts); when only one side was, the single
    value stands more than the margin beyond that side's range. With one repeat on both
    sides the spread is unknown and the margin alone decides. Not measured on either side (None,
    not finite): no difference.
    """
    if a is None or b is None or not (math.isfinite(a.median) and math.isfinite(b.median)):
        return Verdict(False, None, None, False, "not measured on both sides")
    x, y = a.median, b.median
    gap, small = abs(x - y), min(abs(x), abs(y))
    gap_pct = gap / small * 100 if small else (0.0 if gap == 0 else math.inf)
    apart = (f"gap {gap_pct:.1f}% of the smaller value" if math.isfinite(gap_pct)
             else "one side is 0")
    beyond = gap > margin * small
    if not beyond:
        return Verdict(False, None, gap_pct, False, f"{apart}, within the {margin:.0%} margin")
    past = f"{apart}, beyond the {margin:.0%} margin"
    if a.ranged and b.ranged:
        overlap = a.min <= b.max and b.min <= a.max
        ranges = f"min-max ranges over {a.n} and {b.n} repeats"
        if overlap:
            return Verdict(False, None, gap_pct, True, f"{past}, but the {ranges} overlap")
        # ranges that only just miss each other can still be one side's own run-to-run
        # movement: the medians must also be further apart than either side's range is wide
        wide = max(a.max - a.min, b.max - b.min)
        if gap <= wide and not b_is_interval:
            return Verdict(False, None, gap_pct, True,
                           f"{past}, and the {ranges} do not overlap, but the medians are no "
                           f"further apart ({gap:.3g}) than one side's runs moved among "
                           f"themselves ({wide:.3g})")
        basis = (f"{past}, and the {ranges} do not overlap"
                 + ("" if b_is_interval else
                    ", and the medians are further apart than either range is wide"))
    elif a.ranged or b.ranged:
        # one run against a range: the range is what that side's runs already moved by,
        # so the single value must stand beyond the margin from its nearer end
        ranged, one = (a, b) if a.ranged else (b, a)
        edge = min((ranged.min, ranged.max), key=lambda e: abs(e - one.median))
        inside = ranged.min <= one.median <= ranged.max
        near = abs(one.median - edge) <= margin * min(abs(one.median), abs(edge))
        if inside or near:
            return Verdict(False, None, gap_pct, True,
                           f"{past}, but the single run is "
                           f"{'inside' if inside else 'within the margin of'} the other side's "
                           f"min-max range over {ranged.n} runs")
        basis = (f"{past}, and the single run is beyond it from the other side's min-max range "
                 f"over {ranged.n} runs")
    else:
        basis = f"{past}; one repeat, spread unknown"
    better = None if key is None else ("a" if metric(key).better(x, y) else "b")
    return Verdict(True, better, gap_pct, True, basis)


def differs(a: Measured | None, b: Measured | None, margin: float = MARGIN) -> bool:
    """Whether a and b differ by the lab's rule (`compare`)."""
    return compare(a, b, margin=margin).differs


def unlike_caches(a: float | None, b: float | None) -> str | None:
    """Why two runs cannot be ranked against each other: their prefix-cache hit shares (%,
    `Point.prefix_cache_hit_pct`) differ; None when they do not (both unknown, or equal to
    0.1 percentage point, or one unknown and the other 0)."""
    if a is not None and b is not None and abs(a - b) < 0.1:
        return None
    if not a and not b:
        return None
    shown = ["not read" if v is None else f"{v:.1f}%" for v in (a, b)]
    return (f"prefix-cache hit shares differ ({shown[0]} vs {shown[1]}): a cache hit skips "
            "the prefill, so the runs did not do the same work and no winner is named")


def compare_points(a: Point, b: Point, key: MetricKey | Metric) -> Verdict:
    """The rule (`compare`) on metric `key` of two points; when their prefix-cache hit
    shares differ (`unlike_caches`), no difference claimed and no winner named, the basis
    saying why."""
    verdict = compare(a.of(key), b.of(key), key)
    why = unlike_caches(a.prefix_cache_hit_pct, b.prefix_cache_hit_pct)
    if why is None:
        return verdict
    return verdict._replace(differs=False, better=None, basis=f"{verdict.basis}; but {why}")


def rounded(v: float | None) -> float | None:
    """A median for a table whose columns also hold words (pandas' `round` skips those)."""
    return None if v is None else round(v, 2)


def metric_rows(a: Point, b: Point, names: tuple[str, str], *, label: str = "heading",
                mark_invalid: bool = False) -> list[dict[str, Any]]:
    """Two runs of one load point side by side, one row per compared metric (`COMPARED`):
    the metric (its `label`: "heading", "TTFT p50 (ms)", or "key", vLLM's name), a's and
    b's medians under `names`, the ratio (b against a with the direction in words: "1.3x
    lower"; None when either is missing) and the better one by the lab's rule
    (`compare_points`): "=" when they do not differ ("= (runs' spread)" when further apart
    than the margin but not beyond the runs' own spread), "invalid" with `mark_invalid`
    when either run is invalid. What the notebooks' comparison tables are made of."""
    both = a.valid and b.valid
    rows = []
    for m in COMPARED:
        x, y = a.median(m), b.median(m)
        v = compare_points(a, b, m)
        tie = ("=" if not v.beyond_margin or v.differs else "= (caches differ)"
               if "prefix-cache hit shares differ" in v.basis else "= (runs' spread)")
        better = {"a": names[0], "b": names[1]}.get(v.better or "", tie)
        rows.append({"metric": getattr(m, label), names[0]: rounded(x), names[1]: rounded(y),
                     "ratio": None if x is None or y is None else m.times(y, x),
                     "better": "invalid" if mark_invalid and not both else better})
    return rows


RULE = (f"a difference counts only when it is larger than {MARGIN:.0%} of the smaller value "
        "and, where both sides were measured at least twice, their min-max ranges over the "
        "repeats do not overlap and the medians are further apart than either range is wide "
        "(a gap no larger than one side's own run-to-run movement is not counted); where one side was measured once, that value stands more "
        f"than {MARGIN:.0%} beyond the other side's range (with one repeat on both sides the "
        "spread is unknown and the margin alone decides)")

__all__ = ["BY_KEY", "COMPARED", "FORECAST", "KEYS", "MARGIN", "METRICS", "RULE", "Measured",
           "Metric", "MetricKey", "Point", "Verdict", "compare", "compare_points", "differs", "metric", "metric_rows", "pooled", "rounded",
           "select",
           "unlike_caches"]
