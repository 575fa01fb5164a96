"""The lab proxy against test doubles: routing, the P/D protocol, streaming pass-through
and every failure behaviour, each with a bounded time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import httpx
import pytest

from lab_utils.serve.proxy import MAX_HEADER_BYTES, ProxySettings, create_app, server_options
from lab_utils.serve.proxy_server import guarded_protocol

from support.fakes import FakeBackend, ServerThread, free_port

ADDR = "127.0.0.4"


@pytest.fixture(scope="module")
def backends():
    fakes = [FakeBackend(f"b{i}") for i in range(3)]
    servers = [ServerThread(f.app, "127.0.0.5") for f in fakes]
    for s in servers:
        s.__enter__()
    yield list(zip(fakes, servers, strict=True))
    for s in servers:
        s.__exit__()


@pytest.fixture(autouse=True)
def fresh(backends):
    for fake, _ in backends:
        fake.requests.clear()
        fake.auth.clear()
        for ev in (fake.go_ahead, fake.first_chunk_sent, fake.stream_cancelled):
            ev.clear()


def proxy(settings: ProxySettings) -> ServerThread:
    """The proxy served as `serve.proxy.run` serves it (its uvicorn settings)."""
    return ServerThread(create_app(settings), ADDR,
                        **{**server_options(settings), "timeout_graceful_shutdown": 1})


def body(model="fake", stream=False, **kw) -> dict:
    return {"model": model, "prompt": "hello", "max_tokens": 8, "stream": stream, **kw}


def test_round_robin_spreads_requests(backends):
    urls = [s.url for _, s in backends[:2]]
    with proxy(ProxySettings("replicated", backends=urls)) as p:
        for _ in range(4):
            assert httpx.post(f"{p.url}/v1/completions", json=body()).status_code == 200
    assert [len(f.requests) for f, _ in backends[:2]] == [2, 2]


def test_least_outstanding_avoids_the_busy_backend(backends):
    (busy, bs), (idle, is_) = backends[0], backends[1]
    settings = ProxySettings("replicated", backends=[bs.url, is_.url], policy="least_outstanding")
    with proxy(settings) as p, httpx.Client(timeout=30) as c, \
            c.stream("POST", f"{p.url}/v1/completions", json=body("gaps", stream=True)) as held:
        chunks = held.iter_raw()  # keep the iterator: dropping it closes the stream
        next(chunks)  # the first request is now in flight on one backend
        for _ in range(3):
            assert c.post(f"{p.url}/v1/completions", json=body()).status_code == 200
        holder, other = (busy, idle) if busy.first_chunk_sent.is_set() else (idle, busy)
        assert len(other.requests) == 3 and len(holder.requests) == 1
        holder.go_ahead.set()


def test_stream_chunks_pass_through_unbuffered(backends):
    fake, server = backends[0]
    with proxy(ProxySettings("replicated", backends=[server.url])) as p, httpx.Client(timeout=20) as c, \
            c.stream("POST", f"{p.url}/v1/completions", json=body("gaps", stream=True)) as r:
        chunks = r.iter_raw()
        first = next(chunks)  # arrives while the backend still holds the second chunk back
        assert b"t0" in first and not fake.go_ahead.is_set()
        fake.go_ahead.set()
        rest = b"".join(chunks)
    assert b"t1" in rest and rest.endswith(b"data: [DONE]\n\n")


def test_refused_backend_gives_502_naming_it_quickly():
    dead = f"http://127.0.0.5:{free_port('127.0.0.5')}"
    with proxy(ProxySettings("replicated", backends=[dead], request_timeout_s=20.0)) as p:
        t0 = time.monotonic()
        r = httpx.post(f"{p.url}/v1/completions", json=body(), timeout=30)
        elapsed = time.monotonic() - t0
    # a refused connection is answered at once, not after the request timeout (the bound
    # is far below the timeout and far above a busy machine's scheduling delays)
    assert r.status_code == 502 and elapsed < 5.0
    assert r.json()["error"]["backend"] == dead and dead in r.json()["error"]["message"]


def test_hanging_backend_gives_504_after_the_timeout(backends):
    _, server = backends[0]
    with proxy(ProxySettings("replicated", backends=[server.url], request_timeout_s=1.0)) as p:
        t0 = time.monotonic()
        r = httpx.post(f"{p.url}/v1/completions", json=body("hang"), timeout=10)
        elapsed = time.monotonic() - t0
    assert r.status_code == 504 and 0.9 < elapsed < 3.0
    assert r.json()["error"]["type"] == "upstream_timeout"


@pytest.fixture
def syn_dropping_port():
    """A port whose SYNs go unanswered, as behind a full accept queue: backlog 0 holds one
    connection, which a client made here fills; nothing is ever accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.5", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())
    yield listener.getsockname()[1]
    filler.close()
    listener.close()


def test_a_connect_that_never_completes_gives_504_after_the_connect_timeout(syn_dropping_port):
    url = f"http://127.0.0.5:{syn_dropping_port}"
    with proxy(ProxySettings("replicated", backends=[url], connect_timeout_s=1.0)) as p:
        t0 = time.monotonic()
        r = httpx.post(f"{p.url}/v1/completions", json=body(), timeout=10)
        elapsed = time.monotonic() - t0
        m = httpx.get(f"{p.url}/metrics").text
    err = r.json()["error"]
    assert r.status_code == 504 and err["type"] == "upstream_timeout" and err["backend"] == url
    assert "accepted no connection" in err["message"] and "(2 attempts)" in err["message"]
    assert 0.9 < elapsed < 3.0
    assert 'proxy_connect_retries_total{role="replica"} 1.0' in m


def test_a_hung_connect_is_retried_on_a_fresh_socket(backends, monkeypatch):
    """The first connect hangs (as a connect to a healthy backend once did in CI); the
    request still succeeds, once, on a second socket, and the retry is counted."""
    import aiohttp

    fake, server = backends[0]
    real = aiohttp.TCPConnector._create_connection
    calls = []

    async def first_hangs(self, *args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) == 1:
            await asyncio.sleep(3600)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.TCPConnector, "_create_connection", first_hangs)
    with proxy(ProxySettings("replicated", backends=[server.url], connect_timeout_s=1.0)) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body(), timeout=10)
        m = httpx.get(f"{p.url}/metrics").text
    assert r.status_code == 200 and len(fake.requests) == 1
    assert len(calls) == 2 and 0.45 < calls[1] - calls[0] < 1.5  # the attempt's share: 0.5 s
    assert 'proxy_connect_retries_total{role="replica"} 1.0' in m


def pd_settings(backends, **kw) -> ProxySettings:
    return ProxySettings("disaggregated", prefill=[backends[0][1].url], decode=[backends[1][1].url], **kw)


def test_pd_protocol(backends):
    (pre, _), (dec, _) = backends[0], backends[1]
    with proxy(pd_settings(backends)) as p:
        r = httpx.post(f"{p.url}/v1/completions",
                       json=body(stream=True, stream_options={"include_usage": True}, min_tokens=4),
                       timeout=10)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    sent_to_prefill, = pre.requests
    assert sent_to_prefill["max_tokens"] == 1 and sent_to_prefill["stream"] is False
    assert "stream_options" not in sent_to_prefill and "min_tokens" not in sent_to_prefill
    assert sent_to_prefill["kv_transfer_params"]["do_remote_decode"] is True
    sent_to_decode, = dec.requests
    assert sent_to_decode["kv_transfer_params"]["remote_engine_id"] == "b0"
    assert sent_to_decode["max_tokens"] == 8 and sent_to_decode["stream"] is True
    assert sent_to_decode["min_tokens"] == 4 and sent_to_decode["stream_options"] == {"include_usage": True}


def test_chat_prefill_caps_max_completion_tokens(backends):
    pre = backends[0][0]
    with proxy(pd_settings(backends)) as p:
        chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
        assert httpx.post(f"{p.url}/v1/chat/completions", json=chat, timeout=10).status_code == 200
    assert pre.requests[0]["max_completion_tokens"] == 1 and pre.requests[0]["max_tokens"] == 1


def test_prefill_without_kv_params_is_a_502_naming_the_connector(backends):
    dec = backends[1][0]
    with proxy(pd_settings(backends)) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body("no_kv"), timeout=10)
    assert r.status_code == 502 and "misconfigured" in r.json()["error"]["message"]
    assert dec.requests == []


def test_decode_dying_mid_stream_ends_with_an_error_event(backends):
    with proxy(pd_settings(backends)) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body("die", stream=True), timeout=10)
    events = [e for e in r.text.split("\n\n") if e]
    assert "[DONE]" not in r.text
    err = json.loads(events[-1].removeprefix("data: "))
    assert err["error"]["type"] == "upstream_stream_broken"


def test_client_disconnect_cancels_the_upstream_stream(backends):
    dec = backends[1][0]
    with proxy(pd_settings(backends)) as p:
        with httpx.Client(timeout=10) as c, \
                c.stream("POST", f"{p.url}/v1/completions", json=body("slow", stream=True)) as r:
            chunks = r.iter_raw()
            next(chunks)
            assert not dec.stream_cancelled.is_set()
        t0 = time.monotonic()
        assert dec.stream_cancelled.wait(5), "upstream stream still running after the client left"
        assert time.monotonic() - t0 < 5


def test_bad_requests_never_reach_a_backend(backends):
    fake, server = backends[0]
    settings = ProxySettings("replicated", backends=[server.url], max_body_bytes=1000, api_key="k3y")
    auth = {"Authorization": "Bearer k3y"}
    with proxy(settings) as p:
        url = f"{p.url}/v1/completions"
        assert httpx.post(url, content=b"{not json", headers=auth).status_code == 400
        assert httpx.post(url, content=b"[1, 2]", headers=auth).status_code == 400
        big = json.dumps(body(prompt="x" * 2000))
        assert httpx.post(url, content=big, headers=auth).status_code == 413
        assert httpx.post(url, json=body()).status_code == 401
        assert httpx.post(url, json=body(), headers={"Authorization": "Bearer nope"}).status_code == 401
        assert fake.requests == []
        assert httpx.post(url, json=body(), headers=auth).status_code == 200
        metrics = httpx.get(f"{p.url}/metrics", headers=auth).text
    assert len(fake.requests) == 1
    assert 'proxy_errors_total{kind="invalid_json"} 2.0' in metrics
    assert 'proxy_errors_total{kind="unauthorized"} 2.0' in metrics


def test_health_models_and_metrics(backends):
    dead = f"http://127.0.0.5:{free_port('127.0.0.5')}"
    with proxy(pd_settings(backends)) as p:
        h = httpx.get(f"{p.url}/health")
        assert h.status_code == 200 and set(h.json()["backends"].values()) == {"ok"}
        assert httpx.get(f"{p.url}/v1/models").json()["data"][0]["owned_by"] == "b1"
        tok = httpx.post(f"{p.url}/tokenize", json={"model": "m", "prompt": "hi"})
        assert tok.status_code == 200 and tok.json() == {"tokens": [104, 105], "from": "b1"}
        assert httpx.post(f"{p.url}/tokenize", content=b"{").status_code == 400
        httpx.post(f"{p.url}/v1/completions", json=body(), timeout=10)
        m = httpx.get(f"{p.url}/metrics").text
    assert "proxy_prefill_seconds_count 1.0" in m and "proxy_decode_ttfb_seconds_count 1.0" in m
    assert 'proxy_requests_total{endpoint="/v1/completions"} 1.0' in m
    with proxy(ProxySettings("replicated", backends=[dead], connect_timeout_s=0.5)) as p:
        h = httpx.get(f"{p.url}/health", timeout=10)
    assert h.status_code == 503 and h.json()["status"] == "degraded"


def test_with_a_key_every_endpoint_but_health_wants_it_and_health_names_no_backend(backends):
    with proxy(pd_settings(backends, api_key="k3y")) as p:
        for path in ("/v1/models", "/metrics"):
            assert httpx.get(f"{p.url}{path}").status_code == 401, path
            assert httpx.get(f"{p.url}{path}", headers={"Authorization": "Bearer k3y"}).status_code == 200
        assert httpx.post(f"{p.url}/tokenize", json={"model": "m", "prompt": "hi"}).status_code == 401
        h = httpx.get(f"{p.url}/health")
    assert h.status_code == 200 and h.json() == {"status": "ok"}
    assert "127.0.0.5" not in h.text


def test_the_key_is_compared_in_constant_time(backends, monkeypatch):
    import lab_utils.serve.proxy as proxy_module

    compared = []

    def spy(a, b):
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(proxy_module.hmac, "compare_digest", spy)
    with proxy(ProxySettings("replicated", backends=[backends[0][1].url], api_key="k3y")) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body(), headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and compared == [(b"Bearer nope", b"Bearer k3y")]


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(backends):
    """The client sends more than the limit in chunks and then nothing: the 413 comes
    without waiting for the rest of the body."""
    with proxy(ProxySettings("replicated", backends=[backends[0][1].url], max_body_bytes=1000)) as p, \
            socket.create_connection((ADDR, p.port), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(3):
            s.sendall(b"200\r\n" + b" " * 0x200 + b"\r\n")  # 1536 bytes, the body not ended
        t0 = time.monotonic()
        head = s.recv(200)
    assert head.startswith(b"HTTP/1.1 413"), head
    assert time.monotonic() - t0 < 3
    assert backends[0][0].requests == []


def test_a_clients_kv_transfer_params_are_refused(backends):
    """They would tell an instance which host to read KV from: only the proxy sets them."""
    theirs = {"do_remote_prefill": True, "remote_host": "203.0.113.9", "remote_port": 5600,
              "remote_engine_id": "x", "remote_block_ids": [[1]]}
    for settings in (ProxySettings("replicated", backends=[backends[0][1].url]), pd_settings(backends)):
        with proxy(settings) as p:
            r = httpx.post(f"{p.url}/v1/completions", json=body(kv_transfer_params=theirs), timeout=10)
        assert r.status_code == 400 and "kv_transfer_params" in r.json()["error"]["message"]
    assert all(f.requests == [] for f, _ in backends)


def test_the_instances_key_goes_with_every_request_to_a_backend(backends):
    (pre, _), (dec, _) = backends[0], backends[1]
    with proxy(pd_settings(backends, api_key="proxy-key", backend_api_key="vllm-key")) as p:
        auth = {"Authorization": "Bearer proxy-key"}
        assert httpx.post(f"{p.url}/v1/completions", json=body(stream=True), headers=auth,
                          timeout=10).status_code == 200
        assert httpx.get(f"{p.url}/v1/models", headers=auth).status_code == 200
        assert httpx.get(f"{p.url}/health").status_code == 200
    assert pre.auth and dec.auth
    assert set(pre.auth) | set(dec.auth) == {"Bearer vllm-key"}  # never the client's key


class ResettingBackend:
    """A raw HTTP/1.1 backend that keeps connections alive and, when told, resets its idle
    ones (RST, as a backend dropping a keep-alive connection with unread data does)."""

    def __init__(self, host: str = "127.0.0.5"):
        import threading

        self.listener = socket.create_server((host, 0))
        self.url = f"http://{host}:{self.listener.getsockname()[1]}"
        self.seen: list[int] = []  # the connection (in order of accept) of each request
        self.reset = threading.Event()
        self.open_connections = 0
        self._n = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._n += 1
            threading.Thread(target=self._serve, args=(conn, self._n - 1), daemon=True).start()

    def _serve(self, conn: socket.socket, n: int) -> None:
        import struct

        self.open_connections += 1
        conn.settimeout(0.02)
        buf = b""
        try:
            while True:
                if b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except TimeoutError:
                        if self.reset.is_set() and not buf:  # idle: drop it, hard
                            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                            struct.pack("ii", 1, 0))
                            return
                        continue
                    if not chunk:
                        return
                    buf += chunk
                    continue
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.seen.append(n)
                out = json.dumps({"choices": [{"text": "ok"}]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(out), out))
        except OSError:
            return
        finally:
            conn.close()
            self.open_connections -= 1

    def reset_idle(self) -> None:
        """Reset every idle connection and wait until they are gone; later ones are kept."""
        self.reset.set()
        deadline = time.monotonic() + 5
        while self.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        self.reset.clear()

    def close(self) -> None:
        self.listener.close()


def test_a_request_not_written_on_a_pooled_connection_is_sent_again(monkeypatch):
    """The proxy takes a pooled connection, is held up (its event loop blocked, as when the
    whole machine stands still), and meanwhile the backend drops that connection: writing
    the request fails ("Can not write request body"). The backend never saw it, so the
    proxy sends it once more on a new connection; the client gets its answer and the
    resend is counted."""
    import aiohttp

    backend = ResettingBackend()
    real_get = aiohttp.TCPConnector._get
    held = []

    async def reuse_after_a_stall(self, key, traces):
        conn = await real_get(self, key, traces)
        if conn is not None and not held:
            held.append(conn)
            backend.reset_idle()  # the backend drops the idle connection while the
            time.sleep(0.1)  # proxy's loop is held up (this runs inside that loop)
        return conn

    try:
        with proxy(ProxySettings("replicated", backends=[backend.url])) as p:
            assert httpx.post(f"{p.url}/v1/completions", json=body(), timeout=10).status_code == 200
            monkeypatch.setattr(aiohttp.TCPConnector, "_get", reuse_after_a_stall)
            r = httpx.post(f"{p.url}/v1/completions", json=body(), timeout=10)
            m = httpx.get(f"{p.url}/metrics").text
    finally:
        backend.close()
    assert held, "the pooled connection was not reused: the test did not set up the race"
    assert r.status_code == 200, r.text
    # the first request, then the second once, on a new connection (never on the reset one)
    assert backend.seen == [0, 1]
    assert 'proxy_resends_total{role="replica"} 1.0' in m


# ----- hostile requests: refused before the prefill, in vLLM's error shape ---------------

INVALID = [  # (raw body, the field vLLM's error names)
    (json.dumps(body(max_tokens=-1)), "max_tokens"),
    (json.dumps(body(max_tokens=0)), "max_tokens"),
    (json.dumps(body(max_tokens=5000)), "max_tokens"),  # over the served max_model_len
    (json.dumps(body(max_tokens=8.5)), "max_tokens"),
    (json.dumps(body(stream="banana")), "stream"),
    (json.dumps(body(n=1000)), "n"),
    (json.dumps(body(n=0)), "n"),
    (json.dumps(body(best_of=1000)), "best_of"),
    (json.dumps(body(temperature=-1)), "temperature"),
    (json.dumps(body(top_p=0)), "top_p"),
    (json.dumps(body(logprobs=1000)), "logprobs"),
    (json.dumps(body(stop=5)), "stop"),
    (json.dumps(body(stream_options="yes")), "stream_options"),
    (json.dumps(body(prompt=5)), "prompt"),
    (json.dumps(body(prompt=[-1, 2])), "prompt"),
    (json.dumps({"model": "fake", "max_tokens": 4}), "prompt"),
    (json.dumps(body(model=7)), "model"),
    (json.dumps(body()).replace('"max_tokens": 8', '"max_tokens": 1e400'), "max_tokens"),
    (json.dumps(body()).replace('"max_tokens": 8', '"temperature": 1e400'), "temperature"),
]
NOT_JSON = [
    json.dumps(body()).replace('"max_tokens": 8', '"max_tokens": NaN'),
    json.dumps(body()).replace('"max_tokens": 8', '"temperature": Infinity'),
    '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}",
]


def _vllm_shaped(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status and r.headers["content-type"] == "application/json", r.text
    err = r.json()["error"]
    assert {"message", "type", "param", "code"} <= set(err) and err["code"] == status
    return err


def test_an_invalid_body_never_reaches_the_prefill_instance(backends):
    """Each body vLLM would refuse is refused by the proxy's own checks (a controller
    without vLLM), in vLLM's shape and naming the field: the prefill's request count does
    not move (and the decode's). vLLM's own rules: test_proxy_engine's corpus."""
    (pre, _), (dec, _) = backends[0], backends[1]
    with proxy(pd_settings(backends, max_tokens=2048, max_n=8, vllm_rules=False)) as p, httpx.Client(timeout=10) as c:
        for raw, param in INVALID:
            err = _vllm_shaped(c.post(f"{p.url}/v1/completions", content=raw), 400)
            assert err["param"] == param, (raw[:80], err)
        for raw in NOT_JSON:
            _vllm_shaped(c.post(f"{p.url}/v1/completions", content=raw), 400)
        chat = {"model": "fake", "messages": "hi", "max_completion_tokens": 4}
        assert _vllm_shaped(c.post(f"{p.url}/v1/chat/completions", json=chat), 400)["param"] == "messages"
        chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 99}
        assert _vllm_shaped(c.post(f"{p.url}/v1/chat/completions", json=chat), 400)["param"] == "top_logprobs"
        assert pre.requests == [] and dec.requests == []
        # what vLLM accepts still goes through
        ok = body(n=2, temperature=0.5, top_p=1, logprobs=2, stop=["x"], prompt=[[1, 2], [3]])
        assert c.post(f"{p.url}/v1/completions", json=ok).status_code == 200
        # vLLM's models read scalars as pydantic does: "8" is 8 and true is 1, "no" false
        for lax in (body(max_tokens="8"), body(max_tokens=True), body(echo="no", n="1")):
            r = c.post(f"{p.url}/v1/completions", json=lax)
            assert r.status_code == 200, (lax, r.text)
        m = c.get(f"{p.url}/metrics").text
    # two prompts, two choices each: one pair a prompt and choice; then three of one each
    assert len(pre.requests) == 7 and len(dec.requests) == 7
    # counted by vLLM's error type: "Bad Request" where its request models refuse a value,
    # "BadRequestError" where its sampling checks do
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
                  if line.startswith(('proxy_errors_total{kind="BadRequestError"}',
                                      'proxy_errors_total{kind="Bad Request"}')))
    assert counted == len(INVALID) + 2, m


def test_a_backend_error_passes_through_in_vllms_shape_without_its_url(backends):
    """An error the prefill answers (unknown model) reaches the client as vLLM gave it,
    with its status; with a key set, no error names where a backend is."""
    key = {"Authorization": "Bearer k3y-long-enough-000"}
    dead = f"http://127.0.0.5:{free_port('127.0.0.5')}"
    with proxy(pd_settings(backends, api_key="k3y-long-enough-000")) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body("unknown"), headers=key, timeout=10)
    err = _vllm_shaped(r, 404)
    assert err == {"message": "The model `unknown` does not exist.", "type": "NotFoundError",
                   "param": "model", "code": 404}
    assert backends[1][0].requests == []
    with proxy(ProxySettings("replicated", backends=[dead], api_key="k3y-long-enough-000")) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body(), headers=key, timeout=10)
    err = _vllm_shaped(r, 502)
    assert "127.0.0.5" not in r.text and "backend" not in err


def test_the_proxy_never_answers_a_plain_text_500(backends, monkeypatch):
    import lab_utils.serve.proxy as proxy_module

    def broken(*a, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(proxy_module, "check_request", broken)
    with proxy(ProxySettings("replicated", backends=[backends[0][1].url])) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body(), timeout=10)
    assert _vllm_shaped(r, 500)["type"] == "InternalServerError" and "a bug" not in r.text


def test_bearer_is_matched_in_any_case_and_openapi_wants_the_key(backends):
    key = "k3y-long-enough-000"
    with proxy(ProxySettings("replicated", backends=[backends[0][1].url], api_key=key)) as p:
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = httpx.post(f"{p.url}/v1/completions", json=body(),
                           headers={"Authorization": f"{scheme} {key}"})
            assert r.status_code == 200, scheme
        assert httpx.post(f"{p.url}/v1/completions", json=body(),
                          headers={"Authorization": f"Basic {key}"}).status_code == 401
        assert httpx.get(f"{p.url}/openapi.json").status_code == 401
        assert httpx.get(f"{p.url}/openapi.json", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    with proxy(ProxySettings("replicated", backends=[backends[0][1].url])) as p:
        assert httpx.get(f"{p.url}/openapi.json").status_code == 200


def test_a_body_sent_too_slowly_is_refused_in_bounded_time(backends):
    settings = ProxySettings("replicated", backends=[backends[0][1].url], body_timeout_s=1.0)
    with proxy(settings) as p, socket.create_connection((ADDR, p.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\":")  # and then nothing
        t0 = time.monotonic()
        head = s.recv(200)
        assert head.startswith(b"HTTP/1.1 408"), head
        assert 0.9 < time.monotonic() - t0 < 3
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b" 1")  # the client goes on sending: the connection is closed anyway
        _, closed = _closed_within(s, 2.0)
        assert closed is not None, "the connection stayed open after the 408"
    assert backends[0][0].requests == []


@pytest.mark.parametrize("parser", ["auto", "h11"])
def test_a_request_the_server_cannot_parse_gets_a_json_400(backends, parser):
    settings = ProxySettings("replicated", backends=[backends[0][1].url])
    options = {} if parser == "auto" else {"http": guarded_protocol(10, MAX_HEADER_BYTES, h11=True)}
    with ServerThread(create_app(settings), ADDR, **{**server_options(settings), **options}) as p:
        for garbage in (b"HELLO\x00 there\r\n\r\n", b"GET / HTTP/1.1\r\nHost x\r\n\r\n"):
            with socket.create_connection((ADDR, p.port), timeout=10) as s:
                s.sendall(garbage)
                said, closed = _closed_within(s, 3.0)
            assert closed is not None and said.startswith(b"HTTP/1.1 400"), said
            head, payload = said.split(b"\r\n\r\n", 1)
            assert b"content-type: application/json" in head.lower(), head
            assert json.loads(payload)["error"]["type"] == "BadRequestError", payload
    assert backends[0][0].requests == []


def test_a_client_that_stops_reading_is_dropped_and_its_stream_cancelled(backends):
    """A streamed answer the client never reads: once the proxy's send buffer has stayed
    full for proxy.send_timeout_s, the connection is reset and the upstream stream ends."""
    fake, backend = backends[0]
    settings = ProxySettings("replicated", backends=[backend.url], send_timeout_s=1.0)
    with ServerThread(create_app(settings), ADDR, **server_options(settings)) as p:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((ADDR, p.port))
        payload = json.dumps(body(model="flood", stream=True)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                  + f"content-length: {len(payload)}\r\n\r\n".encode() + payload)
        assert s.recv(64).startswith(b"HTTP/1.1 200")  # then it reads nothing more
        t0 = time.monotonic()
        assert fake.stream_cancelled.wait(20), "the upstream stream still runs"
        took = time.monotonic() - t0
        s.settimeout(5)  # what was queued, then the end (a reset, or EOF): not a timeout
        with contextlib.suppress(ConnectionResetError):
            while s.recv(1 << 20):
                pass
        s.close()
        # the buffers fill within a second or two, then the 1 s timeout
        assert 1.0 <= took < 10, took


def _closed_within(s: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """What the server sent on `s` and when (seconds from now) it closed it; None if it
    did not within `seconds`."""
    t0, said = time.monotonic(), b""
    s.settimeout(0.2)
    while time.monotonic() - t0 < seconds:
        try:
            data = s.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return said, time.monotonic() - t0
        if not data:
            return said, time.monotonic() - t0
        said += data
    return said, None


@pytest.mark.parametrize("parser", ["auto", "h11"])
def test_headers_sent_too_slowly_close_the_connection_in_bounded_time(backends, parser):
    """A byte of header every 0.3 s (and a connection that sends nothing at all) is cut
    off at proxy.header_timeout_s with a 408; a request that completes its headers in
    time, on a connection kept alive after it, is unaffected. With the parser uvicorn
    picks here (httptools) and with h11 (uvicorn without httptools, as on a controller
    that has only `uvicorn`)."""
    settings = ProxySettings("replicated", backends=[backends[0][1].url], header_timeout_s=1.5)
    options = {} if parser == "auto" else {"http": guarded_protocol(1.5, MAX_HEADER_BYTES, h11=True)}
    with ServerThread(create_app(settings), ADDR, **{**server_options(settings), **options}) as p:
        dribblers = [socket.create_connection((ADDR, p.port), timeout=10) for _ in range(4)]
        silent = socket.create_connection((ADDR, p.port), timeout=10)
        t0 = time.monotonic()
        for s in dribblers:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        while time.monotonic() - t0 < 1.2:  # keeps sending, under the timeout, then stops
            time.sleep(0.3)
            for s in dribblers:
                s.sendall(b"a")
        with httpx.Client(timeout=10) as c:  # a normal client, kept alive across the timeout
            assert c.post(f"{p.url}/v1/completions", json=body()).status_code == 200
            time.sleep(1.0)
            assert c.post(f"{p.url}/v1/completions", json=body()).status_code == 200
        for s in [*dribblers, silent]:
            said, closed = _closed_within(s, 3.0)
            assert closed is not None, "the proxy kept a slow client's connection open"
            assert 1.4 < time.monotonic() - t0 < 4.0
            s.close()
            if s is not silent:
                assert said.startswith(b"HTTP/1.1 408"), said
                assert json.loads(said.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "header_timeout"
    assert len(backends[0][0].requests) == 2


@pytest.mark.parametrize("parser", ["auto", "h11"])
def test_headers_past_the_limit_are_refused_and_the_connection_closed(backends, parser):
    """Before, with httptools, headers of any size were taken (h11's limit did not apply)."""
    settings = ProxySettings("replicated", backends=[backends[0][1].url])
    options = {} if parser == "auto" else {"http": guarded_protocol(10, MAX_HEADER_BYTES, h11=True)}
    with ServerThread(create_app(settings), ADDR, **{**server_options(settings), **options}) as p, \
            socket.create_connection((ADDR, p.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(MAX_HEADER_BYTES // 1000 + 2):
                s.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
        said, closed = _closed_within(s, 5.0)
    assert closed is not None and said.split(b"\r\n", 1)[0] in (
        b"HTTP/1.1 431 Request Header Fields Too Large", b"HTTP/1.1 400 Bad Request"), said


def test_a_batch_runs_as_one_pair_per_prompt_and_choice(backends):
    (pre, _), (dec, _) = backends[0], backends[1]
    with proxy(pd_settings(backends)) as p:
        r = httpx.post(f"{p.url}/v1/completions", json=body(prompt=["a", "bb"], n=2), timeout=10)
        assert r.status_code == 200, r.text
        assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
        # each decode gets one prompt, one choice and the KV of its own prefill
        assert sorted(d["prompt"] for d in dec.requests) == ["a", "a", "bb", "bb"]
        assert all(d["n"] == 1 and d["kv_transfer_params"]["remote_engine_id"] == "b0"
                   for d in dec.requests) and len(pre.requests) == 4
        pre.requests.clear()
        dec.requests.clear()
        # streamed, it is refused before any backend is asked
        r = httpx.post(f"{p.url}/v1/completions", json=body(prompt=["a", "bb"], stream=True),
                       timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    assert pre.requests == [] and dec.requests == []


def test_tokenize_is_bounded_by_the_served_context(backends):
    """A text far longer than any prompt of the served context is refused before the front
    instance's tokenizer sees it (16 bytes a token of max_tokens)."""
    with proxy(pd_settings(backends, max_tokens=100)) as p:
        r = httpx.post(f"{p.url}/tokenize", json={"model": "fake", "prompt": "x" * 2000}, timeout=10)
        assert r.status_code == 413 and "1600" in r.json()["error"]["message"]
        ok = httpx.post(f"{p.url}/tokenize", json={"model": "fake", "prompt": "x" * 1000}, timeout=10)
        assert ok.status_code == 200


def test_a_long_prompt_list_runs_a_few_pairs_at_a_time(backends):
    """40 prompts in one request become 40 prefill/decode pairs, never more than
    proxy.max_n of them in flight at once; the answer still holds all 40 choices."""
    prefill = backends[0][0]
    prefill.most_in_flight = 0
    with proxy(pd_settings(backends, max_n=4)) as p, httpx.Client(timeout=30) as c:
        r = c.post(f"{p.url}/v1/completions",
                   json=body(model="busy", prompt=[f"p{i}" for i in range(40)]))
    assert r.status_code == 200, r.text
    assert [ch["index"] for ch in r.json()["choices"]] == list(range(40))
    assert len(prefill.requests) == 40 and 1 < prefill.most_in_flight <= 4
