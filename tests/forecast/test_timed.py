"""The replicated and P/D forecasts calibrated on their instances timed before the sweep
(`forecast.timed`)."""

from __future__ import annotations

import pytest
from forecast.test_forecast import ONE, hand_inputs, write_01_02

from lab_utils.forecast.model import Architecture, Load, forecast
from lab_utils.forecast.timed import calibrate
from lab_utils.notebook import make_forecast
from lab_utils.results.forecast import TimedProfile

PD = Architecture(prefill=1, decode=1)


def timed(ttft: float, step: float | None, n: int = 1, tokens: int = 100) -> TimedProfile:
    return TimedProfile(requests=n, prompt_tokens=tokens, ttft_ms=ttft, step_ms=step,
                       parts={"prefill": 1.0, "proxy hop": 1.0, "KV move": 1.0,
                              "first decode step": 1.0})


def test_a_decode_leg_pays_the_extra_exactly_once():
    # by hand (test_one_prefill_one_decode_by_hand): first token at 35.1 ms, 5 ms per token
    base = forecast(hand_inputs(), PD, ONE).metrics
    extra = forecast(hand_inputs().__class__(**{**hand_inputs().__dict__, "pd_extra_ms": 7.0}),
                     PD, ONE).metrics
    assert extra["median_ttft_ms"] - base["median_ttft_ms"] == pytest.approx(7.0)
    assert extra["median_tpot_ms"] == pytest.approx(base["median_tpot_ms"])
    # one instance has no decode leg: the extra never applies to it
    one = hand_inputs().__class__(**{**hand_inputs().__dict__, "pd_extra_ms": 7.0})
    assert forecast(one, Architecture(), ONE).metrics == forecast(hand_inputs(), Architecture(),
                                                                  ONE).metrics


@pytest.mark.parametrize("measured_ttft, measured_step", [(60.0, 7.5), (35.1, 5.0), (90.0, 10.0)])
def test_the_calibrated_model_reproduces_the_pairs_own_figures(measured_ttft, measured_step):
    inputs, said = calibrate(hand_inputs(), PD, timed(measured_ttft, measured_step),
                             output_len=4)
    assert inputs.decode_beside == pytest.approx(measured_step / 5.0)
    m = forecast(inputs, PD, ONE).metrics
    assert m["median_ttft_ms"] == pytest.approx(measured_ttft, rel=1e-6)
    assert m["median_tpot_ms"] == pytest.approx(measured_step)
    assert f"{measured_ttft:.1f} ms" in said
    assert (f"gets {inputs.pd_extra_ms:.1f} ms more" if inputs.pd_extra_ms > 0
            else "nothing is added to each request's decode leg") in said
    assert "stretches" not in said  # machines of their own: nothing shared to stretch it


def test_a_pair_faster_than_the_model_adds_nothing_and_says_so():
    inputs, said = calibrate(hand_inputs(), PD, timed(20.0, None), output_len=4)
    assert inputs.pd_extra_ms == 0.0
    assert inputs.decode_beside == hand_inputs().decode_beside  # no step measured: kept
    assert "no more than the" in said and "01's factor kept" in said
    assert "nothing is added to each request's decode leg (from the prefill's answer" in said


def test_higher_loads_are_still_predicted_not_copied():
    inputs, _ = calibrate(hand_inputs(), PD, timed(60.0, 7.5), output_len=4)
    four = Load(input_len=100, output_len=4, num_prompts=8, concurrency=4)
    m = forecast(inputs, PD, four).metrics
    assert m["median_ttft_ms"] > 60.0  # queueing at concurrency 4 comes from the model


def with_and_without(cfg, kind: str, ttft: float, step: float):
    """`kind`'s forecast from 01's and 02's results, timed (`ttft`, `step`) and untimed,
    and what the timed one says of its timing."""
    write_01_02(cfg)
    p = timed(ttft, step, n=6, tokens=cfg.workload.input_len)
    fc = make_forecast(cfg, kind, timed=p)
    assert fc.timed == p
    return fc, make_forecast(cfg, kind), fc.sources["timed before the sweep"]


def test_04s_forecast_records_its_timed_pair(test_cfg):
    with_pair, without, said = with_and_without(test_cfg, "disaggregated", 300.0, 2.4)
    assert said.startswith("04's instances timed before the sweep")
    # the rehearsal's instances share one machine: the added cost is said before and after
    assert "once sharing the machine stretches it" in said
    assert "superseded by the timed" in with_pair.sources.get("NIXL's threads",
                                                              "superseded by the timed")
    assert without.timed is None and "timed before the sweep" not in without.sources
    c1 = next(r for r in with_pair.rows if r.workload == "standard" and r.value == 1.0)
    assert c1.median("median_ttft_ms") == pytest.approx(300.0, rel=0.25)
    assert with_pair.splits == without.splits  # the splits: a machine per instance, untimed


def test_03s_forecast_takes_the_replicas_time_per_token_and_nothing_else(test_cfg):
    fc, base, said = with_and_without(test_cfg, "replicated", 300.0, 4.0)
    assert said.startswith("03's instances timed before the sweep")
    assert "a replica's decode steps" in said and "decode leg" not in said
    one = lambda f: next(r for r in f.rows if r.workload == "standard" and r.value == 1.0)  # noqa: E731
    # per token: the timed replicas' (4 ms), not 01's; TTFT keeps the model's own path
    assert one(fc).median("median_tpot_ms") == pytest.approx(4.0, rel=0.05)
    assert one(base).median("median_tpot_ms") < 3.0
    assert one(fc).median("median_ttft_ms") < 100.0  # the timed 300 ms TTFT is not copied in


def test_the_uncalibrated_miss_at_the_timed_point_widens_the_interval(test_cfg):
    write_01_02(test_cfg)
    base = make_forecast(test_cfg, "replicated")
    close = make_forecast(test_cfg, "replicated", timed=timed(
        base.rows[0].median("median_ttft_ms"), base.rows[0].median("median_tpot_ms"), n=6,
        tokens=test_cfg.workload.input_len))
    far = make_forecast(test_cfg, "replicated", timed=timed(
        300.0, 4.0, n=6, tokens=test_cfg.workload.input_len))
    fam = lambda f, k: f.error_band["families"][k]  # noqa: E731
    assert "at its timed point, before calibration (2 graded values)" in far.error_band["source"]
    assert fam(far, "per-token")["n"] == fam(base, "per-token")["n"] + 1
    # a model that missed the timed point by ~2x gets a band at least that wide; one that
    # met it gets none wider than before
    assert fam(far, "per-token")["factor"] > 1.5 > fam(close, "per-token")["factor"]
    assert fam(far, "TTFT p50")["factor"] > fam(base, "TTFT p50")["factor"]


SPLIT = Architecture(ranks=2)


def split_inputs(fixed: float = 0.0):
    """hand_inputs split over 2 ranks: 1,000 B per token over a link of 1,000 B per ms."""
    from dataclasses import replace

    return replace(hand_inputs(), allreduce_bytes_per_token=1000, link_bytes_per_ms=1000.0,
                   tp_step_ms=fixed)


def test_a_split_step_is_half_the_work_then_the_all_reduces_by_hand():
    # prefill step: (5 + 0.1 x 100) / 2 = 7.5, + 100 tokens x 1 ms + 2 fixed -> 109.5, at 6
    # -> first token at 115.5; each decode step: 5 / 2 + 1 token x 1 ms + 2 = 5.5
    m = forecast(split_inputs(2.0), SPLIT, ONE).metrics
    assert SPLIT.name == "1 instance over 2 ranks"
    assert m["median_ttft_ms"] == pytest.approx(115.5)
    assert m["median_tpot_ms"] == pytest.approx(5.5)
    # without a link rate the bytes cost nothing the model can say: only the fixed cost
    from dataclasses import replace

    bare = forecast(replace(split_inputs(2.0), link_bytes_per_ms=None), SPLIT, ONE).metrics
    assert bare["median_tpot_ms"] == pytest.approx(4.5)


@pytest.mark.parametrize("measured_step", [9.0, 20.8])
def test_the_split_instances_time_per_token_sets_the_all_reduces_fixed_cost(measured_step):
    inputs, said = calibrate(split_inputs(), SPLIT, timed(120.0, measured_step), output_len=4)
    # 1/2 of 01's 5 ms step and 1 ms of bytes: the rest is the all-reduces' latency
    assert inputs.tp_step_ms == pytest.approx(measured_step - 3.5)
    assert forecast(inputs, SPLIT, ONE).metrics["median_tpot_ms"] == pytest.approx(measured_step)
    assert f"the forecast adds {measured_step - 3.5:.2f} ms to every step" in said
    faster, said = calibrate(split_inputs(), SPLIT, timed(120.0, 2.0), output_len=4)
    assert faster.tp_step_ms == 0.0 and "adds 0.00 ms to every step" in said


def test_the_split_forecast_takes_00s_link_and_its_timed_instance(test_cfg):
    fc, base, said = with_and_without(test_cfg, "tensor-parallel", 300.0, 20.0)
    assert said.startswith("the split instance timed before the sweep")
    assert "2 all-reduces per layer x 4 layers x 256 x 2 B = 4,096 B" in fc.sources["all-reduce"]
    assert "00's link check did not run" in fc.sources["all-reduce"]  # none written here
    one = lambda f: next(r for r in f.rows if r.workload == "standard" and r.value == 1.0)  # noqa: E731
    assert one(fc).median("median_tpot_ms") == pytest.approx(20.0, rel=0.05)
    assert one(base).median("median_tpot_ms") < 5.0  # untimed: half of 01's step, no latency
