"""Notebook 04's proof that the KV cache moved, one prompt at a time, as it is kept
(`lab_utils.serve.pd` gathers the evidence and judges it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ProofCounts(BaseModel):
    """One prompt's evidence as it is kept: the decode instance's per-request counter deltas,
    the tokens both sides produced, and whether they had to match exactly."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int
    external_kv_transfer: int
    local_compute: int
    local_cache_hit: int
    nixl_bytes: int
    expected_bytes: int
    nixl_transfers: int
    nixl_xfer_ms: float | None
    block_size: int
    prefill_ms: float | None
    decode_ms: float | None
    pd_tokens: list[int]
    baseline_tokens: list[int] | None
    strict: bool = True  # the CPU rehearsal: tokens and bytes must be exactly equal


class ProofRow(ProofCounts):
    """A prompt's proof as notebook 04 records it: the evidence and the verdicts drawn from it
    (files written before the GPU verdict fields were added judged by exact equality)."""

    all_external: bool
    bytes_match: bool
    tokens_match: bool | None
    tokens_equal: bool | None
    tokens_ok: bool | None = None
    diverged_at: int | None = None  # first token that differs from the baseline
    divergence_margin: float | None = None  # decode's chosen minus baseline's token, nats
    tokens_why: str = ""
