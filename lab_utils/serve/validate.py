"""What the proxy checks in a completions or chat request before any backend sees it.

In prefill/decode mode the proxy rewrites `max_tokens`, `stream`, `n`, the logprobs and
`stream_options` for the prefill call, so a field that only the decode instance would
refuse was refused after the prefill had run (and its KV blocks were held until their
lease ended). So the proxy checks the fields vLLM's OpenAI schemas and sampling
parameters check, with vLLM's ranges, plus the lab's own limits on `n` and `max_tokens`,
and refuses with vLLM's error shape (`message`, `type`, `param`, `code`) naming the field.
Fields it does not know pass through unchanged, for vLLM to judge.

Where this Python has vLLM (the rehearsal, and a controller that is one of the nodes), the
proxy checks with vLLM's own rules instead (`VllmRules`): its request models, then the
sampling parameters its server builds from them, so nothing one instance refuses reaches
a prefill; a differential test sends a generated corpus to one instance and through the
proxy and compares. Without vLLM (a CPU controller with the lab only), the hand-written
checks below stand in, and the proxy says at start-up that it uses them; they read
scalars with pydantic's lax rules, as vLLM's models do, and tests/serve/test_hand_rules.py
shows them refusing exactly what vLLM's rules refuse over three generated corpora.

Pure functions of the parsed body (no I/O), so each rule is tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pydantic import TypeAdapter, ValidationError

INT64 = 2**63 - 1
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


@dataclass(frozen=True)
class Limits:
    """The lab's own limits: the most choices (`n`, `best_of`) and output tokens a request
    may ask for (None: no limit but vLLM's)."""

    max_n: int = 8
    max_tokens: int | None = None


class InvalidRequest(ValueError):
    """A request vLLM would refuse: the field (`param`), why, and the error type vLLM
    answers with (`kind`: "Bad Request" for its request models, "BadRequestError" for
    its sampling checks)."""

    def __init__(self, param: str | None, message: str, kind: str = "BadRequestError",
                 status: int = 400):
        super().__init__(f"{param}: {message}" if param and param not in message else message)
        self.param, self.kind, self.status = param, kind, status


class VllmRules:
    """vLLM's own checks of a completions or chat request: its pydantic request model,
    then the sampling (or beam-search) parameters its server makes from it. Loading them
    imports vLLM's OpenAI layer (about 7 s and 0.5 GB here), once per proxy."""

    def __init__(self) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )

        self.error = create_error_response
        self.models: dict[str, Any] = {"chat": ChatCompletionRequest,
                                       "completions": CompletionRequest}

    @staticmethod
    def served(max_model_len: int | None) -> Any:
        """What vLLM's logprob check reads of the served model: its --max-logprobs
        (vLLM's default, which the lab keeps) and sizes no request id can pass."""
        return SimpleNamespace(max_logprobs=MAX_LOGPROBS, get_vocab_size=lambda: INT64,
                               max_model_len=max_model_len or INT64)

    def check(self, body: Mapping, path: str, max_tokens: int | None) -> dict[str, Any]:
        """Raise `InvalidRequest` where vLLM would, with its status, error type and field;
        `max_tokens` stands for the output length vLLM's server works out when a request
        sets none (the served context). Returns the lengths and counts as vLLM read them
        (it takes "2" for 2), for the lab's limits."""
        model = self.models["chat" if path.endswith("chat/completions") else "completions"]
        try:
            req = model.model_validate(body)
            asked = getattr(req, "max_completion_tokens", None)
            asked = req.max_tokens if asked is None else asked
            tokens = asked if asked is not None else (max_tokens or 2**31 - 1)
            if req.use_beam_search:
                req.to_beam_search_params(tokens, {})
            else:
                # and the logprob counts against the served model's --max-logprobs (what
                # the engine checks next; the prefill is sent none, so only the decode
                # would); token ids are checked against the vocabulary by the prefill
                req.to_sampling_params(tokens, {})._validate_logprobs(self.served(max_tokens))
        except ValidationError as e:  # vLLM's server: 400 "Bad Request", the field's path
            first = e.errors()[0]
            loc = [str(p) for p in first.get("loc", ()) if not any(c in str(p) for c in "[(")]
            raise InvalidRequest(".".join(loc) or None, first.get("msg", str(e)),
                                 kind="Bad Request") from None
        except Exception as e:  # what vLLM's server makes of any other error it raises
            err = self.error(e).error
            raise InvalidRequest(err.param, err.message, kind=err.type,
                                 status=err.code) from None
        return {k: getattr(req, k, None) for k in ("max_tokens", "max_completion_tokens", "n",
                                                    "best_of")}


def vllm_rules() -> VllmRules | None:
    """vLLM's own checks, or None where this Python has no vLLM."""
    try:
        return VllmRules()
    except ImportError:
        return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v))


# vLLM's request models are pydantic models in lax mode: "2" is 2, 2.0 is 2, True is 1,
# "no" is False. The hand checks read scalars the same way, with pydantic's own adapters
# (fastapi, which the proxy runs on, brings pydantic), so they refuse no value vLLM takes.
_LAX: dict[Any, TypeAdapter[Any]] = {int: TypeAdapter(int), float: TypeAdapter(float), bool: TypeAdapter(bool),
        str: TypeAdapter(str), "ints": TypeAdapter(list[int]), "strs": TypeAdapter(list[str])}


def _lax(body: Mapping, key: str, kind: Any, what: str) -> Any:
    """The field as vLLM's models read it (None when absent or null), or InvalidRequest."""
    v = body.get(key)
    if v is None:
        return None
    try:
        return _LAX[kind].validate_python(v)
    except ValidationError:
        raise InvalidRequest(key, f"must be {what}, got {_shown(v)}", kind="Bad Request") from None


def _int(body: Mapping, key: str, lo: int | None, hi: int | None = INT64, *,
         hint: str = "") -> int | None:
    v = _lax(body, key, int, "an integer")
    if v is None:
        return None
    top = INT64 if hi is None else hi
    if not (lo is None or lo <= v) or not v <= top:
        rng = f"at least {lo}" if top == INT64 else f"between {lo} and {top}"
        raise InvalidRequest(key, f"must be {rng}, got {v}{hint}")
    return v


def _strict_int(body: Mapping, key: str, lo: int, hi: int, *, hint: str = "") -> None:
    """A logprob count: vLLM's sampling check wants an integer itself (not "2")."""
    v = body.get(key)
    if v is not None and not isinstance(v, int):
        raise InvalidRequest(key, f"`{key}` must be an integer.")
    _int(body, key, lo, hi, hint=hint)


def _num(body: Mapping, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
    v = _lax(body, key, float, "a number")
    if v is None:
        return None
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise InvalidRequest(key, f"must be in {left}{lo:g}, {hi:g}], got {v}")
    return v


def _bool(body: Mapping, key: str) -> bool | None:
    return _lax(body, key, bool, "true or false")


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
    if not isinstance(m, list):
        raise InvalidRequest("messages", "must be a list of messages")
    for i, msg in enumerate(m):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidRequest(f"messages[{i}]", "must be an object with a string 'role'")
        if "content" in msg and not isinstance(msg["content"], (str, list)):
            raise InvalidRequest(f"messages[{i}].content", "must be a string or a list of "
                                 "content parts", kind="Bad Request")


def _stop(body: Mapping) -> None:
    v = body.get("stop")
    if v is None or isinstance(v, str):
        return
    if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        raise InvalidRequest("stop", "must be a string or a list of strings")


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _combinations(body: Mapping, chat: bool, stream: bool | None, tokens: int | None) -> None:
    """vLLM's checks of fields against each other (its sampling parameters' and request
    models' validators), with its messages."""
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise InvalidRequest("stream_options", "must be an object", kind="Bad Request")
        for key in ("include_usage", "continuous_usage_stats"):
            _lax(so, key, bool, "true or false")
        if so and not stream:
            raise InvalidRequest("stream_options", "Stream options can only be defined when "
                                 "`stream=True`.")
    if body.get("prompt_logprobs") and stream:
        raise InvalidRequest("prompt_logprobs", "`prompt_logprobs` are not available when "
                             "`stream=True`.")
    ids = _lax(body, "logprob_token_ids", "ints", "a list of token ids")
    if ids:
        if body.get("logprobs") in (None, False):
            raise InvalidRequest("logprob_token_ids", "when using `logprob_token_ids`, "
                                 "`logprobs` must be set.")
        if any(t < 0 for t in ids):
            raise InvalidRequest("logprob_token_ids", "contains out-of-vocab token ids")
    if chat and body.get("top_logprobs") and not _bool(body, "logprobs"):
        raise InvalidRequest("top_logprobs", "when using `top_logprobs`, `logprobs` must be "
                             "set to true.")
    if chat and body.get("tool_choice") not in (None, "none") and not body.get("tools"):
        raise InvalidRequest("tool_choice", "When using `tool_choice`, `tools` must be set.")
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") in RESPONSE_FORMATS):
        raise InvalidRequest("response_format", "must be an object whose type is one of "
                             f"{', '.join(RESPONSE_FORMATS)}", kind="Bad Request")
    n = _int(body, "n", 1) or 1
    if n > 1 and _num(body, "temperature", 0.0, 2.0) == 0.0:
        raise InvalidRequest(None, f"n must be 1 when using greedy sampling, got {n}.")
    low = _int(body, "min_tokens", 0, None)
    if low is not None and tokens is not None and low > tokens:
        raise InvalidRequest(None, f"min_tokens must be less than or equal to "
                             f"max_tokens={tokens}, got {low}.")


def check_request(body: Mapping, path: str, limits: Limits = Limits(),
                  rules: VllmRules | None = None) -> None:
    """Raise `InvalidRequest` for a completions (`path` ending in /completions) or chat
    request vLLM would refuse (by vLLM's own `rules` where given, else by the checks
    here), or one over the lab's `limits`."""
    if rules is not None:
        _limits(rules.check(body, path, limits.max_tokens), limits)
        return
    chat = path.endswith("chat/completions")
    if "model" in body and body["model"] is not None and not isinstance(body["model"], str):
        raise InvalidRequest("model", f"must be a string, got {_shown(body['model'])}")
    _messages(body) if chat else _prompt(body)
    for key in ("echo", "ignore_eos", "skip_special_tokens", "return_token_ids",
                "include_stop_str_in_output", "add_special_tokens", "use_beam_search",
                "return_tokens_as_token_ids", "spaces_between_special_tokens",
                "add_generation_prompt", "continue_final_message"):
        _bool(body, key)
    stream = _bool(body, "stream")
    lowest = 0 if (not chat and _bool(body, "echo") is True) else 1
    # chat: max_tokens (deprecated) is not read where max_completion_tokens is set
    read = ("max_completion_tokens",) if chat and body.get("max_completion_tokens") is not None \
        else ("max_tokens", "max_completion_tokens")
    asked = {key: _int(body, key, lowest) if key in read else None
             for key in ("max_tokens", "max_completion_tokens")}
    tokens = asked["max_completion_tokens"] if asked["max_completion_tokens"] is not None \
        else asked["max_tokens"]
    _int(body, "min_tokens", 0, limits.max_tokens)
    counts = {"n": _int(body, "n", 1), "best_of": _int(body, "best_of", None)}
    _limits({**asked, **counts}, limits)
    _num(body, "temperature", 0.0, 2.0)
    _num(body, "top_p", 0.0, 1.0, lo_open=True)
    _num(body, "min_p", 0.0, 1.0)
    _num(body, "presence_penalty", -2.0, 2.0)
    _num(body, "frequency_penalty", -2.0, 2.0)
    _num(body, "repetition_penalty", 0.0, 1e6, lo_open=True)
    _num(body, "length_penalty", -1e6, 1e6)
    _int(body, "top_k", -1, INT64)
    _int(body, "seed", -INT64 - 1, INT64)
    _int(body, "truncate_prompt_tokens", -1, INT64)
    if chat:
        _bool(body, "logprobs")
        _strict_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    else:
        _strict_int(body, "logprobs", 0, MAX_LOGPROBS)
    _strict_int(body, "prompt_logprobs", 0, MAX_LOGPROBS, hint=" (-1, every token's, is "
                f"more than vLLM's --max-logprobs {MAX_LOGPROBS} allows)")
    _stop(body)
    for key in ("suffix", "user"):
        _lax(body, key, str, "a string")
    _lax(body, "stop_token_ids", "ints", "a list of token ids")
    _lax(body, "bad_words", "strs", "a list of strings")
    lb = body.get("logit_bias")
    if lb is not None and not (isinstance(lb, dict) and all(_is_num(v) for v in lb.values())):
        raise InvalidRequest("logit_bias", "must be an object of token id to finite number")
    _combinations(body, chat, stream, tokens)


def _limits(values: Mapping, limits: Limits) -> None:
    """The lab's own limits on output tokens and choices, applied to a request whose
    fields have passed vLLM's checks (or the ones here): upper bounds only."""
    tokens = (limits.max_tokens, "the lab's limit: the served max_model_len")
    choices = (limits.max_n, "the lab's limit, proxy.max_n")
    caps = {"max_tokens": tokens, "max_completion_tokens": tokens, "n": choices,
            "best_of": choices}
    for key, (cap, why) in caps.items():
        v = values.get(key)
        if cap is not None and isinstance(v, int) and v > cap:
            raise InvalidRequest(key, f"must be at most {cap} ({why}), got {v}")
