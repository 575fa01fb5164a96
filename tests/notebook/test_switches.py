"""01's two switches: the table row from a mixed run, and conclusions that follow the
numbers (each sentence changes when the measurement says the opposite)."""

from __future__ import annotations

import pytest

from lab_utils.notebook.switches import (
    CPU_DEFAULT_BUDGET,
    budget_as_served,
    switch_run,
    switches_frame,
    variants,
)
from lab_utils.results.experiments import SMALL_BUDGET, chunking_claim, others_claim, prefix_claim
from lab_utils.results.payloads import PrefixTwice, Switches, SwitchRun
from lab_utils.results.points import Measured, Point
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult


def _req(prompt_len: int, ttft: float, error: str | None = None) -> dict:
    return {"index": 0, "prompt_len": prompt_len, "max_tokens": 32, "ttft_ms": ttft,
            "itl_ms": [2.0], "error": error}


def _result(itl_p99: float) -> BenchmarkResult:
    reqs = [_req(3000, 90.0), _req(128, 10.0), _req(128, 12.0), _req(3000, 110.0),
            _req(128, 999.0, error="timeout")]
    points = [BenchmarkPoint(mode="concurrency", value=4.0, repeat=r,
                             summary={}, requests=reqs)
              for r in range(2)]
    combined = [Point.model_validate({"mode": "concurrency", "value": 4.0, "repeats": 2,
                                      "prefix_cache_hit_pct": 0.0, "p99_itl_ms": itl_p99,
                                      "median_itl_ms": 2.5})]
    return BenchmarkResult(target="t", model="m", workload={}, points=points, combined=combined)


def test_row_reads_the_highest_concurrency_and_splits_long_from_short():
    run = switch_run("served", "as served", 2048, _result(40.0), long=3000)
    assert run.point.median("p99_itl_ms") == 40.0 and run.point.value == 4
    assert run.long_ttft_ms == 100.0  # the failed request is left out
    assert run.other_ttft_ms == 11.0
    row = switches_frame(Switches(chunked_prefill=[run])).loc["as served"]
    assert row["ITL p99 ms"] == "40" and row["prefix-cache hits %"] == "0"


def test_budget_is_read_from_vllms_start_line_or_is_the_cpu_default(test_cfg):
    log = "x\nINFO Chunked prefill is enabled with max_num_batched_tokens=512.\n"
    assert budget_as_served(test_cfg, log) == 512
    cpu = test_cfg.model_copy(update={"vllm": test_cfg.vllm.model_copy(update={"device": "cpu"})})
    gpu = test_cfg.model_copy(update={"vllm": test_cfg.vllm.model_copy(update={"device": "cuda"})})
    assert budget_as_served(cpu, "nothing here") == 2048
    assert budget_as_served(gpu, "nothing here") is None


def test_variants_hold_the_longest_prompt_when_chunking_is_off(test_cfg):
    (_, _, served), (_, _, small), (_, _, off) = variants(test_cfg)
    assert served == []  # as served: nothing added
    assert small == ["--max-num-batched-tokens", str(SMALL_BUDGET)]
    assert off[:1] == ["--no-enable-chunked-prefill"]
    assert int(off[-1]) >= test_cfg.vllm.max_model_len


def _run(suffix: str, budget: int, p99: float | None, long_ttft: float | None = 80.0,
         other: float | None = None) -> SwitchRun:
    point = Point(mode="concurrency", value=4.0, repeats=1,
                  p99_itl_ms=Measured.one(p99))
    return SwitchRun(suffix=suffix, label=suffix, budget=budget, point=point,
                     long_ttft_ms=long_ttft, other_ttft_ms=other)


def _sw(small_p99, off_p99, small_ttft, off_ttft) -> Switches:
    return Switches(chunked_prefill=[_run("served", 2048, 30.0),
                                     _run("steps256", SMALL_BUDGET, small_p99, small_ttft),
                                     _run("unchunked", 4096, off_p99, off_ttft)])


def test_chunking_sentence_follows_the_numbers():
    won = chunking_claim(_sw(8.0, 90.0, 120.0, 90.0))
    assert "cut the streams' tail (11x lower)" in won.text and "1.3x higher" in won.text
    assert "(one load point, concurrency 4)" in won.text
    c, served, bare = won.comparisons
    assert (c.better, c.subject.run, c.reference.run) == ("subject", "switch steps256",
                                                          "switch unchunked")
    assert (served.better, served.reference.run) == ("subject", "switch served")
    # chunking off against as served as well (ITL p99 90 ms against 30 ms)
    assert (bare.subject.run, bare.reference.run, bare.better) == (
        "switch unchunked", "switch served", "reference")
    assert "chunking off against as served: off did not cut it (3.0x higher)" in won.text
    assert "and 30 ms as served" in won.text and "as served they cut it (3.8x lower)" in won.text
    # the first tokens of the lower tail against each setting ranked (served: long 80 ms)
    assert ("first tokens with the lower tail (steps256 against unchunked): the long prompts' "
            "first token 120 ms against 90 ms (1.3x higher)") in won.text
    assert ("first tokens with the lower tail (steps256 against served): the long prompts' "
            "first token 120 ms against 80 ms") in won.text
    short = Switches(chunked_prefill=[_run("served", 2048, 30.0, 80.0, 25.0),
                                      _run("steps256", SMALL_BUDGET, 8.0, 120.0, 400.0),
                                      _run("unchunked", 4096, 90.0, 90.0, 30.0)])
    assert "the short prompts' median first token 400 ms against 25 ms (16x higher)" in (
        chunking_claim(short).text)
    # the lowest tail (chunking off) held against as served, with what it cost there
    off_best = Switches(chunked_prefill=[_run("served", 2048, 190.0, 380.0, 29.0),
                                         _run("steps256", SMALL_BUDGET, 48.0, 400.0, 396.0),
                                         _run("unchunked", 4096, 9.7, 382.0, 367.0)])
    text = chunking_claim(off_best).text
    assert "chunking off against as served: off cut the tail (20x lower)" in text
    assert ("first tokens with the lower tail (unchunked against served): the long prompts' "
            "first token 382 ms against 380 ms (1% apart: no difference by the lab's rule), the short prompts' median first "
            "token 367 ms against 29 ms (13x higher)") in text
    lost = chunking_claim(_sw(50.0, 25.0, 90.0, 90.0))
    assert "did not shorten the tail (2.0x higher)" in lost.text
    # chunking off had the lower tail: its first tokens are set against the small steps'
    lower = chunking_claim(_sw(50.0, 25.0, 120.0, 300.0))
    assert ("first tokens with the lower tail (unchunked against steps256): the long prompts' "
            "first token 300 ms against 120 ms (2.5x higher)") in lower.text
    assert "steps cut" not in lost.text and "they cut" not in lost.text
    even = chunking_claim(_sw(26.0, 25.0, 90.0, 90.0))
    assert "no difference by the lab's rule (26.00 ms in one run vs 25.00 ms in one run: gap" in even.text
    assert "nothing to compare" in chunking_claim(_sw(None, 25.0, 90.0, 90.0)).text


def test_prefix_sentence_follows_the_numbers():
    hit = prefix_claim(PrefixTwice(prompt_tokens=3000, first_ttft_ms=90.0, first_hits_pct=0.0,
                                   second_ttft_ms=9.0, second_hits_pct=98.9)).text
    assert "99% of the 3,000-token prompt" in hit and "10x lower" in hit
    assert "the prompt was fresh" in hit and "one request each time" in hit
    seen = prefix_claim(PrefixTwice(prompt_tokens=3000, first_ttft_ms=50.0, first_hits_pct=40.0,
                                    second_ttft_ms=9.0, second_hits_pct=98.9)).text
    assert "40% already hit" in seen and "fresh" not in seen
    miss = prefix_claim(PrefixTwice(prompt_tokens=3000, first_ttft_ms=90.0, first_hits_pct=0.0,
                                    second_ttft_ms=91.0, second_hits_pct=0.0)).text
    assert "none of the 3,000-token prompt" in miss and "lower" not in miss


def test_cpu_default_budget_is_the_installed_vllms():
    engine = pytest.importorskip("vllm.engine.arg_utils", reason="vLLM is not installed here")
    from vllm.usage.usage_lib import UsageContext

    budgets, _ = engine.EngineArgs.get_batch_defaults(1)
    assert budgets[UsageContext.OPENAI_API_SERVER] == CPU_DEFAULT_BUDGET


def test_the_eta_counts_every_restart(test_cfg):
    from lab_utils.forecast.timing import SWITCH_RESTARTS

    assert len(variants(test_cfg)) == SWITCH_RESTARTS


def test_the_short_prompts_sentence_quotes_each_setting():
    sw = Switches(chunked_prefill=[_run("as served", 2048, 30.0, other=18.0),
                                   _run("chunked prefill off", 4096, 30.0, other=160.5),
                                   _run("x", 256, 30.0, other=None)])
    assert others_claim(sw).text == ("The short prompts' median first token: as served 18 ms; "
                                     "chunked prefill off 160.5 ms.")
    assert others_claim(Switches(chunked_prefill=[])) is None


def test_first_tokens_are_held_apart_by_their_runs_ranges():
    """Two runs each: long prompts' first token 411.6 ms against 369.7 ms is 11% apart, but
    the runs overlap, so the sentence says no difference and shows the ranges; the repeats
    are read from the run itself (each repeat's median of each kind)."""
    sw = _sw(8.0, 90.0, 411.6, 369.7)
    sw.chunked_prefill[1].long_ttft = Measured(median=411.6, min=360.0, max=463.2, n=2)
    sw.chunked_prefill[2].long_ttft = Measured(median=369.7, min=350.0, max=389.4, n=2)
    text = chunking_claim(sw).text
    assert ("the long prompts' first token 411.6 ms against 369.7 ms (11% apart: no difference "
            "by the lab's rule; 360-463.2 ms over 2 runs against 350-389.4 ms over 2)") in text
    run = switch_run("served", "as served", 2048, _result(40.0), long=3000)
    assert run.long_ttft == Measured(median=100.0, min=100.0, max=100.0, n=2)
    assert run.first_token(False) == run.other_ttft and run.other_ttft.median == 11.0


def test_a_mixed_run_says_its_first_tokens_by_kind():
    from types import SimpleNamespace

    from lab_utils.notebook.steps import first_tokens_line
    r = _result(40.0)  # per repeat: long 90 and 110 ms, short 10 and 12 ms, one failed
    assert r.first_tokens(4.0, 3000) == {True: [[90.0, 110.0]] * 2, False: [[10.0, 12.0]] * 2}
    line = first_tokens_line(r, SimpleNamespace(long_len=3000))
    assert line.startswith("first tokens at concurrency 4, by kind: the 3,000-token prompts' "
                           "median 100 ms (4 requests); the short prompts' median 11 ms (4), of "
                           "which 0 took over five times as long")
