"""Notebook 02's arithmetic: how big a prompt's KV cache is, and how long moving it takes.

KV sizes come from `kv` (bytes per token from config.json, whole vLLM blocks per
prompt) for the configured model and two reference models; the probe (`kv.probe`)
measures transfers of exactly those sizes. "Predicted" is the size divided by the best
bandwidth the probe reached (what a bandwidth-only estimate promises); "measured" is the
probe's median time for that size; the gap is the per-transfer overhead that dominates
short prompts. The recommended `kv_buffer_device` follows `recommend_kv_buffer_device`;
`choose_buffer_device` turns the configured value ("auto" included) and that recommendation
into the device notebook 04's instances use (`kv_buffer_device`: with 02's recorded one). `KvTransferPayload` is what notebook 02 records
(kv_transfer_metrics.json); `payload` builds it from what the notebook measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from lab_utils.cluster.provision import run_in_model_dir
from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.kv.probe import ProbePlan, expected_rates, plan_probe
from lab_utils.kv.shapes import PUBLISHED_CONFIGS, KVShape, kv_shape
from lab_utils.results import load_optional
from lab_utils.results.kv_transfer import (
    KvRecommendation,
    KvTransferPayload,
    ModelKv,
    PredictedTransfer,
    ProbeResult,
)
from lab_utils.util.numbers import label_log_axis, titled

FALLBACK_BUFFER_DEVICE = "cpu"  # kv_buffer_device "auto" before notebook 02 has measured


def choose_buffer_device(cfg: LabConfig, recommendation: KvRecommendation | None) -> str:
    """The configured kv_buffer_device; for "auto", notebook 02's recommendation (measured
    on this profile) when there is one, else "cpu"."""
    if cfg.kv_transfer.kv_buffer_device != "auto":
        return cfg.kv_transfer.kv_buffer_device
    return recommendation.kv_buffer_device if recommendation else FALLBACK_BUFFER_DEVICE


def kv_buffer_device(cfg: LabConfig) -> str:
    """The kv_buffer_device prefill and decode instances get: the configured one, or for
    "auto" notebook 02's recommendation on this profile (else "cpu")."""
    kv = load_optional(cfg, "02") if cfg.kv_transfer.kv_buffer_device == "auto" else None
    return choose_buffer_device(cfg, kv.payload.recommendation if kv else None)


# Notebook 02's reference models, beside the configured one.
REFERENCE_MODELS = {name: PUBLISHED_CONFIGS[name]
                    for name in ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B")}


def block_size(cfg: LabConfig) -> int:
    """vLLM's KV block size for this profile (its default when the config leaves it unset)."""
    return cfg.vllm.block_size or (16 if cfg.vllm.device == "cuda" else 128)


def model_hf_config(cfg: LabConfig) -> dict:
    """The configured model's config.json, read on the prefill node where vLLM reads it."""

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
    top = longest or cfg.vllm.max_model_len
    return [128 << i for i in range((top // 128).bit_length())]


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


PROBE_TIMEOUT_S = 300.0  # notebook 02's limit for the whole probe (both memory types)


def probe_plan(cfg: LabConfig, sizes: list[int], *,
               timeout_s: float = PROBE_TIMEOUT_S) -> ProbePlan:
    """The probe run for these sizes that fits `timeout_s` at this profile's expected
    rates (`kv.probe.plan_probe`; measured ones where an earlier probe measured them,
    `kv.probe.expected_rates`); `describe()` says what it moves and how long that takes."""
    rates, basis = expected_rates(cfg)
    return plan_probe(sizes, seg_types=seg_types(cfg), rates_GBps=rates, rate_basis=basis,
                      timeout_s=timeout_s)


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


def pvm_frame(rows: list[dict]):
    """`predicted_vs_measured` as 02 shows it: sizes in MiB, times in ms to the microsecond,
    and measured / predicted."""
    import pandas as pd

    return pd.DataFrame([{
        "prompt tokens": r["prompt_tokens"], "blocks": r["blocks"],
        "KV (MiB)": round(r["kv_bytes"] / 2**20, 3),
        "predicted ms": round(r["predicted_ms"], 3),
        "measured ms": None if r["measured_ms"] is None else round(r["measured_ms"], 3),
        "p99 ms": None if r["p99_ms"] is None else round(r["p99_ms"], 3),
        "measured / predicted": (None if not r["measured_ms"] or not r["predicted_ms"]
                                 else round(r["measured_ms"] / r["predicted_ms"], 2))}
        for r in rows])


def best_bandwidth(rows: list[dict], seg_type: str) -> float | None:
    """The best READ bandwidth (GB/s) the probe reached from this kind of memory."""
    found = [r["bandwidth_GBps"] for r in rows if r["seg_type"] == seg_type and r["op"] == "READ"]
    return max(found) if found else None


def plot_predicted_vs_measured(rows: list[dict], title: str, device: str | None = None):
    """Predicted vs measured transfer time per prompt length (log-log; `device`: the
    profile's, named in the title on the CPU rehearsal)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    x = [r["prompt_tokens"] for r in rows]
    ax.plot(x, [r["predicted_ms"] for r in rows], "--", label="predicted (size / best bandwidth)")
    ax.plot(x, [r["measured_ms"] for r in rows], "o-", label="measured (probe median)")
    ax.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="transfer time (ms)",
           title=titled(title, device))
    # ticks at the prompt lengths themselves: a log axis' own minor labels run together
    ax.set_xticks(x, [f"{v:,}" for v in x])
    ax.xaxis.set_minor_formatter(NullFormatter())
    label_log_axis(ax.yaxis)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def descriptor_bytes(shape: KVShape, bs: int) -> int:
    """One NIXL descriptor of vLLM's paged cache: one block of one layer, K and V together.

    vLLM 0.32's attention layers keep a layer's cache as [num_blocks, kv_heads, block_size,
    2 x head_dim] (K and V packed in the last dimension, FlashAttention's documented layout)
    and its NixlConnector registers each layer as one region whose descriptor is one page
    (`page_size_bytes` of the layer's KV spec: kv_heads x block_size x (K + V head dims) x
    dtype bytes). An MLA layer stores one latent per token instead."""
    return bs * shape.bytes_per_token // shape.layers


def seg_types(cfg: LabConfig) -> tuple[str, ...]:
    return ("DRAM", "VRAM") if cfg.vllm.device == "cuda" else ("DRAM",)


def rails(cfg: LabConfig) -> int:
    """Rails the probe's path uses: the devices in `data_netdev` (comma-separated), the
    fewer of its two ends; 1 when a node names none."""
    def count(name: str) -> int:
        netdev = cfg.nodes[name].data_netdev
        return max(1, len([d for d in (netdev or "").split(",") if d.strip()]))

    return min(count(name) for name in cfg.probe_pair())


def link_rate(checks: Iterable[Any], cfg: LabConfig | None = None) -> float | None:
    """The data-plane rate (Gb/s) the probe is held to, if the checklist's link check ran
    (`checks`: notebook 00's check results): what ib_write_bw moved over every configured
    rail at once (UCX stripes a transfer over every device in UCX_NET_DEVICES), scaled to
    the rails the probe's path uses (`rails`, with `cfg`).

    Results of a link check that timed one rail only hold that rail's ceiling: the lower of
    one PCIe Gen5 x4 half's ~100 Gb/s and the device's reported rate (the reported rate
    alone would double the limit where a half reports the port's 200 Gb/s), times the
    rails."""
    for d in (c.data for c in checks if c.check == "link"):
        if d.get("rails") and d.get("measured_gbps"):
            return d["measured_gbps"] / d["rails"] * (rails(cfg) if cfg is not None else d["rails"])
        if d.get("reported_gbps"):
            per_rail = d.get("ceiling_gbps") or d["reported_gbps"]
            return per_rail * (rails(cfg) if cfg is not None else 1)
    return None


def recommend(cfg: LabConfig, rows: list[dict]) -> KvRecommendation:
    """The kv_buffer_device for notebook 04, from the measured bandwidths."""
    dram, vram = best_bandwidth(rows, "DRAM"), best_bandwidth(rows, "VRAM")
    device, reason = recommend_kv_buffer_device(dram, vram, has_gpu=cfg.vllm.device == "cuda")
    return KvRecommendation(kv_buffer_device=device, reason=reason, dram_GBps=dram,
                            vram_GBps=vram)


def payload(cfg: LabConfig, kv_shapes: dict[str, KVShape], lengths: list[int],
            probe: ProbeResult, pvm: list[dict],
            recommendation: KvRecommendation) -> KvTransferPayload:
    """What kv_transfer_metrics.json holds, from what notebook 02 measured."""
    shape = kv_shapes[cfg.model.name]
    bs = block_size(cfg)
    return KvTransferPayload(
        model=cfg.model.name, kv_per_token_bytes=shape.bytes_per_token, block_size=bs,
        descriptor_bytes=descriptor_bytes(shape, bs),
        models={n: ModelKv(bytes_per_token=s.bytes_per_token, layers=s.layers,
                           kv_heads=s.kv_heads, head_dim=s.head_dim, dtype_bytes=s.dtype_bytes,
                           mla=s.mla) for n, s in kv_shapes.items()},
        prompt_lengths=lengths,
        predicted_vs_measured=[PredictedTransfer.model_validate(r) for r in pvm],
        recommendation=recommendation, probe=probe.to_dict())


KV_BUFFER_VRAM_RATIO = 0.8  # "cuda" only when VRAM moves at least this share of DRAM's rate


def recommend_kv_buffer_device(
    dram_GBps: float | None, vram_GBps: float | None, *, has_gpu: bool
) -> tuple[str, str]:
    """`kv_buffer_device` for vLLM's NixlConnector ("cpu" or "cuda") and a one-sentence
    reason quoting the measured nixlbench bandwidths (GB/s).

    "cuda" only when VRAM-to-VRAM transfers reach at least KV_BUFFER_VRAM_RATIO of the
    DRAM-to-DRAM rate: NIXL then reads the KV cache where vLLM keeps it, without a staging
    copy to host memory. Without a GPU, or without both measurements, the answer is "cpu".
    On a GB10 pair (no GPUDirect RDMA) VRAM moves ~0.4-0.6 GB/s against 11-13 GB/s.
    """
    if not has_gpu:
        return "cpu", "This node has no GPU, so the KV buffer can only live in host memory."
    if vram_GBps is None:
        dram = f" (DRAM {dram_GBps:.2f} GB/s)" if dram_GBps is not None else ""
        return "cpu", (
            f"VRAM transfer bandwidth was not measured{dram}, so keep the KV buffer in host "
            "memory, which works with or without GPUDirect RDMA."
        )
    if dram_GBps is None or dram_GBps <= 0:
        return "cpu", (
            f"DRAM transfer bandwidth was not measured (VRAM {vram_GBps:.2f} GB/s), so there "
            "is nothing to compare with and the host-memory KV buffer stays the safe choice."
        )
    pct = 100 * vram_GBps / dram_GBps
    if vram_GBps >= KV_BUFFER_VRAM_RATIO * dram_GBps:
        return "cuda", (
            f"NIXL moved {vram_GBps:.2f} GB/s from VRAM and {dram_GBps:.2f} GB/s from DRAM "
            f"({pct:.0f}%), so a CUDA KV buffer saves the staging copy through host memory."
        )
    return "cpu", (
        f"NIXL moved only {vram_GBps:.2f} GB/s from VRAM against {dram_GBps:.2f} GB/s from "
        f"DRAM ({pct:.0f}%), so staging the KV cache through host memory is faster here."
    )
