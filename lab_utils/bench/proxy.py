"""Benchmark: what the lab proxy adds to each request, against the direct path.

An instant backend (`lab_utils.bench.stub_server` with no delays: a JSON answer with
`kv_transfer_params` for prefill calls, three SSE chunks for streamed ones) runs in its
own process; so does each
proxy under test. A closed-loop client keeps `concurrency` requests in flight and times
each one to its last byte. The direct path does the same work without a proxy (in P/D
mode the client itself calls prefill, then decode). Targets are interleaved within each
repeat, so drift on a busy machine hits them alike. Output: per mode, concurrency and
target, median over repeats of p50/p99 latency and requests/s, with the min-max spread,
and the latency added over direct. `--toy-proxy FILE` adds vLLM's reference toy proxy
(P/D mode only) measured the same way.

    python -m lab_utils.bench.proxy [--repeats 3] [--toy-proxy /path/toy_proxy_server.py]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import httpx

from lab_utils.bench.stub_server import spawn_until_up
from lab_utils.on_node.proctools import stop_group
from lab_utils.serve.protocol import decode_request, prefill_request, transfer_params

HOST = "127.0.0.7"
PROMPT = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}


def _serve(role: str, port: int, mode: str, backend: str) -> None:
    import uvicorn

    if role == "backend":
        from lab_utils.bench.stub_server import make_app

        app = make_app(0, 0)  # instant
    else:
        from lab_utils.serve.proxy import ProxySettings, create_app

        settings = (ProxySettings("replicated", backends=[backend]) if mode == "replicated"
                    else ProxySettings("disaggregated", prefill=[backend], decode=[backend]))
        app = create_app(settings)
    uvicorn.run(app, host=HOST, port=port, log_level="error", access_log=False)


async def _one(client: httpx.AsyncClient, url: str, direct_pd: bool) -> float:
    t0 = time.perf_counter()
    if direct_pd:  # the protocol without a proxy: prefill, then decode with its params
        pre = await client.post(url, json=prefill_request(PROMPT))
        body = decode_request(PROMPT, transfer_params(pre.json()))
    else:
        body = PROMPT
    async with client.stream("POST", url, json=body) as r:
        async for _ in r.aiter_raw():
            pass
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}")
    return time.perf_counter() - t0


async def _load(url: str, concurrency: int, n: int, direct_pd: bool) -> tuple[list[float], float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        for _ in range(min(concurrency, 20)):  # warm connections
            await _one(client, url, direct_pd)
        latencies: list[float] = []
        remaining = n

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                latencies.append(await _one(client, url, direct_pd))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, len(latencies) / (time.perf_counter() - t0)


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=400, help="requests per point")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--modes", default="replicated,disaggregated")
    ap.add_argument("--toy-proxy", help="path to vLLM's toy_proxy_server.py (not shipped)")
    ap.add_argument("--serve", nargs=4, metavar=("ROLE", "PORT", "MODE", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), args.serve[2], args.serve[3])
        return 0
    from lab_utils.on_node.proctools import port_is_free

    ports = iter(p for p in range(18700, 18800) if port_is_free(HOST, p))
    me = [sys.executable, "-m", "lab_utils.bench.proxy", "--serve"]
    procs = []
    try:
        bport = next(ports)
        backend = f"http://{HOST}:{bport}"
        procs.append(spawn_until_up(me + ["backend", str(bport), "-", "-"], f"{backend}/v1/completions"))
        rows = []
        for mode in args.modes.split(","):
            targets = {"direct": (f"{backend}/v1/completions", mode == "disaggregated")}
            port = next(ports)
            procs.append(spawn_until_up(me + ["proxy", str(port), mode, backend], f"http://{HOST}:{port}/v1/completions"))
            targets["lab proxy"] = (f"http://{HOST}:{port}/v1/completions", False)
            if args.toy_proxy and mode == "disaggregated":
                port = next(ports)
                toy = [sys.executable, args.toy_proxy, "--host", HOST, "--port", str(port),
                       "--prefiller-hosts", HOST, "--prefiller-ports", str(bport),
                       "--decoder-hosts", HOST, "--decoder-ports", str(bport)]
                procs.append(spawn_until_up(toy, f"http://{HOST}:{port}/v1/completions"))
                targets["vLLM toy proxy"] = (f"http://{HOST}:{port}/v1/completions", False)
            for conc in (int(c) for c in args.concurrency.split(",")):
                results: dict[str, list[tuple[float, float, float]]] = {t: [] for t in targets}
                for _ in range(args.repeats):
                    for name, (url, direct_pd) in targets.items():
                        lat, rps = asyncio.run(_load(url, conc, args.requests, direct_pd))
                        results[name].append((_pct(lat, 50) * 1e3, _pct(lat, 99) * 1e3, rps))
                base = statistics.median(r[0] for r in results["direct"])
                base99 = statistics.median(r[1] for r in results["direct"])
                for name, reps in results.items():
                    p50s, p99s, rpss = zip(*reps, strict=True)
                    rows.append((mode, conc, name, statistics.median(p50s), min(p50s), max(p50s),
                                 statistics.median(p99s), statistics.median(rpss), min(rpss), max(rpss),
                                 statistics.median(p50s) - base, statistics.median(p99s) - base99))
                print(f"  done: {mode} c={conc}", file=sys.stderr, flush=True)
    finally:
        for pid, ticks in procs:
            stop_group(pid, ticks, 5)
    print(f"\n{args.repeats} repeats x {args.requests} requests per point; medians over repeats "
          "[min-max]; latency to the last byte; added = median minus direct's median\n")
    print(f"{'mode':<14}{'conc':>5}  {'target':<15}{'p50 ms':>22}{'p99 ms':>9}"
          f"{'req/s':>22}{'added p50':>11}{'added p99':>11}")
    for m, c, t, p50, lo, hi, p99, rps, rlo, rhi, a50, a99 in rows:
        print(f"{m:<14}{c:>5}  {t:<15}{p50:>8.2f} [{lo:5.2f}-{hi:5.2f}]{p99:>9.2f}"
              f"{rps:>8.0f} [{rlo:5.0f}-{rhi:5.0f}]{a50:>11.2f}{a99:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
