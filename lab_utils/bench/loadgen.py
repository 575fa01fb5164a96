"""Benchmark the load generator: its own ceiling, and agreement with `vllm bench serve`.

Ceiling: against an instant stub server (`lab_utils.bench.stub_server`, own process), Poisson
arrivals at rising rates; the ceiling is the highest rate at which the generator sent
every request within 10 ms of its schedule (p99 send lag) with no errors.

Agreement: on one rehearsal vLLM instance (the profile's baseline, started if needed),
the same workload (input/output lengths, request count, concurrency, `ignore_eos`) run by
this generator and by vLLM's own `vllm.benchmarks.serve` (imported from the installed
vLLM), interleaved, `--repeats` times each; medians of TTFT, TPOT and output throughput
side by side with their spreads.

    python -m lab_utils.bench.loadgen [--config F] [--repeats 3] [--skip-vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys

from lab_utils.bench.stub_server import spawn_until_up
from lab_utils.config import WorkloadConfig, load_config
from lab_utils.measure.benchmark import summarize
from lab_utils.measure.loadgen import RequestSpec, run_point
from lab_utils.on_node.proctools import port_is_free, stop_group

HOST = "127.0.0.8"


def ceiling(rates: list[float], seconds: float) -> list[dict]:
    port = next(p for p in range(18800, 18900) if port_is_free(HOST, p))
    url = f"http://{HOST}:{port}"
    pid, ticks = spawn_until_up([sys.executable, "-m", "lab_utils.bench.stub_server", HOST, str(port), "0", "0"],
                                f"{url}/v1/completions")
    try:
        rows = []
        for rate in rates:
            n = int(rate * seconds)
            specs = [RequestSpec([1, 2, 3, 4], 4) for _ in range(n)]
            records, wall = asyncio.run(run_point(url, "stub", specs, rate=rate, seed=1, show_progress=False))
            s = summarize(records, wall, WorkloadConfig(max_failed_fraction=0.0))
            rows.append({"rate": rate, "sent": len(records), "achieved_rps": s["request_throughput"],
                         "p99_send_lag_ms": s["p99_send_lag_ms"], "failed": s["failed"],
                         "ok": s["failed"] == 0 and s["p99_send_lag_ms"] < 10.0})
        return rows
    finally:
        stop_group(pid, ticks, 5)


# Runs in its own process, so vLLM's imports and threads cannot slow this generator down.
_VLLM_BENCH = """
import contextlib, json, sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
serve.add_cli_args(parser)
args = parser.parse_args(sys.argv[1:])
with contextlib.redirect_stdout(sys.stderr):
    result = serve.main(args)
keys = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput",
        "request_throughput", "completed", "failed")
print(json.dumps({k: result.get(k) for k in keys}))
"""


def _vllm_bench(url: str, model: str, tokenizer: str, w: WorkloadConfig, conc: int, seed: int,
                api_key: str | None = None) -> dict:
    argv = ["--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(w.input_len),
            "--random-output-len", str(w.output_len), "--num-prompts", str(w.num_prompts),
            "--max-concurrency", str(conc), "--ignore-eos", "--num-warmups", str(w.warmup),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm", "--seed", str(seed),
            "--temperature", "0"]
    env = {**os.environ, "OPENAI_API_KEY": api_key} if api_key else None  # how vLLM's reads it
    p = subprocess.run([sys.executable, "-c", _VLLM_BENCH, *argv], capture_output=True, text=True,
                       timeout=1800, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def agreement(cfg, repeats: int, conc: int) -> list[tuple[str, str, float, float, float]]:
    from lab_utils.cluster import Cluster
    from lab_utils.config import api_key
    from lab_utils.measure.workload import build_requests, local_tokenizer
    from lab_utils.serve.topology import serve

    w = cfg.workload
    key = api_key(cfg, "vllm")  # the instance is measured directly
    with Cluster(cfg) as cluster:
        records = serve(cluster, "baseline")
    url = next(r.url for r in records if r.extra.get("role") == "baseline")
    tok, detok = local_tokenizer(cfg.model_path)
    # One untimed pass first: a fresh instance's first batches of a new shape are slow.
    asyncio.run(run_point(url, cfg.model.name, build_requests(w, w.num_prompts, tok, detok, seed=99),
                          concurrency=conc, show_progress=False, api_key=key))
    ours, theirs = [], []
    for rep in range(repeats):
        order = ("ours", "vllm") if rep % 2 == 0 else ("vllm", "ours")
        for who in order:
            seed = 100 + rep
            if who == "ours":
                specs = build_requests(w, w.warmup + w.num_prompts, tok, detok, seed=seed)
                records, wall = asyncio.run(run_point(url, cfg.model.name, specs, concurrency=conc,
                                                      warmup=w.warmup, show_progress=False, api_key=key))
                ours.append(summarize(records, wall, w))
            else:
                theirs.append(_vllm_bench(url, cfg.model.name, cfg.model_path, w, conc, seed, key))
            last = (ours if who == "ours" else theirs)[-1]
            print(f"  repeat {rep + 1} {who:<4}: TTFT {last['median_ttft_ms']:.2f} ms, TPOT "
                  f"{last['median_tpot_ms']:.2f} ms, {last['output_throughput']:.0f} tok/s", flush=True)
    rows = []
    for key in ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput",
                "request_throughput"):
        a = [s[key] for s in ours]
        b = [s[key] for s in theirs]
        rows.append((key, "lab", statistics.median(a), min(a), max(a)))
        rows.append((key, "vllm bench serve", statistics.median(b), min(b), max(b)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=96, help="requests per run (the "
                    "profile's workload sets the lengths)")
    ap.add_argument("--rates", default="100,200,300,400,600")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--skip-vllm", action="store_true", help="measure the ceiling only")
    args = ap.parse_args(argv)

    print("\nGenerator ceiling against an instant stub server (Poisson arrivals)")
    print(f"{'rate':>8}{'sent':>7}{'achieved req/s':>16}{'p99 send lag ms':>17}{'failed':>8}")
    for r in ceiling([float(x) for x in args.rates.split(",")], args.seconds):
        print(f"{r['rate']:>8.0f}{r['sent']:>7}{r['achieved_rps']:>16.1f}{r['p99_send_lag_ms']:>17.2f}"
              f"{r['failed']:>8}  {'ok' if r['ok'] else 'over the ceiling'}")
    if args.skip_vllm:
        return 0
    cfg = load_config(args.config)
    cfg.workload = w = cfg.workload.model_copy(update={"num_prompts": args.num_prompts,
                                                        "warmup": max(cfg.workload.warmup, 4)})
    print(f"\nAgreement with vllm bench serve on {cfg.profile}'s baseline instance: input "
          f"{w.input_len}, output {w.output_len}, {w.num_prompts} requests at concurrency "
          f"{args.concurrency}, {args.repeats} repeats each, interleaved; median [min-max]")
    rows = agreement(cfg, args.repeats, args.concurrency)
    for i in range(0, len(rows), 2):
        (key, _, m1, lo1, hi1), (_, _, m2, lo2, hi2) = rows[i], rows[i + 1]
        diff = (m1 - m2) / m2 * 100 if m2 else float("nan")
        spread = max(hi1 - lo1, hi2 - lo2)
        verdict = "agree" if abs(m1 - m2) <= max(0.1 * abs(m2), spread) else "DIFFER"
        print(f"  {key:<22} lab {m1:9.2f} [{lo1:.2f}-{hi1:.2f}]   vllm {m2:9.2f} [{lo2:.2f}-{hi2:.2f}]"
              f"   {diff:+6.1f}%  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
