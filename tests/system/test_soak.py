"""Soak: a few minutes of mixed streaming load through the lab proxy in front of the
disaggregated rehearsal instances (the path notebook 04 measures), from a few clients
that abandon about a quarter of their requests at a random point. Afterwards every
request is accounted for, the clients' counts reconcile with the proxy's and vLLM's own
counters, nothing is left running or in flight, and the memory of the proxy and of each
vLLM instance is back where it was after the warm-up."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest

from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.measure.workload import build_requests, local_tokenizer
from lab_utils.on_node import proctools
from lab_utils.serve.metrics import MetricsSnapshot, fetch_metrics
from lab_utils.serve.topology import serve

from support.profiles import show

SEED = 4242
CLIENTS = 3  # concurrent clients
WARMUP_S = 20.0  # load before the memory baseline: one-off allocations happen here
LOAD_S = 60.0  # load after it (no request starts later): ~7 requests/s on the 2-core CI
# machine (1101 in 150 s, 2026-11-28), so some 400
MIN_LOAD_REQUESTS = 200  # fewer, and the leak bounds below lose their meaning
ABANDON_FRACTION = 0.25  # requests the client walks away from
BEFORE_TOKEN_MAX_S = 2.0  # such a client gives up within this, before its first token...
# ...or after k token chunks, k in 1..max_tokens/2 (so well before the stream would end)
REQUEST_BOUND_S = 120.0  # no request may take longer (a rehearsal P/D stall is ~30 s)
SETTLE_BOUND_S = 90.0  # for everything to be idle again after a phase (measured: < 1 s;
# the bound allows for prefill KV blocks that no decode read, held for vLLM's 30 s lease)
SOAK_BOUND_S = WARMUP_S + LOAD_S + 2 * (REQUEST_BOUND_S + SETTLE_BOUND_S)
STARTUP_ALLOWANCE_S = 700.0  # rehearsal.up() when this test is the first to need it

# Memory: the end (after the load, idle) may exceed the start (after the warm-up, idle)
# by at most max(RSS_REL * start, RSS_ABS), per process (group). Idle RSS moves by some
# MiB between two idle moments without any leak: glibc arenas, torch's CPU allocator and
# Python's pools keep what they once used, and a batch shape first seen after the
# warm-up allocates once. Measured here: a vLLM instance (API server + engine core, with
# its 1 GiB KV cache) ~3.4 GiB, +2..+9 MiB over a soak; the proxy process group ~650 MiB,
# +0..1 MiB. So 5% (~170 MiB) for an instance and 5% (~32 MiB) for the proxy leave room
# for that noise, and over at least MIN_LOAD_REQUESTS a leak of ~850 KiB per vLLM request
# or ~160 KiB per proxy request still fails.
RSS_REL = 0.05
RSS_ABS = 32 * 2**20

# The error kinds the lab proxy itself produces (lab_utils/serve/proxy.py: ProxyError kinds
# and the relay's upstream_stream_broken); it counts each in proxy_errors_total{kind}. Errors
# of any other type come from vLLM and are passed through uncounted.
PROXY_KINDS = {"unauthorized", "body_too_large", "invalid_json", "client_disconnected",
               "prefill_failed", "no_kv_transfer_params", "upstream_timeout",
               "upstream_unavailable", "upstream_stream_broken", "BadRequestError",
               "body_timeout", "InternalServerError"}
# Kinds the proxy can raise before it has the decode instance's response headers, i.e.
# before it counts the request in proxy_decode_ttfb_seconds; upstream_stream_broken is
# the only one raised after.
PRE_DECODE_KINDS = PROXY_KINDS - {"upstream_stream_broken"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(STARTUP_ALLOWANCE_S + SOAK_BOUND_S + 120)]


# ---- one client request ---------------------------------------------------------------

@dataclass
class Plan:
    abandon_after_s: float | None = None  # give up at this time if the stream still runs
    abandon_after_chunks: int | None = None  # ...or on receiving this many token chunks

    @property
    def label(self) -> str:
        if self.abandon_after_s is not None:
            return "before_first_token"
        return "mid_stream" if self.abandon_after_chunks else "complete"


@dataclass
class Result:
    index: int
    prompt_len: int
    max_tokens: int
    plan: Plan
    outcome: str = "bad"  # completed | error | disconnected | bad (anything else)
    stage: str = ""  # disconnected: before_headers | before_first_token | mid_stream
    status: int | None = None
    error_kind: str | None = None
    error_message: str = ""
    token_chunks: int = 0
    completion_tokens: int | None = None
    done: bool = False  # saw data: [DONE]
    seconds: float = 0.0
    detail: str = ""


class Abandon(Exception):
    pass


def error_of(raw: bytes, status: int) -> tuple[str, str]:
    """(type, message) of an OpenAI-style error body."""
    try:
        err = json.loads(raw)["error"]
        return err["type"], str(err.get("message", ""))[:300]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}", raw[:300].decode(errors="replace")


async def _on_chunk_sent(session, ctx, params) -> None:
    ctx.trace_request_ctx["sent"].set()


def trace_config() -> aiohttp.TraceConfig:
    """Tells a request when its body is on the wire: a client that gives up must not do
    so before the proxy has the whole request (else the proxy never saw it)."""
    tc = aiohttp.TraceConfig()
    tc.on_request_chunk_sent.append(_on_chunk_sent)
    return tc


async def stream(session: aiohttp.ClientSession, url: str, body: dict, res: Result,
                 sent: asyncio.Event) -> None:
    async with session.post(url, json=body, trace_request_ctx={"sent": sent}) as resp:
        res.status = resp.status
        if resp.status != 200:
            res.error_kind, res.error_message = error_of(await resp.read(), resp.status)
            return
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                data = event.removeprefix(b"data: ").strip()
                if data == b"[DONE]":
                    res.done = True
                if not data or data == b"[DONE]":
                    continue
                msg = json.loads(data)
                if "error" in msg:
                    res.error_kind, res.error_message = error_of(data, 200)
                    continue
                if msg.get("usage"):
                    res.completion_tokens = msg["usage"].get("completion_tokens")
                if any(c.get("text") for c in msg.get("choices") or []):
                    res.token_chunks += 1
                    n = res.plan.abandon_after_chunks
                    if n and res.token_chunks >= n:
                        resp.close()  # drop the connection: the client is gone
                        raise Abandon


async def one_request(session: aiohttp.ClientSession, url: str, body: dict, res: Result) -> None:
    """Run one request to its end, its planned abandonment or REQUEST_BOUND_S; never
    raises. Cancelling the request closes its connection (force_close: one per request)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    sent = asyncio.Event()
    task = asyncio.ensure_future(stream(session, url, body, res, sent))
    deadline = t0 + REQUEST_BOUND_S
    if res.plan.abandon_after_s is not None:  # the client's patience starts once it has sent
        on_wire = asyncio.ensure_future(sent.wait())
        await asyncio.wait({task, on_wire}, timeout=REQUEST_BOUND_S,
                           return_when=asyncio.FIRST_COMPLETED)
        on_wire.cancel()
        deadline = min(deadline, loop.time() + res.plan.abandon_after_s)
    done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
    if not done:
        task.cancel()
    try:
        await task
    except Abandon:
        res.outcome = "disconnected"
    except asyncio.CancelledError:
        if res.done:
            pass  # cancelled between [DONE] and the end of the stream: it completed
        elif res.plan.abandon_after_s is not None and deadline < t0 + REQUEST_BOUND_S:
            res.outcome = "disconnected"
        else:
            res.detail = f"no end within {REQUEST_BOUND_S:.0f} s"
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        res.detail = f"{type(e).__name__}: {e}"[:300]
    res.seconds = loop.time() - t0
    if res.outcome == "disconnected":
        res.stage = ("before_headers" if res.status is None else
                     "before_first_token" if res.token_chunks == 0 else "mid_stream")
    elif res.detail:
        pass  # bad: a transport failure or no end in time
    elif res.error_kind is not None:
        res.outcome = "error"
    elif res.done and res.completion_tokens == res.max_tokens:
        res.outcome = "completed"
    else:
        res.detail = (f"stream ended without an error: done={res.done}, completion_tokens="
                      f"{res.completion_tokens} (want {res.max_tokens})")


def make_plan(rng: random.Random, max_tokens: int) -> Plan:
    if rng.random() >= ABANDON_FRACTION:
        return Plan()
    if rng.random() < 0.5:  # before the first token (or at it, if it comes sooner)
        return Plan(abandon_after_s=rng.uniform(0.0, BEFORE_TOKEN_MAX_S), abandon_after_chunks=1)
    return Plan(abandon_after_chunks=rng.randint(1, max_tokens // 2))


async def load_phase(url: str, model: str, work, results: list[Result], seconds: float) -> None:
    """CLIENTS clients send requests back to back from `work` until `seconds` are over."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     trace_configs=[trace_config()]) as session:
        t_end = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < t_end:
                i, spec, plan = next(work)
                body = {"model": model, "prompt": spec.prompt_ids, "max_tokens": spec.max_tokens,
                        "temperature": 0.0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                res = Result(i, len(spec.prompt_ids), spec.max_tokens, plan)
                results.append(res)
                await one_request(session, f"{url}/v1/completions", body, res)

        await asyncio.gather(*(client() for _ in range(CLIENTS)))


# ---- counters, gauges and memory ------------------------------------------------------

def by_label(snap: MetricsSnapshot, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in snap.samples:
        if s.name == name:
            out[s.labels.get(label, "")] = out.get(s.labels.get(label, ""), 0.0) + s.value
    return out


def total(snap: MetricsSnapshot, name: str) -> float:
    return sum(s.value for s in snap.samples if s.name == name)


def proxy_reading(client: httpx.Client, url: str) -> dict[str, float]:
    snap = fetch_metrics(url, client, timeout=10)
    requests = by_label(snap, "proxy_requests_total", "endpoint")
    out = {"requests": requests.get("/v1/completions", 0.0),
           "in_flight": total(snap, "proxy_in_flight"),
           "prefill_done": total(snap, "proxy_prefill_seconds_count"),
           "decode_started": total(snap, "proxy_decode_ttfb_seconds_count")}
    out.update({f"errors:{k}": v for k, v in by_label(snap, "proxy_errors_total", "kind").items()})
    return out


def vllm_reading(client: httpx.Client, url: str) -> dict[str, float]:
    snap = fetch_metrics(url, client, timeout=10)
    out = {"running": total(snap, "vllm:num_requests_running"),
           "waiting": total(snap, "vllm:num_requests_waiting"),
           "kv_usage": total(snap, "vllm:kv_cache_usage_perc")}
    out.update({f"success:{k}": v for k, v in
                by_label(snap, "vllm:request_success_total", "finished_reason").items()})
    return out


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def rss_bytes(rec: ProcessRecord) -> int:
    """Resident memory of the record's whole process group (a vLLM instance is an API
    server plus its engine core process)."""
    out = 0
    for pid in proctools.group_members(rec.pgid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                out += int(line.split()[1]) * 1024
    return out


def settle(client: httpx.Client, proxy_url: str, urls: dict[str, str],
           start: dict[str, dict[str, float]]) -> tuple[bool, float, dict[str, dict[str, float]]]:
    """Poll until nothing is in flight in the proxy, nothing runs or waits in vLLM and the
    KV cache usage is back to its starting level (or SETTLE_BOUND_S pass); return whether
    it got there, the seconds it took and the last readings."""
    t0 = time.monotonic()
    while True:
        now = {"proxy": proxy_reading(client, proxy_url)}
        now.update({role: vllm_reading(client, u) for role, u in urls.items()})
        idle = now["proxy"]["in_flight"] == start["proxy"]["in_flight"] and all(
            now[r][g] <= start[r][g] for r in urls for g in ("running", "waiting", "kv_usage"))
        if idle or time.monotonic() - t0 > SETTLE_BOUND_S:
            return idle, time.monotonic() - t0, now
        time.sleep(0.5)


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


# ---- the test -------------------------------------------------------------------------

def test_soak_through_the_proxy_with_client_disconnects(rehearsal, engine_cfg, request):
    cfg = engine_cfg
    rehearsal.up()
    cluster = Cluster(cfg)  # local nodes: nothing to close
    had_proxy = any(r.name == "proxy" and r.extra.get("mode") == "disaggregated"
                    for r in cluster.running())
    records = serve(cluster, "disaggregated", with_proxy=True, show_progress=False)
    procs = {r.extra["role"]: r for r in records}
    proxy_url = procs["proxy"].url
    urls = {role: procs[role].url for role in ("prefill", "decode")}
    try:
        _soak(cfg, request, procs, proxy_url, urls)
    finally:
        if not had_proxy:  # leave the rehearsal as we found it
            cluster.stop([procs["proxy"]])


def _soak(cfg, request, procs, proxy_url, urls) -> None:
    w = cfg.workload
    max_model_len = cfg.vllm.max_model_len
    assert w.mixed_long_len + w.output_len <= max_model_len
    tok, _ = local_tokenizer(cfg.model_path)
    n_specs = 600  # prompts, sent in turn as often as the clients get through them
    specs = build_requests(w, n_specs, tok, mixed=True, seed=SEED)
    rng = random.Random(SEED)
    # endless: how many requests fit in the time depends on the machine (a fixed list ran
    # out once the rehearsal's P/D step stopped standing still)
    work = ((i, specs[i % n_specs], make_plan(rng, specs[i % n_specs].max_tokens))
            for i in itertools.count())
    results: list[Result] = []
    t_soak = time.monotonic()

    with httpx.Client() as c:
        start = {"proxy": proxy_reading(c, proxy_url)}
        start.update({role: vllm_reading(c, u) for role, u in urls.items()})

        asyncio.run(load_phase(proxy_url, cfg.model.name, work, results, WARMUP_S))
        idle, warm_settle_s, warm = settle(c, proxy_url, urls, start)
        assert idle, f"not idle {SETTLE_BOUND_S:.0f} s after the warm-up: {warm} (start {start})"
        rss_start = {name: rss_bytes(procs[name]) for name in ("proxy", "prefill", "decode")}
        n_warmup = len(results)

        t_load = time.monotonic()
        asyncio.run(load_phase(proxy_url, cfg.model.name, work, results, LOAD_S))
        load_s = time.monotonic() - t_load
        _, end_settle_s, end = settle(c, proxy_url, urls, start)  # checked in detail below
        rss_end = {name: rss_bytes(procs[name]) for name in ("proxy", "prefill", "decode")}
    soak_s = time.monotonic() - t_soak

    # ---- what the clients saw
    sent = len(results)
    outcomes = Counter(r.outcome for r in results)
    stages = Counter(r.stage for r in results if r.outcome == "disconnected")
    client_errors = Counter(r.error_kind for r in results if r.outcome == "error")
    completed, errors, disconnected = (outcomes["completed"], outcomes["error"],
                                       outcomes["disconnected"])
    p, pre, dec = ((start[k], end[k]) for k in ("proxy", "prefill", "decode"))
    d_proxy = {k: delta(p[1], p[0], k) for k in set(p[0]) | set(p[1]) if k != "in_flight"}
    proxy_errors = {k.removeprefix("errors:"): v for k, v in d_proxy.items()
                    if k.startswith("errors:") and v}
    d_pre = {k: delta(pre[1], pre[0], k) for k in pre[1] if k.startswith("success:")}
    d_dec = {k: delta(dec[1], dec[0], k) for k in dec[1] if k.startswith("success:")}
    longest = max(results, key=lambda r: r.seconds)

    gone = stages["before_headers"] - int(proxy_errors.get("client_disconnected", 0))
    line = " | ".join([
        f"[soak] {soak_s:.0f} s (warm-up {WARMUP_S:.0f} s + load {load_s:.0f} s, settled in "
        f"{warm_settle_s:.1f} s / {end_settle_s:.1f} s), {CLIENTS} clients: sent {sent} "
        f"({n_warmup} in warm-up), completed {completed}, errors {errors} {dict(client_errors)}, "
        f"disconnected {disconnected} {dict(stages)}, bad {outcomes['bad']}; longest request "
        f"{longest.seconds:.1f} s",
        f"proxy: requests {d_proxy['requests']:.0f}, prefills done {d_proxy['prefill_done']:.0f}, "
        f"decodes started {d_proxy['decode_started']:.0f} (of which {gone} for a client already "
        f"gone), errors {proxy_errors}, in flight {p[0]['in_flight']:.0f} -> "
        f"{p[1]['in_flight']:.0f}",
        f"vLLM success: prefill {_nonzero(d_pre)}, decode {_nonzero(d_dec)}; running/waiting/kv "
        f"prefill {_gauges(pre[1])}, decode {_gauges(dec[1])}",
        "RSS start -> end: " + ", ".join(
            f"{n} {mib(rss_start[n])} -> {mib(rss_end[n])}" for n in rss_start)])
    for r in [r for r in results if r.outcome == "error"][:5]:
        line += f"\n[soak] error: request {r.index} after {r.seconds:.1f} s: {r.error_message}"
    show(request, line)

    # ---- every request ended in exactly one accepted way, within its bound
    bad = [r for r in results if r.outcome == "bad"]
    assert not bad, [(r.index, r.plan.label, r.status, r.token_chunks, r.detail) for r in bad[:10]]
    assert completed + errors + disconnected == sent
    assert all(r.seconds <= REQUEST_BOUND_S + 5 for r in results)
    assert all(r.plan.label != "complete" for r in results if r.outcome == "disconnected")
    assert completed and disconnected, "the soak exercised too little: check the load sizing"
    assert sent - n_warmup >= MIN_LOAD_REQUESTS, (
        f"{sent - n_warmup} requests in the {load_s:.0f} s load: too few for the leak bounds")
    assert soak_s <= SOAK_BOUND_S

    # ---- the proxy's counters. Exact: it counts every request it receives, and every
    # error it produces under its kind. A client that leaves while the proxy waits for the
    # prefill is a client_disconnected error (499); one that leaves once the decode answered
    # is not an error to the proxy (the stream is cancelled, nothing counted). Which of the
    # two a client that left before seeing response headers met is a race the client
    # cannot see (it may have left while the decode's headers were on their way), so that
    # count is bounded, and the proxy's own conservation law is checked exactly: every
    # request either failed before the decode or reached it (proxy_decode_ttfb_seconds).
    assert d_proxy["requests"] == sent
    for kind in PROXY_KINDS - {"client_disconnected"}:
        assert proxy_errors.get(kind, 0) == client_errors.get(kind, 0), kind
    assert set(proxy_errors) <= PROXY_KINDS, proxy_errors
    assert proxy_errors.get("client_disconnected", 0) <= stages["before_headers"]
    assert d_proxy["requests"] == d_proxy["decode_started"] + sum(
        proxy_errors.get(k, 0) for k in PRE_DECODE_KINDS)
    reached_decode = completed + stages["before_first_token"] + stages["mid_stream"] + sum(
        n for kind, n in client_errors.items() if kind not in PRE_DECODE_KINDS)
    assert reached_decode <= d_proxy["decode_started"] <= reached_decode + stages["before_headers"]
    assert p[1]["in_flight"] == p[0]["in_flight"], "requests left in flight in the proxy"

    # ---- vLLM's counters (vllm:request_success_total{finished_reason}), 0.32 semantics:
    # a request is counted when the engine finishes it; one the client aborted first is
    # not counted at all (OutputProcessor.abort_requests drops its state, and the engine's
    # later ABORT output for it is ignored), so the "abort" series stays 0. ignore_eos
    # makes every finished request a "length" one. The prefill instance finishes (one
    # token) every prefill the proxy received an answer for, plus possibly some whose
    # client left (a 499) after the engine was done; the decode instance finishes every
    # completed request, plus possibly some whose client left too late to stop it.
    assert d_pre.get("success:abort", 0) == 0 and d_dec.get("success:abort", 0) == 0
    prefilled = d_proxy["prefill_done"] - proxy_errors.get("prefill_failed", 0)
    assert prefilled <= d_pre.get("success:length", 0) <= prefilled + proxy_errors.get(
        "client_disconnected", 0)
    assert completed <= d_dec.get("success:length", 0) <= completed + disconnected
    assert sum(d_dec.values()) <= d_proxy["decode_started"]

    # ---- back to the starting level: nothing running, waiting, or holding KV blocks
    for role, (s, e) in (("prefill", pre), ("decode", dec)):
        for g in ("running", "waiting", "kv_usage"):
            assert e[g] <= s[g], f"{role} {g}: {s[g]} at the start, {e[g]} after settling"

    # ---- memory back to its level after the warm-up
    for name in rss_start:
        allowed = max(RSS_REL * rss_start[name], RSS_ABS)
        assert rss_end[name] - rss_start[name] <= allowed, (
            f"{name}: RSS {mib(rss_start[name])} -> {mib(rss_end[name])}, "
            f"more than {mib(allowed)} of growth")


def _nonzero(d: dict[str, float]) -> dict[str, int]:
    return {k.removeprefix("success:"): int(v) for k, v in d.items() if v}


def _gauges(r: dict[str, float]) -> str:
    return f"{r['running']:.0f}/{r['waiting']:.0f}/{r['kv_usage']:.3f}"
