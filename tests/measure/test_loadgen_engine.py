"""The load generator against a real rehearsal vLLM instance: a concurrency sweep through
the CLI completes with zero errors, exact prompt lengths and exact output lengths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab_utils.results import load_envelope

pytestmark = pytest.mark.slow


def test_cli_sweep_on_a_real_instance(rehearsal, engine_cfg, tmp_path):
    urls = rehearsal.up()
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "lab_utils", "bench", "--config", str(engine_cfg.source),
                        "--url", urls["baseline"], "--api-key-file", engine_cfg.vllm.api_key_file,
                        "--concurrency", "1,4", "--num-prompts", "8",
                        "--input-len", "48", "--output-len", "12", "--warmup", "1", "--repeats", "1",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    env = load_envelope(out)
    assert env.kind == "benchmark" and env.profile == engine_cfg.profile
    result = env.payload
    assert [c["value"] for c in result["combined"]] == [1, 4]
    for point in result["points"]:
        s = point["summary"]
        assert s["valid"] and s["failed"] == 0 and s["completed"] == 8, json.dumps(s)[:500]
        assert s["total_output_tokens"] == 8 * 12
        assert all(r["prompt_tokens"] == 48 and r["completion_tokens"] == 12 for r in point["requests"])
        assert s["median_ttft_ms"] > 0 and s["median_tpot_ms"] > 0 and s["output_throughput"] > 0
    assert "concurrency 4" in p.stdout and "yes" in p.stdout


def test_chat_completions_stream_through_the_generator(rehearsal, engine_cfg):
    import asyncio

    from lab_utils.config import api_key
    from lab_utils.measure.benchmark import summarize
    from lab_utils.measure.loadgen import run_point
    from lab_utils.measure.workload import build_requests, local_tokenizer

    urls = rehearsal.up()
    w = engine_cfg.workload.model_copy(update={"chat": True, "input_len": 30, "output_len": 10})
    tok, detok = local_tokenizer(engine_cfg.model_path)
    specs = build_requests(w, 4, tok, detok, seed=11)
    assert all(s.prompt_text for s in specs)
    records, wall = asyncio.run(run_point(urls["baseline"], engine_cfg.model.name, specs,
                                          concurrency=2, chat=True, show_progress=False,
                                          api_key=api_key(engine_cfg, "vllm")))
    s = summarize(records, wall, w)
    assert s.valid and s.completed == 4, s.errors
    # Exact token counts come from usage. How many chunks carry them is the server's
    # business: a starved API server merges several tokens into one chunk, so the
    # inter-token gaps seen (at most 9) can be fewer; the chunk arithmetic is checked
    # against a server with known timing in test_loadgen.py.
    seen = [(r.completion_tokens, len(r.itl_ms)) for r in records]
    assert all(r.completion_tokens == 10 and len(r.itl_ms) <= 9 for r in records), seen
    assert all(r.ttft_ms > 0 and r.tpot_ms > 0 for r in records), seen
    assert all(r.prompt_tokens >= 30 for r in records)  # the chat template adds tokens
