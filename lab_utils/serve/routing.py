"""The proxy's backends: one pool per role, how a backend is picked, how it is called.

A `Pool` holds the backends of one role (replica, prefill or decode), each with its own
pooled aiohttp client session (opened inside the server's event loop) and in-flight
count, and picks one per request: round-robin or least-outstanding. A backend connect
that hangs is retried on a fresh socket within the connect timeout (nothing has been sent
yet). A request whose pooled connection was lost before any answer (the backend closed
it while the proxy was held up between taking it from the pool and writing) is sent once
more on a new connection. Failures become
`ProxyError`s, which answer as OpenAI-style JSON errors.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import math
import time

import aiohttp
from fastapi.responses import JSONResponse, Response

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

log = logging.getLogger("lab_utils.serve.proxy")  # one logger for the whole proxy


class ProxyError(Exception):
    """An error the proxy answers with, in vLLM's shape: `{"error": {"message", "type",
    "param", "code"}}` (plus `backend` when the backends' URLs may be shown). `kind` is
    the error's type and its label in `proxy_errors_total`. `raw`: a backend's own error
    body, passed through as it came (with `status`)."""

    def __init__(self, status: int, kind: str, message: str, backend: str | None = None,
                 param: str | None = None, raw: bytes | None = None, public: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.backend, self.param = status, kind, backend, param
        self.raw, self.public = raw, public

    def redacted(self) -> ProxyError:
        """This error without the backend's URL (for clients when a key is set: they
        are not told where the instances are, as /health does not)."""
        if not self.backend:
            return self
        message = self.public or str(self).replace(self.backend, "").replace("  ", " ")
        return ProxyError(self.status, self.kind, message, None, self.param, self.raw)

    def body(self) -> dict:
        error = {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}
        return {"error": {**error, "backend": self.backend} if self.backend else error}

    def response(self) -> Response:
        if self.raw is not None:
            return Response(self.raw, status_code=self.status, media_type="application/json")
        return JSONResponse(self.body(), status_code=self.status)


class Pool:
    """Backends of one role, each with its own pooled client and in-flight count.
    Clients are opened by `open()` inside the server's event loop."""

    def __init__(self, role: str, urls: list[str], policy: str, timeout: aiohttp.ClientTimeout,
                 on_connect_retry=None, on_resend=None, headers: dict[str, str] | None = None):
        self.role, self.urls, self.policy, self.timeout = role, urls, policy, timeout
        self.headers = headers or {}  # sent with every request (the instances' API key)
        self.clients: dict[str, aiohttp.ClientSession] = {}
        self.fresh: dict[str, aiohttp.ClientSession] = {}  # a new connection per request
        self.in_flight = dict.fromkeys(urls, 0)
        self._cycle = itertools.cycle(urls)
        assert timeout.connect is not None  # the proxy gives its pools a connect timeout
        self.connect_attempts = max(2, math.ceil(timeout.connect / CONNECT_ATTEMPT_S))
        self._attempt = aiohttp.ClientTimeout(total=None, connect=timeout.connect / self.connect_attempts,
                                              sock_read=timeout.sock_read)
        self._on_connect_retry = on_connect_retry or (lambda: None)
        self._on_resend = on_resend or (lambda: None)

    def open(self) -> None:
        def session(url: str, **pooling) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(base_url=url, timeout=self.timeout, headers=self.headers,
                                         connector=aiohttp.TCPConnector(limit=0, **pooling))
        self.clients = {u: session(u, keepalive_timeout=BACKEND_KEEPALIVE_S) for u in self.urls}
        self.fresh = {u: session(u, force_close=True) for u in self.urls}

    def pick(self) -> str:
        if self.policy == "least_outstanding":
            return min(self.urls, key=self.in_flight.__getitem__)
        return next(self._cycle)

    async def post(self, url: str, path: str, body: dict) -> aiohttp.ClientResponse:
        """POST `body` to `url`; a connect that does not complete within its share of
        connect_timeout_s is given up and tried again on a fresh socket, and a request
        that could not be written on a pooled connection is sent once more on a new one."""
        t0 = time.monotonic()
        client, resent, attempt = self.clients[url], False, 0
        while True:
            attempt += 1
            t1 = time.monotonic()
            try:
                return await client.post(path, json=body, timeout=self._attempt)
            except aiohttp.ConnectionTimeoutError:
                now = time.monotonic()
                if attempt >= self.connect_attempts:
                    raise ProxyError(504, "upstream_timeout",
                                     f"{self.role} backend {url} accepted no connection in {now - t0:.1f} s "
                                     f"({attempt} attempts): is it overloaded, or is a firewall dropping "
                                     "packets to that port?", url) from None
                log.warning("%s backend %s: connect attempt %d gave up after %.1f s (limit %.1f s); "
                            "trying a fresh socket", self.role, url, attempt, now - t1, self._attempt.connect)
                self._on_connect_retry()
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
                if resent or not _connection_lost(e):
                    raise
                log.warning("%s backend %s: a pooled connection was lost before any answer "
                            "(%r); sending the request once more on a new connection",
                            self.role, url, e)
                self._on_resend()
                client, resent = self.fresh[url], True

    async def aclose(self) -> None:
        await asyncio.gather(*(c.close() for c in [*self.clients.values(), *self.fresh.values()]))


def _connection_lost(exc: Exception) -> bool:
    """Whether `exc` (raised before any response header arrived) is how a connection the
    backend closed or reset shows: the request could not be written, the peer reset it,
    or it closed without an answer. Typically the backend dropped an idle pooled
    connection while the proxy was held up between taking it and writing, so the backend
    never saw the request. Were the connection lost after the backend had the request,
    the request runs twice; vLLM aborts the first, whose client is gone."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return ("Can not write request body" in str(exc)
            or getattr(exc, "errno", None) in (errno.ECONNRESET, errno.EPIPE))


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def upstream_error(exc: Exception, url: str, role: str) -> ProxyError:
    if isinstance(exc, asyncio.TimeoutError):
        return ProxyError(504, "upstream_timeout", f"{role} backend {url} timed out ({type(exc).__name__})", url)
    return ProxyError(502, "upstream_unavailable", f"{role} backend {url} unreachable: {exc!r}", url,
                      public=f"{role} backend unreachable ({type(exc).__name__})")


def backend_error(status: int, raw: bytes, role: str, url: str) -> ProxyError:
    """A backend's error answer: vLLM's own JSON error passes through with its status;
    anything else is wrapped in that shape (the backend's URL only in `backend`)."""
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return ProxyError(status, f"{role}_failed", f"{role} backend answered {status}", url,
                          raw=raw)
    text = raw[:300].decode("utf-8", "replace")
    return ProxyError(status if status >= 400 else 502, f"{role}_failed",
                      f"{role} backend answered {status}: {text}", url)
