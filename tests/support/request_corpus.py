"""A generated corpus of completions and chat requests for the differential test of the
proxy's checks against one vLLM instance (`test_proxy_engine`): every field the lab's
users send, with valid values, wrong types, out-of-range values and the combinations
vLLM's sampling checks judge (min_tokens above max_tokens, n > 1 greedy, logprobs and
streaming ...), singly and two or three at a time. Deterministic (a seeded generator).

The request's model name is not varied: an unknown model is refused by the instance
(404) without a prefill, and the proxy does not know the served name."""

from __future__ import annotations

import random
from typing import Any

COMPLETION_VALUES: dict[str, list[Any]] = {
    "prompt": ["hi", ["hi", "yo"], [1, 2, 3], [[1, 2], [3]], [], [-1], 5, None, [[]], [1.5]],
    "max_tokens": [1, 3, 0, -1, "2", 2.5, True, None, 10**20],
    "temperature": [0, 0.7, -0.5, "hot", None, 1e6, True],
    "top_p": [0, 0.5, 1, 1.5, -1, "x"],
    "top_k": [0, -1, 5, -2, 2.5],
    "min_p": [0, 0.5, 2, -0.1],
    "n": [1, 2, 0, -1, "2", 3],
    "seed": [0, 7, -1, 2**64, "x"],
    "stream": [True, False, "banana", None, 1],
    "stream_options": [{"include_usage": True}, {"include_usage": "banana"}, "yes", {},
                       {"continuous_usage_stats": True}],
    "logprobs": [0, 2, 20, 21, -1, True, None],
    "prompt_logprobs": [0, 1, -1, -2, 21, "1"],
    "min_tokens": [0, 1, 5, -1],
    "stop": ["x", ["a", "b"], 5, [1], None],
    "stop_token_ids": [[1], [-1], "1"],
    "presence_penalty": [0, 1.5, 3, -3],
    "frequency_penalty": [0, -2, 2.5],
    "repetition_penalty": [1, 0, 0.5, -1],
    "ignore_eos": [True, False, "yes"],
    "echo": [True, False, "no"],
    "logit_bias": [{"5": 1.0}, {"5": "x"}, [], {"5": 200}],
    "use_beam_search": [False, "x"],
    "response_format": [{"type": "text"}, {"type": "bogus"}, "json"],
    "logprob_token_ids": [[1, 2], [], [-1], "1"],
    "return_token_ids": [True, "x"],
    "skip_special_tokens": [False, 3],
    "include_stop_str_in_output": [True, "y"],
    "truncate_prompt_tokens": [2, -1, 0, -5],
    "allowed_token_ids": [[1, 2, 3], [], [-5]],
    "bad_words": [["x"], "x", [5]],
    "suffix": ["x", 5],
    "user": ["u", 5],
    "best_of": [1, 2, 0],
}

CHAT_VALUES: dict[str, list[Any]] = {
    "messages": [[{"role": "user", "content": "hi"}], [], "hi", [{"content": "hi"}],
                 [{"role": "user", "content": 5}], [{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": "hi"}],
                 [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]],
    "max_completion_tokens": [1, 3, 0, -1, "2"],
    "max_tokens": [2, 0, -1],
    "logprobs": [True, False, "x", 2],
    "top_logprobs": [0, 2, 20, 21, -1],
    "n": [1, 2, 0],
    "temperature": [0, 0.7, -1],
    "top_p": [0.5, 0, 2],
    "stream": [True, False, "x"],
    "stream_options": [{"include_usage": True}, {"include_usage": "banana"}, "yes"],
    "min_tokens": [0, 5, -1],
    "prompt_logprobs": [1, -1, -2],
    "seed": [1, "x"],
    "stop": ["x", 5],
    "presence_penalty": [1, 5],
    "response_format": [{"type": "text"}, {"type": "bogus"}],
    "tool_choice": ["none", "auto", "bogus"],
    "echo": [True, "x"],
    "add_generation_prompt": [False, "x"],
    "continue_final_message": [True],
    "ignore_eos": [True, 3],
}


def _requests(base: dict, values: dict[str, list[Any]], extra: int, rng: random.Random,
              ) -> list[dict]:
    out = [{**base, key: v} for key, vs in values.items() for v in vs]
    keys = list(values)
    for _ in range(extra):
        picked = rng.sample(keys, rng.choice((2, 3)))
        out.append({**base, **{k: rng.choice(values[k]) for k in picked}})
    return out


def corpus(model: str, seed: int = 46) -> list[tuple[str, dict]]:
    """(path, body) pairs: at least 300 completions and 200 chat requests."""
    rng = random.Random(seed)
    completions = _requests({"model": model, "prompt": "hi there", "max_tokens": 2},
                            COMPLETION_VALUES, 300 - sum(map(len, COMPLETION_VALUES.values()))
                            + 60, rng)
    chat = _requests({"model": model, "messages": [{"role": "user", "content": "hi"}],
                      "max_completion_tokens": 2}, CHAT_VALUES,
                     200 - sum(map(len, CHAT_VALUES.values())) + 40, rng)
    return ([("/v1/completions", b) for b in completions]
            + [("/v1/chat/completions", b) for b in chat])
