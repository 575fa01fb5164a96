"""What the proxy checks in a completions or chat request before any backend sees it.

In prefill/decode mode the proxy rewrites `max_tokens`, `stream`, `n`, the logprobs and
`stream_options` for the prefill call, so a field that only the decode instance would
refuse was refused after the prefill had run (and its KV blocks were held until their
lease ended). So the proxy checks the fields vLLM's OpenAI schemas and sampling
parameters check, with vLLM's ranges, plus the lab's own limits on `n` and `max_tokens`,
and refuses with vLLM's error shape (`message`, `type`, `param`, `code`) naming the field.
Fields it does not know pass through unchanged, for vLLM to judge.

Pure functions of the parsed body (no I/O), so each rule is tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT64 = 2**63 - 1
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


@dataclass(frozen=True)
class Limits:
    """The lab's own limits: the most choices (`n`, `best_of`) and output tokens a request
    may ask for (None: no limit but vLLM's)."""

    max_n: int = 8
    max_tokens: int | None = None


class InvalidRequest(ValueError):
    """A request vLLM would refuse: the field (`param`) and why."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v))


def _int(body: Mapping, key: str, lo: int, hi: int | None = INT64, *,
         hint: str = "") -> None:
    v = body.get(key)
    if v is None:
        return
    if not _is_int(v):
        raise InvalidRequest(key, f"must be an integer, got {_shown(v)}")
    top = INT64 if hi is None else hi
    if not lo <= v <= top:
        rng = f"at least {lo}" if top == INT64 else f"between {lo} and {top}"
        raise InvalidRequest(key, f"must be {rng}, got {v}{hint}")


def _num(body: Mapping, key: str, lo: float, hi: float, *, lo_open: bool = False) -> None:
    v = body.get(key)
    if v is None:
        return
    if not _is_num(v):
        raise InvalidRequest(key, f"must be a finite number, got {_shown(v)}")
    if v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise InvalidRequest(key, f"must be in {left}{lo:g}, {hi:g}], got {v}")


def _bool(body: Mapping, key: str) -> None:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise InvalidRequest(key, f"must be true or false, got {_shown(v)}")


def _shown(v: Any) -> str:
    text = repr(v) if not isinstance(v, (dict, list)) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(t) and 0 <= t <= INT64 for t in v)


def _prompt(body: Mapping) -> None:
    if "prompt" not in body or body["prompt"] is None:
        raise InvalidRequest("prompt", "is required")
    p = body["prompt"]
    ok = (isinstance(p, str) or _token_ids(p)
          or (isinstance(p, list) and p and (all(isinstance(x, str) for x in p)
                                             or all(_token_ids(x) for x in p))))
    if not ok:
        raise InvalidRequest("prompt", "must be a string, a list of strings, a list of token "
                                       f"ids or a list of token id lists, got {_shown(p)}")


def _messages(body: Mapping) -> None:
    m = body.get("messages")
    if not isinstance(m, list) or not m:
        raise InvalidRequest("messages", "must be a non-empty list of messages")
    for i, msg in enumerate(m):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidRequest(f"messages[{i}]", "must be an object with a string 'role'")


def _stop(body: Mapping) -> None:
    v = body.get("stop")
    if v is None or isinstance(v, str):
        return
    if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise InvalidRequest("stop", "must be a string or a list of strings")


def check_request(body: Mapping, path: str, limits: Limits = Limits()) -> None:
    """Raise `InvalidRequest` for a completions (`path` ending in /completions) or chat
    request vLLM would refuse, or one over the lab's `limits`."""
    chat = path.endswith("chat/completions")
    if "model" in body and body["model"] is not None and not isinstance(body["model"], str):
        raise InvalidRequest("model", f"must be a string, got {_shown(body['model'])}")
    _messages(body) if chat else _prompt(body)
    for key in ("stream", "echo", "ignore_eos", "skip_special_tokens", "return_token_ids",
                "include_stop_str_in_output", "add_special_tokens",
                "return_tokens_as_token_ids", "spaces_between_special_tokens"):
        _bool(body, key)
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise InvalidRequest("stream_options", "must be an object")
    cap = limits.max_tokens
    hint = " (the lab's limit: the served max_model_len)" if cap else ""
    lowest = 0 if (not chat and body.get("echo") is True) else 1
    for key in ("max_tokens", "max_completion_tokens"):
        _int(body, key, lowest, cap, hint=hint)
    _int(body, "min_tokens", 0, cap)
    for key in ("n", "best_of"):
        _int(body, key, 1, limits.max_n, hint=" (the lab's limit, proxy.max_n)")
    _num(body, "temperature", 0.0, 1e6)
    _num(body, "top_p", 0.0, 1.0, lo_open=True)
    _num(body, "min_p", 0.0, 1.0)
    _num(body, "presence_penalty", -2.0, 2.0)
    _num(body, "frequency_penalty", -2.0, 2.0)
    _num(body, "repetition_penalty", 0.0, 1e6, lo_open=True)
    _num(body, "length_penalty", -1e6, 1e6)
    _int(body, "top_k", -1, INT64)
    _int(body, "seed", -INT64 - 1, INT64)
    if chat:
        _bool(body, "logprobs")
        _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    else:
        _int(body, "logprobs", 0, MAX_LOGPROBS)
    _int(body, "prompt_logprobs", -1, MAX_LOGPROBS)
    _stop(body)
    lb = body.get("logit_bias")
    if lb is not None and not (isinstance(lb, dict) and all(_is_num(v) for v in lb.values())):
        raise InvalidRequest("logit_bias", "must be an object of token id to finite number")
