"""Each notebook's conclusions are computed from its own numbers: every builder is fed a
result where the notebook's expectation holds and one where it fails, and says which,
with the numbers."""

from __future__ import annotations

from types import SimpleNamespace

from lab_utils.notebook import lessons
from lab_utils.results.sweep import BenchmarkResult

from support.payloads import kv_dict, model


def texts(claims) -> list[str]:
    """The sentences of the claims a builder returned; every comparison behind them names
    where its two sides were measured."""
    for c in claims:
        for cmp in c.comparisons:
            assert cmp.subject.notebook and cmp.reference.notebook
    return [c.text for c in claims]


def conclude_01(*a, **k): return texts(lessons.conclude_01(*a, **k))  # noqa: E704
def conclude_02(*a, **k): return texts(lessons.conclude_02(*a, **k))  # noqa: E704
def conclude_03(*a, **k): return texts(lessons.conclude_03(*a, **k))  # noqa: E704
def conclude_04(*a, **k): return texts(lessons.conclude_04(*a, **k))  # noqa: E704
def conclude_tp(*a, **k): return texts(lessons.conclude_tp(*a, **k))  # noqa: E704


def result(per_load: dict[int, dict[str, float]]) -> BenchmarkResult:
    combined = [{"mode": "concurrency", "value": float(c), "valid": True, "repeats": 1, **m}
                for c, m in per_load.items()]
    return BenchmarkResult(target="t", model="m", workload={}, points=[], combined=combined)


def point(tps: float, ttft: float = 10.0, tpot: float = 2.0, itl_p99: float = 4.0) -> dict:
    return {"output_throughput": tps, "median_ttft_ms": ttft, "p99_ttft_ms": 1.5 * ttft,
            "median_tpot_ms": tpot, "p99_itl_ms": itl_p99}


def test_01_batching_paid_or_not():
    roof = SimpleNamespace(max_tokens_per_s_per_stream=17.0)
    paid = SimpleNamespace(sweep=result({1: point(15, tpot=60), 4: point(55, tpot=70)}),
                           roofline=roof, profile=None)
    (first, second) = conclude_01(paid, "cuda")
    assert first.startswith("Batching paid") and "3.7x" in first and "TPOT p50 was 1.17x higher" in first
    assert "expected" not in first  # no forecast recorded: no expectation claimed
    assert "98% of the memory roofline" in second and "within reach of it" in second
    flat = SimpleNamespace(sweep=result({1: point(600), 4: point(610)}), roofline=None,
                           profile=None)
    said = conclude_01(flat, "cpu")
    assert said[0].startswith("Batching did not pay") and "600 tok/s at 1" in said[0]
    assert "two cores" in said[0]
    # from nothing at the lowest load: no ratio to quote, still a sentence
    from_zero = SimpleNamespace(sweep=result({1: point(0), 4: point(50)}), roofline=None,
                                profile=None)
    said = conclude_01(from_zero, "cpu")
    assert said[0].startswith("Batching paid") and "rose ∞ from concurrency 1" in said[0]


def test_01_says_why_the_request_measured_alone_is_slower_than_the_sweep():
    sweep = result({1: point(15, ttft=12.0), 4: point(55)})
    sweep.workload = {"warmup": 1}
    alone = SimpleNamespace(ttft_ms=43.6)
    said = conclude_01(SimpleNamespace(sweep=sweep, roofline=None, profile=None,
                                       single_request=alone), "cpu")
    (text,) = [str(c) for c in said if str(c).startswith("The request measured alone")]
    assert "took 43.6 ms to its first token, 3.6x higher than the sweep's TTFT p50 at " \
           "concurrency 1 (12 ms)" in text
    assert "the instance's first request since it started, while the sweep sends warm-up" in text
    alone.ttft_ms = 12.5  # within the margin: the same, and no reason given
    said = conclude_01(SimpleNamespace(sweep=sweep, roofline=None, profile=None,
                                       single_request=alone), "cpu")
    (text,) = [str(c) for c in said if str(c).startswith("The request measured alone")]
    assert text.endswith("as the sweep's TTFT p50 at concurrency 1 (12 ms) did by the lab's rule.")


def probe_rows(gbps: dict[int, float]) -> list[dict]:
    return [{"seg_type": "DRAM", "op": "READ", "bytes": b, "bandwidth_GBps": g,
             "median_us": b / g / 1e3, "p99_us": b / g / 1e3, "iterations": 10,
             "checksum_ok": True} for b, g in gbps.items()]


def kv(measured: list[float], gbps: dict[int, float] | None = None) -> object:
    rows = [{"prompt_tokens": n, "kv_bytes": n * 2048, "blocks": n // 32, "predicted_ms": p,
             "measured_ms": m} for n, p, m in zip((128, 512, 2048), (0.1, 0.4, 1.6), measured,
                                                  strict=True)]
    probe = probe_rows(gbps or {1 << 18: 1.0, 1 << 20: 2.0, 1 << 22: 2.6})
    return model("02", kv_dict(pvm=rows, probe_rows=probe)).model_copy(
        update={"block_size": 32, "kv_per_token_bytes": 2048})


def test_02_fixed_cost_seen_or_not():
    said = conclude_02(kv([0.3, 0.5, 1.6]), input_len=128)
    assert said[0].startswith("The shortest prompt paid a fixed cost") and "3.00x" in said[0] and "1.00x" in said[0]
    assert "0.25 MiB" in said[1]
    said = conclude_02(kv([0.1, 0.4, 1.7]))
    assert said[0].startswith("The shortest prompt's transfer took") and "1.00x" in said[0]
    assert "too small to see" in said[0]
    # the same excess (200 µs) inside the shortest size's own variation (p90 - p50 of its
    # READs: 300 µs): no fixed cost is claimed out of the noise
    noisy = kv([0.3, 0.5, 1.6])
    for r in noisy.probe.rows:
        r.update({"p50_us": r["median_us"], "p90_us": r["median_us"] + 300.0})
    said = conclude_02(noisy)
    assert "no fixed cost per transfer stands out of the noise" in said[0]
    assert "excess (200 µs)" in said[0] and "p90 - p50: 300 µs" in said[0]
    # the shortest was the fastest per byte: its 1.00x is by construction, said so
    said = conclude_02(kv([0.1, 0.4, 5.1], {1 << 18: 3.0, 1 << 20: 2.0, 1 << 22: 1.0}))
    assert said[0].startswith("The shortest prompt's transfer was the fastest per byte")
    assert "by construction (1.00x)" in said[0] and "up to 3.19x" in said[0]
    # the bandwidth collapsed at the largest size: said so, not read as "no fixed cost"
    said = conclude_02(kv([0.1, 0.4, 5.1]))
    assert said[0].startswith("The longest prompt's transfer took") and "3.19x" in said[0]
    assert "bandwidth fell at the largest size only" in said[0] and "too small" not in said[0]
    assert "within 10% of the estimate" in said[0]
    assert "more than 10% above the estimate at: 2048 tokens +218.7%" in said[0]
    # both ends above, the shortest's excess (50 µs) inside its variation (300 µs)
    both = kv([0.15, 0.4, 5.1])
    for r in both.probe.rows:
        r.update({"p50_us": r["median_us"], "p90_us": r["median_us"] + 300.0})
    said = conclude_02(both)
    assert said[0].startswith("The longest prompt's transfer took 3.19x")
    assert "an excess of 50 µs, no larger than its own run-to-run variation" in said[0]
    assert "128 tokens +50.0%, 2048 tokens +218.7%" in said[0]
    said = conclude_02(kv([0.15, 0.4, 5.1]))  # no variation recorded: both ends said
    assert said[0].startswith("Both ends took longer")


def test_02_says_where_the_best_bandwidth_came_from():
    largest = " ".join(conclude_02(kv([0.3, 0.5, 1.6])))
    assert "2.6 GB/s, at 4 MiB, its largest transfer" in largest
    assert "by construction" in largest
    # best at 0.5 MiB, the largest 3.2x slower: the sentence follows the run
    mid = " ".join(conclude_02(kv([0.3, 0.5, 1.6], {1 << 19: 3.2, 1 << 22: 1.0})))
    assert "3.2 GB/s, at 0.5 MiB, not at its largest transfer (4 MiB reached 1 GB/s, 3.2x less)" in mid
    assert "its largest transfer:" not in mid
    # best at 0.5 MiB by 4%: inside the margin, no size stands out and no fall is claimed
    near = " ".join(conclude_02(kv([0.3, 0.5, 1.6], {1 << 19: 2.7, 1 << 22: 2.6})))
    assert "its largest transfer (4 MiB) reached 2.6 GB/s, within 10% of it" in near
    assert "bandwidth fell" not in near


def test_03_capacity_added_or_not():
    base = result({1: point(100), 4: point(300)})
    said = conclude_03(base, result({1: point(100), 4: point(560)}), device="cuda")
    assert said[0].startswith("Two replicas added capacity") and "1.9x higher" in said[0]
    assert said[1] == ("At concurrency 1, one request at a time, medians and tails: TTFT p50 "
                       "10 ms alone, 10 ms on replicas (no difference by the lab's rule); TTFT "
                       "p99 15 ms alone, 15 ms on replicas (no difference by the lab's rule); "
                       "ITL p99 4 ms alone, 4 ms on replicas (no difference by the lab's rule).")
    said = conclude_03(base, result({1: point(70, ttft=14), 4: point(180, ttft=20)}),
                       device="cpu")
    assert said[0].startswith("Two replicas served less than one instance")  # lost everywhere
    assert "1: 1.4x lower, 4: 1.7x lower" in said[0]
    even = conclude_03(base, result({1: point(100), 4: point(310)}), device="cpu")
    assert even[0].startswith("Two replicas did not add capacity")  # no difference at the top
    assert "two cores" in said[0] and "(1.4x higher)" in said[1] and "two cores" in said[1]


def test_04_itl_tail_protected_or_not():
    rep = result({1: point(100), 4: point(300)})
    dis = result({1: point(90, ttft=30), 4: point(200, ttft=40)})
    proof = SimpleNamespace(ok=True, prompts=[1, 2, 3], tokens_equal=3)
    said = conclude_04(rep, dis, result({4: point(250, itl_p99=40)}),
                       result({4: point(180, itl_p99=12)}), proof, "cuda")
    assert said[0].startswith("Disaggregation protected the ITL tail") and "40 ms on replicas, 12 ms" in said[0]
    assert "(3.3x lower)" in said[0] and "proved for 3 prompts" in said[1]
    assert "(one load point)" in said[0]
    assert ("what it cost there (every metric the replicas won at that point): output "
            "throughput 180.0 tok/s disaggregated vs 250.0 tok/s on replicas (1.4x lower)"
            ) in said[0]
    assert said[2].startswith(
        "Output throughput, disaggregated against replicated, at every load both measured: "
        "concurrency 1: 90 against 100 tok/s (1.11x lower); concurrency 4: 200 against 300 "
        "tok/s (1.5x lower). vLLM's documentation says disaggregated prefill does not raise "
        "throughput; against replicated serving it did not at any load both measured")
    said = conclude_04(rep, dis, result({4: point(250, itl_p99=15)}),
                       result({4: point(180, itl_p99=19)}), proof, "cpu")
    assert said[0].startswith("Disaggregation did not protect the ITL tail: ")
    assert "(1.3x higher)" in said[0] and "NIXL" in said[0]
    # within the lab's margin: no difference, said so, and no number that reads as a win
    said = conclude_04(rep, result({1: point(90), 4: point(320)}),
                       result({4: point(250, itl_p99=15)}), result({4: point(180, itl_p99=14)}),
                       proof, "cuda")
    assert said[0].startswith("Disaggregation did not protect the ITL tail "
                              "measurably: ") and "(no difference by the lab's rule)" in said[0]
    assert "concurrency 4: 320 against 300 tok/s (no difference by the lab's rule)" in said[2]
    higher = conclude_04(rep, result({1: point(150), 4: point(450)}), None, None, None)
    assert any("against replicated serving it did at concurrency 1 and 4." in t
               for t in higher), higher
    said = conclude_04(rep, dis, None, None, None)
    assert "not compared" in said[0]


def test_04_names_what_01_measured_beside_nixls_threads():
    rep = result({1: point(100), 4: point(300)})
    dis = result({1: point(90, tpot=5.0), 4: point(200)})
    beside = SimpleNamespace(ratio=2.68, threads=2, policy="SCHED_OTHER nice 19 slice 0.1 ms")
    base = SimpleNamespace(sweep=result({1: point(100, tpot=2.0)}),
                           profile=SimpleNamespace(beside_busy=beside))
    said = conclude_04(rep, dis, result({4: point(250, itl_p99=15)}),
                       result({4: point(180, itl_p99=19)}), None, "cpu", base)
    assert ("01 measured a decode step on this machine 2.7x slower beside 2 stand-ins for "
            "NIXL's threads (SCHED_OTHER nice 19 slice 0.1 ms); here TPOT at concurrency 1 was "
            "2.5x 01's.") in said[0]
    far = SimpleNamespace(sweep=base.sweep, profile=SimpleNamespace(
        beside_busy=SimpleNamespace(ratio=4.3, threads=2, policy=beside.policy)))
    said = conclude_04(rep, dis, result({4: point(250, itl_p99=15)}),
                       result({4: point(180, itl_p99=19)}), None, "cpu", far)
    assert ("here TPOT at concurrency 1 was 2.5x 01's, so 01's stand-ins do not match what the "
            "decode met here") in said[0]
    without = SimpleNamespace(sweep=base.sweep, profile=SimpleNamespace(beside_busy=None))
    said = conclude_04(rep, dis, result({4: point(250, itl_p99=15)}),
                       result({4: point(180, itl_p99=19)}), None, "cpu", without)
    assert "01 measured" not in said[0] and "polls without pause" in said[0]
    assert ". On the CPU rehearsal every instance shares" in said[0]
    assert "rehearsal on the CPU rehearsal" not in said[0]
    with_single = SimpleNamespace(sweep=base.sweep, mixed=result({4: point(90, itl_p99=25)}),
                                  profile=SimpleNamespace(beside_busy=None))
    said = conclude_04(rep, dis, result({4: point(250, itl_p99=15)}),
                       result({4: point(180, itl_p99=19)}), None, "cpu", with_single)
    assert "19 ms disaggregated (1.3x higher); 25 ms on 01's single instance (01's mixed sweep at the same load, baseline_metrics.json);" in said[0], said[0]
    waiting = conclude_04(rep, dis, result({4: point(250, itl_p99=15)}),
                          result({4: point(180, itl_p99=19)}), None, "cpu", without, "waiting")
    assert "polls without pause" not in waiting[0]
    assert "the proxy and the load generator." in waiting[0]


def test_04_names_the_first_token_tail_when_there_is_one():
    rep = result({1: point(100, ttft=10), 4: point(300)})
    tail = {**point(90, ttft=26), "p99_ttft_ms": 487.0}
    said = conclude_04(rep, result({1: tail, 4: point(200)}), None, None, None, "cpu",
                       nixl="lowered")
    assert ("The first-token tail at concurrency 1: TTFT p99 487 ms disaggregated against its "
            "median of 26 ms (19x; replicated 15 ms)") in said[-1]
    assert "NIXL's lowered threads" in said[-1]
    said = conclude_04(rep, result({1: tail, 4: point(200)}), None, None, None, "cuda")
    assert said[-1].endswith("(19x; replicated 15 ms).")
    said = conclude_04(rep, result({1: tail, 4: point(200)}), None, None, None, "cpu",
                       nixl="waiting")  # no thread was lowered: no price of lowering named
    assert said[-1].endswith("(19x; replicated 15 ms).")
    no_tail = conclude_04(rep, result({1: point(90, ttft=26), 4: point(200)}), None, None, None)
    assert not any("first-token tail" in s for s in no_tail)


def tp_payload(sweep: BenchmarkResult, rows: list[dict]):
    from lab_utils.results import TensorParallelPayload

    return TensorParallelPayload(topology="tensor-parallel", instances=[], sweep=sweep,
                                 ranks=2, same_output=rows)


def same_row(equal: bool = True, ok: bool = True, at: int | None = None,
             margin: float | None = None, why: str = "same tokens") -> dict:
    return {"prompt_tokens": 40, "tokens_equal": equal, "tokens_ok": ok, "diverged_at": at,
            "divergence_margin": margin, "tokens_why": why}


def test_tp_output_and_cost_or_not():
    base = result({1: point(100, tpot=10.0), 4: point(300)})
    paid = tp_payload(result({1: point(150, tpot=6.0), 4: point(500)}),
                      [same_row(), same_row(False, True, 29, 0.12, "near tie at token 29")])
    said = conclude_tp(base, paid, {"replicated": result({4: point(400)})}, "cuda")
    assert said[0].startswith("The split model's output passed its check") and "1 of 2 prompts" in said[0]
    assert "1 parted from them at a near tie (output token 29, counted from 0, 0.12 nats)" in said[0]
    assert "04's proof allows a near tie after the first token only" in said[0]
    assert said[1].startswith("Split, the model was faster per token") and "6 ms" in said[1]
    assert "400 tok/s replicated, 500 split (1.2x higher)" in said[2]
    assert "was ahead on this model" not in said[2]
    lost = tp_payload(result({1: point(40, tpot=25.0), 4: point(120)}),
                      [same_row(False, False, 0, 3.2, "differs at token 0 by 3.200 nats")])
    said = conclude_tp(base, lost, {"replicated": result({4: point(400)}),
                                    "disaggregated": result({4: point(300)})}, "cpu")
    assert said[0].startswith("The split model's output failed its check for 1 of 1")
    assert "differs at token 0 by 3.200" in said[0] and "exact equality on the CPU" in said[0]
    assert said[1].startswith("Split, the model was slower per token") and "2.5x higher" in said[1]
    assert "Gloo on loopback" in said[1]
    assert "replicated was ahead in this run" in said[2] and "fits one node" not in said[2]
    assert "300 tok/s disaggregated, 120 split" in said[3]


def test_04_itl_tail_is_also_held_against_03s_other_routing_policy():
    """Routing alone moved the replicas' tail in 03: the P/D win is stated against that run
    too (round-robin, the configured policy, pooled with its mixed-sweep point)."""
    from lab_utils.results.payloads import Policies
    from lab_utils.results.points import Point

    rep, dis = result({4: point(300)}), result({4: point(200, ttft=40)})
    mixed_rep = result({4: point(250, itl_p99=200)})
    runs = {"round_robin": Point.model_validate({**mixed_rep.combined[0].model_dump()}),
            "least_outstanding": Point.model_validate(
                {"mode": "concurrency", "value": 4.0, "repeats": 1,
                 **{k: {"median": v, "min": v, "max": v} for k, v in
                    point(260, itl_p99=16.8).items()}})}
    said = conclude_04(rep, dis, mixed_rep, result({4: point(180, itl_p99=11.2)}), None, "cuda",
                       policies=Policies(runs=runs), policy="round_robin")
    assert said[0].startswith("Disaggregation protected the ITL tail")
    assert ("against 03's same replicas routed least-outstanding (one run), ITL p99 11.20 ms "
            "disaggregated vs 16.80 ms routed so (1.5x lower)") in said[0]


def test_04_where_the_other_routing_policy_beat_the_tail_the_headline_says_so():
    """Against round-robin P/D wins the tail, against least-outstanding it loses it: the
    first sentence says so, and what the replicas also won is not called a cost."""
    from lab_utils.results.payloads import Policies
    from lab_utils.results.points import Point

    rep, dis = result({4: point(300)}), result({4: point(200, ttft=40)})
    mixed_rep = result({4: point(250, itl_p99=200)})
    runs = {"round_robin": Point.model_validate({**mixed_rep.combined[0].model_dump()}),
            "least_outstanding": Point.model_validate(
                {"mode": "concurrency", "value": 4.0, "repeats": 1,
                 **{k: {"median": v, "min": v, "max": v} for k, v in
                    point(260, itl_p99=8.0).items()}})}
    said = conclude_04(rep, dis, mixed_rep, result({4: point(180, itl_p99=11.2)}), None, "cuda",
                       policies=Policies(runs=runs), policy="round_robin")
    assert said[0].startswith("Disaggregation protected the ITL tail against round-robin "
                              "replicas, but least-outstanding routing protected it more: ")
    assert ("against 03's same replicas routed least-outstanding (one run), ITL p99 11.20 ms "
            "disaggregated vs 8.00 ms routed so (1.4x higher): routing alone kept the tail lower, and those replicas also "
            "won output throughput") in said[0]
    assert "at the cost of" not in said[0]


def test_01_a_tpot_cost_the_top_loads_spread_hides_is_said_where_it_shows():
    """TPOT at the top load spread too wide to differ, but at concurrency 2 it was higher by
    the rule: the batching sentence says so, not only 'did not differ'."""
    def m(v: float, lo: float, hi: float) -> dict:
        return {"median": v, "min": lo, "max": hi, "n": 2}

    sweep = result({1: {"output_throughput": m(300, 295, 305), "median_ttft_ms": m(12, 11.8, 12.2),
                        "median_tpot_ms": m(3.04, 3.0, 3.08)},
                    2: {"output_throughput": m(520, 510, 530), "median_ttft_ms": m(13, 12.8, 13.2),
                        "median_tpot_ms": m(3.77, 3.7, 3.84)},
                    4: {"output_throughput": m(900, 880, 920), "median_ttft_ms": m(25, 24, 26),
                        "median_tpot_ms": m(3.83, 3.39, 4.28)}})
    (first, *_) = conclude_01(SimpleNamespace(sweep=sweep, roofline=None, profile=None), "cuda")
    assert "while TPOT p50 did not differ by the lab's rule (3.04 ms -> 3.83 ms; at concurrency " \
           "2 it was 1.2x higher (3.77 ms))" in first
