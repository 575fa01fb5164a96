"""The prefill/decode request bodies (`serve.protocol`), as the proxy and `serve.pd` send them."""

from __future__ import annotations

from lab_utils.serve.protocol import (
    PREFILL_DROP,
    REMOTE_DECODE,
    batch,
    decode_request,
    merge,
    prefill_request,
    split,
    transfer_params,
)

CLIENT = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 64, "temperature": 0.0,
          "stream": True, "stream_options": {"include_usage": True}, "min_tokens": 10,
          "n": 2, "best_of": 2, "logprobs": 3, "prompt_logprobs": 1, "ignore_eos": True}


def test_prefill_asks_for_one_token_unstreamed_and_a_remote_decode():
    req = prefill_request(CLIENT, "/v1/completions")
    assert req["max_tokens"] == 1 and req["stream"] is False
    assert "max_completion_tokens" not in req  # the completions API has none
    assert not set(PREFILL_DROP) & set(req)
    assert req["kv_transfer_params"] == REMOTE_DECODE
    assert req["kv_transfer_params"]["do_remote_decode"] is True
    assert req["kv_transfer_params"]["do_remote_prefill"] is False
    # the rest of the request (model, prompt, sampling) goes as the client sent it
    assert {k: req[k] for k in ("model", "prompt", "temperature", "ignore_eos")} == {
        "model": "m", "prompt": [1, 2, 3], "temperature": 0.0, "ignore_eos": True}


def test_chat_prefill_also_caps_max_completion_tokens():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 50, "min_completion_tokens": 5, "top_logprobs": 2}
    req = prefill_request(body, "/v1/chat/completions")
    assert req["max_completion_tokens"] == 1 and req["max_tokens"] == 1
    assert "min_completion_tokens" not in req and "top_logprobs" not in req
    assert req["messages"] == body["messages"]


def test_requests_leave_the_client_body_and_the_template_alone():
    body = dict(CLIENT, kv_transfer_params={"from": "client"})
    before = dict(body)
    req = prefill_request(body)
    req["kv_transfer_params"]["remote_host"] = "changed"
    assert body == before
    assert REMOTE_DECODE["remote_host"] is None
    assert prefill_request(body)["kv_transfer_params"]["remote_host"] is None


def test_decode_is_the_original_request_with_the_prefills_params():
    returned = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[0, 1]],
                "remote_engine_id": "e0", "remote_request_id": "r0", "remote_host": "10.0.0.1",
                "remote_port": 5600, "tp_size": 1}
    body = dict(CLIENT, kv_transfer_params={"do_remote_decode": True})
    req = decode_request(body, returned)
    assert req == {**CLIENT, "kv_transfer_params": returned}  # the client's own is replaced
    assert req["max_tokens"] == 64 and req["stream"] is True  # not the prefill's limits
    assert body["kv_transfer_params"] == {"do_remote_decode": True}


def test_transfer_params_of_a_prefill_answer():
    params = {"do_remote_prefill": True, "remote_block_ids": [[3]]}
    assert transfer_params({"choices": [], "kv_transfer_params": params}) == params
    for answer in ({"choices": []}, {"kv_transfer_params": None}, {"kv_transfer_params": {}}):
        assert transfer_params(answer) is None


def test_a_batch_and_n_are_split_into_one_request_per_prompt_and_choice():
    body = {"model": "m", "prompt": ["a", [5, 6]], "n": 2, "seed": 7, "max_tokens": 4}
    parts = split(body)
    assert [(p["prompt"], p["n"], p["seed"]) for p in parts] == [
        ("a", 1, 7), ("a", 1, 8), ([5, 6], 1, 7), ([5, 6], 1, 8)]
    assert all(p["max_tokens"] == 4 for p in parts) and body["n"] == 2  # client's left alone
    # one prompt (a string, or one list of token ids) and one choice: as it came
    for one in ({"prompt": "a"}, {"prompt": [1, 2, 3]}, {"prompt": "a", "n": 1}, {"messages": []}):
        assert split(one) == [one] and batch(one) is None
    chat = split({"messages": [{"role": "user", "content": "hi"}], "n": 3})
    assert len(chat) == 3 and all("prompt" not in p and p["n"] == 1 for p in chat)
    # a seed at the top of vLLM's range stays inside it
    assert [p["seed"] for p in split({"prompt": "a", "n": 2, "seed": 2**63 - 1})] == [
        2**63 - 1, 2**63 - 2]


def test_merged_answers_are_numbered_and_counted_as_one_instance_answers():
    answers = [{"id": f"c{i}", "choices": [{"index": 0, "text": t}], "kv_transfer_params": None,
                "usage": {"prompt_tokens": p, "completion_tokens": 4, "total_tokens": p + 4}}
               for i, (t, p) in enumerate([("x", 3), ("y", 3), ("z", 9), ("w", 9)])]
    merged = merge(answers, n=2)
    assert [(c["index"], c["text"]) for c in merged["choices"]] == [
        (0, "x"), (1, "y"), (2, "z"), (3, "w")]
    # each prompt's tokens once (3 + 9), every choice's output (4 x 4)
    assert merged["usage"] == {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28}
    assert merged["id"] == "c0" and "kv_transfer_params" not in merged
