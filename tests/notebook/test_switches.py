"""01's two switches: the table row from a mixed run, and conclusions that follow the
numbers (each sentence changes when the measurement says the opposite)."""

from __future__ import annotations

import pytest

from lab_utils.notebook.switches import (
    CPU_DEFAULT_BUDGET,
    SMALL_BUDGET,
    budget_as_served,
    chunking_sentence,
    mixed_row,
    prefix_sentence,
    variants,
)
from lab_utils.results.points import Point
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
    row = mixed_row("as served", 2048, _result(40.0), long=3000)
    assert row["ITL p99 ms"] == 40.0 and row["concurrency"] == 4
    assert row["long prompts' TTFT p50 ms"] == 100.0  # the failed request is left out
    assert row["other prompts' TTFT p50 ms"] == 11.0
    assert row["prefix-cache hits %"] == 0.0


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


def _rows(small_p99, off_p99, small_ttft, off_ttft):
    return [{"engine": "as served", "step budget (tokens)": 2048, "ITL p99 ms": 30.0,
             "long prompts' TTFT p50 ms": 80.0},
            {"engine": "small", "step budget (tokens)": SMALL_BUDGET, "ITL p99 ms": small_p99,
             "long prompts' TTFT p50 ms": small_ttft},
            {"engine": "chunked prefill off", "step budget (tokens)": 4096,
             "ITL p99 ms": off_p99, "long prompts' TTFT p50 ms": off_ttft}]


def test_chunking_sentence_follows_the_numbers():
    won = chunking_sentence(_rows(8.0, 90.0, 120.0, 90.0))
    assert "cut the streams' tail 11.2x" in won and "1.3x longer" in won
    lost = chunking_sentence(_rows(50.0, 25.0, 90.0, 90.0))
    assert "did not shorten the tail (2.0x longer)" in lost and "within 5% of each other" in lost
    assert "cut" not in lost
    assert "nothing to compare" in chunking_sentence(_rows(None, 25.0, 90.0, 90.0))


def test_prefix_sentence_follows_the_numbers():
    hit = prefix_sentence({"prompt tokens": 3000, "first TTFT ms": 90.0, "first hits %": 0.0,
                           "second TTFT ms": 9.0, "second hits %": 98.9})
    assert "99% of the 3,000-token prompt" in hit and "10.0x faster" in hit
    assert "the prompt was fresh" in hit
    seen = prefix_sentence({"prompt tokens": 3000, "first TTFT ms": 50.0, "first hits %": 40.0,
                            "second TTFT ms": 9.0, "second hits %": 98.9})
    assert "40% already hit" in seen and "fresh" not in seen
    miss = prefix_sentence({"prompt tokens": 3000, "first TTFT ms": 90.0, "first hits %": 0.0,
                            "second TTFT ms": 91.0, "second hits %": 0.0})
    assert "none of the 3,000-token prompt" in miss and "faster" not in miss


def test_cpu_default_budget_is_the_installed_vllms():
    engine = pytest.importorskip("vllm.engine.arg_utils", reason="vLLM is not installed here")
    from vllm.usage.usage_lib import UsageContext

    budgets, _ = engine.EngineArgs.get_batch_defaults(1)
    assert budgets[UsageContext.OPENAI_API_SERVER] == CPU_DEFAULT_BUDGET


def test_the_eta_counts_every_restart(test_cfg):
    from lab_utils.forecast.timing import SWITCH_RESTARTS

    assert len(variants(test_cfg)) == SWITCH_RESTARTS


def test_the_short_prompts_sentence_quotes_each_setting():
    from lab_utils.notebook.switches import others_sentence

    rows = [{"engine": "as served", "other prompts' TTFT p50 ms": 18.0},
            {"engine": "chunked prefill off", "other prompts' TTFT p50 ms": 160.5},
            {"engine": "x", "other prompts' TTFT p50 ms": None}]
    assert others_sentence(rows) == ("The short prompts' median first token: as served 18 ms; "
                                      "chunked prefill off 160.5 ms.")
    assert others_sentence([]) == ""
