"""The API key on every route of a vLLM instance but /health and /metrics.

vLLM 0.32 checks VLLM_API_KEY only on paths under /v1, /v2, /inference and /cohere; its
other routes answer anyone, among them /invocations (SageMaker's entry point, which runs
a completion, `kv_transfer_params` included) and /tokenize. The launcher loads this ASGI
middleware into every instance that has a key (`--middleware
lab_utils.on_node.api_guard.RequireKey`); it reads the key from the same VLLM_API_KEY
and answers 401 to any other request without `Authorization: Bearer <key>`. /health (the
lab's and the proxy's readiness checks) and /metrics (Prometheus scrapers) stay open.
Standard library only: it runs inside vLLM's API server, from the deployed copy.
"""

from __future__ import annotations

import hmac
import json
import os

OPEN_PATHS = frozenset({"/health", "/metrics"})


class RequireKey:
    """Pure ASGI middleware; without VLLM_API_KEY in the environment it lets all through."""

    def __init__(self, app):
        self.app = app
        key = os.environ.get("VLLM_API_KEY")
        self.expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send):
        if (self.expected is None or scope["type"] not in ("http", "websocket")
                or scope.get("method") == "OPTIONS" or scope["path"] in OPEN_PATHS):
            return await self.app(scope, receive, send)
        sent = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = sent.strip().partition(b" ")
        if scheme.lower() == b"bearer":  # the scheme in any case (RFC 9110), as vLLM does
            sent = b"Bearer " + token.strip()
        if hmac.compare_digest(sent, self.expected):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
