"""The agreement benchmark's verdict rule, and its `vllm bench serve` command line as
vLLM's own parser reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_utils.bench.aiperf_runner import summary
from lab_utils.bench.loadgen import table, verdict, vllm_bench_argv
from lab_utils.config import WorkloadConfig


def test_verdict_within_ten_percent_or_within_the_spread():
    assert verdict([10.5, 10.9, 11.0], [10.0, 10.1, 10.2]) == "agree"  # +7.8%
    assert verdict([12.0, 13.0, 20.0], [10.0, 10.5, 12.5]) == "agree (spread)"  # +24%, ranges meet
    assert verdict([13.0, 13.5, 14.0], [10.0, 10.5, 12.5]) == "DIFFER"  # +29%, apart
    assert verdict([9.5, 9.7], [10.4, 10.6]) == "agree"  # -8.6%


def test_table_compares_each_tool_with_the_lab_per_point_and_metric():
    run = {"median_ttft_ms": 10.0, "median_tpot_ms": 2.0, "median_itl_ms": 2.0,
           "output_throughput": 300.0, "request_throughput": 10.0}
    slow = {**run, "median_ttft_ms": 20.0}
    result = {"tools": ["lab", "vllm bench serve", "aiperf"],
              "runs": {"concurrency 1": {"lab": [run, run], "vllm bench serve": [run, run],
                                         "aiperf": [slow, slow]}}}
    rows = table(result)
    assert len(rows) == 10
    ttft = {r["against"]: r for r in rows if r["metric"] == "median_ttft_ms"}
    assert ttft["vllm bench serve"]["verdict"] == "agree"
    assert ttft["aiperf"]["verdict"] == "DIFFER" and ttft["aiperf"]["diff_pct"] == -50.0


def test_aiperf_export_maps_onto_the_labs_names():
    export = {"time_to_first_token": {"unit": "ms", "p50": 12.5, "avg": 13.0},
              "inter_token_latency": {"unit": "ms", "p50": 2.25},
              "output_token_throughput": {"unit": "tokens/sec", "avg": 900.0},
              "request_throughput": {"unit": "requests/sec", "avg": 28.1}}
    s = summary(export)
    assert s == {"median_ttft_ms": 12.5, "median_tpot_ms": 2.25, "median_itl_ms": None,
                 "output_throughput": 900.0, "request_throughput": 28.1}


@pytest.mark.parametrize("point", [("concurrency", 16.0), ("rate", 12.4)])
def test_vllm_bench_serve_reads_our_arguments(point):
    pytest.importorskip("vllm", reason="vLLM is in the project's venv (make venv)")
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    w = WorkloadConfig(input_len=128, output_len=32, warmup=4)
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(vllm_bench_argv("http://127.0.0.1:8000", "tiny", "/m", w, 96, point, 7))
    assert (args.random_input_len, args.random_output_len, args.num_prompts) == (128, 32, 96)
    assert args.ignore_eos and args.seed == 7 and args.num_warmups == 4
    if point[0] == "concurrency":
        assert args.max_concurrency == 16 and args.request_rate == float("inf")
    else:
        assert args.max_concurrency is None and args.request_rate == 12.4 and args.burstiness == 1.0


def test_vllm_bench_serve_reads_the_same_dataset_as_we_do(tmp_path):
    """With a custom JSONL file, vLLM's benchmark gets the file, its output lengths and its
    text as written: what `measure.dataset` sends."""
    pytest.importorskip("vllm", reason="vLLM is in the project's venv (make venv)")
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    data = tmp_path / "p.jsonl"
    w = WorkloadConfig(dataset=str(data), warmup=4)
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(vllm_bench_argv("http://127.0.0.1:8000", "tiny", "/m", w, 96,
                                             ("concurrency", 4.0), 7))
    assert (args.dataset_name, args.dataset_path, args.custom_output_len) == ("custom", str(data), -1)
    assert args.skip_chat_template and args.disable_shuffle and args.ignore_eos
    assert args.num_prompts == 96
    ratio = WorkloadConfig(range_ratio=0.25)
    args = parser.parse_args(vllm_bench_argv("http://127.0.0.1:8000", "tiny", "/m", ratio, 8,
                                             ("concurrency", 1.0), 7))
    assert args.dataset_name == "random" and args.random_range_ratio == "0.25"


def test_on_a_dataset_both_tools_send_the_same_requests_in_the_same_order(tmp_path):
    """Two samples of one file of mixed lengths differ by more than the tools do: vLLM gets
    a file of exactly the rows the lab sends after its warm-up, read unshuffled."""
    import json
    import zlib

    from lab_utils.bench.loadgen import same_prompts
    from lab_utils.measure.workload import build_requests

    def tokenize(text):
        return [zlib.crc32(x.encode()) % 500 for x in text.split()]

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": "w " * (i + 1), "output_tokens": i + 1}) + "\n"
                            for i in range(40)))
    w = WorkloadConfig(dataset=str(data), warmup=3)
    ours = build_requests(w, 3 + 10, tokenize, seed=1204)[3:]
    written = same_prompts(w, 10, 1204, tmp_path).dataset
    assert written is not None
    theirs = [json.loads(x) for x in Path(written).read_text().splitlines()]
    assert [(len(s.prompt_ids), s.max_tokens) for s in ours] == [
        (len(r["prompt"].split()), r["output_tokens"]) for r in theirs]
    assert same_prompts(WorkloadConfig(), 10, 1204, tmp_path).dataset is None
