"""The proxy in front of real rehearsal vLLM instances: streamed P/D output equals the
baseline's token for token, and a client that leaves mid-decode leaves nothing running."""

from __future__ import annotations

import json
import time

import httpx
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
                             backend_api_key=api_key(engine_cfg, "vllm"))
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
