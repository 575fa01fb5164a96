"""The prefill/decode protocol of vLLM's NixlConnector: the request bodies, as pure functions.

Disaggregated serving is two ordinary OpenAI-style requests tied together by one field,
`kv_transfer_params`, which the connector reads from the request and writes into the
response:

1. The **prefill** request is the client's request with `max_tokens=1` (and, for chat,
   `max_completion_tokens=1`), `stream: false`, the options that would produce more than
   that one token or stream dropped, and
   `kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false, ...}`.
   `do_remote_decode` tells the prefill instance's connector (kv_role `kv_producer` or
   `kv_both`) that another instance will decode: when the request finishes it keeps the
   prompt's KV blocks instead of freeing them (for a limited lease, in case no decode
   comes) and answers with its own
   `kv_transfer_params`: `do_remote_prefill: true`, `remote_block_ids` (where the blocks
   are), `remote_engine_id`, `remote_request_id`, `remote_host` and `remote_port` (its
   NIXL side channel), `tp_size` and a few more.
2. The **decode** request is the client's original request with the prefill's returned
   `kv_transfer_params` in place of whatever it carried. Seeing `do_remote_prefill`, the
   decode instance's connector (kv_role `kv_consumer` or `kv_both`) counts the prompt
   tokens as external, connects to the side channel (NIXL metadata handshake), READs the
   blocks over NIXL into blocks of its own, tells the prefill instance it may free them,
   and generates from there.

The remaining keys of the prefill's `kv_transfer_params` are sent as None: the connector
expects them present. `serve.proxy` and `serve.pd` both build their requests here.

One pair of requests carries one prompt and one choice. A prefill answers with the
`kv_transfer_params` of the first prompt only, and a decode handed one set for several
prompts (a batch, which the OpenAI SDK sends as a list) or several choices (`n` > 1) reads
blocks that are not there: vLLM asserts and the decode instance exits. So such a request
is split into one request per prompt and choice (`split`), each run as its own pair, and
the answers are put back together as one instance would have answered (`merge`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The prefill computes the prompt's KV and one token, in one non-streamed answer.
PREFILL_ONLY = {"max_tokens": 1, "max_completion_tokens": 1, "stream": False}
# Options that would make the prefill produce more than its one token, or stream.
PREFILL_DROP = ("stream_options", "min_tokens", "min_completion_tokens", "n", "best_of",
                "logprobs", "top_logprobs", "prompt_logprobs")
# What the prefill request tells the connector: keep the blocks, another instance decodes.
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False,
                 "remote_engine_id": None, "remote_block_ids": None, "remote_host": None,
                 "remote_port": None}


def prefill_request(body: Mapping, path: str = "/v1/completions") -> dict:
    """The prefill instance's request for the client's `body` sent to `path`.
    `max_completion_tokens` is set on chat requests only (the completions API has none)."""
    req = {k: v for k, v in body.items() if k not in PREFILL_DROP}
    chat = path.endswith("chat/completions")
    req.update({k: v for k, v in PREFILL_ONLY.items() if chat or k != "max_completion_tokens"})
    req["kv_transfer_params"] = dict(REMOTE_DECODE)
    return req


def transfer_params(prefill_response: Mapping) -> dict | None:
    """The `kv_transfer_params` a prefill instance answered with, or None when it gave
    none (its KV connector is missing or not a producer)."""
    return prefill_response.get("kv_transfer_params") or None


def decode_request(body: Mapping, params: Mapping) -> dict:
    """The decode instance's request: the client's `body` with the prefill's `params`."""
    return {**body, "kv_transfer_params": dict(params)}


def batch(body: Mapping) -> list | None:
    """The prompts of a completions request that sends several (a list of strings or of
    token-id lists), or None when it sends one (a string, or one list of token ids)."""
    p = body.get("prompt")
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        return p
    return None


def split(body: Mapping) -> list[dict]:
    """`body` as one request per prompt and per choice, in vLLM's choice order (prompt by
    prompt, each prompt's `n` choices in turn). A request with one prompt and one choice
    is returned as it is. With a `seed`, choice j of a prompt gets `seed + j`, so that its
    choices differ as one instance's would (their text is not the same as that
    instance's, which draws all `n` from one generator)."""
    n = int(body.get("n") or 1)  # as vLLM read it ("2" is 2): it has passed vLLM's checks
    prompts = batch(body)
    if prompts is None and n == 1:
        return [dict(body)]
    parts = []
    for prompt in prompts if prompts is not None else [body.get("prompt")]:
        for j in range(n):
            part = {**body, "n": 1}
            if prompts is not None:
                part["prompt"] = prompt
            if body.get("seed") is not None:  # kept inside vLLM's int64 range
                seed = body["seed"]
                part["seed"] = seed + j if seed + j < 2**63 else seed - j
            parts.append(part)
    return parts


def merge(answers: list[Mapping[str, Any]], n: int) -> dict:
    """One answer from the answers to `split`'s requests, in their order: the choices
    numbered as one instance numbers them, the usage added up (each prompt's tokens
    counted once, as vLLM counts them for `n` choices)."""
    merged = {k: v for k, v in answers[0].items() if k != "kv_transfer_params"}
    merged["choices"] = [{**c, "index": i}
                         for i, a in enumerate(answers) for c in a.get("choices", [])[:1]]
    usages = [a.get("usage") or {} for a in answers]
    prompt = sum(u.get("prompt_tokens", 0) for u in usages[::n])
    completion = sum(u.get("completion_tokens", 0) for u in usages)
    merged["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                       "total_tokens": prompt + completion}
    return merged
