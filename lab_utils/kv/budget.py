"""Notebook 02's arithmetic: how big a prompt's KV cache is, and how long moving it takes.

KV sizes come from `kv` (bytes per token from config.json, whole vLLM blocks per
prompt) for the configured model and two reference models; the probe (`nixl_probe`)
measures transfers of exactly those sizes. "Predicted" is the size divided by the best
bandwidth the probe reached (what a bandwidth-only estimate promises); "measured" is the
probe's median time for that size; the gap is the per-transfer overhead that dominates
short prompts. The recommended `kv_buffer_device` follows `parsers.recommend_kv_buffer_device`.
"""

from __future__ import annotations

import json

from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.kv.shapes import KVShape, kv_shape

# The config.json fields that set the KV layout, as published with each model.
REFERENCE_MODELS = {
    "meta-llama/Llama-3.1-8B": {"hidden_size": 4096, "num_attention_heads": 32,
                                "num_key_value_heads": 8, "num_hidden_layers": 32,
                                "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.1-70B": {"hidden_size": 8192, "num_attention_heads": 64,
                                 "num_key_value_heads": 8, "num_hidden_layers": 80,
                                 "torch_dtype": "bfloat16"},
}



def block_size(cfg: LabConfig) -> int:
    """vLLM's KV block size for this profile (its default when the config leaves it unset)."""
    return cfg.vllm.block_size or (16 if cfg.vllm.device == "cuda" else 128)


def model_hf_config(cfg: LabConfig) -> dict:
    """The configured model's config.json, read on the prefill node where vLLM reads it."""
    from lab_utils.cluster.provision import run_in_model_dir

    name = cfg.topology.disaggregated.prefill[0]
    r = run_in_model_dir(cfg, name, 'print(open(os.path.join(where, "config.json")).read())')
    if not r.ok:
        raise LabError(f"cannot read {cfg.model.name}'s config.json on {name}: "
                       f"{r.why}; run notebook 00 (it fetches the model)")
    return json.loads(r.stdout)


def shapes(cfg: LabConfig, hf_config: dict) -> dict[str, KVShape]:
    """KV layouts of the configured model and the reference models."""
    out = {cfg.model.name: kv_shape(hf_config)}
    out.update({n: kv_shape(c) for n, c in REFERENCE_MODELS.items() if n not in out})
    return out


def prompt_lengths(cfg: LabConfig, longest: int | None = None) -> list[int]:
    """Prompt lengths to study: powers of two from 128 tokens to the longest prompt."""
    top, n, out = longest or cfg.vllm.max_model_len, 128, []
    while n <= top:
        out.append(n)
        n *= 2
    return out


def kv_frame(cfg: LabConfig, kv_shapes: dict[str, KVShape], lengths: list[int]):
    """Per model: the layout, bytes per token, and KV per prompt length (whole blocks)."""
    import pandas as pd

    bs = block_size(cfg)
    rows = []
    for name, s in kv_shapes.items():
        row = {"model": name, "layers": s.layers, "KV heads": "latent" if s.mla else s.kv_heads,
               "head dim": s.head_dim, "bytes/elem": s.dtype_bytes,
               "KiB/token": s.bytes_per_token / 1024}
        row.update({f"{n} tok (MiB)": s.transfer_bytes(n, bs) / 2**20 for n in lengths})
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def probe_sizes(shape: KVShape, lengths: list[int], bs: int) -> list[int]:
    return sorted({shape.transfer_bytes(n, bs) for n in lengths})


def predicted_vs_measured(shape: KVShape, lengths: list[int], bs: int, rows: list[dict],
                          seg_type: str = "DRAM", op: str = "READ") -> list[dict]:
    """One row per prompt length: KV bytes, time at the probe's best bandwidth, measured."""
    mine = [r for r in rows if r["seg_type"] == seg_type and r["op"] == op]
    if not mine:
        return []
    best = max(r["bandwidth_GBps"] for r in mine) * 1e9
    by_size = {r["bytes"]: r for r in mine}
    out = []
    for n in lengths:
        nbytes = shape.transfer_bytes(n, bs)
        measured = by_size.get(nbytes)
        out.append({"prompt_tokens": n, "kv_bytes": nbytes, "blocks": shape.blocks(n, bs),
                    "predicted_ms": nbytes / best * 1e3,
                    "measured_ms": measured["median_us"] / 1e3 if measured else None,
                    "p99_ms": measured["p99_us"] / 1e3 if measured else None})
    return out


def best_bandwidth(rows: list[dict], seg_type: str) -> float | None:
    """The best READ bandwidth (GB/s) the probe reached from this kind of memory."""
    found = [r["bandwidth_GBps"] for r in rows if r["seg_type"] == seg_type and r["op"] == "READ"]
    return max(found) if found else None


def plot_predicted_vs_measured(rows: list[dict], title: str):
    """Predicted vs measured transfer time per prompt length (log-log)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    x = [r["prompt_tokens"] for r in rows]
    ax.plot(x, [r["predicted_ms"] for r in rows], "--", label="predicted (size / best bandwidth)")
    ax.plot(x, [r["measured_ms"] for r in rows], "o-", label="measured (probe median)")
    ax.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="transfer time (ms)",
           title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def descriptor_bytes(shape: KVShape, bs: int) -> int:
    """One NIXL descriptor of vLLM's paged cache: one block of one layer's K (or V)."""
    return bs * shape.head_dim * shape.dtype_bytes * (1 if shape.mla else shape.kv_heads)


def seg_types(cfg: LabConfig) -> tuple[str, ...]:
    return ("DRAM", "VRAM") if cfg.vllm.device == "cuda" else ("DRAM",)


def link_rate(environment: dict) -> float | None:
    """The data-plane rate (Gb/s) the checklist saw reported, if any."""
    for c in environment.get("checks", []):
        if c["check"] == "link" and c.get("data", {}).get("reported_gbps"):
            return c["data"]["reported_gbps"]
    return None


def recommend(cfg: LabConfig, rows: list[dict]) -> dict:
    """The kv_buffer_device for notebook 04, from the measured bandwidths."""
    from lab_utils.checks.parsers import recommend_kv_buffer_device

    dram, vram = best_bandwidth(rows, "DRAM"), best_bandwidth(rows, "VRAM")
    device, reason = recommend_kv_buffer_device(dram, vram, has_gpu=cfg.vllm.device == "cuda")
    return {"kv_buffer_device": device, "reason": reason, "dram_GBps": dram, "vram_GBps": vram}


def payload(cfg: LabConfig, kv_shapes: dict[str, KVShape], lengths: list[int], probe,
            pvm: list[dict], recommendation: dict) -> dict:
    """What kv_transfer_metrics.json holds."""
    shape = kv_shapes[cfg.model.name]
    return {"model": cfg.model.name, "kv_per_token_bytes": shape.bytes_per_token,
            "block_size": block_size(cfg), "descriptor_bytes": descriptor_bytes(shape, block_size(cfg)),
            "models": {n: {"bytes_per_token": s.bytes_per_token, "layers": s.layers,
                           "kv_heads": s.kv_heads, "head_dim": s.head_dim,
                           "dtype_bytes": s.dtype_bytes, "mla": s.mla}
                       for n, s in kv_shapes.items()},
            "prompt_lengths": lengths, "predicted_vs_measured": pvm,
            "recommendation": recommendation, "probe": probe.to_dict()}
