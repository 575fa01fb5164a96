"""Benchmark: what a proxy adds to each request, against the direct path.

An instant backend (`lab_utils.bench.stub_server` with no delays: a JSON answer with
`kv_transfer_params` for prefill calls, three SSE chunks for streamed ones) runs in its
own process; so does each proxy under test: the lab's, and when given, vLLM's toy proxy
(`--toy-proxy FILE`, P/D mode only) and `vllm-router` (`--vllm-router BINARY`). The direct
path does the same work without a proxy: in P/D mode the client itself calls prefill, then
decode with the `kv_transfer_params` the prefill returned.

The load comes from `wrk` (a compiled HTTP load tool, Debian package `wrk`), with
`wrk_requests.lua`: one thread per connection keeps `concurrency` logical requests in
flight for `--seconds`, and times each to its last byte. A Python client could not: on 2
cores it was the bottleneck at concurrency 8 and 64, and there the direct path came out
slower than going through a proxy. By default `wrk` runs on the last CPU and the servers
on the others (`--no-pin` to share them all), and the CPU time of the client, of the
backend and of each proxy is reported per 1,000 requests, so a row limited by the client
shows as such. Targets are interleaved within each repeat, so drift on a busy machine hits
them alike. Output: per mode, concurrency and target, the median over repeats of p50/p99
latency and requests/s with the min-max spread, the latency added over direct, and at the
end, whether the direct path was the fastest row and how the lab's proxy did against its
goals (added p50 < 0.5 ms and p99 < 2 ms at concurrency 1; at 8 and above, at least 0.8x
the direct path's requests/s and never below the toy proxy's).

    python -m lab_utils.bench.proxy [--repeats 3] [--seconds 3] [--toy-proxy FILE]
        [--vllm-router BINARY] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
from pathlib import Path

from lab_utils.bench.stub_server import make_app, spawn_until_up
from lab_utils.on_node.proctools import cpu_seconds, port_is_free, stop_group
from lab_utils.serve.protocol import decode_request, prefill_request
from lab_utils.serve.proxy import ProxySettings, create_app, server_options

HOST = "127.0.0.7"
PROMPT = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}
WRK_SCRIPT = Path(__file__).with_name("wrk_requests.lua")
MARK = "@@KV@@"  # where the prefill's kv_transfer_params go in the direct decode body
GOALS = {"c1_added_p50_ms": 0.5, "c1_added_p99_ms": 2.0, "min_share_of_direct": 0.8}


def _serve(role: str, port: int, mode: str, backend: str) -> None:
    import uvicorn

    if role == "backend":  # one instant backend process on two ports (`backend` is the 2nd)
        socks = []
        for p in (port, int(backend)):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((HOST, p))
            socks.append(s)
        config = uvicorn.Config(make_app(0, 0), log_level="error", access_log=False)
        uvicorn.Server(config).run(sockets=socks)
        return
    prefill, decode = backend.split(",")
    settings = (ProxySettings("replicated", backends=[prefill]) if mode == "replicated"
                else ProxySettings("disaggregated", prefill=[prefill], decode=[decode]))
    app = create_app(settings)
    # served as `python -m lab_utils proxy` serves it (its HTTP protocol and limits)
    uvicorn.run(app, host=HOST, port=port, **{**server_options(settings), "log_level": "error"})


def wrk_argv(url: str, concurrency: int, seconds: int, direct_pd: bool,
             wrk: str = "wrk") -> list[str]:
    """The wrk command line for one point: `direct_pd` makes the client do the P/D protocol
    itself (prefill, then decode with the prefill's `kv_transfer_params`)."""
    head = [wrk, "-t", str(concurrency), "-c", str(concurrency), "-d", f"{int(seconds)}s",
            "--timeout", "10s", "-s", str(WRK_SCRIPT), url, "--"]
    if not direct_pd:
        return head + ["single", json.dumps(PROMPT)]
    decode = json.dumps(decode_request(PROMPT, {MARK: 0}))
    pre, post = decode.split(json.dumps({MARK: 0}))
    return head + ["pd", json.dumps(prefill_request(PROMPT)), pre, post]


def run_wrk(argv: list[str], cpus: set[int] | None = None, name: str = "wrk") -> dict:
    """Run one wrk point; its JSON line, plus requests/s and the client's own CPU seconds."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    assert p.stdout is not None and p.stderr is not None  # both PIPE
    out, err = p.stdout.read(), p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed (exit {p.returncode}): {err.strip() or out.strip()}")
    res = json.loads(lines[-1])
    if res["errors"] or not res["requests"]:
        raise RuntimeError(f"{name}: {res['errors']} failed "
                           f"of {res['requests']} requests; last: {res['last_error']}")
    res["rps"] = res["requests"] / res["duration_s"]
    res["client_cpu_s"] = usage.ru_utime + usage.ru_stime
    return res


def _pin(pid: int, cpus: set[int] | None) -> None:
    """Pin a server and its threads to `cpus` (threads started later inherit it)."""
    if cpus:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), cpus)


def _cpu_sets(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def _router_argv(binary: str, port: int, mode: str, backend: str, decode: str) -> list[str]:
    argv = [binary, "--host", HOST, "--port", str(port), "--policy", "round_robin",
            "--log-level", "error", "--prometheus-port", str(port + 1000),
            "--worker-startup-check-interval", "1"]
    if mode == "replicated":
        return argv + ["--worker-urls", backend]
    return argv + ["--vllm-pd-disaggregation", "--kv-connector", "nixl",
                   "--prefill", backend, "--decode", decode]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3, help="wrk's duration per point")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--modes", default="replicated,disaggregated")
    ap.add_argument("--toy-proxy", help="path to vLLM's toy_proxy_server.py (not shipped)")
    ap.add_argument("--vllm-router", help="path to the vllm-router binary (pip install vllm-router)")
    ap.add_argument("--no-pin", action="store_true", help="let wrk and the servers share every CPU")
    ap.add_argument("--json", help="also write the rows and verdicts to this file")
    ap.add_argument("--serve", nargs=4, metavar=("ROLE", "PORT", "MODE", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), args.serve[2], args.serve[3])
        return 0
    wrk = shutil.which("wrk")
    if not wrk:
        print("bench.proxy needs wrk, the HTTP load tool: apt-get install wrk "
              "(or bash tests/ensure_sysdeps.sh)", file=sys.stderr)
        return 2
    client_cpus, server_cpus = _cpu_sets(not args.no_pin)
    ports = iter(p for p in range(18700, 18800) if port_is_free(HOST, p)
                 and port_is_free(HOST, p + 1000))
    me = [sys.executable, "-m", "lab_utils.bench.proxy", "--serve"]
    procs: list[tuple[int, int]] = []

    def start(argv: list[str], url: str) -> int:
        procs.append(spawn_until_up(argv, url))
        _pin(procs[-1][0], server_cpus)
        return procs[-1][0]

    concs = [int(c) for c in args.concurrency.split(",")]
    rows = []
    try:
        # vllm-router wants the prefill and decode URLs to differ: the one backend process
        # listens on a second port, given as the decode URL to every proxy
        bport, bport2 = next(ports), next(ports)
        backend, backend2 = f"http://{HOST}:{bport}", f"http://{HOST}:{bport2}"
        backend_pid = start(me + ["backend", str(bport), "-", str(bport2)],
                            f"{backend}/v1/completions")
        for mode in args.modes.split(","):
            pd = mode == "disaggregated"
            targets = {"direct": (f"{backend}/v1/completions", pd, None)}

            def add(name: str, argv: list[str], port: int, targets: dict = targets) -> None:
                url = f"http://{HOST}:{port}/v1/completions"
                targets[name] = (url, False, start(argv, url))

            port = next(ports)
            add("lab proxy", me + ["proxy", str(port), mode, f"{backend},{backend2}"], port)
            if args.toy_proxy and pd:
                port = next(ports)
                add("vLLM toy proxy", [sys.executable, args.toy_proxy, "--host", HOST, "--port", str(port),
                                       "--prefiller-hosts", HOST, "--prefiller-ports", str(bport),
                                       "--decoder-hosts", HOST, "--decoder-ports", str(bport2)], port)
            if args.vllm_router:
                port = next(ports)
                add("vllm-router", _router_argv(args.vllm_router, port, mode, backend, backend2), port)
            for conc in concs:
                reps: dict[str, list[dict]] = {t: [] for t in targets}
                for _ in range(args.repeats):
                    for name, (url, direct_pd, pid) in targets.items():
                        watched = {k: v for k, v in (("backend", backend_pid), ("proxy", pid)) if v}
                        before = {k: cpu_seconds(v) for k, v in watched.items()}
                        res = run_wrk(wrk_argv(url, conc, args.seconds, direct_pd, wrk), client_cpus, name)
                        for k, t0 in before.items():
                            res[f"{k}_cpu_s"] = cpu_seconds(watched[k]) - t0
                        reps[name].append(res)
                rows += summarise(mode, conc, reps)
                print(f"  done: {mode} c={conc}", file=sys.stderr, flush=True)
    finally:
        for pid, ticks in procs:
            stop_group(pid, ticks, 5)
    verdicts = judge(rows)
    pinning = (f"wrk on CPU {sorted(client_cpus)}, servers on CPUs {sorted(server_cpus)}"
               if client_cpus and server_cpus else "wrk and the servers share every CPU")
    print(table(rows, args.repeats, args.seconds, pinning))
    print("\n".join(verdicts))
    if args.json:
        Path(args.json).write_text(json.dumps({"repeats": args.repeats, "seconds": args.seconds,
                                               "pinning": pinning, "rows": rows,
                                               "verdicts": verdicts}, indent=1))
    return 0


def summarise(mode: str, conc: int, reps: dict[str, list[dict]]) -> list[dict]:
    """One row per target: medians over repeats, spreads, added latency over direct, and CPU
    seconds per 1,000 requests of the client, the backend and the proxy."""
    med = statistics.median
    base50 = med(r["p50_ms"] for r in reps["direct"])
    base99 = med(r["p99_ms"] for r in reps["direct"])
    rows = []
    for name, runs in reps.items():
        n = [r["requests"] for r in runs]

        def per_1k(key: str, runs: list[dict] = runs, n: list[int] = n) -> float | None:
            if key not in runs[0]:
                return None
            return med(r[key] / k * 1000 for r, k in zip(runs, n, strict=True))

        p50s, p99s, rpss = ([r[k] for r in runs] for k in ("p50_ms", "p99_ms", "rps"))
        rows.append({"mode": mode, "concurrency": conc, "target": name,
                     "p50_ms": med(p50s), "p50_min": min(p50s), "p50_max": max(p50s),
                     "p99_ms": med(p99s), "rps": med(rpss), "rps_min": min(rpss), "rps_max": max(rpss),
                     "added_p50_ms": med(p50s) - base50, "added_p99_ms": med(p99s) - base99,
                     "client_cpu_s_per_1k": per_1k("client_cpu_s"),
                     "backend_cpu_s_per_1k": per_1k("backend_cpu_s"),
                     "proxy_cpu_s_per_1k": per_1k("proxy_cpu_s")})
    return rows


def judge(rows: list[dict]) -> list[str]:
    """The verdicts: is direct the fastest row at each point, and the lab proxy's goals."""
    out = []
    points = sorted({(r["mode"], r["concurrency"]) for r in rows})
    for mode, conc in points:
        here = {r["target"]: r for r in rows if (r["mode"], r["concurrency"]) == (mode, conc)}
        d, lab, toy = here["direct"], here.get("lab proxy"), here.get("vLLM toy proxy")
        faster = [t for t, r in here.items() if t != "direct" and r["rps"] > d["rps"]]
        out.append(f"{mode} c={conc}: direct is {'NOT ' if faster else ''}the fastest row"
                   + (f" ({', '.join(faster)} served more requests/s)" if faster else ""))
        if not lab:
            continue
        if conc == 1:
            ok = lab["added_p50_ms"] < GOALS["c1_added_p50_ms"] and lab["added_p99_ms"] < GOALS["c1_added_p99_ms"]
            out.append(f"  lab proxy: added p50 {lab['added_p50_ms']:.2f} ms (goal < {GOALS['c1_added_p50_ms']}), "
                       f"added p99 {lab['added_p99_ms']:.2f} ms (goal < {GOALS['c1_added_p99_ms']}): "
                       f"{'met' if ok else 'MISSED'}")
        else:
            share = lab["rps"] / d["rps"]
            ok = share >= GOALS["min_share_of_direct"] and (not toy or lab["rps"] >= toy["rps"])
            vs_toy = f", toy proxy {toy['rps']:.0f} req/s" if toy else ""
            out.append(f"  lab proxy: {lab['rps']:.0f} req/s = {share:.2f}x direct "
                       f"(goal >= {GOALS['min_share_of_direct']}){vs_toy}: {'met' if ok else 'MISSED'}")
    return out


def table(rows: list[dict], repeats: int, seconds: float, pinning: str) -> str:
    def cpu(v: float | None) -> str:
        return f"{v:7.2f}" if v is not None else "      -"

    lines = [f"\n{repeats} repeats of {seconds:g} s per point (wrk, one connection per thread; {pinning}); "
             "medians over repeats [min-max]; latency to the last byte; added = median minus "
             "direct's median; CPU = CPU seconds per 1,000 requests\n",
             f"{'mode':<14}{'conc':>5}  {'target':<15}{'p50 ms':>22}{'p99 ms':>9}{'req/s':>22}"
             f"{'added p50':>11}{'added p99':>11}{'CPU client':>11}{'backend':>8}{'proxy':>8}"]
    for r in rows:
        lines.append(f"{r['mode']:<14}{r['concurrency']:>5}  {r['target']:<15}{r['p50_ms']:>8.2f} "
                     f"[{r['p50_min']:5.2f}-{r['p50_max']:5.2f}]{r['p99_ms']:>9.2f}{r['rps']:>8.0f} "
                     f"[{r['rps_min']:5.0f}-{r['rps_max']:5.0f}]{r['added_p50_ms']:>11.2f}"
                     f"{r['added_p99_ms']:>11.2f}    {cpu(r['client_cpu_s_per_1k'])} "
                     f"{cpu(r['backend_cpu_s_per_1k'])} {cpu(r['proxy_cpu_s_per_1k'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
