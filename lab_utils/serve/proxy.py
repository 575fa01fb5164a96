"""The lab's proxy: one HTTP front door for every architecture the lab measures.

`replicated` mode spreads requests over N identical vLLM instances (round-robin or
least-outstanding). `disaggregated` mode runs the prefill/decode protocol
(`serve.protocol`): the request goes to a prefill instance with `max_tokens=1`, no
streaming and `kv_transfer_params: {"do_remote_decode": true}`; the `kv_transfer_params`
it returns (where its KV blocks are) go with the original request to a decode instance,
whose response is passed back unchanged, streamed chunk by chunk as it arrives.

`create_app` builds a FastAPI app around one `Proxy` (the handlers and their state);
nothing lives in module globals. Each backend gets one pooled aiohttp client session
(`serve.routing`), opened at start-up and closed at shutdown (aiohttp rather than httpx:
measured with `python -m lab_utils.bench.proxy`, it halves the latency the proxy adds).
Failures become JSON errors in bounded time (502 unreachable, 504 timed out), a stream
that breaks ends with an error event (never a clean end), and a client that goes away
cancels its upstream requests. A backend connect that hangs is retried on a fresh socket
within the connect timeout (nothing has been sent yet), and a request whose pooled
connection was lost before any answer is sent once more on a new one; both are counted in
`/metrics` (`proxy_connect_retries_total`, `proxy_resends_total`) and logged.

With an API key every endpoint but `/health` wants it (compared in constant time), and
`/health` then says only whether the backends are healthy, not where they are. The body
is read up to `max_body_bytes` and no further. `kv_transfer_params` are the proxy's to
set: a client's own are refused (they would tell an instance where to read KV from). A
request vLLM would refuse is refused before any backend is called (`serve.validate`), so
a bad field no longer costs a prefill; errors have vLLM's shape and, with a key set, do
not name the backends.
The instances' key goes with every request to a backend.

Over 400 lines on purpose: one request's whole life through the front door (read, refuse,
route, forward, stream back, count) reads top to bottom in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any

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

from lab_utils.measure.loadgen import auth_headers
from lab_utils.serve.protocol import (
    decode_request,
    merge,
    prefill_request,
    split,
    transfer_params,
)
from lab_utils.serve.proxy_server import MAX_HEADER_BYTES as MAX_HEADER_BYTES
from lab_utils.serve.proxy_server import server_options as server_options
from lab_utils.serve.proxy_settings import KEY_ENV as KEY_ENV
from lab_utils.serve.proxy_settings import ProxySettings as ProxySettings
from lab_utils.serve.proxy_settings import settings_from_config
from lab_utils.serve.routing import (
    UPSTREAM_ERRORS,
    Pool,
    ProxyError,
    backend_error,
    log,
    upstream_error,
)
from lab_utils.serve.validate import InvalidRequest, Limits, check_request, vllm_rules

# generous: a token of text is about 4 bytes of English, 16 covers most scripts' UTF-8
TOKENIZE_BYTES_PER_TOKEN = 16


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


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
        self.resends = Counter("proxy_resends", "Requests whose pooled backend connection was "
                               "lost before any answer, sent again on a new one", ["role"],
                               registry=r)
        self.decode_ttfb_s = Histogram("proxy_decode_ttfb_seconds",
                                       "Time to the decode backend's first response byte", registry=r)


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


def run(cfg, mode: str) -> None:
    """Serve the proxy in the foreground on the proxy node's LAN address."""
    import uvicorn

    settings = settings_from_config(cfg, mode)
    uvicorn.run(create_app(settings), host=cfg.nodes[cfg.proxy.node].lan_address,
                port=cfg.proxy.port, **server_options(settings))


class Proxy:
    """The handlers and their state: the settings, a backend pool per role and the metrics.
    `front` is the pool whose answer goes back to the client (replica or decode)."""

    def __init__(self, settings: ProxySettings):
        self.settings, self.metrics = settings, Metrics()
        timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s,
                                        sock_read=settings.request_timeout_s)
        roles = ({"replica": settings.backends} if settings.mode == "replicated"
                 else {"prefill": settings.prefill, "decode": settings.decode})
        self.pools = {role: Pool(role, urls, settings.policy, timeout,
                                 on_connect_retry=self.metrics.connect_retries.labels(role).inc,
                                 on_resend=self.metrics.resends.labels(role).inc,
                                 headers=auth_headers(settings.backend_api_key))
                      for role, urls in roles.items()}
        self.front = self.pools.get("replica") or self.pools["decode"]
        self.limits = Limits(max_n=settings.max_n, max_tokens=settings.max_tokens)
        # vLLM's own rules matter where a refusal would come after a prefill: in P/D mode.
        # In front of replicas (or one instance) the instance refuses a bad request itself
        # at no extra cost, so the proxy skips loading them (about 7 s per start here).
        self.rules = (vllm_rules() if settings.vllm_rules and settings.mode == "disaggregated"
                      else None)
        log.info("requests are checked by %s", "vLLM's own request models and sampling checks"
                 if self.rules else "the lab's checks (serve.validate)")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        for pool in self.pools.values():
            pool.open()
        watchdog = asyncio.ensure_future(_report_stalls())
        yield
        watchdog.cancel()
        await asyncio.gather(*(p.aclose() for p in self.pools.values()))

    @contextlib.contextmanager
    def tracked(self, pool: Pool, url: str):
        pool.in_flight[url] += 1
        self.metrics.in_flight.labels(pool.role, url).inc()
        try:
            yield
        finally:
            pool.in_flight[url] -= 1
            self.metrics.in_flight.labels(pool.role, url).dec()

    def authorize(self, request: Request) -> None:
        """Refuse a request without the API key (when one is set); constant-time compare.
        The scheme is matched case-insensitively (RFC 9110), as vLLM does."""
        key = self.settings.api_key
        if not key:
            return
        sent = request.headers.get("authorization", "")
        scheme, _, token = sent.strip().partition(" ")
        if scheme.lower() == "bearer":
            sent = f"Bearer {token.strip()}"
        if not hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
            raise ProxyError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer ...)")

    async def read_json(self, request: Request, limit: int | None = None) -> dict:
        """The request's JSON object, once the API key and the body size are checked. A
        body is read until it passes `limit` (default `max_body_bytes`), not further
        (chunked bodies too)."""
        s = self.settings
        limit = limit or s.max_body_bytes
        self.authorize(request)
        too_large = ProxyError(413, "body_too_large", f"body over {limit} bytes")
        declared = request.headers.get("content-length")
        if declared and not declared.isdigit():
            raise ProxyError(400, "invalid_request", f"Content-Length {declared[:40]!r} is not a number")
        if declared and int(declared) > limit:
            raise too_large
        chunks: list[bytes] = []

        async def read() -> None:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)

        try:  # a client that sends its body slowly (or never ends it) does not hold on
            await asyncio.wait_for(read(), s.body_timeout_s)
        except TimeoutError:
            raise ProxyError(408, "body_timeout", f"the request body was not received within "
                             f"{s.body_timeout_s:g} s") from None
        raw = b"".join(chunks)
        try:
            body = json.loads(raw, parse_constant=_refuse_constant)
        except ValueError as e:
            raise ProxyError(400, "invalid_json", f"request body is not valid JSON: {e}") from None
        except RecursionError:
            raise ProxyError(400, "invalid_json", "request body is nested too deeply") from None
        if not isinstance(body, dict):
            raise ProxyError(400, "invalid_json", "request body must be a JSON object")
        return body

    # ----- /v1/completions and /v1/chat/completions -----------------------------------

    async def completion(self, request: Request, *, path: str) -> Response:
        self.metrics.requests.labels(path).inc()
        try:
            body = await self.read_json(request)
            if "kv_transfer_params" in body:
                raise ProxyError(400, "kv_transfer_params_refused",
                                 "kv_transfer_params are set by the proxy, not by clients: remove "
                                 "the field from the request")
            try:
                check_request(body, path, self.limits, self.rules)
            except InvalidRequest as e:
                raise ProxyError(e.status, e.kind, str(e), param=e.param) from None
            if self.settings.mode == "disaggregated":
                if body.get("use_beam_search"):
                    raise ProxyError(400, "BadRequestError", "beam search is not supported by "
                                     "the disaggregated front door (its prefill answers one "
                                     "token and hands over one sequence's KV): send it to an "
                                     "instance directly", param="use_beam_search")
                parts = split(body)
                if len(parts) > 1:
                    return await self.pairs(request, path, body, parts)
                body = decode_request(body, await self.prefill(request, path, body))
            return await self.forward(request, path, body, self.front)
        except ProxyError as e:
            return self.answer(e)
        except Exception:  # never a plain-text 500
            log.exception("the proxy failed on a %s request", path)
            return self.answer(ProxyError(500, "InternalServerError", "the proxy failed on this "
                                          "request; its log has the details"))

    async def pairs(self, request: Request, path: str, body: dict, parts: list[dict]) -> Response:
        """A request of several prompts or choices, as one prefill/decode pair per prompt
        and choice (`protocol.split`), run side by side, at most `proxy.max_n` at a time
        (a list of thousands of prompts does not become thousands of requests at once);
        the first error answer is the client's, else the answers merged as one instance
        would answer."""
        if body.get("stream"):
            raise ProxyError(400, "BadRequestError",
                             "streaming several prompts or choices (a prompt list, or n > 1) "
                             "is not supported by the disaggregated front door: stream one "
                             "request per prompt and choice, or set stream to false",
                             param="stream")

        width = asyncio.Semaphore(self.limits.max_n or 1)  # pairs in flight, at most

        async def pair(part: dict) -> Response:
            async with width:
                part = decode_request(part, await self.prefill(request, path, part))
                return await self.forward(request, path, part, self.front)

        try:
            async with asyncio.TaskGroup() as group:  # one failing cancels the others
                tasks = [group.create_task(pair(p)) for p in parts]
        except ExceptionGroup as e:  # the first failure is the client's answer
            raise e.exceptions[0] from None
        answers = [t.result() for t in tasks]
        failed = next((a for a in answers if a.status_code != 200), None)
        if failed is not None:
            return failed
        merged = merge([json.loads(bytes(a.body)) for a in answers], int(body.get("n") or 1))
        return JSONResponse(merged)

    def answer(self, e: ProxyError) -> Response:
        """The client's error answer: counted, and without backend URLs when a key is set."""
        self.metrics.errors.labels(e.kind).inc()
        if e.backend and self.settings.api_key:
            log.warning("%s", e)
            e = e.redacted()
        response = e.response()
        if e.status in (408, 413):  # the rest of the body is not waited for: close
            response.headers["connection"] = "close"
        return response

    async def prefill(self, request: Request, path: str, body: dict) -> dict:
        """Run the prompt on a prefill backend; return its `kv_transfer_params`."""
        pool = self.pools["prefill"]
        url = pool.pick()
        req = prefill_request(body, path)
        t0 = time.perf_counter()

        async def call() -> tuple[int, bytes]:
            async with await pool.post(url, path, req) as r:
                return r.status, await r.read()

        with self.tracked(pool, url):
            try:
                status, raw = await _until_disconnect(request, asyncio.ensure_future(call()))
            except UPSTREAM_ERRORS as e:
                raise upstream_error(e, url, "prefill") from None
        self.metrics.prefill_s.observe(time.perf_counter() - t0)
        if status != 200:
            raise backend_error(status, raw, "prefill", url)
        try:
            params = transfer_params(json.loads(raw))
        except (ValueError, RecursionError, AttributeError):
            params = None
        if not params:
            raise ProxyError(502, "no_kv_transfer_params",
                             f"prefill backend {url} returned no kv_transfer_params: its KV connector "
                             "is probably misconfigured (expected NixlConnector with kv_role kv_producer)", url)
        return params

    async def forward(self, request: Request, path: str, body: dict, pool: Pool) -> Response:
        """Send `body` to a backend of `pool`; its answer whole, or streamed as it comes."""
        url = pool.pick()
        stack = contextlib.ExitStack()
        stack.enter_context(self.tracked(pool, url))
        t0 = time.perf_counter()
        try:
            resp = await pool.post(url, path, body)
        except UPSTREAM_ERRORS as e:
            stack.close()
            raise upstream_error(e, url, pool.role) from None
        except BaseException:
            stack.close()
            raise
        self.metrics.decode_ttfb_s.observe(time.perf_counter() - t0)
        media = resp.headers.get("content-type", "application/json")
        if not body.get("stream") or resp.status != 200:
            try:
                content = await _until_disconnect(request, asyncio.ensure_future(resp.read()))
            except UPSTREAM_ERRORS as e:
                raise upstream_error(e, url, pool.role) from None
            finally:
                resp.close()
                stack.close()
            return Response(content, status_code=resp.status, media_type=media)
        return StreamingResponse(self.relay(resp, pool, url, stack.close), status_code=200,
                                 media_type=media)

    async def relay(self, resp: aiohttp.ClientResponse, pool: Pool, url: str,
                    done) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        except UPSTREAM_ERRORS as e:
            self.metrics.errors.labels("upstream_stream_broken").inc()
            err = ProxyError(502, "upstream_stream_broken",
                             f"{pool.role} backend {url} broke off the stream: {e!r}", url,
                             public=f"{pool.role} backend broke off the stream ({type(e).__name__})")
            if self.settings.api_key:
                log.warning("%s", err)
                err = err.redacted()
            yield f"data: {json.dumps(err.body())}\n\n".encode()
        finally:
            resp.close()  # unfinished: drops the connection, so the backend sees the client leave
            done()

    # ----- side requests: models, tokenizer, health, metrics ---------------------------

    async def ask_front(self, method: str, path: str, body: dict | None = None) -> Response:
        """A side request (model list, tokenizer) to the first backend of the front role,
        outside the routing and the counts."""
        url = self.front.urls[0]
        try:
            async with self.front.clients[url].request(method, path, json=body) as r:
                return Response(await r.read(), status_code=r.status, media_type="application/json")
        except UPSTREAM_ERRORS as e:
            return self.answer(upstream_error(e, url, self.front.role))

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        return await self.ask_front("GET", "/v1/models")

    async def tokenizer(self, request: Request, *, path: str) -> Response:
        """/tokenize and /detokenize, for clients that build prompts: bounded by what a
        prompt of the served context can be (`TOKENIZE_BYTES_PER_TOKEN` bytes a token),
        so a huge text does not hold the front instance's tokenizer for seconds."""
        tokens = self.settings.max_tokens or 32768
        body = await self.read_json(request, min(self.settings.max_body_bytes,
                                                 tokens * TOKENIZE_BYTES_PER_TOKEN))
        return await self.ask_front("POST", path, body)

    async def backend_health(self, pool: Pool, url: str) -> str:
        quick = aiohttp.ClientTimeout(total=self.settings.connect_timeout_s)
        try:
            async with pool.clients[url].get("/health", timeout=quick) as r:
                return "ok" if r.status == 200 else f"HTTP {r.status}"
        except UPSTREAM_ERRORS as e:
            return type(e).__name__

    async def health(self) -> JSONResponse:
        checks = [(p, u) for p in self.pools.values() for u in p.urls]
        states = await asyncio.gather(*(self.backend_health(p, u) for p, u in checks))
        ok = all(s == "ok" for s in states)
        answer: dict[str, Any] = {"status": "ok" if ok else "degraded"}
        if not self.settings.api_key:  # open to anyone on the LAN when a key is set: no URLs
            answer.update(mode=self.settings.mode, backends={
                f"{p.role} {u}": s for (p, u), s in zip(checks, states, strict=True)})
        return JSONResponse(answer, status_code=200 if ok else 503)

    async def prometheus(self, request: Request) -> Response:
        self.authorize(request)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(settings: ProxySettings) -> FastAPI:
    proxy = Proxy(settings)
    app = FastAPI(title="spark-disagg-lab proxy", lifespan=proxy.lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)

    async def openapi(request: Request) -> Response:  # behind the key, like every route
        proxy.authorize(request)
        return JSONResponse(app.openapi())

    @app.exception_handler(ProxyError)  # a side request refused (the key, the body): its answer
    async def refused(request: Request, e: ProxyError) -> Response:
        return e.response()

    async def failed(request: Request, exc: Exception) -> Response:  # never plain text
        log.error("the proxy failed on %s: %r", request.url.path, exc)
        return ProxyError(500, "InternalServerError", "the proxy failed on this request; its "
                          "log has the details").response()

    app.add_exception_handler(Exception, failed)
    app.state.proxy, app.state.pools, app.state.metrics = proxy, proxy.pools, proxy.metrics
    app.state.settings = settings
    # Plain Starlette routes for the hot path: FastAPI's parameter machinery costs
    # measurable time per request and these endpoints take the raw request anyway.
    for path in ("/v1/completions", "/v1/chat/completions"):
        app.add_route(path, functools.partial(proxy.completion, path=path), methods=["POST"])
    # the served model's tokenizer, so a client of the proxy (the bench command) can
    # build exact-length prompts without a local copy of the model
    for path in ("/tokenize", "/detokenize"):
        app.add_route(path, functools.partial(proxy.tokenizer, path=path), methods=["POST"])
    app.get("/v1/models")(proxy.models)
    app.get("/health")(proxy.health)
    app.get("/metrics")(proxy.prometheus)
    app.add_route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)
    return app
