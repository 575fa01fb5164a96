"""Test doubles for HTTP backends, and a helper to serve any ASGI app in a thread.

`FakeBackend` speaks just enough of vLLM's OpenAI API for fault injection: it records what
it received (bodies, and the Authorization header of every request) and behaves as the
request's `model` field asks ("gaps": stream chunks that
wait for the test's go-ahead, "hang", "die": break off mid-stream, "no_kv": a prefill
answer without kv_transfer_params, "unknown": vLLM's 404 for a model it does not serve,
anything else: an instant answer).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class ServerThread:
    """Run an ASGI app under uvicorn in a daemon thread, on address:port."""

    def __init__(self, app, address: str, port: int | None = None, **options):
        """`options`: uvicorn.Config's, over the defaults here."""
        self.address, self.port = address, port or free_port(address)
        options = {"log_level": "warning", "access_log": False, "timeout_graceful_shutdown": 1,
                   **options}
        self.server = uvicorn.Server(uvicorn.Config(app, host=address, port=self.port, **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        t_end = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > t_end or not self.thread.is_alive():
                raise RuntimeError(f"test server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class FakeBackend:
    def __init__(self, name: str = "fake"):
        self.name = name
        self.requests: list[dict] = []
        self.auth: list[str | None] = []  # each request's Authorization header
        self.go_ahead = threading.Event()  # "gaps": the test allows the second chunk
        self.first_chunk_sent = threading.Event()
        self.stream_cancelled = threading.Event()
        self.in_flight = self.most_in_flight = 0  # requests of model "busy" being answered
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()
        fake = self

        class RecordAuth:  # plain ASGI: a client that leaves still cancels the stream
            def __init__(self, inner):
                self.inner = inner

            async def __call__(self, scope, receive, send):
                if scope["type"] == "http":
                    fake.auth.append(dict(scope["headers"]).get(b"authorization", b"").decode() or None)
                await self.inner(scope, receive, send)

        app.add_middleware(RecordAuth)

        def chunk(i: int) -> bytes:
            return f"data: {json.dumps({'choices': [{'index': 0, 'text': f't{i}'}], 'from': fake.name})}\n\n".encode()

        async def waiting_for(event: threading.Event, timeout: float = 10) -> None:
            t_end = time.monotonic() + timeout
            while not event.is_set() and time.monotonic() < t_end:
                await asyncio.sleep(0.005)

        @app.post("/v1/completions")
        @app.post("/v1/chat/completions")
        async def completions(request: Request):
            body = await request.json()
            fake.requests.append(body)
            behaviour = body.get("model", "")
            if behaviour == "hang":
                await asyncio.sleep(3600)
            if behaviour == "busy":  # answers after a while, counting how many it holds
                fake.in_flight += 1
                fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                await asyncio.sleep(0.05)
                fake.in_flight -= 1
            if behaviour == "unknown":
                return JSONResponse({"error": {"message": "The model `unknown` does not exist.",
                                               "type": "NotFoundError", "param": "model",
                                               "code": 404}}, status_code=404)
            if not body.get("stream"):
                out = {"id": "x", "choices": [{"index": 0, "text": "ok"}], "from": fake.name}
                if behaviour != "no_kv" and body.get("kv_transfer_params", {}).get("do_remote_decode"):
                    out["kv_transfer_params"] = {"remote_engine_id": fake.name, "remote_block_ids": [[1]],
                                                 "remote_host": "127.0.0.9", "remote_port": 5600,
                                                 "do_remote_prefill": True}
                return JSONResponse(out)

            async def flood():  # endless 64 KiB events, until the reader goes away
                pad = "x" * 65536
                try:
                    while True:
                        yield f"data: {json.dumps({'choices': [{'index': 0, 'text': pad}]})}\n\n".encode()
                        await asyncio.sleep(0)
                except asyncio.CancelledError:
                    fake.stream_cancelled.set()
                    raise
                finally:
                    fake.stream_cancelled.set()

            if behaviour == "flood":
                return StreamingResponse(flood(), media_type="text/event-stream")

            async def stream():
                try:
                    yield chunk(0)
                    fake.first_chunk_sent.set()
                    if behaviour == "gaps":
                        await waiting_for(fake.go_ahead)
                    elif behaviour == "slow":
                        await asyncio.sleep(30)
                    if behaviour == "die":
                        raise RuntimeError("backend died mid-stream")
                    yield chunk(1)
                    if (body.get("stream_options") or {}).get("include_usage"):
                        usage = {"prompt_tokens": len(body.get("prompt") or ""), "completion_tokens": 2}
                        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                except asyncio.CancelledError:
                    fake.stream_cancelled.set()
                    raise
                finally:
                    if behaviour == "slow":
                        fake.stream_cancelled.set()

            return StreamingResponse(stream(), media_type="text/event-stream")

        @app.get("/health")
        async def health():
            return JSONResponse({})

        @app.get("/v1/models")
        async def models():
            return JSONResponse({"data": [{"id": "fake", "owned_by": fake.name}]})

        @app.post("/tokenize")
        async def tokenize(request: Request):  # one token per character
            body = await request.json()
            return JSONResponse({"tokens": [ord(c) for c in body["prompt"]], "from": fake.name})

        return app
