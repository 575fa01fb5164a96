"""The proof of transfer's verdict on the output, on constructed inputs (no server): exact
on the CPU rehearsal, and on a GPU failing only on what a broken transfer produces."""

from __future__ import annotations

import math

import pytest

from lab_utils.serve.pd import (
    NEAR_TIE_NATS,
    TransferProof,
    completion_body,
    judge_tokens,
    top_logprobs,
)

BASE = [11, 12, 13, 14, 15, 16]


def _steps(tokens: list[int], runner_up: dict[int, tuple[int, float]]) -> list[dict[int, float]]:
    """Top logprobs per step: the chosen token at -0.1, and at step k `runner_up[k]`
    (token, logprob); other steps a far runner-up."""
    out = []
    for k, t in enumerate(tokens):
        other, lp = runner_up.get(k, (999, -8.0))
        out.append({t: -0.1, other: lp, 998: -9.0})
    return out


def test_equal_output_passes_everywhere():
    for strict in (True, False):
        v = judge_tokens(BASE, list(BASE), strict=strict)
        assert v.ok and v.diverged_at is None
    assert judge_tokens(BASE, None, strict=True).ok  # nothing to compare with


def test_cpu_rehearsal_wants_exact_equality_even_for_a_near_tie():
    pd = BASE[:4] + [77, 78]
    v = judge_tokens(pd, BASE, strict=True, pd_logprobs=_steps(pd, {4: (15, -0.12)}))
    assert not v.ok and v.diverged_at == 4 and "exact" in v.why


def test_gpu_late_near_tie_passes_with_its_margin():
    pd = BASE[:4] + [77, 78]  # at step 4 the decode chose 77; the baseline's 15 was 0.2 behind
    v = judge_tokens(pd, BASE, strict=False, pd_logprobs=_steps(pd, {4: (15, -0.3)}))
    assert v.ok and v.diverged_at == 4 and v.margin == pytest.approx(0.2)
    assert "near tie at output token 4 (from 0)" in v.why


def test_gpu_late_divergence_beyond_the_margin_fails():
    pd = BASE[:4] + [77, 78]
    lp = -0.1 - NEAR_TIE_NATS - 0.4
    v = judge_tokens(pd, BASE, strict=False, pd_logprobs=_steps(pd, {4: (15, lp)}))
    assert not v.ok and v.diverged_at == 4 and v.margin == pytest.approx(NEAR_TIE_NATS + 0.4)
    assert "not a near tie" in v.why


def test_gpu_baseline_token_outside_the_top_logprobs_fails():
    pd = BASE[:3] + [77, 78, 79]
    v = judge_tokens(pd, BASE, strict=False, pd_logprobs=_steps(pd, {}))
    assert not v.ok and v.diverged_at == 3 and v.margin is None and "not among" in v.why


def test_gpu_first_token_differing_fails_even_when_tied():
    pd = [77] + BASE[1:]
    v = judge_tokens(pd, BASE, strict=False, pd_logprobs=_steps(pd, {0: (11, -0.1)}))
    assert not v.ok and v.diverged_at == 0 and "first token" in v.why


def test_gpu_divergence_without_logprobs_fails():
    pd = BASE[:4] + [77, 78]
    v = judge_tokens(pd, BASE, strict=False, pd_logprobs=None)
    assert not v.ok and v.diverged_at == 4 and "no logprobs" in v.why


def test_different_lengths_fail():
    v = judge_tokens(BASE[:4], BASE, strict=False, pd_logprobs=_steps(BASE[:4], {}))
    assert not v.ok and v.diverged_at == 4 and "lengths" in v.why


def _proof(**kw) -> TransferProof:
    base = dict(prompt_tokens=48, external_kv_transfer=48, local_compute=0, local_cache_hit=0,
                nixl_bytes=1000, expected_bytes=1000, nixl_transfers=1, nixl_xfer_ms=1.0,
                block_size=16, prefill_ms=math.nan, decode_ms=5.0, pd_tokens=list(BASE),
                baseline_tokens=list(BASE))
    return TransferProof(**(base | kw))


def test_proof_on_a_gpu_fails_only_on_a_broken_transfer():
    pd = BASE[:4] + [77, 78]
    tie = dict(strict=False, pd_tokens=pd, pd_logprobs=_steps(pd, {4: (15, -0.3)}))
    assert _proof(**tie).ok and not _proof(**tie).tokens_match
    assert _proof(strict=False, nixl_bytes=1200).ok  # more bytes than the KV: not missing
    assert not _proof(strict=False, nixl_bytes=800).ok  # short of the prompt's KV
    assert not _proof(strict=False, external_kv_transfer=0, local_compute=48).ok
    assert not _proof(strict=False, pd_tokens=[77] + BASE[1:]).ok
    # the CPU rehearsal: the same near tie and surplus bytes fail
    assert not _proof(**(tie | {"strict": True})).ok
    assert not _proof(nixl_bytes=1200).ok and _proof().ok


def test_proof_row_records_the_verdict():
    pd = BASE[:4] + [77, 78]
    p = _proof(strict=False, pd_tokens=pd, pd_logprobs=_steps(pd, {4: (15, -0.3)}))
    row = p.row()
    assert (row.tokens_ok, row.diverged_at, row.strict) == (True, 4, False)
    assert row.divergence_margin == pytest.approx(0.2) and "near tie" in row.tokens_why
    assert "pd_logprobs" not in p.as_dict()


def test_logprobs_are_asked_and_read_by_token_id():
    body = completion_body("m", [1, 2], 4, logprobs=5)
    assert body["logprobs"] == 5 and body["return_tokens_as_token_ids"] is True
    assert "logprobs" not in completion_body("m", [1, 2], 4)
    # the shape vLLM's completions API answers with (keys "token_id:<id>")
    choice = {"token_ids": [7, 8], "logprobs": {
        "tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"token_id:7": -0.1, "token_id:3": -2.5},
                         {"token_id:8": -0.2, "token_id:9": -0.25}]}}
    assert top_logprobs(choice) == [{7: -0.1, 3: -2.5}, {8: -0.2, 9: -0.25}]
    assert top_logprobs({"token_ids": [7]}) is None
