"""A deterministic stand-in for a vLLM server, for tests and benchmarks.

It answers /v1/completions (any POST path) with SSE: the first token after `ttft_ms`, then one token
every `itl_ms`, `max_tokens` tokens in all, then a usage chunk (prompt tokens = prompt
length) and [DONE]; a body with `messages` gets chat chunks instead (a role-only delta
first, as vLLM sends, then one `delta.content` per token; the prompt's length is its
words); without `stream` it answers JSON at once, with `kv_transfer_params`
when asked to prefill for a remote decode. A prompt whose first id is 13 gets HTTP 500
(for failure counting). With 0 and 0 it is instant: a backend that costs a benchmark
almost nothing.
With a 5th argument, it appends to that file, per request, the TTFT and inter-token
gaps it really produced (from the request's arrival to each chunk handed to the
server), so a test can compare the client's arithmetic with the truth.
Run: python -m lab_utils.bench.stub_server ADDRESS PORT TTFT_MS ITL_MS [TIMING_FILE]
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx

from lab_utils.on_node.proctools import start_ticks, stop_group


def make_app(ttft_ms: float, itl_ms: float, timing_file: str | None = None):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        t_arrival = time.perf_counter()
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw or b"{}")
        chat = "messages" in body
        prompt = body.get("prompt") or [0]
        if chat:
            prompt = " ".join(m.get("content", "") for m in body["messages"]).split() or [0]
        elif isinstance(prompt, str):
            prompt = prompt.split()
        if prompt[0] == 13:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"injected failure"})
            return
        if not body.get("stream"):
            out = {"choices": [{"index": 0, "text": "t"}],
                   "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1}}
            if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
                out["kv_transfer_params"] = {"remote_engine_id": "stub", "remote_block_ids": [[1]],
                                             "remote_host": "127.0.0.1", "remote_port": 1,
                                             "do_remote_prefill": True}
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(out).encode()})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        n = int(body.get("max_tokens", 1))
        stamps = []
        if chat:
            role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await send({"type": "http.response.body", "body": f"data: {json.dumps(role)}\n\n".encode(),
                        "more_body": True})
        for i in range(n):
            if ttft_ms or itl_ms:
                await asyncio.sleep((ttft_ms if i == 0 else itl_ms) / 1000.0)
            token = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            chunk = {"choices": [{"index": 0, **token, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                        "more_body": True})
            stamps.append(time.perf_counter())
        if timing_file:
            with open(timing_file, "a") as f:
                f.write(json.dumps({"prompt": prompt, "ttft_ms": (stamps[0] - t_arrival) * 1e3,
                                    "itl_ms": [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]}) + "\n")
        usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}}
        await send({"type": "http.response.body", "more_body": False,
                    "body": f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()})
    return app


def spawn_until_up(argv: list[str], probe_url: str, timeout_s: float = 30.0) -> tuple[int, int]:
    """Start `argv` in its own process group and wait until POSTing to `probe_url` gets
    any HTTP answer; return (pid, start_ticks) for `proctools.stop_group`."""
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    ticks = start_ticks(p.pid)
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end and p.poll() is None:
        try:
            httpx.post(probe_url, json={"model": "m", "prompt": [1], "max_tokens": 1}, timeout=1)
            return p.pid, ticks
        except httpx.HTTPError:
            time.sleep(0.05)
    stop_group(p.pid, ticks, 2)
    raise RuntimeError(f"{argv} did not answer at {probe_url} within {timeout_s:.0f} s")


def main() -> None:
    import uvicorn

    address, port, ttft, itl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    timing = sys.argv[5] if len(sys.argv) > 5 else None
    # The plain asyncio loop: its timers are finer than uvloop's millisecond ticks.
    uvicorn.run(make_app(ttft, itl, timing), host=address, port=port, log_level="error", access_log=False,
                loop="asyncio")


if __name__ == "__main__":
    main()
