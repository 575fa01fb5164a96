"""The report's claims that compare with documentation or describe the hardware: each
follows the run (it changes when the numbers say the opposite)."""

from __future__ import annotations

from report.test_report import LOADS, metrics, write_baseline, write_disaggregated, write_replicated

from lab_utils import report
from lab_utils.report.conclusions import documentation_claim
from lab_utils.report.summary import machine_claim
from lab_utils.report.verdict import verdict_claim
from lab_utils.results import load_results, write_results
from lab_utils.results.sweep import SweepCpu


def _data(cfg, pd_tps: float):
    write_baseline(cfg)
    write_replicated(cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS})
    write_disaggregated(cfg, {c: metrics(pd_tps * c, 60, 9, 30) for c in LOADS})
    return report.load_report_data(cfg)


def test_the_documentation_sentence_says_whether_the_run_agrees(test_cfg):
    lower = documentation_claim(report.conclusions(_data(test_cfg, 140)).findings)
    # the single instance of these files serves 280 tok/s per concurrency
    assert "against replicated serving, lower at concurrency 1, 2 and 4" in lower.text
    assert lower.text.endswith("So this run disagrees with the documentation only where "
                               "disaggregated serving's output throughput was higher: against "
                               "the single instance at concurrency 1, 2 and 4; against replicated "
                               "serving it agrees at every load.")
    assert {c.better for c in lower.comparisons if c.reference.name == "replicated"} == {"reference"}
    higher = documentation_claim(report.conclusions(_data(test_cfg, 300)).findings)
    assert "against replicated serving, higher at concurrency 1, 2 and 4 (up to 1.5x)" in higher.text
    assert ("higher: against replicated serving at concurrency 1, 2 and 4 and the single "
            "instance") in higher.text
    even = documentation_claim(report.conclusions(_data(test_cfg, 205)).findings)
    assert "against replicated serving, no different at concurrency 1, 2 and 4" in even.text
    assert "higher: against the single instance" in even.text
    below = documentation_claim(report.conclusions(_data(test_cfg, 100)).findings)
    assert below.text.endswith("So this run agrees with the documentation: nowhere was it "
                               "higher by the lab's rule.")


def test_one_machine_is_said_with_the_cores_each_sweep_used(test_cfg, spark_cfg):
    data = _data(test_cfg, 140)
    said = machine_claim(data)
    assert said is not None and "the same machine" in said.text
    assert "was not recorded" in said.text
    env = load_results(test_cfg, "03")
    cpu = SweepCpu(wall_s=10.0, host_cores=2, by_process={"replica-0": 9.0, "replica-1": 8.0})
    sweep = env.payload.sweep.model_copy(update={"cpu": cpu})
    write_results(test_cfg, "03", env.payload.model_copy(update={"sweep": sweep}))
    said = machine_claim(report.load_report_data(test_cfg))
    assert "replicated serving 1.7 of 2" in said.text and said.figures["replicated cores"] == 1.7
    # on a cluster the nodes are machines of their own: nothing to say
    assert machine_claim(_data(spark_cfg, 140)) is None


def test_the_verdict_names_the_best_of_every_architecture(test_cfg):
    # the single instance is best on TTFT p50 here (20 ms against 40 and 60)
    write_disaggregated(test_cfg, {c: metrics(140 * c, 60, 9, 30) for c in LOADS})
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS})
    from report.test_report import baseline_dict, roofline_dict, sweep, write

    write(test_cfg, "01", baseline_dict(sweep("baseline", {c: metrics(100 * c, 20, 10, 30)
                                                           for c in LOADS}),
                                        roofline=roofline_dict()))
    said = verdict_claim(report.conclusions(report.load_report_data(test_cfg)))
    assert ("TTFT p50: the single instance at concurrency 1, 2 and 4 (up to 2.0x lower than "
            "the next)") in said.text
    assert "output throughput: replicated serving at concurrency 1, 2 and 4" in said.text
    assert ("(beaten by none, by the lab's rule: disaggregated serving 30.00 ms / 30.00 ms / "
            "30.00 ms and the single instance 30.00 ms / 30.00 ms / 30.00 ms)") in said.text
    assert all(c.winner for c in said.comparisons if c.metric == "median_ttft_ms")


def test_the_policy_sentence_names_the_win_and_its_cost():
    from lab_utils.results.experiments import policy_claims
    from lab_utils.results.points import Point

    def pt(itl_p99: float, ttft: float) -> Point:
        return Point.model_validate({"mode": "concurrency", "value": 4.0, "repeats": 1,
                                     "mixed": True, "p99_itl_ms": itl_p99,
                                     "median_ttft_ms": ttft, "p99_ttft_ms": 3 * ttft,
                                     "output_throughput": 300.0})

    (won,) = policy_claims({"round_robin": pt(91.5, 24.6), "least_outstanding": pt(12.8, 60.0)})
    assert ("ITL p99 12.80 ms against 91.50 ms (7.1x lower, better: 12.80 ms in one run vs "
            "91.50 ms in one run)") in won.text
    assert "(one load point)" in won.text
    assert won.text.endswith("Least-outstanding won on ITL p99 and cost TTFT p50, TTFT p99.")
    (lost,) = policy_claims({"round_robin": pt(12.8, 24.6), "least_outstanding": pt(91.5, 24.0)})
    assert lost.text.endswith("Least-outstanding won on nothing and cost ITL p99.")
    (even,) = policy_claims({"round_robin": pt(12.8, 24.6), "least_outstanding": pt(12.5, 24.0)})
    assert even.text.endswith("Least-outstanding won on nothing.")
    assert policy_claims({"round_robin": pt(1, 1)}) == []
    # the configured policy pooled with the mixed sweep's point at that load: the runs are
    # counted from the points' repeats, as the range beside them is
    from types import SimpleNamespace
    swept = pt(14.0, 25.0).model_copy(update={"repeats": 2})
    (pooled,) = policy_claims({"round_robin": pt(91.5, 24.6), "least_outstanding": pt(12.8, 60.0)},
                              mixed=SimpleNamespace(combined=[swept]), configured="round_robin")
    assert "round-robin 3 runs (1 its own, 2 the mixed sweep's) and least-outstanding 1 run" \
        in pooled.text


def test_a_verdict_cell_is_a_chain_only_where_every_pair_agrees():
    from lab_utils.report.sections import _ranking
    from lab_utils.results.claims import comparison
    from lab_utils.results.points import Point

    def pt(v: float, lo: float, hi: float) -> Point:
        return Point.model_validate({"mode": "concurrency", "value": 1.0, "repeats": 2,
                                     "p99_itl_ms": {"median": v, "min": lo, "max": hi, "n": 2}})

    def cell(points: dict[str, Point]) -> str:
        names = list(points)
        return _ranking([comparison("p99_itl_ms", (a, "x", "sweep", points[a]),
                                    (b, "x", "sweep", points[b]))
                         for i, a in enumerate(names) for b in names[i + 1:]])

    # baseline ties with both, but replicated beats disaggregated: no chain is true
    loose = cell({"baseline": pt(7.75, 6.0, 9.5), "replicated": pt(7.9, 7.5, 8.3),
                  "disaggregated": pt(10.99, 9.0, 11.5)})
    assert loose == ("baseline = replicated; baseline = disaggregated; "
                     "replicated > disaggregated (1.4x) [baseline = disaggregated though 1.4x "
                     "apart: their ranges over the repeats overlap (6.00-9.50 ms over 2 runs "
                     "vs 9.00-11.50 ms over 2 runs)]")
    tight = cell({"baseline": pt(7.8, 7.6, 8.0), "replicated": pt(8.0, 7.9, 8.2),
                  "disaggregated": pt(11.0, 10.8, 11.2)})
    assert tight == "baseline = replicated > disaggregated (1.4x)"


def test_a_front_door_is_not_named_better_inside_the_lab_proxys_own_run_to_run_gap():
    from lab_utils.results.payloads import FrontDoors
    from lab_utils.results.sweep import BenchmarkResult

    def run(ttft: float) -> BenchmarkResult:
        return BenchmarkResult(target="t", model="m", workload={}, points=[], combined=[
            {"mode": "concurrency", "value": 4.0, "repeats": 1, "median_ttft_ms": ttft}])

    doors = FrontDoors(point="concurrency 4", lab=run(59.0), vllm_router=run(44.0),
                       router_version="0.1.17")
    row = lambda frame: frame[frame["metric"] == "TTFT p50 (ms)"].iloc[0]  # noqa: E731
    assert row(doors.frame())["better"] == "vllm-router 0.1.17"
    noisy = row(doors.frame(run(43.0)))  # the lab proxy alone measured 43 ms in the sweep
    assert noisy["lab proxy, in the sweep"] == 43.0
    # the cell quotes the range it judged by
    assert noisy["better"] == ("= (within 10% of the range of the lab proxy's runs here and in the "
                               "sweep, 43.00-59.00)")
    assert row(doors.frame(run(58.0)))["better"] == "vllm-router 0.1.17"


def _mixed(**values: float):
    from lab_utils.results.points import Point
    return Point.model_validate({"mode": "concurrency", "value": 4.0, "repeats": 1,
                                 "mixed": True, **values})


def test_a_median_winner_that_lost_the_tail_is_said_to_have_lost_it():
    """A two-humped TTFT: the replicas' median lands on the fast side, their p99 is the
    worst; the verdict names who beat them on the tail."""
    from lab_utils.report.conclusions import Conclusions
    from lab_utils.results.claims import comparison
    points = {"replicated": _mixed(median_ttft_ms=30.0, p99_ttft_ms=540.0),
              "baseline": _mixed(median_ttft_ms=250.0, p99_ttft_ms=400.0),
              "tensor-parallel": _mixed(median_ttft_ms=270.0, p99_ttft_ms=285.0)}
    names = list(points)
    findings = [comparison(k, (a, "x", "mixed", points[a]), (b, "x", "mixed", points[b]))
                for k in ("median_ttft_ms", "p99_ttft_ms")
                for i, a in enumerate(names) for b in names[i + 1:]]
    said = verdict_claim(Conclusions([], [], findings, []))
    assert ("TTFT p50: replicated serving (8.3x lower than the next), though on TTFT p99 the "
            "single instance and the model split over the nodes beat it") in said.text
    assert {c.metric for c in said.comparisons} == {"median_ttft_ms", "p99_ttft_ms"}
    # the tail taken away: no "though"
    points["replicated"] = _mixed(median_ttft_ms=30.0, p99_ttft_ms=200.0)
    findings = [comparison(k, (a, "x", "mixed", points[a]), (b, "x", "mixed", points[b]))
                for k in ("median_ttft_ms", "p99_ttft_ms")
                for i, a in enumerate(names) for b in names[i + 1:]]
    assert "though" not in verdict_claim(Conclusions([], [], findings, [])).text


def test_the_verdict_says_where_the_other_routing_policy_beat_its_winner(test_cfg):
    """The sweeps' replicas are round-robin; 03 also ran least-outstanding once at the
    mixed workload's top load. Where that run beat the verdict's winner, the verdict says so;
    where it did not, nothing is added."""
    from lab_utils.results.payloads import Policies
    write_baseline(test_cfg)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS},
                     mixed={c: metrics(150 * c, 80, 12, 400) for c in LOADS})
    write_disaggregated(test_cfg, {c: metrics(140 * c, 60, 9, 30) for c in LOADS},
                        mixed={c: metrics(120 * c, 90, 10, 40) for c in LOADS})
    env = load_results(test_cfg, "03")

    def verdict(itl_p99: float) -> str:
        runs = {"round_robin": _mixed(**metrics(600, 80, 12, 400)),
                "least_outstanding": _mixed(**metrics(600, 80, 12, itl_p99))}
        write_results(test_cfg, "03", env.payload.model_copy(update={
            "policy": "round_robin", "policies": Policies(runs=runs)}))
        data = report.load_report_data(test_cfg)
        return verdict_claim(report.conclusions(data), data).text

    beat = verdict(20.0)
    assert "round-robin replicated serving" in beat
    assert ("ITL p99: disaggregated serving at concurrency 1, 2 and 4 (up to 10x lower than "
            "the next), but 03's replicas routed least-outstanding beat it at concurrency 4 in "
            "their one run (20.00 ms vs 40.00 ms, 2.0x lower)") in beat
    assert ("but 03's replicas routed least-outstanding matched it at concurrency 4 in their "
            "one run (39.00 ms vs 40.00 ms, no difference by the lab's rule)") in verdict(39.0)
    # worse than the winner: nothing added to ITL p99's verdict
    assert verdict(60.0).endswith("ITL p99: disaggregated serving at concurrency 1, 2 and 4 (up "
                                  "to 10x lower than the next).")


def test_the_roofline_caption_says_how_far_below_the_line_one_stream_decoded():
    from types import SimpleNamespace

    from lab_utils.report.plots import roofline_text
    from lab_utils.results.points import Point

    def data(tpot: float):
        r = SimpleNamespace(max_tokens_per_s_per_stream=17.0, memory_bandwidth_GBps=None,
                            weight_bytes=None)
        one = Point.model_validate({"mode": "concurrency", "value": 1.0, "repeats": 1,
                                    "median_tpot_ms": tpot})
        from lab_utils.results.sweep import BenchmarkResult
        sweep = BenchmarkResult(target="t", model="m", workload={}, points=[], combined=[one])
        return SimpleNamespace(baseline=SimpleNamespace(roofline=r), sweeps={"baseline": sweep})

    far = roofline_text(data(200.0))
    assert ("01's single instance at concurrency 1 decoded 5 tokens/s per stream (1000 / its "
            "TPOT p50), 29% of the line; this run does not measure what else set that pace.") in far
    near = roofline_text(data(62.5))  # 16 tokens/s: 94% of the line, no cause asked for
    assert "94% of the line." in near and "what else" not in near


def test_the_workloads_are_printed_as_01_recorded_them():
    from types import SimpleNamespace

    from lab_utils.report import workloads_text
    w = {"input_len": 128, "output_len": 32, "concurrency": [1, 2, 4], "num_prompts": 24,
         "mixed_long_len": 3000, "mixed_long_every": 4, "_about": "ignored"}
    data = SimpleNamespace(sweeps={"baseline": SimpleNamespace(workload=w)}, mixed={})
    assert workloads_text(data).startswith("standard workload: 128-token prompts; 32 output")
    assert "mixed" not in workloads_text(data)
    data.mixed = {"baseline": object()}
    assert workloads_text(data).endswith(
        "1 repeat; concurrency 4; one 3000-token prompt in every 4 requests")


def test_a_forecast_cell_names_which_part_of_the_rule_left_it_no_difference():
    from lab_utils.report.forecast import _verdict
    from lab_utils.results.forecast import GradeRow

    def row(measured, lo=None, hi=None) -> str:
        return _verdict(GradeRow(metric="median_ttft_ms", predicted=10.0, measured=measured,
                                 lo=12.0, hi=20.0, measured_lo=lo, measured_hi=hi))

    assert row(9.5).endswith("(the measured median within 10% of the predicted one)")
    assert row(8.0, 7.0, 12.5).endswith("(the runs' range reaches into the interval)")
    assert row(15.0) == "inside"
