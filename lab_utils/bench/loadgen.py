"""Benchmark the load generator: its own ceiling, and agreement with `vllm bench serve`.

Ceiling: against an instant stub server (`lab_utils.bench.stub_server`, own process), Poisson
arrivals at rising rates; the ceiling is the highest rate at which the generator sent
every request within 10 ms of its schedule (p99 send lag) with no errors.

Agreement: on one rehearsal vLLM instance (the profile's baseline, started for this with
prefix caching off and stopped again unless `--keep`), the same workload (input/output
lengths, request count, `ignore_eos`; with `--dataset F`, the prompts and output lengths of
a custom JSONL file, `--dataset-name custom` for vLLM) run by this generator and by vLLM's
own `vllm.benchmarks.serve` (the installed vLLM, in a process of its own that imports it
once), at concurrency 1, 4 and 16 and at two Poisson rates (40% and 80% of the request rate the instance reached at the
highest concurrency in an untimed pass first), `--repeats` times each, the two tools in
turn and the order swapped every repeat. With `--aiperf PATH` (an `aiperf` executable in
a venv of its own; `make aiperf-venv` makes one) NVIDIA's AIPerf runs the same points as
a third opinion. Per point and metric: the medians over the repeats, their [min-max],
and a verdict by the lab's one rule (`lab_utils.results.points.compare`): "agree" when
the medians are within 10% of the smaller one, "agree (spread)" when they are further
apart but within the runs' own spread (the two ranges overlap, or the medians are no
further apart than one side's range is wide), else "DIFFER".

Why prefix caching is off: vLLM's random dataset makes each prompt a run of consecutive
token ids from a random start, so on the tiny model's 512-token vocabulary its prompts
repeat across runs, and a repeated prompt is a prefix-cache hit whose TTFT is not a
prefill's (seen: `vllm bench serve`'s TTFT at concurrency 1 fell from 86 to 31 ms by the
third repeat, while the lab's fresh prompts stayed at 87-88 ms). Every run records the
share of its prompt tokens the instance served from its cache (`prefix_cache_hit_pct`,
from the instance's counters), which is then 0.

    python -m lab_utils.bench.loadgen [--config F] [--repeats 5] [--aiperf PATH] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

from lab_utils.bench import aiperf_runner
from lab_utils.bench.stub_server import spawn_until_up
from lab_utils.cluster import Cluster
from lab_utils.config import WorkloadConfig, api_key, load_config
from lab_utils.measure.benchmark import summarize
from lab_utils.measure.dataset import read_dataset
from lab_utils.measure.loadgen import RequestSpec, run_point
from lab_utils.measure.workload import build_requests, dataset_sample, local_tokenizer
from lab_utils.on_node.proctools import port_is_free, stop_group
from lab_utils.results.points import Measured, compare, select
from lab_utils.serve.metrics import fetch_metrics, read_counters
from lab_utils.serve.topology import serve

HOST = "127.0.0.8"
NO_PREFIX_CACHING = "--no-enable-prefix-caching"
METRICS = tuple(m.key for m in select("request_throughput", "output_throughput",
                                       "median_ttft_ms", "median_itl_ms", "median_tpot_ms"))


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
            rows.append({"rate": rate, "sent": len(records), "achieved_rps": s.request_throughput,
                         "p99_send_lag_ms": s.p99_send_lag_ms, "failed": s.failed,
                         "ok": s.failed == 0 and (s.p99_send_lag_ms or 0.0) < 10.0})
        return rows
    finally:
        stop_group(pid, ticks, 5)


def verdict(ours: list[float], theirs: list[float]) -> str:
    """The lab's one rule (`points.compare`) on the two tools' runs, in the module's words."""
    v = compare(Measured.of(ours), Measured.of(theirs))
    if v.differs:
        return "DIFFER"
    return "agree (spread)" if v.beyond_margin else "agree"


# ---- vllm bench serve, in a process that imports vLLM once --------------------------------

# Reads one JSON argv list per line, runs vLLM's benchmark with it, prints one JSON line.
_VLLM_WORKER = """
import contextlib, json, sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
keys = json.loads(sys.argv[1])
for line in sys.stdin:
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(json.loads(line))
    with contextlib.redirect_stdout(sys.stderr):
        result = serve.main(args)
    print(json.dumps({k: result.get(k) for k in keys}), flush=True)
"""


def vllm_bench_argv(url: str, model: str, tokenizer: str, w: WorkloadConfig, n: int,
                    point: tuple[str, float], seed: int) -> list[str]:
    """`vllm bench serve` arguments for one point: ("concurrency", c) or ("rate", r/s)."""
    kind, value = point
    load = (["--max-concurrency", str(int(value))] if kind == "concurrency"
            else ["--request-rate", str(value), "--burstiness", "1.0"])
    # a dataset: the same file, its output lengths and its text as written (no chat template)
    data = (["--dataset-name", "custom", "--dataset-path", w.dataset, "--custom-output-len",
             "-1", "--skip-chat-template", "--disable-shuffle"] if w.dataset else
            ["--dataset-name", "random", "--random-input-len", str(w.input_len),
             "--random-output-len", str(w.output_len), "--random-range-ratio", f"{w.range_ratio:g}"])
    return ["--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
            *data, "--num-prompts", str(n), *load, "--ignore-eos", "--num-warmups", str(w.warmup),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm", "--seed", str(seed),
            "--temperature", "0"]


class VllmBench:
    """`vllm bench serve` runs, one process for all of them (vLLM's import takes seconds)."""

    def __init__(self, api_key: str | None, log: Path):
        env = {**os.environ, "OPENAI_API_KEY": api_key} if api_key else None  # how vLLM's reads it
        self.log = log
        self._err = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-c", _VLLM_WORKER, json.dumps(METRICS + ("completed", "failed"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, env=env)

    def run(self, argv: list[str]) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both PIPE
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self._err.flush()
            raise RuntimeError(f"vllm bench serve stopped; the end of {self.log}:\n"
                               f"{self.log.read_text()[-2000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None  # PIPE
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()


# ---- the comparison -----------------------------------------------------------------------

def point_label(point: tuple[str, float]) -> str:
    kind, value = point
    return f"concurrency {int(value)}" if kind == "concurrency" else f"Poisson {value:g} req/s"


def _ours(url: str, cfg, specs: list[RequestSpec], point: tuple[str, float], seed: int,
          key: str | None) -> dict:
    w = cfg.workload
    kind, value = point
    load = {"concurrency": int(value)} if kind == "concurrency" else {"rate": value, "seed": seed}
    records, wall = asyncio.run(run_point(url, cfg.model.name, specs, warmup=w.warmup,
                                          show_progress=False, api_key=key, **load))
    return summarize(records, wall, w).model_dump()  # beside the other tools' JSON


def without_prefix_caching(cfg):
    """`cfg` with the baseline instance's prefix caching turned off (see the docstring)."""
    b = cfg.vllm.baseline
    if NO_PREFIX_CACHING not in b.extra_args:
        b = b.model_copy(update={"extra_args": [*b.extra_args, NO_PREFIX_CACHING]})
    return cfg.model_copy(update={"vllm": cfg.vllm.model_copy(update={"baseline": b})})


def same_prompts(w: WorkloadConfig, n: int, seed: int, workdir: Path) -> WorkloadConfig:
    """For a dataset: `w` with a file of exactly the rows the lab sends with `seed` after its
    warm-up, in its order, which vLLM reads unshuffled: both tools send the same requests
    (two samples of a file of mixed lengths differ by more than the tools do)."""
    if not w.dataset:
        return w
    rows = dataset_sample(w, w.warmup + n, random.Random(seed))[w.warmup:]
    path = workdir / f"dataset-{seed}.jsonl"
    path.write_text("".join(json.dumps({"prompt": r.prompt, "output_tokens": r.output_tokens})
                            + "\n" for r in rows))
    return w.model_copy(update={"dataset": str(path)})


def agreement(cfg, url: str, key: str | None, concurrencies: list[int], n_rates: int,
              repeats: int, aiperf: Path | None, workdir: Path) -> dict:
    """Run every point with every tool, `repeats` times, interleaved; return the raw runs."""

    w = cfg.workload
    n = w.num_prompts
    tok, detok = local_tokenizer(cfg.model_path)
    # One untimed pass at the highest concurrency: a fresh instance's first batches of a
    # new shape are slow, and its request rate sets the Poisson points.
    top = max(concurrencies)
    warm = _ours(url, cfg, build_requests(w, w.warmup + n, tok, detok, seed=99), ("concurrency", top), 99, key)
    capacity = warm["request_throughput"]
    rates = [round(capacity * f, 1) for f in ((0.4, 0.8) if n_rates == 2 else
                                               [(i + 1) / (n_rates + 1) for i in range(n_rates)])]
    points = [("concurrency", float(c)) for c in concurrencies] + [("rate", r) for r in rates]
    print(f"  untimed pass at concurrency {top}: {capacity:.1f} req/s; Poisson points at "
          f"{', '.join(f'{r:g}' for r in rates)} req/s", flush=True)
    tools = ["lab", "vllm bench serve"] + (["aiperf"] if aiperf else [])
    runs: dict[str, dict[str, list[dict]]] = {point_label(p): {t: [] for t in tools} for p in points}
    vllm = VllmBench(key, workdir / "vllm-bench.log")
    try:
        for rep in range(repeats):
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]
            for i, p in enumerate(points):
                # fresh prompts for every point and repeat: a prompt seen before is a
                # prefix-cache hit, and its TTFT is not a prefill's
                seed = 1000 + 100 * rep + i
                for who in order:
                    # the instance's prompt tokens, and those served from its prefix cache
                    before = read_counters(fetch_metrics(url), require_nixl=False)
                    if who == "lab":
                        specs = build_requests(w, w.warmup + n, tok, detok, seed=seed)
                        s = _ours(url, cfg, specs, p, seed, key)
                    elif who == "vllm bench serve":
                        s = vllm.run(vllm_bench_argv(url, cfg.model.name, cfg.model_path,
                                                     same_prompts(w, n, seed, workdir), n, p, seed))
                    else:
                        assert aiperf is not None  # AIPerf is in `order` only when given
                        out = workdir / f"aiperf-{rep}-{p[0]}-{p[1]:g}"
                        s = aiperf_runner.run(aiperf, url, cfg, n, p, seed, key, out)
                    d = read_counters(fetch_metrics(url), require_nixl=False) - before
                    s["prefix_cache_hit_pct"] = (100 * d.prompt_tokens_local_cache_hit / d.prompt_tokens
                                                 if d.prompt_tokens else 0.0)
                    runs[point_label(p)][who].append(s)
                    print(f"  repeat {rep + 1} {point_label(p):<22} {who:<17} TTFT "
                          f"{s['median_ttft_ms']:7.2f} ms  TPOT {s['median_tpot_ms']:6.2f} ms  "
                          f"{s['request_throughput']:6.1f} req/s  cache hits "
                          f"{s['prefix_cache_hit_pct']:4.1f}%", flush=True)
    finally:
        vllm.close()
    return {"rates": rates, "capacity_rps": capacity, "tools": tools, "runs": runs}


def table(result: dict) -> list[dict]:
    """One row per point, metric and tool other than the lab: medians, ranges, verdict."""
    rows = []
    for label, by_tool in result["runs"].items():
        for metric in METRICS:
            ours = [s[metric] for s in by_tool["lab"]]
            for other in result["tools"][1:]:
                theirs = [s[metric] for s in by_tool[other] if s.get(metric) is not None]
                if not theirs:
                    continue
                a, b = statistics.median(ours), statistics.median(theirs)
                rows.append({"point": label, "metric": metric, "against": other,
                             "lab": a, "lab_range": [min(ours), max(ours)],
                             "other": b, "other_range": [min(theirs), max(theirs)],
                             "diff_pct": (a - b) / b * 100 if b else None,
                             "verdict": verdict(ours, theirs)})
    return rows


def print_table(rows: list[dict]) -> None:
    point = None
    for r in rows:
        if r["point"] != point:
            point = r["point"]
            print(f"\n  {point}")
        (lo1, hi1), (lo2, hi2) = r["lab_range"], r["other_range"]
        diff = f"{r['diff_pct']:+6.1f}%" if r["diff_pct"] is not None else "    n/a"
        print(f"    {r['metric']:<20} lab {r['lab']:8.2f} [{lo1:.2f}-{hi1:.2f}]  "
              f"{r['against']:<16} {r['other']:8.2f} [{lo2:.2f}-{hi2:.2f}]  {diff}  {r['verdict']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrencies")
    ap.add_argument("--poisson-rates", type=int, default=2, help="how many Poisson points")
    ap.add_argument("--num-prompts", type=int, default=96, help="requests per run (the "
                    "profile's workload sets the lengths)")
    ap.add_argument("--rates", default="100,200,300,400,600", help="the ceiling's rates")
    ap.add_argument("--seconds", type=float, default=5.0, help="the ceiling's seconds per rate")
    ap.add_argument("--skip-vllm", action="store_true", help="measure the ceiling only")
    ap.add_argument("--aiperf", type=Path, help="an aiperf executable (own venv) for a third opinion")
    ap.add_argument("--dataset", type=Path, help="a custom JSONL file (prompt, output_tokens on "
                    "every line): both tools send its prompts instead of random ones")
    ap.add_argument("--keep", action="store_true", help="leave a baseline this started running")
    ap.add_argument("--json", type=Path, help="write the runs and the table here")
    args = ap.parse_args(argv)

    print("\nGenerator ceiling against an instant stub server (Poisson arrivals)")
    print(f"{'rate':>8}{'sent':>7}{'achieved req/s':>16}{'p99 send lag ms':>17}{'failed':>8}")
    for r in ceiling([float(x) for x in args.rates.split(",")], args.seconds):
        print(f"{r['rate']:>8.0f}{r['sent']:>7}{r['achieved_rps']:>16.1f}{r['p99_send_lag_ms']:>17.2f}"
              f"{r['failed']:>8}  {'ok' if r['ok'] else 'over the ceiling'}")
    if args.skip_vllm:
        return 0
    if args.aiperf and not args.aiperf.exists():
        print(f"no aiperf at {args.aiperf}: make aiperf-venv makes one (.venv-aiperf/bin/aiperf)")
        return 2

    cfg = without_prefix_caching(load_config(args.config))
    cfg.workload = w = cfg.workload.model_copy(update={
        "num_prompts": args.num_prompts, "warmup": max(cfg.workload.warmup, 4),
        "dataset": str(args.dataset.resolve()) if args.dataset else None})
    if w.dataset:
        prompts, _ = read_dataset(w.dataset)
        if not w.dataset.endswith(".jsonl") or any(r.output_tokens is None for r in prompts):
            print(f"{w.dataset}: the comparison takes a custom JSONL file with output_tokens on "
                  "every line (vllm bench serve reads either every line's or none)")
            return 2
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    shape = (f"the prompts and output lengths of {w.dataset}" if w.dataset else
             f"input {w.input_len}, output {w.output_len} tokens")
    print(f"\nAgreement with vllm bench serve on {cfg.profile}'s baseline instance: {shape}, "
          f"{w.num_prompts} requests per run, "
          f"concurrency {', '.join(map(str, concurrencies))} and {args.poisson_rates} Poisson "
          f"rates, {args.repeats} repeats, tools in turn; median [min-max]")
    key = api_key(cfg, "vllm")  # the instance is measured directly
    with Cluster(cfg) as cluster:
        running = cluster.running()
        before = {r.name for r in running}
        if any(r.extra.get("role") == "baseline" for r in running):
            print(f"{cfg.profile}'s baseline instance is already running, with its own settings; "
                  f"this benchmark starts one without prefix caching (vLLM's random prompts repeat on "
                  f"a small vocabulary, and a repeat is a cache hit). Stop it first: "
                  f"python -m lab_utils cleanup" + (f" --config {args.config}" if args.config else ""))
            return 2
        records = serve(cluster, "baseline")
        started = [r for r in records if r.name not in before]
        try:
            url = next(r.url for r in records if r.extra.get("role") == "baseline")
            assert url is not None  # an instance's record has its URL
            workdir = cfg.results_dir / "bench-loadgen"  # vLLM's and AIPerf's logs
            workdir.mkdir(parents=True, exist_ok=True)
            result = agreement(cfg, url, key, concurrencies, args.poisson_rates, args.repeats,
                               args.aiperf, workdir)
        finally:
            if started and not args.keep:
                print(f"\nstopping what this started: {', '.join(cluster.stop(started))}")
            elif started:
                print(f"\nleft running (--keep): {', '.join(r.name for r in started)}; "
                      f"python -m lab_utils cleanup stops it")
    rows = table(result)
    print_table(rows)
    differ = [r for r in rows if r["verdict"] == "DIFFER"]
    print(f"\n{len(rows) - len(differ)} of {len(rows)} agree"
          + (f"; DIFFER: {', '.join(r['point'] + ' ' + r['metric'] + ' vs ' + r['against'] for r in differ)}"
             if differ else ""))
    if args.json:
        args.json.write_text(json.dumps({"runs": result, "table": rows}, indent=1))
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
