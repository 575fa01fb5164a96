"""The typed measured point, the metric table and the one rule for "this differs": every
place that judges (the notebooks' conclusions, the comparison table's better/worse column,
the report's verdicts, the forecast grading, the load generator's agreement benchmark) is
fed the same pairs of measurements and must give the same verdict; results files written
with flat metric keys load into typed points."""

from __future__ import annotations

import ast
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab_utils.bench.loadgen import verdict as agreement
from lab_utils.forecast import grade as g
from lab_utils.measure.benchmark import HEADLINE, combine
from lab_utils.notebook import lessons
from lab_utils.notebook.compare import compare_frame
from lab_utils.report.conclusions import compare as report_compare
from lab_utils.report.data import ReportData
from lab_utils.results import load_envelope, points
from lab_utils.results.forecast import Forecast
from lab_utils.results.points import BY_KEY, COMPARED, METRICS, Measured, Point, compare, differs
from lab_utils.results.sweep import BenchmarkResult, RepeatSummary

from support.payloads import baseline_dict, model, sweep_dict

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "flat-points" / "baseline_metrics.json"
TOP, ONE = 4.0, 1.0  # the load points conclude_03 compares (highest and lowest)
FILLER = {"output_throughput": 100.0, "median_ttft_ms": 10.0}

# (what, repeats of side a, repeats of side b, differ?)
CASES = [
    ("one repeat, 12% apart", [100.0], [112.0], True),
    ("one repeat, 8% apart", [100.0], [108.0], False),
    ("one repeat against three whose range reaches it, 12% apart", [100.0],
     [95.0, 112.0, 120.0], False),
    ("one repeat 20% beyond the nearer end of three", [100.0], [120.5, 125.0, 130.0], True),
    ("ranges overlap, medians 50% apart", [80.0, 100.0, 130.0], [120.0, 150.0, 160.0], False),
    ("3% apart, ranges disjoint", [99.0, 100.0, 101.0], [102.5, 103.0, 103.5], False),
    ("30% apart, ranges disjoint", [99.0, 100.0, 101.0], [129.0, 130.0, 131.0], True),
    ("two repeats each, 20% apart, ranges disjoint", [99.0, 101.0], [119.0, 121.0], True),
    # the report's case: ranges 0.01 apart, but one side's two runs 1.97 apart, the
    # medians only 1.42: a gap inside one side's own movement
    ("two repeats each, 18% apart, ranges a hair apart, one range wider than the gap",
     [7.55, 8.40], [8.41, 10.38], False),
    ("two repeats each, 18% apart, ranges a hair apart and as wide as each other",
     [7.00, 8.40], [8.41, 9.81], True),
    ("b lower, 25% apart, one repeat", [125.0], [100.0], True),
    ("zero against a value", [0.0], [5.0], True),
    ("zero against zero", [0.0], [0.0], False),
]
KEYS = ("output_throughput", "median_ttft_ms")  # one of each direction


def _sweep(per_load: dict[float, dict[str, list[float]]]) -> BenchmarkResult:
    """A sweep whose points combine these repeats (every list of a load equally long)."""
    combined = []
    for load, metrics in per_load.items():
        (n,) = {len(v) for v in metrics.values()}
        summaries = [RepeatSummary(**{k: v[i] for k, v in metrics.items()}) for i in range(n)]
        combined.append(combine(summaries, "concurrency", load))
    return BenchmarkResult(target="t", model="m", workload={}, points=[], combined=combined)


def _pair(key: str, a: list[float], b: list[float]) -> tuple[BenchmarkResult, BenchmarkResult]:
    """Two sweeps measuring `key` as a and b at both load points, the other keys fixed."""
    def side(vals: list[float]) -> BenchmarkResult:
        rest = {k: [v] * len(vals) for k, v in FILLER.items() if k != key}
        return _sweep({ONE: {key: vals, **rest}, TOP: {key: vals, **rest}})
    return side(a), side(b)


def _expected(key: str, a: list[float], b: list[float], differ: bool) -> str | None:
    if not differ:
        return None
    ma, mb = statistics.median(a), statistics.median(b)
    return "a" if BY_KEY[key].better(ma, mb) else "b"


# ---- each place that judges, asked for its verdict ("a", "b" or None) ------------------------


def rule(key, a, b) -> str | None:
    v = compare(Measured.of(a), Measured.of(b), key)
    assert v.differs == (v.better is not None) == differs(Measured.of(a), Measured.of(b))
    return v.better


def notebook_conclusions(key, a, b) -> str | None:
    """Notebook 03's sentences: capacity added (throughput at the top load) and the same
    TTFT at concurrency 1."""
    base, rep = _pair(key, a, b)
    said = lessons.conclude_03(base, rep, device="cuda")
    if key == "output_throughput":
        won = said[0].text.startswith("Two replicas added capacity")
        (c,) = [c for c in said[0].comparisons if c.value == TOP]
        assert won == (c.better == "subject")
        return {"subject": "b", "reference": "a", None: None}[c.better]
    (c,) = [c for c in said[1].comparisons if c.metric == key]
    assert (f"({c.margin()})" in said[1].text) == (c.better is not None)
    return {"subject": "b", "reference": "a", None: None}[c.better]


def report_verdict(key, a, b) -> str | None:
    """The report's finding for replicated (b) against baseline (a) at the top load."""
    base, rep = _pair(key, a, b)
    data = ReportData("p", "cpu", Path("."), {}, {}, {"baseline": base, "replicated": rep}, {})
    (f,) = [f for f in report_compare(data) if f.metric == key and f.value == TOP]
    assert (f.subject.name, f.reference.name) == ("replicated", "baseline")
    return {"replicated": "b", "baseline": "a", None: None}[f.winner]


def loadgen_agreement(key, a, b) -> str | None:
    """The agreement benchmark says only whether the tools differ; the side is the rule's."""
    said = agreement(a, b)
    assert said in ("agree", "agree (spread)", "DIFFER")
    return rule(key, a, b) if said == "DIFFER" else None


def forecast_grading(key, a, b) -> str | None:
    """a measured, b predicted (its min-max as the prediction's interval)."""
    measured, _ = _pair(key, a, b)
    ranged = len(b) > 1
    row = {"workload": "standard", "mode": "concurrency", "value": TOP,
           "load": f"concurrency {TOP:g}", key: statistics.median(b),
           f"{key}_lo": min(b) if ranged else None, f"{key}_hi": max(b) if ranged else None}
    fc = Forecast(architecture="replicated", made_at="t", sources={}, rows=[row])
    (r,) = [r for r in g.grade_rows(fc, {"standard": measured}) if r.metric == key]
    if r.differs != compare(Measured.of(a), Measured.of(b), b_is_interval=True).differs:
        return "not the interval rule"
    # an interval is not runs: where the rule would call the gap the runs' own movement
    # (both ranged, apart, but no further than the wider range), the interval rule differs
    return rule(key, a, b) if compare(Measured.of(a), Measured.of(b)).differs else None


def comparison_table(key, a, b) -> str | None:
    """The notebooks' side-by-side table (serving.compare_frame), its "better" column."""
    base, rep = _pair(key, a, b)
    reference = SimpleNamespace(notebook="01", payload=SimpleNamespace(sweep=base))
    frame = compare_frame(reference, rep, ("one", "two"))
    row = frame[(frame["metric"] == BY_KEY[key].heading) & (frame["load"] == "concurrency 4")]
    b = row["better"].item()
    return None if b.startswith("=") else {"one": "a", "two": "b"}[b]


JUDGES = [rule, notebook_conclusions, report_verdict, loadgen_agreement, forecast_grading,
          comparison_table]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize(("what", "a", "b", "differ"), CASES, ids=[c[0] for c in CASES])
def test_every_judge_gives_the_rules_verdict(what, a, b, differ, key):
    want = _expected(key, a, b, differ)
    got = {judge.__name__: judge(key, a, b) for judge in JUDGES}
    assert got == dict.fromkeys(got, want), what


def test_the_rule_in_numbers():
    one = Measured.one
    assert not differs(one(100.0), one(110.0))  # exactly 10% of the smaller: not larger
    assert differs(one(100.0), one(110.5))
    assert differs(one(110.5), one(100.0))  # symmetric
    # 10% of the smaller value, not of either side: 100 vs 109.5 is 8.7% of the larger
    assert not differs(one(100.0), one(109.5))
    # a range known on one side only: the single value must stand beyond the margin from
    # the range's nearer end (the range is what that side's runs already moved by)
    assert not differs(Measured.of([80.0, 100.0, 130.0]), one(120.0))  # inside it
    assert not differs(Measured.of([80.0, 100.0]), one(108.0))  # 8% past its top
    v = compare(Measured.of([80.0, 100.0]), one(112.0))  # 12% past it
    assert v.differs and "beyond it from the other side's min-max range over 2 runs" in v.basis
    v = compare(Measured.of([99.0, 100.0, 101.0]), Measured.of([129.0, 130.0, 131.0]),
                "median_ttft_ms")
    assert (v.differs, v.better, round(v.gap_pct, 1), v.beyond_margin) == (True, "a", 30.0, True)
    assert "do not overlap" in v.basis and "3 and 3 repeats" in v.basis
    v = compare(Measured.of([80.0, 100.0, 130.0]), Measured.of([120.0, 150.0, 160.0]))
    assert (v.differs, v.beyond_margin) == (False, True) and "overlap" in v.basis
    assert "one repeat, spread unknown" in compare(one(1.0), one(2.0)).basis
    assert compare(one(0.0), one(5.0)).gap_pct == float("inf")


def test_not_measured_is_no_difference_everywhere():
    assert compare(None, Measured.one(5.0)) == (False, None, None, False,
                                                 "not measured on both sides")
    assert not differs(Measured.one(float("nan")), Measured.one(5.0))
    base = _sweep({TOP: {"output_throughput": [100.0]}})
    rep = _sweep({TOP: {"output_throughput": [200.0], "median_ttft_ms": [10.0]}})
    data = ReportData("p", "cpu", Path("."), {}, {}, {"baseline": base, "replicated": rep}, {})
    assert {f.metric for f in report_compare(data)} == {"output_throughput"}
    frame = compare_frame(SimpleNamespace(notebook="01", payload=SimpleNamespace(sweep=base)),
                          rep, ("one", "two"))
    assert frame.set_index("metric")["better"].to_dict()[BY_KEY["median_ttft_ms"].heading] == "="
    fc = Forecast(architecture="replicated", made_at="t", sources={},
                  rows=[{"workload": "standard", "mode": "concurrency", "value": TOP,
                         "load": "concurrency 4", "median_ttft_ms": 12.0}])
    (r,) = [r for r in g.grade_rows(fc, {"standard": base}) if r.metric == "median_ttft_ms"]
    assert r.measured is None and not r.differs and not r.graded


# ---- the typed point and its older flat form ---------------------------------------------------


def test_an_older_flat_results_file_loads_into_typed_points():
    raw = json.loads(FIXTURE.read_text())["payload"]["sweep"]["combined"]
    assert "median_ttft_ms_min" in raw[0] and "median_ttft_ms_spread" in raw[0]
    sweep = load_envelope(FIXTURE).payload.sweep
    assert len(sweep.combined) == len(raw) == 3
    for p, flat in zip(sweep.combined, raw, strict=True):
        assert isinstance(p, Point)
        assert (p.mode, p.value, p.mixed, p.repeats, p.valid) == (
            flat["mode"], flat["value"], flat["mixed"], flat["repeats"], flat["valid"])
        for key in HEADLINE:
            m = p.of(key)
            assert (m.median, m.min, m.max, m.n) == (flat[key], flat[f"{key}_min"],
                                                      flat[f"{key}_max"], flat["repeats"])
            assert m.spread == pytest.approx(flat[f"{key}_spread"])
    # written again, it is the typed form, and reads back the same
    again = BenchmarkResult.model_validate(json.loads(sweep.model_dump_json()))
    assert again == sweep and "median_ttft_ms_min" not in again.model_dump()["combined"][0]


def test_flat_points_in_a_payload_dict_load_too():
    flat = {"mode": "rate", "value": 2.5, "valid": True, "repeats": 2, "median_ttft_ms": 20.0,
            "median_ttft_ms_min": 18.0, "median_ttft_ms_max": 23.0,
            "median_ttft_ms_spread": 5.0, "output_throughput": 300.0}
    (p,) = model("01", baseline_dict(sweep_dict(combined=[flat]))).sweep.combined
    assert p.median_ttft_ms == Measured(median=20.0, min=18.0, max=23.0, n=2)
    assert p.output_throughput == Measured(median=300.0, min=300.0, max=300.0, n=2)
    assert p.p99_itl_ms is None and p.median("p99_itl_ms") is None and p.load == "rate 2.5"
    assert not p.mixed


def test_combine_builds_the_point_of_its_repeats():
    runs = [RepeatSummary(median_ttft_ms=v) for v in (10, 14, 11)]
    p = combine(runs, "concurrency", 4.0, mixed=True)
    assert p.median_ttft_ms == Measured(median=11, min=10, max=14, n=3)
    assert p.request_goodput is None and p.mixed and p.repeats == 3


# ---- the metric table ----------------------------------------------------------------------------


def test_one_table_for_every_headline_metric():
    assert sorted(HEADLINE) == sorted(m.key for m in METRICS) == sorted(Point.model_fields.keys()
                                                                         - {"mode", "value", "mixed",
                                                                            "repeats", "valid",
                                                                            "invalid_reason",
                                                                            "prefix_cache_hit_pct"})
    assert len({m.label for m in METRICS}) == len(METRICS)
    assert [m.key for m in COMPARED] == ["request_throughput", "output_throughput",
                                         "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                                         "p99_itl_ms", "median_tpot_ms"]
    ttft = BY_KEY["median_ttft_ms"]
    assert (ttft.heading, ttft.text(1234.56), ttft.text(None), ttft.way) == (
        "TTFT p50 (ms)", "1,234.56 ms", "–", "lower")
    assert BY_KEY["output_throughput"].better(2.0, 1.0) and ttft.better(1.0, 2.0)
    with pytest.raises(KeyError):
        points.select("median_ttft")


def test_points_imports_nothing_from_lab_utils():
    """It moves to the bottom of the package (lab_utils/results/points.py)."""
    tree = ast.parse(Path(points.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {n.split(".")[0] for n in names} <= {"__future__", "collections", "dataclasses",
                                                  "math", "pydantic", "statistics", "typing"}


def test_a_pooled_point_is_the_median_over_every_run_it_names():
    """03's configured policy: its own run (6.64 req/s) and the mixed sweep's two repeats
    (5.97, 6.33) are three runs, and the sentence says so: their median is 6.33, not the
    median of the two points' medians (6.40), which no three runs have."""
    own = Point(mode="concurrency", value=4.0, mixed=True, repeats=1, valid=True,
                request_throughput=Measured.of([6.64]))
    sweep = Point(mode="concurrency", value=4.0, mixed=True, repeats=2, valid=True,
                  request_throughput=Measured.of([6.33, 5.97]))
    both = points.pooled([own, sweep])
    m = both.of("request_throughput")
    assert (m.median, m.min, m.max, m.n, both.repeats) == (6.33, 5.97, 6.64, 3, 3)
    # more than three repeats in one point: its values are not known, the medians pooled
    many = Point(mode="concurrency", value=4.0, mixed=True, repeats=4, valid=True,
                 request_throughput=Measured.of([1.0, 2.0, 3.0, 10.0]))
    assert points.pooled([own, many]).of("request_throughput").median == statistics.median([6.64, 2.5])


def test_a_comparison_row_says_why_a_gap_beyond_the_margin_is_no_difference():
    from lab_utils.results.points import metric_rows

    def pt(runs: list[float]) -> Point:
        return combine([RepeatSummary(median_ttft_ms=v, output_throughput=100.0) for v in runs],
                       "concurrency", 1.0)

    rows = {r["metric"]: r for r in metric_rows(pt([10.0, 14.0]), pt([13.0, 15.0]), ("a", "b"))}
    assert rows["TTFT p50 (ms)"]["better"] == "= (runs' spread)"  # 17% apart, runs overlap
    assert rows["output throughput (tok/s)"]["better"] == "="  # the same
    rows = {r["metric"]: r for r in metric_rows(pt([10.0, 10.5]), pt([14.0, 14.5]), ("a", "b"))}
    assert rows["TTFT p50 (ms)"]["better"] == "a"


def test_a_forecast_interval_is_not_held_to_the_width_test():
    """Measured twice, both runs below a wide forecast interval and more than 10% from the
    prediction: the forecast differs, though the interval is wider than the gap (an
    interval is not run-to-run movement); the runs' own rule would not say so."""
    runs, interval = Measured.of([2.90, 2.94]), Measured(median=5.12, min=3.13, max=7.0, n=2)
    assert compare(runs, interval, b_is_interval=True).differs
    assert not compare(runs, interval).differs
    reaching = Measured.of([2.90, 3.20])  # the runs reach into the interval: no difference
    assert not compare(reaching, interval, b_is_interval=True).differs
