"""The load generator: one ruler for every architecture the lab compares.

Streams OpenAI completions (or chat completions) over HTTP and times each request with
`time.perf_counter()` from the moment it is on the wire: TTFT (to the first token), the inter-token latencies, TPOT
((last token - first token) / (output tokens - 1), as `vllm bench serve` defines it),
end-to-end latency, the token counts the server reports in its usage, the scheduled
and actual send times (their difference is the generator's own lag), and how many
tokens reached it in the same read as the token before (`read_together`). Two modes: a fixed
number of requests in flight (`concurrency`) or arrivals at a Poisson `rate` (with a
gamma `burstiness`; 1.0 is Poisson). Warm-up requests run first and are not recorded. A
failed request is recorded with its error; it never stops the run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import time
from dataclasses import dataclass

import aiohttp

from lab_utils.results.sweep import RequestRecord
from lab_utils.util.progress import progress_bar


@dataclass
class RequestSpec:
    prompt_ids: list[int]
    max_tokens: int
    prompt_text: str | None = None  # for chat, which takes text


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header that carries an API key (none without one), as vLLM and the proxy read it."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _body(model: str, spec: RequestSpec, chat: bool) -> dict:
    body = {"model": model, "max_tokens": spec.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": spec.prompt_text or ""}]
    else:
        body["prompt"] = spec.prompt_ids
    return body


async def _request_sent(session, ctx, params) -> None:
    """aiohttp trace hook: stamp the moment the request's last byte went out."""
    ctx.trace_request_ctx["sent"] = time.perf_counter()


def trace_config() -> aiohttp.TraceConfig:
    """Timing starts when the request is on the wire, not while aiohttp builds it: the
    client's own Python overhead (a few tenths of a ms) is not the server's latency."""
    tc = aiohttp.TraceConfig()
    tc.on_request_headers_sent.append(_request_sent)
    tc.on_request_chunk_sent.append(_request_sent)
    return tc


class TokenReader:
    """Parses a completions stream (server-sent events) into `rec` as it is read: the
    first token's time is the TTFT, each later token adds an inter-token gap.

    A token is an event with a choice in it, whatever its text: vLLM sends one per
    decoding step, and a step whose token ends in the middle of a character (a byte of a
    multi-byte character) or is a special token carries empty text. Waiting for visible
    text instead would count the time of the next step as the first token's, and merge
    two gaps into one (`vllm bench serve` counts every such event too).

    Every token is stamped when the read that brought it returned. A read that brings
    several tokens means they waited in the client's socket (the client was late to read,
    e.g. starved of CPU) or were sent together; the gaps between them then say nothing
    about decoding, and `rec.read_together` counts them."""

    def __init__(self, rec: RequestRecord, t0: float):
        self.rec, self.last, self.buf = rec, t0, b""

    def feed(self, chunk: bytes, now: float) -> None:
        rec, tokens = self.rec, 0
        self.buf += chunk
        while b"\n\n" in self.buf:
            event, self.buf = self.buf.split(b"\n\n", 1)
            data = event.removeprefix(b"data: ").strip()
            if not data or data == b"[DONE]":
                continue
            msg = json.loads(data)
            if "error" in msg:
                raise RuntimeError(f"error event: {json.dumps(msg['error'])[:300]}")
            if msg.get("usage"):
                rec.prompt_tokens = msg["usage"].get("prompt_tokens")
                rec.completion_tokens = msg["usage"].get("completion_tokens")
            choices = msg.get("choices") or []
            if not choices:
                continue
            delta = choices[0].get("delta") or {}
            if delta.get("role") and not delta.get("content"):
                continue  # a chat stream's opening event names the role; no token yet
            if rec.ttft_ms is None:
                rec.ttft_ms = (now - self.last) * 1000.0
            else:
                rec.itl_ms.append((now - self.last) * 1000.0)
                rec.read_together += tokens > 0
            tokens += 1
            self.last = now


async def send_one(session: aiohttp.ClientSession, url: str, body: dict,
                   rec: RequestRecord, t_zero: float) -> RequestRecord:
    """Send one streaming request and fill `rec` in; errors are recorded, not raised.
    The session must carry `trace_config()`."""
    rec.sent_s = time.perf_counter() - t_zero
    stamp = {"sent": time.perf_counter()}
    try:
        async with session.post(url, json=body, trace_request_ctx=stamp) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return rec
            reader = TokenReader(rec, stamp["sent"])
            async for chunk in resp.content.iter_any():
                reader.feed(chunk, time.perf_counter())
        rec.e2el_ms = (time.perf_counter() - stamp["sent"]) * 1000.0
        if rec.ttft_ms is None:
            rec.error = "stream ended without a token"
        elif rec.completion_tokens is None:
            rec.error = "no usage in the response (is stream_options.include_usage supported?)"
        elif rec.completion_tokens > 1:  # first token to last token, not to the stream's end
            rec.tpot_ms = ((reader.last - stamp["sent"]) * 1000.0 - rec.ttft_ms) / (rec.completion_tokens - 1)
    except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:400]
    return rec


def arrival_offsets(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Send times (s) of `n` requests at mean `rate`/s; gamma gaps with shape
    `burstiness` (1.0: Poisson arrivals; below 1: burstier; above: more regular)."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def run_sync(coro):
    """Run a coroutine to completion, also from inside a running event loop (a Jupyter
    kernel has one): then in a worker thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def run_point(url: str, model: str, requests: list[RequestSpec], *,
                    concurrency: int | None = None, rate: float | None = None,
                    burstiness: float = 1.0, warmup: int = 0, seed: int = 0,
                    duration_s: float | None = None, chat: bool = False,
                    timeout_s: float = 600.0, show_progress: bool = True,
                    desc: str = "", api_key: str | None = None) -> tuple[list[RequestRecord], float]:
    """Run one load point; return (records, wall seconds of the measured part).
    With `duration_s`, no request is started after that many seconds; `api_key` is sent
    as a bearer token."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency or rate")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    target = url.rstrip("/") + path
    limit = concurrency or 1024
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=auth_headers(api_key),
                                     trace_configs=[trace_config()]) as session:
        for spec in requests[:warmup]:  # warm-up: connections, caches; not recorded
            await send_one(session, target, _body(model, spec, chat),
                           RequestRecord(-1, len(spec.prompt_ids), spec.max_tokens), time.perf_counter())
        measured = requests[warmup:]
        records = [RequestRecord(i, len(s.prompt_ids), s.max_tokens) for i, s in enumerate(measured)]
        # no rate on the bar: tqdm's is a moving average from the bar's own clock, which the
        # tables' throughput (first send to last token) would contradict
        bar = progress_bar(total=len(measured), desc=desc or "requests", unit="req",
                           disable=not show_progress, leave=False,
                           bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} req "
                                      "[{elapsed}<{remaining}]{postfix}")
        t_zero = time.perf_counter()

        async def one(i: int) -> None:
            await send_one(session, target, _body(model, measured[i], chat), records[i], t_zero)
            bar.update(1)

        def expired() -> bool:
            return duration_s is not None and time.perf_counter() - t_zero > duration_s

        if concurrency is not None:
            queue = iter(range(len(measured)))

            async def worker() -> None:
                for i in queue:
                    if expired():
                        return
                    records[i].scheduled_s = time.perf_counter() - t_zero
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            assert rate is not None  # exactly one of concurrency and rate, checked above
            offsets = arrival_offsets(len(measured), rate, burstiness, random.Random(seed))
            tasks = []
            for i, at in enumerate(offsets):
                delay = at - (time.perf_counter() - t_zero)
                if delay > 0:
                    await asyncio.sleep(delay)
                if expired():
                    break
                records[i].scheduled_s = at
                tasks.append(asyncio.ensure_future(one(i)))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t_zero
        bar.close()
    return [r for r in records if r.sent_s >= 0], wall
