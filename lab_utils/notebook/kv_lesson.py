"""Notebook 02's explanation of the KV cache, in the configured model's own figures.

From the model's config.json (the one vLLM reads): how grouped-query attention shrinks its
cache, its bytes per token, and the worked example of the transfer budget: a prompt's KV
and how long NIXL takes to move it at the rates recorded between two GB10 Sparks
(`forecast.inputs.GB10_NIXL_US`, nixlbench's largest single-rail size per memory type).
"""

from __future__ import annotations

from lab_utils.config import LabConfig
from lab_utils.forecast.inputs import GB10_NIXL_US
from lab_utils.kv.budget import block_size
from lab_utils.kv.shapes import kv_shape


def recorded_GBps(seg: str) -> float:
    """NIXL's rate between two Sparks at nixlbench's largest recorded size (GB/s)."""
    nbytes, us = GB10_NIXL_US[seg][-1]
    return nbytes / us / 1e3


def _duration(seconds: float) -> str:
    ms = seconds * 1e3
    return f"~{ms:.2g} ms" if ms < 10 else f"~{ms:.0f} ms" if ms < 1000 else f"~{seconds:.1f} s"


def explain_kv(cfg: LabConfig, hf_config: dict, tokens: int = 2048) -> str:
    """Two paragraphs for the configured model: its attention layout and bytes per token,
    then what a `tokens`-token prompt's KV weighs and takes to move between two Sparks."""
    c = hf_config.get("text_config", hf_config)
    shape = kv_shape(hf_config, None if cfg.model.dtype == "auto" else cfg.model.dtype)
    name, per = cfg.model.name, shape.bytes_per_token
    if shape.mla:
        layout = (f"{name} uses multi-head latent attention: one latent of {shape.head_dim} "
                  f"numbers per token and layer, shared by all heads. Per token: "
                  f"{shape.layers} layers x {shape.head_dim} x {shape.dtype_bytes} bytes")
    else:
        heads = c["num_attention_heads"]
        group = heads // shape.kv_heads
        gqa = (f"its {heads} query heads share {shape.kv_heads} KV heads ({group} per KV head), "
               f"so its cache is {group} times smaller than with one KV head per query head"
               if group > 1 else f"each of its {heads} query heads has its own KV head (no GQA)")
        layout = (f"{name}: {gqa}. Per token: 2 (K and V) x {shape.layers} layers x "
                  f"{shape.kv_heads} KV heads x {shape.head_dim} x {shape.dtype_bytes} bytes")
    layout += f" = {per:,} bytes ({per / 1024:g} KiB)."
    bs = block_size(cfg)
    size = shape.transfer_bytes(tokens, bs)
    dram, vram = recorded_GBps("DRAM"), recorded_GBps("VRAM")
    blocks = shape.blocks(tokens, bs)
    budget = (f"Worked example: a {tokens:,}-token prompt of {name} fills {blocks:,} blocks of "
              f"{bs} tokens: {blocks * bs:,} x {per / 1024:g} KiB = {size / 2**20:,.1f} MiB of "
              f"KV; at "
              f"the ~{dram:.1f} GB/s NIXL reached between two Sparks from DRAM (recorded "
              f"nixlbench, one rail) that is {_duration(size / (dram * 1e9))}, at the "
              f"~{vram:.2f} GB/s recorded from VRAM {_duration(size / (vram * 1e9))}.")
    return f"{layout}\n\n{budget}"
