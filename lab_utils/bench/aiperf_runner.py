"""NVIDIA's AIPerf as a third opinion beside the lab's generator and `vllm bench serve`.

AIPerf lives in a venv of its own (`make aiperf-venv`: it pins its own aiohttp and pulls
pandas, transformers and plotting libraries the lab does not want). It runs with the
model's local tokenizer (no download), synthetic prompts of exactly the workload's input length,
and the output length fixed with `ignore_eos`; token counts come from the server's usage
(re-tokenizing streamed text miscounts a token cut mid-character).

How its figures map onto `vllm bench serve`'s names: TTFT p50 is `median_ttft_ms`; its
"inter token latency" is per request (end-to-end - TTFT) / (output tokens - 1), which
is TPOT; its "inter chunk latency" (the gaps between streamed events) is ITL. Unlike vLLM's
benchmark and the lab's generator, AIPerf waits for an event with text: a first token that
ends mid-character (empty text) is not its first token.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

OUT_FILE = "profile_export_aiperf.json"
# lab / vllm bench serve name -> (AIPerf metric, statistic)
FIELDS = {"median_ttft_ms": ("time_to_first_token", "p50"),
          "median_tpot_ms": ("inter_token_latency", "p50"),
          "median_itl_ms": ("inter_chunk_latency", "p50"),
          "output_throughput": ("output_token_throughput", "avg"),
          "request_throughput": ("request_throughput", "avg")}


def argv(aiperf: Path, url: str, model: str, tokenizer: str, input_len: int, output_len: int,
         n: int, warmup: int, point: tuple[str, float], seed: int, api_key: str | None,
         out: Path) -> list[str]:
    kind, value = point
    load = (["--concurrency", str(int(value))] if kind == "concurrency"
            else ["--request-rate", str(value), "--arrival-pattern", "poisson"])
    return [str(Path(aiperf).resolve()), "profile", "--model", model, "--tokenizer", str(Path(tokenizer).resolve()),
            "--url", url, "--endpoint-type", "completions", "--streaming",
            "--synthetic-input-tokens-mean", str(input_len), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(output_len), "--output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--no-auto-plot",
            *load, "--request-count", str(n), "--warmup-request-count", str(warmup),
            "--num-dataset-entries", str(n + warmup), "--random-seed", str(seed),
            *(["--api-key", api_key] if api_key else []),
            "--artifact-dir", str(out)]


def summary(export: dict) -> dict:
    """The AIPerf export's figures under the lab's names (ms, tokens/s, requests/s)."""
    out = {}
    for ours, (metric, stat) in FIELDS.items():
        m = export.get(metric)
        out[ours] = float(m[stat]) if isinstance(m, dict) and m.get(stat) is not None else None
    return out


def run(aiperf: Path, url: str, cfg, n: int, point: tuple[str, float], seed: int,
        api_key: str | None, out: Path) -> dict:
    w = cfg.workload
    out.mkdir(parents=True, exist_ok=True)
    cmd = argv(aiperf, url, cfg.model.name, cfg.model_path, w.input_len, w.output_len, n, w.warmup,
               point, seed, api_key, out)
    # a local tokenizer directory loads without the hub; HF_HUB_OFFLINE made 0.13.0 take
    # the path for a hub repository name and fail
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=out)
    export = out / OUT_FILE
    if p.returncode != 0 or not export.exists():
        raise RuntimeError(f"aiperf failed (exit {p.returncode}); its log: {out / 'logs'}\n"
                           f"{(p.stderr or p.stdout)[-2000:]}")
    return summary(json.loads(export.read_text()))
