"""How the scheduling policy of NIXL's progress threads trades time per token against the
first-token tail, on the rehearsal's disaggregated topology.

`python -m tools.nixl_policies` serves the disaggregated topology of a local
profile once (with `kv_transfer.lower_nixl_threads` off, so nothing but this run touches
the threads, and no progress delay, so they poll without pause as vLLM gets them: the
lab's delay, `kv_transfer.nixl_progress_delay_us`, is compared in `tools.pd_compare`),
finds the two progress threads (`on_node.nixl_threads.spinning`), and for
each policy in turn, for `--rounds` rounds, measures through the proxy with the lab's
load generator and fresh prompts:

- **one at a time**: `--prompts` requests of the workload at concurrency 1 (after its
  warm-up): TTFT median and maximum, how many took over 200 ms, TPOT median;
- **beside a busy decode**: two long requests (`--long-tokens` output tokens) decoding,
  and meanwhile `--short` short requests one after another: their TTFT median and maximum.
  A thread that gets no CPU while the engines are busy holds every new request's KV move
  until the decode has finished the long ones.

The policies: normal priority (as NIXL leaves them), nice 19, nice 19 with the shortest
slice (0.1 ms; the lab's choice for a thread still found busy), and `SCHED_IDLE`. It prints one markdown row per policy
and round (docs/REHEARSAL.md quotes them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from lab_utils import config as labconfig
from lab_utils.cluster import Cluster
from lab_utils.measure.loadgen import RequestSpec, run_point, run_sync
from lab_utils.measure.workload import build_requests, server_tokenizer
from lab_utils.on_node import nixl_threads
from lab_utils.serve.topology import Served, cleanup, serve

# name -> (policy, nice, slice ns; 0: the kernel's default slice)
POLICIES: dict[str, tuple[int, int, int]] = {
    "normal priority": (os.SCHED_OTHER, 0, 0),
    "nice 19": (os.SCHED_OTHER, 19, 0),
    "nice 19, 0.1 ms slice": (os.SCHED_OTHER, nixl_threads.NICE, nixl_threads.SLICE_NS),
    "SCHED_IDLE": (os.SCHED_IDLE, 0, 0),
}
SLOW_MS = 200.0


def _ttfts(records) -> list[float]:
    return sorted(r.ttft_ms for r in records if r.ttft_ms is not None)


async def _beside_busy(url: str, model: str, key: str | None, long: list[RequestSpec],
                       short: list[RequestSpec]):
    """The long requests decoding; one second in, the short ones one after another."""
    async def shorts():
        await asyncio.sleep(1.0)
        return await run_point(url, model, short, concurrency=1, show_progress=False, api_key=key)
    busy = run_point(url, model, long, concurrency=len(long), show_progress=False, api_key=key)
    (long_records, _), (short_records, _) = await asyncio.gather(busy, shorts())
    return long_records, short_records


def measure(cfg: labconfig.LabConfig, served: Served, tokenize, detokenize, seed: int,
            args: argparse.Namespace) -> dict[str, Any]:
    w, key = cfg.workload, labconfig.api_key(cfg, "proxy")
    one = build_requests(w, args.prompts + w.warmup, tokenize, detokenize, seed=seed)
    records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, one, concurrency=1,
                                    warmup=w.warmup, show_progress=False, api_key=key))
    ttft = _ttfts(records)
    tpot = [r.tpot_ms for r in records if r.tpot_ms is not None]
    long = [RequestSpec(s.prompt_ids, args.long_tokens)
            for s in build_requests(w, 2, tokenize, detokenize, seed=seed + 1)]
    short = [RequestSpec(s.prompt_ids, 4)
             for s in build_requests(w, args.short, tokenize, detokenize, seed=seed + 2)]
    long_records, short_records = run_sync(_beside_busy(served.proxy_url, cfg.model.name, key,
                                                        long, short))
    busy = _ttfts(short_records)
    failed = sum(r.error is not None for r in [*records, *long_records, *short_records])
    return {"ttft_p50_ms": statistics.median(ttft) if ttft else None,
            "ttft_max_ms": ttft[-1] if ttft else None,
            "slow": sum(t > SLOW_MS for t in ttft), "n": len(ttft),
            "tpot_ms": statistics.median(tpot) if tpot else None,
            "busy_ttft_p50_ms": statistics.median(busy) if busy else None,
            "busy_ttft_max_ms": busy[-1] if busy else None, "failed": failed,
            "load_avg": round(os.getloadavg()[0], 1)}


def run(config: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    raw = json.loads(config.read_text())
    # the threads as vLLM gets them (busy, normal priority): the policies apply to those
    raw.setdefault("kv_transfer", {}).update(lower_nixl_threads=False, nixl_progress_delay_us=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="nixl-policies-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(raw))
        cfg = labconfig.load_config(path)
        with Cluster(cfg) as cluster:
            try:
                records = serve(cluster, "disaggregated", with_proxy=True, show_progress=False)
                served = Served("disaggregated", records)
                threads = [t for r in records if r.extra.get("role") in ("prefill", "decode")
                           for t in nixl_threads.spinning(r.pgid)]
                if not threads:
                    raise RuntimeError("no NIXL progress thread found in the prefill or decode")
                tokenize, detokenize = server_tokenizer(served.instance_urls()[0], cfg.model.name,
                                                        labconfig.api_key(cfg, "vllm"))
                seed = cfg.workload.seed + 5000
                for rnd in range(args.rounds):
                    for name, (policy, nice, slice_ns) in POLICIES.items():
                        for t in threads:
                            nixl_threads.set_policy(t["tid"], policy, nice, slice_ns)
                        seed += 10  # fresh prompts for every measurement: no prefix cache hit
                        row = {"policy": name, "round": rnd + 1,
                               "threads": [nixl_threads.policy_name(t["tid"]) for t in threads],
                               **measure(cfg, served, tokenize, detokenize, seed, args)}
                        print(markdown_row(row), flush=True)
                        rows.append(row)
            finally:
                cleanup(cluster)
    return rows


HEADER = ("| NIXL threads | round | TTFT p50 ms | TTFT max ms | over 200 ms | TPOT p50 ms "
          "| beside busy decode: TTFT p50 / max ms | failed | load avg |\n"
          "|---|---|---|---|---|---|---|---|---|")


def _f(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown_row(r: dict[str, Any]) -> str:
    return (f"| {r['policy']} | {r['round']} | {_f(r['ttft_p50_ms'], '{:.1f}')} | "
            f"{_f(r['ttft_max_ms'])} | {r['slow']} of {r['n']} | {_f(r['tpot_ms'], '{:.1f}')} | "
            f"{_f(r['busy_ttft_p50_ms'])} / {_f(r['busy_ttft_max_ms'])} | {r['failed']} | "
            f"{r['load_avg']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.nixl_policies",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/local-cpu.json"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=24, help="requests at concurrency 1")
    ap.add_argument("--short", type=int, default=6, help="short requests beside the busy decode")
    ap.add_argument("--long-tokens", type=int, default=600)
    args = ap.parse_args(argv)
    print(HEADER, flush=True)
    rows = run(args.config, args)
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
