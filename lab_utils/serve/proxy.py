"""The lab's proxy: one HTTP front door for every architecture the lab measures.

`replicated` mode spreads requests over N identical vLLM instances (round-robin or
least-outstanding). `disaggregated` mode runs the prefill/decode protocol: the request
goes to a prefill instance with `max_tokens=1`, no streaming and
`kv_transfer_params: {"do_remote_decode": true}`; the `kv_transfer_params` it returns
(where its KV blocks are) go with the original request to a decode instance, whose
response is passed back unchanged, streamed chunk by chunk as it arrives.

`create_app` builds a FastAPI app from a list of backends; nothing lives in module
globals. Each backend gets one pooled aiohttp client session, opened at start-up and closed
at shutdown (aiohttp rather than httpx: measured with `python -m lab_utils.bench.proxy`,
it halves the latency the proxy adds). Failures become JSON errors in bounded time (502 unreachable, 504 timed
out), a stream that breaks ends with an error event (never a clean end), and a client
that goes away cancels its upstream requests.
A backend connect that hangs is retried on a fresh socket within the connect timeout
(nothing has been sent yet); the retries are counted in `proxy_connect_retries_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PREFILL_ONLY = {"max_tokens": 1, "max_completion_tokens": 1, "stream": False}
# Options that would make the prefill produce more than its one token, or stream.
PREFILL_DROP = ("stream_options", "min_tokens", "min_completion_tokens", "n", "best_of", "logprobs", "top_logprobs",
                "prompt_logprobs")
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
# A pooled backend connection idle longer than this is not reused. It must stay below the
# backends' own HTTP keep-alive (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE and uvicorn's default
# are 5 s): with aiohttp's default of 15 s the proxy sometimes sent a request on a
# connection the backend was closing at that moment, a 502 for a healthy backend.
BACKEND_KEEPALIVE_S = 2.0
# connect_timeout_s is spent in at least two attempts of at most this long, each on a fresh
# socket. When the controller stalls (seen for up to 20 s on a busy 2-core box), a connect
# that completed meanwhile is timed out as the loop wakes; nothing has been sent when a
# connect fails, so another attempt is safe.
CONNECT_ATTEMPT_S = 5.0

log = logging.getLogger("lab_utils.serve.proxy")


@dataclass
class ProxySettings:
    mode: str  # "replicated" | "disaggregated"
    backends: list[str] = field(default_factory=list)  # replicated
    prefill: list[str] = field(default_factory=list)  # disaggregated
    decode: list[str] = field(default_factory=list)
    policy: str = "round_robin"  # or "least_outstanding"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 300.0
    max_body_bytes: int = 8 * 1024 * 1024
    api_key: str | None = None


class ProxyError(Exception):
    def __init__(self, status: int, kind: str, message: str, backend: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.backend = status, kind, backend

    def response(self) -> JSONResponse:
        body = {"error": {"message": str(self), "type": self.kind, "code": self.status}}
        if self.backend:
            body["error"]["backend"] = self.backend
        return JSONResponse(body, status_code=self.status)


class Pool:
    """Backends of one role, each with its own pooled client and in-flight count.
    Clients are opened by `open()` inside the server's event loop."""

    def __init__(self, role: str, urls: list[str], policy: str, timeout: aiohttp.ClientTimeout,
                 on_connect_retry=None):
        self.role, self.urls, self.policy, self.timeout = role, urls, policy, timeout
        self.clients: dict[str, aiohttp.ClientSession] = {}
        self.in_flight = dict.fromkeys(urls, 0)
        self._cycle = itertools.cycle(urls)
        self.connect_attempts = max(2, math.ceil(timeout.connect / CONNECT_ATTEMPT_S))
        self._attempt = aiohttp.ClientTimeout(total=None, connect=timeout.connect / self.connect_attempts,
                                              sock_read=timeout.sock_read)
        self._on_connect_retry = on_connect_retry or (lambda: None)

    def open(self) -> None:
        self.clients = {u: aiohttp.ClientSession(base_url=u, timeout=self.timeout,
                                                 connector=aiohttp.TCPConnector(
                                                     limit=0, keepalive_timeout=BACKEND_KEEPALIVE_S))
                        for u in self.urls}

    def pick(self) -> str:
        if self.policy == "least_outstanding":
            return min(self.urls, key=self.in_flight.__getitem__)
        return next(self._cycle)

    async def post(self, url: str, path: str, body: dict) -> aiohttp.ClientResponse:
        """POST `body` to `url`; a connect that does not complete within its share of
        connect_timeout_s is given up and tried again on a fresh socket."""
        t0 = time.monotonic()
        for attempt in range(1, self.connect_attempts + 1):
            t1 = time.monotonic()
            try:
                return await self.clients[url].post(path, json=body, timeout=self._attempt)
            except aiohttp.ConnectionTimeoutError:
                now = time.monotonic()
                if attempt == self.connect_attempts:
                    raise ProxyError(504, "upstream_timeout",
                                     f"{self.role} backend {url} accepted no connection in {now - t0:.1f} s "
                                     f"({attempt} attempts): is it overloaded, or is a firewall dropping "
                                     "packets to that port?", url) from None
                log.warning("%s backend %s: connect attempt %d gave up after %.1f s (limit %.1f s); "
                            "trying a fresh socket", self.role, url, attempt, now - t1, self._attempt.connect)
                self._on_connect_retry()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("proxy_requests", "Requests received", ["endpoint"], registry=r)
        self.errors = Counter("proxy_errors", "Requests that ended in an error", ["kind"], registry=r)
        self.in_flight = Gauge("proxy_in_flight", "Requests in flight per backend", ["role", "backend"], registry=r)
        self.prefill_s = Histogram("proxy_prefill_seconds", "Prefill request time", registry=r)
        self.connect_retries = Counter("proxy_connect_retries",
                                       "Backend connect attempts that hung and were retried", ["role"], registry=r)
        self.decode_ttfb_s = Histogram("proxy_decode_ttfb_seconds",
                                       "Time to the decode backend's first response byte", registry=r)


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def _upstream_error(exc: Exception, url: str, role: str) -> ProxyError:
    if isinstance(exc, asyncio.TimeoutError):
        return ProxyError(504, "upstream_timeout", f"{role} backend {url} timed out ({type(exc).__name__})", url)
    return ProxyError(502, "upstream_unavailable", f"{role} backend {url} unreachable: {exc!r}", url)


async def _report_stalls(period_s: float = 0.5, report_s: float = 1.0) -> None:
    """Log when the event loop wakes more than `report_s` late: every request in flight
    was delayed that long by the controller (CPU starved, or a blocking call)."""
    while True:
        t0 = time.monotonic()
        await asyncio.sleep(period_s)
        late = time.monotonic() - t0 - period_s
        if late > report_s:
            log.warning("the proxy's event loop was held up for %.1f s; requests in flight were delayed "
                        "that long", late)


async def _until_disconnect(request: Request, work: asyncio.Future):
    """Await `work`, cancelling it if the client disconnects first."""
    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            work.cancel()
            raise ProxyError(499, "client_disconnected", "client went away")
        return work.result()
    finally:
        watcher.cancel()


def settings_from_config(cfg, mode: str) -> ProxySettings:
    """The proxy's backends and limits for `mode`, from a `LabConfig`."""
    from lab_utils.config import read_secret_file
    from lab_utils.serve.launcher import instance_url

    def urls(topology: str, role: str) -> list[str]:
        return [instance_url(cfg, s) for s in cfg.instances(topology) if s.role == role]

    p = cfg.proxy
    common = dict(connect_timeout_s=p.connect_timeout_s, request_timeout_s=p.request_timeout_s,
                  max_body_bytes=p.max_body_bytes,
                  api_key=read_secret_file(cfg, p.api_key_file, "proxy API key"))
    if mode == "replicated":
        return ProxySettings(mode=mode, backends=urls("replicated", "replica"),
                             policy=cfg.topology.replicated.policy, **common)
    if mode == "baseline":  # one backend, the same path as the other architectures
        return ProxySettings(mode="replicated", backends=urls("baseline", "baseline"), **common)
    return ProxySettings(mode=mode, prefill=urls("disaggregated", "prefill"),
                         decode=urls("disaggregated", "decode"), **common)


def run(cfg, mode: str) -> None:
    """Serve the proxy in the foreground on the proxy node's LAN address."""
    import uvicorn

    app = create_app(settings_from_config(cfg, mode))
    uvicorn.run(app, host=cfg.nodes[cfg.proxy.node].lan_address, port=cfg.proxy.port,
                log_level="warning", access_log=False, timeout_graceful_shutdown=5)


def create_app(settings: ProxySettings) -> FastAPI:
    timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s,
                                    sock_read=settings.request_timeout_s)
    metrics = Metrics()
    if settings.mode == "replicated":
        roles = {"replica": settings.backends}
    else:
        roles = {"prefill": settings.prefill, "decode": settings.decode}
    pools = {role: Pool(role, urls, settings.policy, timeout,
                        on_connect_retry=metrics.connect_retries.labels(role).inc)
             for role, urls in roles.items()}
    front = pools.get("replica") or pools["decode"]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        for pool in pools.values():
            pool.open()
        watchdog = asyncio.ensure_future(_report_stalls())
        yield
        watchdog.cancel()
        await asyncio.gather(*(p.aclose() for p in pools.values()))

    app = FastAPI(title="spark-disagg-lab proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.pools, app.state.metrics, app.state.settings = pools, metrics, settings

    @contextlib.contextmanager
    def tracked(pool: Pool, url: str):
        pool.in_flight[url] += 1
        metrics.in_flight.labels(pool.role, url).inc()
        try:
            yield
        finally:
            pool.in_flight[url] -= 1
            metrics.in_flight.labels(pool.role, url).dec()

    async def read_json(request: Request) -> dict:
        if settings.api_key and request.headers.get("authorization") != f"Bearer {settings.api_key}":
            raise ProxyError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer ...)")
        declared = request.headers.get("content-length")
        if declared and int(declared) > settings.max_body_bytes:
            raise ProxyError(413, "body_too_large", f"body over {settings.max_body_bytes} bytes")
        raw = await request.body()
        if len(raw) > settings.max_body_bytes:
            raise ProxyError(413, "body_too_large", f"body over {settings.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise ProxyError(400, "invalid_json", f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ProxyError(400, "invalid_json", "request body must be a JSON object")
        return body

    async def prefill(request: Request, path: str, body: dict) -> dict:
        pool = pools["prefill"]
        url = pool.pick()
        req = {k: v for k, v in body.items() if k not in PREFILL_DROP}
        req.update(PREFILL_ONLY if path.endswith("chat/completions") else
                   {k: v for k, v in PREFILL_ONLY.items() if k != "max_completion_tokens"})
        req["kv_transfer_params"] = dict(REMOTE_DECODE)
        t0 = time.perf_counter()
        async def call() -> tuple[int, bytes]:
            async with await pool.post(url, path, req) as r:
                return r.status, await r.read()

        with tracked(pool, url):
            try:
                status, raw = await _until_disconnect(request, asyncio.ensure_future(call()))
            except UPSTREAM_ERRORS as e:
                raise _upstream_error(e, url, "prefill") from None
        metrics.prefill_s.observe(time.perf_counter() - t0)
        if status != 200:
            raise ProxyError(status, "prefill_failed", f"prefill backend {url}: {raw[:500]!r}", url)
        params = json.loads(raw).get("kv_transfer_params")
        if not params:
            raise ProxyError(502, "no_kv_transfer_params",
                             f"prefill backend {url} returned no kv_transfer_params: its KV connector "
                             "is probably misconfigured (expected NixlConnector with kv_role kv_producer)", url)
        return params

    async def relay(resp: aiohttp.ClientResponse, pool: Pool, url: str, done) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        except UPSTREAM_ERRORS as e:
            metrics.errors.labels("upstream_stream_broken").inc()
            err = {"error": {"message": f"{pool.role} backend {url} broke off the stream: {e!r}",
                             "type": "upstream_stream_broken", "code": 502, "backend": url}}
            yield f"data: {json.dumps(err)}\n\n".encode()
        finally:
            resp.close()  # unfinished: drops the connection, so the backend sees the client leave
            done()

    async def forward(request: Request, path: str, body: dict, pool: Pool) -> Response:
        url = pool.pick()
        stack = contextlib.ExitStack()
        stack.enter_context(tracked(pool, url))
        t0 = time.perf_counter()
        try:
            resp = await pool.post(url, path, body)
        except UPSTREAM_ERRORS as e:
            stack.close()
            raise _upstream_error(e, url, pool.role) from None
        except BaseException:
            stack.close()
            raise
        metrics.decode_ttfb_s.observe(time.perf_counter() - t0)
        media = resp.headers.get("content-type", "application/json")
        if not body.get("stream") or resp.status != 200:
            try:
                content = await _until_disconnect(request, asyncio.ensure_future(resp.read()))
            except UPSTREAM_ERRORS as e:
                raise _upstream_error(e, url, pool.role) from None
            finally:
                resp.close()
                stack.close()
            return Response(content, status_code=resp.status, media_type=media)
        return StreamingResponse(relay(resp, pool, url, stack.close), status_code=200, media_type=media)

    async def handle(request: Request, *, path: str) -> Response:
        metrics.requests.labels(path).inc()
        try:
            body = await read_json(request)
            if settings.mode == "disaggregated":
                body = {**body, "kv_transfer_params": await prefill(request, path, body)}
            return await forward(request, path, body, front)
        except ProxyError as e:
            metrics.errors.labels(e.kind).inc()
            return e.response()

    # Plain Starlette routes for the hot path: FastAPI's parameter machinery costs
    # measurable time per request and these endpoints take the raw request anyway.
    for path in ("/v1/completions", "/v1/chat/completions"):
        app.add_route(path, functools.partial(handle, path=path), methods=["POST"])

    async def ask_front(method: str, path: str, body: dict | None = None) -> Response:
        """A side request (model list, tokenizer) to the first backend of the front role,
        outside the routing and the counts."""
        url = front.urls[0]
        try:
            async with front.clients[url].request(method, path, json=body) as r:
                return Response(await r.read(), status_code=r.status, media_type="application/json")
        except UPSTREAM_ERRORS as e:
            return _upstream_error(e, url, front.role).response()

    @app.get("/v1/models")
    async def models() -> Response:
        return await ask_front("GET", "/v1/models")

    async def tokenizer(request: Request, *, path: str) -> Response:
        try:
            body = await read_json(request)
        except ProxyError as e:
            return e.response()
        return await ask_front("POST", path, body)

    # the served model's tokenizer, so a client of the proxy (the bench command) can
    # build exact-length prompts without a local copy of the model
    for path in ("/tokenize", "/detokenize"):
        app.add_route(path, functools.partial(tokenizer, path=path), methods=["POST"])

    @app.get("/health")
    async def health() -> JSONResponse:
        async def one(pool: Pool, url: str) -> str:
            quick = aiohttp.ClientTimeout(total=settings.connect_timeout_s)
            try:
                async with pool.clients[url].get("/health", timeout=quick) as r:
                    return "ok" if r.status == 200 else f"HTTP {r.status}"
            except UPSTREAM_ERRORS as e:
                return type(e).__name__
        checks = [(p, u) for p in pools.values() for u in p.urls]
        states = await asyncio.gather(*(one(p, u) for p, u in checks))
        backends = {f"{p.role} {u}": s for (p, u), s in zip(checks, states, strict=True)}
        ok = all(s == "ok" for s in states)
        return JSONResponse({"status": "ok" if ok else "degraded", "mode": settings.mode,
                             "backends": backends}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
