"""Prefill/decode by hand, and the proof that the KV cache really moved.

The disaggregated protocol in three HTTP calls (the bodies come from `serve.protocol`):
ask a prefill instance for one token with `kv_transfer_params: {"do_remote_decode": true}`;
it keeps the prompt's KV blocks and answers with where they are; send the original request
with those parameters to a decode instance, which pulls the blocks over NIXL and generates.
`prove_transfer` does this for each prompt, one at a time, reading the decode instance's
counters before and after, so each request's deltas show where its prompt tokens came from
and how many bytes NIXL moved, and compares the greedy tokens with a baseline instance's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import httpx

from lab_utils.errors import LabError
from lab_utils.kv.shapes import KVShape
from lab_utils.measure.stalls import Deadline
from lab_utils.serve.metrics import InstanceCounters, MetricsSnapshot, fetch_metrics, read_counters
from lab_utils.serve.protocol import decode_request, prefill_request, transfer_params


def _post(client: httpx.Client, url: str, body: dict) -> dict:
    try:
        r = client.post(f"{url}/v1/completions", json=body)
    except httpx.HTTPError as e:
        raise LabError(f"request to {url} failed: {e!r}") from e
    if r.status_code != 200:
        raise LabError(f"{url}/v1/completions answered {r.status_code}: {r.text[:500]}")
    return r.json()


def completion_body(model: str, prompt_ids: list[int], max_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": False,
    }


def complete(client: httpx.Client, url: str, model: str, prompt_ids: list[int],
             max_tokens: int) -> list[int]:
    """Greedy tokens from one instance computing everything itself."""
    return _post(client, url, completion_body(model, prompt_ids, max_tokens))["choices"][0]["token_ids"]


def prefill(client: httpx.Client, url: str, model: str, prompt_ids: list[int]) -> dict:
    """Run the prompt on a prefill instance; return its `kv_transfer_params`."""
    body = prefill_request(completion_body(model, prompt_ids, 1))
    params = transfer_params(_post(client, url, body))
    if not params:
        raise LabError(
            f"prefill instance {url} returned no kv_transfer_params: it is probably not "
            "running with NixlConnector as kv_producer (check --kv-transfer-config)"
        )
    return params


def decode(client: httpx.Client, url: str, model: str, prompt_ids: list[int], max_tokens: int,
           kv_params: dict) -> list[int]:
    body = decode_request(completion_body(model, prompt_ids, max_tokens), kv_params)
    return _post(client, url, body)["choices"][0]["token_ids"]


def warm_up(prefill_url: str, decode_url: str, model: str, attempts: int = 3,
            timeout: float = 120.0) -> int:
    """One small prefill-then-decode round trip, retried: the first request between two
    instances carries the NIXL handshake, which on a busy machine can time out (vLLM
    waits 5 s for the side channel). Returns the attempts used; raises with the last
    error when none succeeds."""
    ids = list(range(100, 116))
    last = ""
    with httpx.Client(timeout=timeout) as client:
        for attempt in range(1, attempts + 1):
            try:
                decode(client, decode_url, model, ids, 2, prefill(client, prefill_url, model, ids))
                return attempt
            except LabError as e:
                last = str(e)
                time.sleep(1.0)
    raise LabError(f"prefill {prefill_url} -> decode {decode_url}: no KV transfer succeeded in "
                   f"{attempts} attempts; last error: {last}. Check the decode instance's log for "
                   "'NIXL transfer failure' (side channel unreachable or handshake timeout).")


@dataclass
class TransferProof:
    """One prompt's evidence, from the decode instance's per-request counter deltas."""

    prompt_tokens: int
    external_kv_transfer: int
    local_compute: int
    local_cache_hit: int
    nixl_bytes: int
    expected_bytes: int
    nixl_transfers: int
    nixl_xfer_ms: float
    block_size: int
    prefill_ms: float
    decode_ms: float
    pd_tokens: list[int]
    baseline_tokens: list[int] | None

    @property
    def all_external(self) -> bool:
        return self.external_kv_transfer == self.prompt_tokens and self.local_compute == 0

    @property
    def bytes_match(self) -> bool:
        return self.nixl_bytes == self.expected_bytes

    @property
    def tokens_match(self) -> bool | None:
        return None if self.baseline_tokens is None else self.pd_tokens == self.baseline_tokens

    @property
    def ok(self) -> bool:
        return self.all_external and self.bytes_match and self.tokens_match is not False

    def as_dict(self) -> dict:
        return {**asdict(self), "all_external": self.all_external,
                "bytes_match": self.bytes_match, "tokens_match": self.tokens_match}


def block_size_of(snapshot: MetricsSnapshot) -> int:
    """The KV block size an instance really uses (from `vllm:cache_config_info`)."""
    for sample in snapshot.samples:
        if sample.name == "vllm:cache_config_info" and "block_size" in sample.labels:
            return int(sample.labels["block_size"])
    raise LabError("vllm:cache_config_info with a block_size label is missing from /metrics")


def _counters_after(client: httpx.Client, url: str, before: InstanceCounters,
                    deadline_s: float = 10.0) -> InstanceCounters:
    """The decode instance's counters once its stats include the request's transfer
    (stats reach /metrics shortly after the response). Time the machine stood still
    does not count against `deadline_s`."""
    with Deadline(deadline_s) as deadline:
        while True:
            after = read_counters(fetch_metrics(url, client), require_nixl=True)
            done = (after.nixl_transfer_count > before.nixl_transfer_count
                    and after.prompt_tokens > before.prompt_tokens)
            if done or deadline.expired():
                return after
            time.sleep(0.1)


def _proof(ids: list[int], d: InstanceCounters, kv: KVShape, block_size: int, prefill_ms: float,
           decode_ms: float, tokens: list[int], base: list[int] | None) -> TransferProof:
    return TransferProof(
        prompt_tokens=len(ids),
        external_kv_transfer=int(d.prompt_tokens_external_kv_transfer),
        local_compute=int(d.prompt_tokens_local_compute),
        local_cache_hit=int(d.prompt_tokens_local_cache_hit),
        nixl_bytes=int(d.nixl_bytes_transferred),
        expected_bytes=kv.transfer_bytes(len(ids), block_size),
        nixl_transfers=int(d.nixl_transfer_count),
        nixl_xfer_ms=d.nixl_transfer_seconds * 1000.0,
        block_size=block_size, prefill_ms=prefill_ms, decode_ms=decode_ms,
        pd_tokens=tokens, baseline_tokens=base)


def prove_transfer(prompts: list[list[int]], *, model: str, prefill_url: str, decode_url: str,
                   kv: KVShape, max_tokens: int = 16, baseline_url: str | None = None,
                   timeout: float = 120.0) -> list[TransferProof]:
    """Prefill then decode each prompt sequentially, with per-request counter deltas.
    Use fresh prompts: a decode instance that has seen a prompt counts it as a local
    cache hit, not a transfer."""
    proofs = []
    with httpx.Client(timeout=timeout) as client:
        block_size = block_size_of(fetch_metrics(decode_url, client))
        for ids in prompts:
            before = read_counters(fetch_metrics(decode_url, client), require_nixl=False)
            t0 = time.perf_counter()
            params = prefill(client, prefill_url, model, ids)
            t1 = time.perf_counter()
            tokens = decode(client, decode_url, model, ids, max_tokens, params)
            t2 = time.perf_counter()
            d = _counters_after(client, decode_url, before) - before
            base = complete(client, baseline_url, model, ids, max_tokens) if baseline_url else None
            proofs.append(_proof(ids, d, kv, block_size, (t1 - t0) * 1000.0,
                                 (t2 - t1) * 1000.0, tokens, base))
    return proofs


def prove_via_proxy(prompts: list[list[int]], baseline_tokens: list[list[int]], *, model: str,
                    proxy_url: str, decode_urls: list[str], kv: KVShape, max_tokens: int,
                    timeout: float = 120.0) -> list[TransferProof]:
    """Each prompt through the proxy (prefill then decode), one at a time, with the decode
    instances' per-request counter deltas, compared with notebook 01's greedy tokens."""
    proofs = []
    with httpx.Client(timeout=timeout) as client:
        block_size = block_size_of(fetch_metrics(decode_urls[0], client))
        for ids, base in zip(prompts, baseline_tokens, strict=True):
            before = [read_counters(fetch_metrics(u, client), require_nixl=False)
                      for u in decode_urls]
            t0 = time.perf_counter()
            tokens = complete(client, proxy_url, model, ids, max_tokens)
            e2e = (time.perf_counter() - t0) * 1000.0
            deltas = [_counters_after(client, u, b, deadline_s=3.0 if len(decode_urls) > 1
                                      else 10.0) - b for u, b in zip(decode_urls, before,
                                                                     strict=True)]
            d = sum(deltas[1:], deltas[0])
            # through the proxy only the whole request is timed: it is in decode_ms
            proofs.append(_proof(ids, d, kv, block_size, float("nan"), e2e, tokens, base))
    return proofs
