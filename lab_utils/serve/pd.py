"""Prefill/decode by hand, and the proof that the KV cache really moved.

The disaggregated protocol in three HTTP calls (the bodies come from `serve.protocol`):
ask a prefill instance for one token with `kv_transfer_params: {"do_remote_decode": true}`;
it keeps the prompt's KV blocks and answers with where they are; send the original request
with those parameters to a decode instance, which pulls the blocks over NIXL and generates.
`prove_transfer` does this for each prompt, one at a time, reading the decode instance's
counters before and after, so each request's deltas show where its prompt tokens came from
and how many bytes NIXL moved, and compares the greedy tokens with a baseline instance's.

How the output is compared (`judge_tokens`) depends on the device. On the CPU rehearsal
(`strict`) prefill/decode must give the baseline's greedy tokens exactly. On a GPU two
instances need not: different batch shapes and kernels move bf16 logits by a few
hundredths, and where the top two tokens are that close greedy decoding can flip and the
continuations part. So on a GPU the proof fails only on what a broken transfer produces:
a different first token (it is computed from the transferred KV alone), prompt tokens not
counted as `external_kv_transfer`, NIXL bytes short of the prompt's KV, or a later
divergence that is not a near tie: the baseline's token is not among the decode's top
logprobs at that step, or trails its chosen token by more than NEAR_TIE_NATS.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from pydantic import Field

from lab_utils.errors import LabError
from lab_utils.kv.shapes import KVShape
from lab_utils.measure.loadgen import auth_headers
from lab_utils.measure.stalls import Deadline
from lab_utils.results.proof import ProofCounts, ProofRow
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


# A divergence where the baseline's token trails the decode's chosen token by at most this
# many nats (natural-log probability) is a near tie, not a broken transfer: the runner-up
# then has at least e^-0.5 = 61% of the top token's probability. bf16 keeps 8 bits of
# mantissa, so a logit near 20 is only known to ~0.06-0.1; two instances with different
# batch shapes and kernels differ by about that per logit, a few times that in a logprob
# difference. A broken transfer (wrong or missing KV) changes the first token already.
NEAR_TIE_NATS = 0.5
TOP_LOGPROBS = 5  # logprobs asked per generated token (vLLM's limit is 20 by default)


def completion_body(model: str, prompt_ids: list[int], max_tokens: int,
                    logprobs: int | None = None) -> dict:
    body = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": False,
    }
    if logprobs:  # top logprobs keyed "token_id:<id>", not by text (texts can collide)
        body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
    return body


def top_logprobs(choice: dict) -> list[dict[int, float]] | None:
    """Per generated token, {token id: logprob} of the top tokens from a completions choice
    asked with `return_tokens_as_token_ids` (keys "token_id:<id>"); None without logprobs."""
    steps = (choice.get("logprobs") or {}).get("top_logprobs")
    if not steps:
        return None
    return [{int(str(k).rsplit(":", 1)[-1]): float(v) for k, v in (step or {}).items()
             if str(k).rsplit(":", 1)[-1].lstrip("-").isdigit()} for step in steps]


def complete(client: httpx.Client, url: str, model: str, prompt_ids: list[int],
             max_tokens: int) -> list[int]:
    """Greedy tokens from one instance computing everything itself."""
    return _post(client, url, completion_body(model, prompt_ids, max_tokens))["choices"][0]["token_ids"]


def complete_scored(client: httpx.Client, url: str, model: str, prompt_ids: list[int],
                    max_tokens: int) -> tuple[list[int], list[dict[int, float]] | None]:
    """Greedy tokens and each step's top logprobs ({token id: logprob})."""
    choice = _post(client, url, completion_body(model, prompt_ids, max_tokens,
                                                TOP_LOGPROBS))["choices"][0]
    return choice["token_ids"], top_logprobs(choice)


@dataclass(frozen=True)
class TokenVerdict:
    """How prefill/decode's greedy tokens compare with the baseline's: `ok`, the first step
    where they differ (None: they do not), the decode's logprob margin there (its chosen
    token's minus the baseline's token's, nats; None: unknown), and why."""

    ok: bool
    diverged_at: int | None = None
    margin: float | None = None
    why: str = ""


def judge_tokens(pd_tokens: list[int], baseline_tokens: list[int] | None, *, strict: bool,
                 pd_logprobs: list[dict[int, float]] | None = None,
                 near_tie: float = NEAR_TIE_NATS, first_may_tie: bool = False) -> TokenVerdict:
    """Compare prefill/decode's greedy output with the baseline's (see the module text):
    `strict` (the CPU rehearsal) wants them equal; otherwise a divergence after the first
    token passes when the decode's logprobs at that step (`pd_logprobs`) show the
    baseline's token within `near_tie` nats of the one it chose; `first_may_tie`: the
    first token may be a near tie too (a split model, `serve.tp`: nothing was moved)."""
    if baseline_tokens is None:
        return TokenVerdict(True, why="no baseline to compare with")
    if pd_tokens == baseline_tokens:
        return TokenVerdict(True, why="same tokens")
    shorter = min(len(pd_tokens), len(baseline_tokens))
    k = next((i for i in range(shorter) if pd_tokens[i] != baseline_tokens[i]), shorter)
    if k >= shorter:
        return TokenVerdict(False, k, None, f"lengths differ ({len(pd_tokens)} tokens against "
                                            f"{len(baseline_tokens)})")
    if strict:
        return TokenVerdict(False, k, None, f"differs at output token {k} (from 0) (exact equality expected "
                                            "on the CPU rehearsal)")
    if k == 0 and not first_may_tie:
        return TokenVerdict(False, 0, None, "the first token differs: it is computed from the "
                                            "transferred KV alone, so the KV is wrong")
    step = (pd_logprobs or [])[k] if pd_logprobs and k < len(pd_logprobs) else None
    if not step:
        return TokenVerdict(False, k, None, f"differs at output token {k} (from 0) and no logprobs were "
                                            "returned to tell a near tie from an error")
    chosen, theirs = pd_tokens[k], baseline_tokens[k]
    if theirs not in step:
        floor = max(step.values()) - min(step.values())
        return TokenVerdict(False, k, None, f"differs at output token {k} (from 0): the baseline's token "
                                            f"{theirs} is not among the top "
                                            f"{len(step)} (margin > {floor:.3f} nats)")
    margin = step.get(chosen, max(step.values())) - step[theirs]
    if margin <= near_tie:
        return TokenVerdict(True, k, margin, f"near tie at output token {k} (from 0): {margin:.3f} nats "
                                             f"<= {near_tie:g} between token ids {chosen} (chosen) and {theirs} "
                                             "(01's)")
    return TokenVerdict(False, k, margin, f"differs at output token {k} (from 0) by {margin:.3f} nats "
                                          f"(> {near_tie:g}): not a near tie")


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
    return decode_scored(client, url, model, prompt_ids, max_tokens, kv_params, None)[0]


def decode_scored(client: httpx.Client, url: str, model: str, prompt_ids: list[int],
                  max_tokens: int, kv_params: dict, logprobs: int | None = TOP_LOGPROBS
                  ) -> tuple[list[int], list[dict[int, float]] | None]:
    body = decode_request(completion_body(model, prompt_ids, max_tokens, logprobs), kv_params)
    choice = _post(client, url, body)["choices"][0]
    return choice["token_ids"], top_logprobs(choice)


def warm_up(prefill_url: str, decode_url: str, model: str, attempts: int = 3,
            timeout: float = 120.0, api_key: str | None = None) -> int:
    """One small prefill-then-decode round trip, retried: the first request between two
    instances carries the NIXL handshake, which on a busy machine can time out (vLLM
    waits 5 s for the side channel). The decode asks for logprobs: vLLM compiles a kernel
    the first time an instance computes them, which the node's compile cache
    (`Node.compile_cache`) keeps; on a node where it is not there yet the compile happens
    here, not in the first request that asks. Returns the attempts used; raises with the
    last error when none succeeds. `api_key`: the instances'."""
    ids = list(range(100, 116))
    last = ""
    with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client:
        for attempt in range(1, attempts + 1):
            try:
                decode_scored(client, decode_url, model, ids, 2,
                              prefill(client, prefill_url, model, ids), logprobs=1)
                return attempt
            except LabError as e:
                last = str(e)
                time.sleep(1.0)
    raise LabError(f"prefill {prefill_url} -> decode {decode_url}: no KV transfer succeeded in "
                   f"{attempts} attempts; last error: {last}. Check the decode instance's log for "
                   "'NIXL transfer failure' (side channel unreachable or handshake timeout).")


class TransferProof(ProofCounts):
    """One prompt's evidence while it is judged (with the decode's logprobs, not kept)."""

    pd_logprobs: list[dict[int, float]] | None = Field(default=None, repr=False)

    @property
    def all_external(self) -> bool:
        return self.external_kv_transfer == self.prompt_tokens and self.local_compute == 0

    @property
    def bytes_match(self) -> bool:
        return self.nixl_bytes == self.expected_bytes

    @property
    def bytes_ok(self) -> bool:
        """Exactly the prompt's KV (strict), else at least it: short means KV is missing."""
        return self.bytes_match if self.strict else self.nixl_bytes >= self.expected_bytes

    @property
    def tokens_match(self) -> bool | None:
        return None if self.baseline_tokens is None else self.pd_tokens == self.baseline_tokens

    @property
    def verdict(self) -> TokenVerdict:
        return judge_tokens(self.pd_tokens, self.baseline_tokens, strict=self.strict,
                            pd_logprobs=self.pd_logprobs)

    @property
    def ok(self) -> bool:
        return self.all_external and self.bytes_ok and self.verdict.ok

    def row(self) -> ProofRow:
        """The proof as it is recorded (the logprobs stay out)."""
        v = self.verdict
        return ProofRow(**self.model_dump(exclude={"pd_logprobs"}), all_external=self.all_external,
                        bytes_match=self.bytes_match, tokens_match=self.tokens_match,
                        tokens_equal=self.tokens_match, tokens_ok=v.ok, diverged_at=v.diverged_at,
                        divergence_margin=v.margin, tokens_why=v.why)

    def as_dict(self) -> dict:
        return self.row().model_dump()


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
           decode_ms: float, tokens: list[int], base: list[int] | None, strict: bool,
           logprobs: list[dict[int, float]] | None) -> TransferProof:
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
        pd_tokens=tokens, baseline_tokens=base, strict=strict, pd_logprobs=logprobs)


def prove_transfer(prompts: list[list[int]], *, model: str, prefill_url: str, decode_url: str,
                   kv: KVShape, max_tokens: int = 16, baseline_url: str | None = None,
                   timeout: float = 120.0, strict: bool = True,
                   api_key: str | None = None) -> list[TransferProof]:
    """Prefill then decode each prompt sequentially, with per-request counter deltas.
    Use fresh prompts: a decode instance that has seen a prompt counts it as a local
    cache hit, not a transfer. `strict`: the output must equal the baseline's exactly
    (the CPU rehearsal); else `judge_tokens` allows a late near tie. `api_key`: the
    instances'."""
    proofs = []
    with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client:
        block_size = block_size_of(fetch_metrics(decode_url, client))
        for ids in prompts:
            before = read_counters(fetch_metrics(decode_url, client), require_nixl=False)
            t0 = time.perf_counter()
            params = prefill(client, prefill_url, model, ids)
            t1 = time.perf_counter()
            tokens, logprobs = decode_scored(client, decode_url, model, ids, max_tokens, params)
            t2 = time.perf_counter()
            d = _counters_after(client, decode_url, before) - before
            base = complete(client, baseline_url, model, ids, max_tokens) if baseline_url else None
            proofs.append(_proof(ids, d, kv, block_size, (t1 - t0) * 1000.0,
                                 (t2 - t1) * 1000.0, tokens, base, strict, logprobs))
    return proofs


def prove_via_proxy(prompts: list[list[int]], baseline_tokens: list[list[int]], *, model: str,
                    proxy_url: str, decode_urls: list[str], kv: KVShape, max_tokens: int,
                    timeout: float = 120.0, strict: bool = True, api_key: str | None = None,
                    instance_key: str | None = None) -> list[TransferProof]:
    """Each prompt through the proxy (prefill then decode), one at a time, with the decode
    instances' per-request counter deltas, compared with notebook 01's greedy tokens
    (`strict`: exactly, as on the CPU rehearsal; else `judge_tokens` allows a late near tie).
    `api_key` is the proxy's, `instance_key` the instances'."""
    proofs = []
    with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client, \
            httpx.Client(timeout=timeout, headers=auth_headers(instance_key)) as instances:
        block_size = block_size_of(fetch_metrics(decode_urls[0], instances))
        for ids, base in zip(prompts, baseline_tokens, strict=True):
            before = [read_counters(fetch_metrics(u, instances), require_nixl=False)
                      for u in decode_urls]
            t0 = time.perf_counter()
            tokens, logprobs = complete_scored(client, proxy_url, model, ids, max_tokens)
            e2e = (time.perf_counter() - t0) * 1000.0
            deltas = [_counters_after(instances, u, b, deadline_s=3.0 if len(decode_urls) > 1
                                      else 10.0) - b for u, b in zip(decode_urls, before,
                                                                     strict=True)]
            d = sum(deltas[1:], deltas[0])
            # through the proxy only the whole request is timed: it is in decode_ms
            proofs.append(_proof(ids, d, kv, block_size, float("nan"), e2e, tokens, base,
                                 strict, logprobs))
    return proofs
