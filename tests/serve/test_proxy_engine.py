"""The proxy in front of real rehearsal vLLM instances: streamed P/D output equals the
baseline's token for token, and a client that leaves mid-decode leaves nothing running."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from lab_utils.config import api_key
from lab_utils.measure.loadgen import auth_headers
from lab_utils.measure.prompts import fresh_prompts, load_tokenizer
from lab_utils.serve.metrics import fetch_metrics, read_counters
from lab_utils.serve.pd import complete
from lab_utils.serve.proxy import ProxySettings, create_app

from support.fakes import ServerThread

pytestmark = pytest.mark.slow


@pytest.fixture
def pd_proxy(rehearsal, engine_cfg):
    urls = rehearsal.up()
    settings = ProxySettings("disaggregated", prefill=[urls["prefill"]], decode=[urls["decode"]],
                             backend_api_key=api_key(engine_cfg, "vllm"),
                             max_tokens=engine_cfg.vllm.max_model_len)
    with ServerThread(create_app(settings), "127.0.0.4") as p:
        yield p, urls


def stream_tokens(client: httpx.Client, url: str, body: dict) -> list[int]:
    tokens: list[int] = []
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                assert "error" not in event, event
                tokens += event["choices"][0].get("token_ids") or []
    return tokens


def test_streamed_pd_output_equals_baseline(pd_proxy, engine_cfg):
    proxy, urls = pd_proxy
    model = engine_cfg.model.name
    prompts, _ = fresh_prompts(load_tokenizer(engine_cfg.model_path), [24, 77, 150])
    # the instances want their key; the proxy wants none and ignores it
    with httpx.Client(timeout=120, headers=auth_headers(api_key(engine_cfg, "vllm"))) as c:
        for ids in prompts:
            before = read_counters(fetch_metrics(urls["decode"], c), require_nixl=False)
            body = {"model": model, "prompt": ids, "max_tokens": 20, "temperature": 0,
                    "ignore_eos": True, "stream": True, "return_token_ids": True}
            streamed = stream_tokens(c, proxy.url, body)
            assert streamed == complete(c, urls["baseline"], model, ids, 20)
            after = read_counters(fetch_metrics(urls["decode"], c), require_nixl=False)
            assert (after - before).prompt_tokens_external_kv_transfer == len(ids)


def running(client: httpx.Client, url: str) -> float:
    return read_counters(fetch_metrics(url, client), require_nixl=False).requests_running


def test_client_leaving_mid_decode_cancels_upstream(pd_proxy, engine_cfg):
    proxy, urls = pd_proxy
    prompts, _ = fresh_prompts(load_tokenizer(engine_cfg.model_path), [32])
    body = {"model": engine_cfg.model.name, "prompt": prompts[0], "max_tokens": 1800,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", f"{proxy.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(5):
                next(lines)
            assert running(c, urls["decode"]) == 1  # decoding when the client goes away
        t_end = time.monotonic() + 15
        while running(c, urls["decode"]) and time.monotonic() < t_end:
            time.sleep(0.1)
        assert running(c, urls["decode"]) == 0 and running(c, urls["prefill"]) == 0


def test_a_batch_and_n_through_pd_answer_what_one_instance_answers(pd_proxy, engine_cfg):
    """What the OpenAI SDK sends for a batch (a list of prompts, the long one second) and
    for n > 1: the same text as the single instance gives, and the pair still serves."""
    proxy, urls = pd_proxy
    key = api_key(engine_cfg, "vllm")
    model = engine_cfg.model.name
    prompts = ["hi", " ".join(["the quick brown fox jumps over the lazy dog"] * 25)]
    through = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=f"{urls['baseline']}/v1", api_key=key, max_retries=0)
    ask = {"model": model, "max_tokens": 6, "temperature": 0, "timeout": 120}
    got = through.completions.create(**ask, prompt=prompts)
    want = direct.completions.create(**ask, prompt=prompts)
    assert [(c.index, c.text) for c in got.choices] == [(c.index, c.text) for c in want.choices]
    assert got.usage == want.usage
    # n > 1 samples (vLLM refuses it greedy, and so does the proxy): one pair a choice
    sampled = {**ask, "temperature": 0.8, "seed": 3, "n": 3, "extra_body": {"ignore_eos": True}}
    got = through.completions.create(**sampled, prompt=prompts[1])
    want = direct.completions.create(**sampled, prompt=prompts[1])
    assert [c.index for c in got.choices] == [0, 1, 2] and got.usage == want.usage
    for greedy in (through, direct):
        with pytest.raises(openai.BadRequestError, match="greedy"):
            greedy.completions.create(**ask, prompt=prompts[1], n=2)
    with httpx.Client(timeout=10, headers=auth_headers(key)) as c:
        assert c.get(f"{proxy.url}/health").json()["status"] == "ok"
    one = through.completions.create(**ask, prompt="hello again")
    assert one.choices[0].text == direct.completions.create(**ask, prompt="hello again").choices[0].text


def _answer(r: httpx.Response) -> tuple[int, str | None]:
    """An answer's status and, for an error, vLLM's error type."""
    if r.status_code == 200:
        return 200, None
    try:
        return r.status_code, r.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return r.status_code, r.text[:80]


def _by_design(body: dict, answer: tuple[int, str | None]) -> bool:
    """Refused by the disaggregated front door on purpose (docs/PROXY.md): beam search,
    and streaming several prompts or choices."""
    n, prompt = body.get("n"), body.get("prompt")
    several = (isinstance(n, int) and n > 1) or (isinstance(prompt, list) and len(prompt) > 1
                                                 and not isinstance(prompt[0], int))
    return answer[0] == 400 and (body.get("use_beam_search") is True
                                 or (body.get("stream") is True and several))


def test_the_proxy_refuses_what_vllm_refuses_before_any_prefill(pd_proxy, engine_cfg):
    """The differential test of the proxy's checks (vLLM's own rules, loaded from this
    Python's vLLM): a generated corpus of 600 requests, each sent to one instance and
    through the P/D front door. Same status and error type for each; no request the
    instance refuses moves the prefill's prompt-token counter."""
    from support.request_corpus import corpus

    proxy, urls = pd_proxy
    key = api_key(engine_cfg, "vllm")
    requests = corpus(engine_cfg.model.name)
    differ, costly = [], []
    with httpx.Client(timeout=120, headers=auth_headers(key)) as c:
        def prefilled() -> float:
            return read_counters(fetch_metrics(urls["prefill"], c), require_nixl=False).prompt_tokens

        direct = [_answer(c.post(f"{urls['baseline']}{path}", json=body)) for path, body in requests]
        refused = [i for i, d in enumerate(direct) if d[0] != 200]

        def through(i: int) -> None:
            path, body = requests[i]
            got = _answer(c.post(f"{proxy.url}{path}", json=body))
            if direct[i] != got and not (direct[i][0] == 200 and _by_design(body, got)):
                differ.append((path, body, direct[i], got))

        # what the instance refuses, all through the proxy: the prefill computed nothing
        before = prefilled()
        for i in refused:
            through(i)
        if prefilled() != before:  # which ones: again, one at a time
            for i in refused:
                was = prefilled()
                c.post(f"{proxy.url}{requests[i][0]}", json=requests[i][1])
                if prefilled() != was:
                    costly.append((*requests[i], direct[i]))
        for i in sorted(set(range(len(requests))) - set(refused)):
            through(i)
    print(f"\n[differential] {len(requests)} requests, {len(refused)} refused by vLLM; "
          f"{len(differ)} answered differently by the proxy, {len(costly)} refused after a prefill")
    assert len(requests) >= 500 and len(refused) >= 100
    assert not (differ or costly), "\n".join(
        [f"{p} {json.dumps(b)[:200]}: vLLM {d}, proxy {t}" for p, b, d, t in differ]
        + [f"after a prefill: {p} {json.dumps(b)[:200]}: vLLM {d}" for p, b, d in costly])
