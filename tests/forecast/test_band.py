"""Tests of lab_utils.forecast.band: the error band from graded values (quantile, floor,
families, what is left out), the widened interval, the coverage count and width, the
series feeding 01's and 03's gradings into 04's forecast, and the proxy's and client's
CPU slowing instances that share a machine.
"""

from __future__ import annotations

import math

import pytest

from lab_utils.forecast import band as b
from lab_utils.forecast.model import Architecture, Inputs, Load, forecast
from lab_utils.notebook import make_forecast
from lab_utils.results import write_results
from lab_utils.results.forecast import ForecastPoint, GradeRow
from lab_utils.results.points import FORECAST

from support.payloads import model


def graded(metric: str, predicted: float, measured: float, *, graded: bool = True,
           lo: float | None = None, hi: float | None = None) -> GradeRow:
    return GradeRow(metric, predicted, measured, lo=lo, hi=hi,  # type: ignore[arg-type]  # a test's metric name
                    not_graded=None if graded else "flagged")


def test_band_is_the_quantile_of_log_errors_per_family_with_a_floor():
    rows = ([graded("median_ttft_ms", 10.0, m) for m in (10.0, 12.0, 15.0, 20.0, 8.0)]
            + [graded("median_tpot_ms", 2.0, 2.02)]  # 1% off: the floor decides
            + [graded("median_ttft_ms", 10.0, 1000.0, graded=False)])  # flagged: left out
    band = b.error_band({"01's sweep": rows})
    ttft = band["families"]["TTFT p50"]
    logs = [abs(math.log(m / 10.0)) for m in (10.0, 12.0, 15.0, 20.0, 8.0)]
    assert ttft["n"] == 5
    assert ttft["log"] == pytest.approx(float(__import__("numpy").quantile(logs, b.QUANTILE)))
    assert band["families"]["per-token"]["log"] == pytest.approx(b.FLOOR)
    # no graded value of its own: the widest band of the others
    assert band["families"]["throughput"]["n"] == 0
    assert band["families"]["throughput"]["log"] == pytest.approx(ttft["log"])
    assert band["graded_values"] == 6 and "01's sweep (6 graded values)" in band["source"]


def test_without_anything_graded_the_band_is_the_floor_and_says_so():
    band = b.error_band({"03's replicated serving": []})
    assert all(f["log"] == pytest.approx(b.FLOOR) for f in band["families"].values())
    assert "no graded forecast" in band["source"] and "03's replicated serving" in band["source"]
    assert band["floor_pct"] == 10


def test_widen_multiplies_the_edges_by_the_family_factor():
    band = b.error_band({"x": [graded("median_tpot_ms", 2.0, 3.0)]})
    f = band["families"]["per-token"]["factor"]
    assert f == pytest.approx(1.5)
    # a point as an older results file holds it, flat: it loads as the typed point
    row = ForecastPoint.model_validate({
        "workload": "standard", "mode": "concurrency", "value": 1.0, "load": "concurrency 1",
        "median_tpot_ms": 2.0, "median_tpot_ms_lo": 1.8, "median_tpot_ms_hi": 2.2,
        "median_itl_ms": 2.0, "median_itl_ms_lo": None, "median_itl_ms_hi": None})
    out = b.widen(row, band)
    tpot = out.interval("median_tpot_ms")
    assert tpot.lo == pytest.approx(1.2) and tpot.hi == pytest.approx(3.3)
    assert tpot.median == 2.0 and out.interval("median_itl_ms").lo is None
    assert row.interval("median_tpot_ms").lo == 1.8  # the point widened is a copy


def test_coverage_counts_graded_values_inside_and_the_median_width():
    rows = [graded("median_ttft_ms", 10.0, 11.0, lo=9.0, hi=12.0),    # inside, width 30%
            graded("median_ttft_ms", 10.0, 14.0, lo=8.0, hi=12.0),    # outside, width 40%
            graded("median_tpot_ms", 2.0, 2.0, lo=1.0, hi=3.0),       # inside, width 100%
            graded("median_tpot_ms", 2.0, 9.0, lo=0.0, hi=99.0, graded=False)]  # not counted
    c = b.coverage(rows)
    assert (c["graded"], c["inside"]) == (3, 2)
    assert c["median_width"] == pytest.approx(0.4)
    assert b.coverage_sentence(c) == ("2 of 3 graded values (67%) inside the forecast's "
                                      "interval; median interval width 40% of the prediction")


def test_04s_forecast_is_widened_by_01s_and_03s_graded_errors(test_cfg):
    from test_forecast import measured_sweep, write_01_02

    from lab_utils.results import load_results

    write_01_02(test_cfg)
    concurrency = test_cfg.workload.concurrency
    first = make_forecast(test_cfg, "disaggregated")
    assert "no graded forecast" in first.error_band["source"]
    # 01 forecasts its own sweep and measures it 30% slower than predicted on TTFT
    base = load_results(test_cfg, "01").payload
    fc01 = make_forecast(test_cfg, "baseline", base.profile)
    by_c = {r.value: r for r in fc01.rows}
    sweep = measured_sweep({c: (1.3 * by_c[float(c)].median("median_ttft_ms"),
                                by_c[float(c)].median("median_tpot_ms")) for c in concurrency})
    data = base.model_dump()
    data.update(forecast=fc01.model_dump(), sweep=sweep)
    write_results(test_cfg, "01", model("01", data), software={}, hardware={})
    rep = make_forecast(test_cfg, "replicated")
    from lab_utils.forecast.grade import grade_rows

    from_01 = b.error_band({"01's single-instance sweep": grade_rows(
        fc01, {"standard": load_results(test_cfg, "01").payload.sweep})})
    assert rep.error_band == from_01
    assert rep.error_band["families"]["TTFT p50"]["log"] >= math.log(1.3) - 1e-9
    values = len(FORECAST) * len(concurrency)  # every metric at every load point graded
    assert f"01's single-instance sweep ({values} graded values)" in rep.error_band["source"]
    pd_ = make_forecast(test_cfg, "disaggregated")
    assert "03's replicated serving (no graded value)" in pd_.error_band["source"]
    for row, before in zip(pd_.rows, first.rows, strict=True):
        now, then = row.interval("median_ttft_ms"), before.interval("median_ttft_ms")
        assert now.median == pytest.approx(then.median)  # the same model
        assert now.hi is not None and then.hi is not None and now.hi > then.hi
        assert now.hi == pytest.approx(then.hi / math.exp(b.FLOOR)
                                       * pd_.error_band["families"]["TTFT p50"]["factor"])


def test_the_proxys_and_clients_cpu_slows_instances_sharing_a_machine():
    from test_forecast import growing_inputs

    base = Inputs(**{**growing_inputs().__dict__, "active_cores": 0.9})
    load = Load(input_len=128, output_len=32, num_prompts=24, concurrency=4)
    shared = Architecture(replicas=2, shared_cores=2)
    quiet = forecast(base, shared, load).metrics["median_tpot_ms"]
    # two replicas of 0.9 cores fit on 2 cores: no slowdown without the streaming CPU
    assert quiet == pytest.approx(forecast(base, Architecture(replicas=2), load)
                                  .metrics["median_tpot_ms"])
    busy = Inputs(**{**base.__dict__, "stream_cpu_ms": 1.0})
    slowed = forecast(busy, shared, load).metrics["median_tpot_ms"]
    assert slowed > 1.2 * quiet
    # on machines of their own the proxy's CPU is not the instances'
    assert forecast(busy, Architecture(replicas=2), load).metrics["median_tpot_ms"] == \
        pytest.approx(quiet)
