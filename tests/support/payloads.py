"""Results payloads as the notebooks wrote them before the payload models existed (plain
dicts, same keys), and the models built from them, for tests that write results files."""

from __future__ import annotations

from typing import Any

from lab_utils.checks.frame import ChecklistReport
from lab_utils.results import PAYLOADS
from lab_utils.results.checklist import CheckResult
from lab_utils.results.sweep import BenchmarkResult

INSTANCE = {"name": "baseline", "node": "local", "url": "http://127.0.0.1:8100",
            "kind": "vllm", "role": "baseline"}
PROXY = {"name": "proxy", "node": "local", "url": "http://127.0.0.1:8000", "kind": "proxy",
         "role": "proxy"}


def sweep_dict(workload: dict[str, Any] | None = None, combined: list | None = None) -> dict:
    return BenchmarkResult(target="http://127.0.0.1:8000", model="tiny-llama",
                           workload=workload or {"input_len": 128}, points=[],
                           combined=combined or []).model_dump()


def single_request_dict() -> dict:
    """`RequestRecord.as_dict()` of a request that succeeded."""
    return {"index": 0, "prompt_len": 128, "max_tokens": 32, "scheduled_s": 0.0,
            "sent_s": 0.001, "ttft_ms": 40.0, "itl_ms": [9.0, 10.0], "read_together": 0,
            "e2el_ms": 60.0, "tpot_ms": 9.5, "prompt_tokens": 128, "completion_tokens": 3,
            "error": None}


def roofline_dict(bw: float | None = None, weights: int | None = None) -> dict:
    return {"memory_bandwidth_GBps": bw, "bandwidth_source": "unknown for this GPU",
            "weight_bytes": weights,
            "max_tokens_per_s_per_stream": bw * 1e9 / weights if bw and weights else None}


def reference_dict() -> dict:
    return {"seed": 7, "max_tokens": 4, "prompts": [[1, 2, 3], [4, 5, 6, 7]],
            "tokens": [[9, 9, 9, 9], [8, 8, 8, 8]]}


def proof_row_dict(ok: bool = True, tokens: int = 64) -> dict:
    """`TransferProof.as_dict()` plus `tokens_equal`, as serving.proof_payload wrote it."""
    return {"prompt_tokens": tokens, "external_kv_transfer": tokens, "local_compute": 0,
            "local_cache_hit": 0, "nixl_bytes": 262144, "expected_bytes": 262144,
            "nixl_transfers": 1, "nixl_xfer_ms": 10.0, "block_size": 16, "prefill_ms": 30.0,
            "decode_ms": 50.0, "pd_tokens": [1, 2], "baseline_tokens": [1, 2] if ok else [3],
            "all_external": True, "bytes_match": True, "tokens_match": ok, "tokens_equal": ok}


def environment_dict(*results: CheckResult, continued: bool = False) -> dict:
    """00's payload as `record_environment` wrote it (no gpu_name yet)."""
    report = ChecklistReport([CheckResult("ssh", "local", "pass", "reachable"), *results])
    return {"blessed": not report.failed,
            "continued_despite_failures": report.failed and continued,
            "counts": report.counts, "checks": report.to_dict()["results"]}


def baseline_dict(sweep: dict | None = None, *, roofline: dict | None = None) -> dict:
    """01's payload as `serving.payload(served, result, single_request=..., roofline=...,
    reference=..., mixed=None)` wrote it."""
    return {"topology": "baseline", "instances": [INSTANCE, PROXY],
            "sweep": sweep or sweep_dict(), "single_request": single_request_dict(),
            "roofline": roofline or roofline_dict(), "reference": reference_dict(),
            "mixed": None}


def probe_dict(rows: list[dict] | None = None) -> dict:
    """`ProbeResult.to_dict()`."""
    return {"rows": rows or [], "target": "local", "initiator": "local",
            "target_address": "127.0.0.1", "initiator_address": "127.0.0.1", "port": 5555,
            "same_machine": True, "env": {"local": {}}, "notes": [],
            "memcpy_GBps": {"1048576": 5.0}, "pids": {"target": 1, "initiator": 2},
            "elapsed_s": 1.5}


def kv_dict(*, pvm: list[dict] | None = None, probe_rows: list[dict] | None = None,
            recommendation: dict | None = None) -> dict:
    """02's payload as `kv_budget.payload` wrote it."""
    shape = {"bytes_per_token": 16384, "layers": 2, "kv_heads": 4, "head_dim": 64,
             "dtype_bytes": 2, "mla": False}
    return {"model": "tiny-llama", "kv_per_token_bytes": 16384, "block_size": 16,
            "descriptor_bytes": 4096, "models": {"tiny-llama": shape},
            "prompt_lengths": [128, 512],
            "predicted_vs_measured": pvm if pvm is not None else [
                {"prompt_tokens": 128, "kv_bytes": 128 * 16384, "blocks": 8,
                 "predicted_ms": 1.0, "measured_ms": 1.2, "p99_ms": 1.5}],
            "recommendation": recommendation or {"kv_buffer_device": "cpu",
                                                 "reason": "DRAM is faster",
                                                 "dram_GBps": 3.0, "vram_GBps": None},
            "probe": probe_dict(probe_rows)}


def replicated_dict(sweep: dict | None = None, mixed: dict | None = None) -> dict:
    """03's payload as `serving.payload(served, result, mixed=..., policy=...)` wrote it."""
    return {"topology": "replicated", "instances": [INSTANCE, PROXY],
            "sweep": sweep or sweep_dict(), "mixed": mixed, "policy": "round_robin"}


def disaggregated_dict(sweep: dict | None = None, mixed: dict | None = None, *,
                       ok: bool = True) -> dict:
    """04's payload as `serving.payload(served, result, mixed=..., proof=...,
    kv_buffer_device=...)` wrote it."""
    return {"topology": "disaggregated", "instances": [INSTANCE, PROXY],
            "sweep": sweep or sweep_dict(), "mixed": mixed,
            "proof": {"ok": ok, "prompts": [proof_row_dict(ok)]}, "kv_buffer_device": "cpu"}


OLD_FORMAT = {"00": environment_dict, "01": baseline_dict, "02": kv_dict,
              "03": replicated_dict, "04": disaggregated_dict}


def model(notebook: str, payload: dict):
    """The notebook's payload model from a dict in the files' format."""
    return PAYLOADS[notebook].model_validate(payload)
