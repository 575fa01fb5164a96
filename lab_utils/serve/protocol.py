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
"""

from __future__ import annotations

from collections.abc import Mapping

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
