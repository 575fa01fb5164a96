"""The report's claims that compare with documentation or describe the hardware: each
follows the run (it changes when the numbers say the opposite)."""

from __future__ import annotations

from report.test_report import LOADS, metrics, write_baseline, write_disaggregated, write_replicated

from lab_utils import report
from lab_utils.report.conclusions import documentation_claim
from lab_utils.report.summary import machine_claim, verdict_claim
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
    assert "against replicated serving lower at concurrency 1, 2 and 4" in lower.text
    assert "the run agrees against replicated serving; disagrees against the single instance" in lower.text
    assert {c.better for c in lower.comparisons if c.reference.name == "replicated"} == {"reference"}
    higher = documentation_claim(report.conclusions(_data(test_cfg, 300)).findings)
    assert "against replicated serving higher at concurrency 1, 2 and 4 (up to 1.5x)" in higher.text
    assert "the run disagrees against replicated serving at concurrency 1, 2 and 4" in higher.text
    even = documentation_claim(report.conclusions(_data(test_cfg, 205)).findings)
    assert "against replicated serving no different at concurrency 1, 2 and 4" in even.text
    assert "agrees" in even.text


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
    assert "(disaggregated serving and the single instance tie at the top)" in said.text
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
                  "disaggregated": pt(10.99, 9.0, 13.0)})
    assert loose == ("baseline = replicated; baseline = disaggregated; "
                     "replicated > disaggregated (1.4x) [baseline = disaggregated though 1.4x "
                     "apart: their ranges over the repeats overlap (6.00-9.50 ms over 2 runs "
                     "vs 9.00-13.00 ms over 2 runs)]")
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
    row = lambda frame: frame[frame["metric"] == "median_ttft_ms"].iloc[0]  # noqa: E731
    assert row(doors.frame())["better"] == "vllm-router 0.1.17"
    noisy = row(doors.frame(run(43.0)))  # the lab proxy alone measured 43 ms in the sweep
    assert noisy["better"].startswith("= (within") and noisy["lab proxy, in the sweep"] == 43.0
    assert row(doors.frame(run(58.0)))["better"] == "vllm-router 0.1.17"
