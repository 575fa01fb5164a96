"""Notebook 02's records (kv_transfer_metrics.json, `KvTransferPayload`): the NIXL probe's
rows (`ProbeResult`, from `lab_utils.kv.probe`), the predicted against the measured
transfer time per prompt length, the models' KV layouts, and the recommended
kv_buffer_device (`lab_utils.kv.budget` computes them and builds the payload).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict

ROW_KEYS = ("seg_type", "op", "bytes", "blocks", "iterations", "median_us", "p50_us", "p90_us",
            "p99_us", "bandwidth_GBps", "bandwidth_Gbps", "limit_GBps", "limit_kind",
            "fraction_of_limit", "checksum_ok")


@dataclass
class ProbeResult:
    """Rows per memory type, operation and size (keys: ROW_KEYS), and where they came from."""

    rows: list[dict]
    target: str
    initiator: str
    target_address: str
    initiator_address: str
    port: int
    same_machine: bool
    env: dict[str, dict[str, str]]
    notes: list[str] = field(default_factory=list)
    memcpy_GBps: dict[int, float] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    plan: dict = field(default_factory=dict)  # ProbePlan.summary(): what was planned
    # per memory type stopped by its time box: what was not measured, and why
    cut_short: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every transfer's destination matched its source."""
        return all(r["checksum_ok"] for r in self.rows)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def to_frame(self, full: bool = False):
        """The probe's table: per memory, operation and size, the time, the bandwidth and
        its share of the limit. Each size moves as many NIXL descriptors of
        `descriptor_bytes` (one block of one layer, K and V together) as its row says; `full`:
        every raw column."""
        import pandas as pd

        raw = pd.DataFrame(self.rows, columns=list(ROW_KEYS))
        if full or raw.empty:
            return raw
        return pd.DataFrame({
            "memory": raw["seg_type"], "op": raw["op"],
            "size (MiB)": (raw["bytes"] / 2**20).round(3),
            "descriptors": raw["blocks"],
            "median (ms)": (raw["median_us"] / 1e3).round(3),
            "p99 (ms)": (raw["p99_us"] / 1e3).round(3),
            "GB/s": raw["bandwidth_GBps"].round(2),
            "limit (GB/s)": raw["limit_GBps"].round(2),
            "limit is": raw["limit_kind"].map(LIMIT_KINDS).fillna("–"),
            "% of limit": (raw["fraction_of_limit"] * 100).round(1),
            "checksum ok": raw["checksum_ok"]})


# what a probe row's limit was, in words
LIMIT_KINDS = {"memcpy": "a memory copy of that size on this machine (both agents here)",
               "link": "the link rate 00 measured between the nodes"}


class KvRecommendation(BaseModel):
    """The kv_buffer_device notebook 02 recommends, why, and the bandwidths behind it."""

    model_config = ConfigDict(extra="forbid")

    kv_buffer_device: str
    reason: str
    dram_GBps: float | None = None
    vram_GBps: float | None = None


class PredictedTransfer(BaseModel):
    """One prompt length: its KV bytes, the time predicted at the probe's best bandwidth,
    and the probe's measured time for that size (None: not measured)."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int
    kv_bytes: int
    blocks: int
    predicted_ms: float | None
    measured_ms: float | None = None
    p99_ms: float | None = None


class ModelKv(BaseModel):
    """A model's KV layout as notebook 02 records it."""

    model_config = ConfigDict(extra="forbid")

    bytes_per_token: int
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    mla: bool = False


class KvTransferPayload(BaseModel):
    """Notebook 02's results (kv_transfer_metrics.json)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str
    kv_per_token_bytes: int
    block_size: int
    descriptor_bytes: int
    models: dict[str, ModelKv]
    prompt_lengths: list[int]
    predicted_vs_measured: list[PredictedTransfer]
    recommendation: KvRecommendation
    probe: ProbeResult
