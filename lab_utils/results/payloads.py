"""What each notebook records: one pydantic model per results file's `payload`, with the
JSON names the files have always used, so files written before these models existed load.

- 00 `EnvironmentPayload` (environment.json): the checklist, whether it is blessed, the GPU.
- 01 `BaselinePayload` (baseline_metrics.json): one instance, one request in detail, the
  sweep, the decode roofline, the reference outputs notebook 04 must reproduce, the
  engine profile the forecasts are made from, and its forecast of its own sweep.
- 02 `KvTransferPayload` (kv_transfer_metrics.json): defined with notebook 02's other
  records in `kv_transfer`; `lab_utils.kv.budget` builds it.
- 03 `ReplicatedPayload` (replicated_metrics.json): the sweep, the mixed run, the policy,
  and the forecast made before them.
- 04 `DisaggregatedPayload` (disaggregated_metrics.json): the same, the kv_buffer_device
  and the proof that the KV cache moved.

`PAYLOADS` maps a notebook to its model; `store` writes and loads them. The records they
hold (`checklist`, `sweep`, `forecast`, `kv_transfer`, `proof`) sit beside this module, so
the results import nothing from the code that measures them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lab_utils.results.checklist import CheckResult
from lab_utils.results.forecast import EngineProfile, Forecast
from lab_utils.results.kv_transfer import KvRecommendation, KvTransferPayload
from lab_utils.results.points import (
    COMPARED,
    MARGIN,
    Measured,
    Point,
    compare_points,
    metric_rows,
    pooled,
    rounded,
)
from lab_utils.results.proof import ProofRow
from lab_utils.results.sweep import BenchmarkResult, RequestRecord

__all__ = ["PAYLOADS", "BaselinePayload", "DisaggregatedPayload", "EnvironmentPayload",
           "FrontDoors", "Instance", "KvRecommendation", "KvTransferPayload", "Payload", "Proof", "ProofRow",
           "Reference", "ReplicatedPayload", "Roofline", "Policies", "PrefixTwice", "ServingPayload", "SwitchRun", "Switches"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----- 00 ---------------------------------------------------------------------------------


class EnvironmentPayload(Record):
    """Notebook 00's verdict: every check's result, the tally, whether the environment is
    blessed (no check failed) or the user chose to go on despite failures, and the GPU the
    gpu check saw (None without one)."""

    blessed: bool
    continued_despite_failures: bool
    counts: dict[str, int]
    checks: list[CheckResult]
    gpu_name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _gpu_name_of_older_files(cls, data: Any) -> Any:
        """Files written before `gpu_name` existed: the name the gpu check's summary
        starts with ("NVIDIA GB10, driver ...")."""
        if not isinstance(data, dict) or "gpu_name" in data:
            return data
        checks = data.get("checks")
        if not isinstance(checks, list):
            return data
        gpus = [c for c in checks if isinstance(c, dict) and c.get("check") == "gpu"]
        names = [(c.get("data") or {}).get("name")
                 or (str(c.get("summary")).split(", driver ")[0] if c.get("status") == "pass"
                     else "") for c in gpus]
        found = ", ".join(dict.fromkeys(names)) if names and all(names) else None
        return {**data, "gpu_name": found}

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == "fail"]


# ----- 01, 03, 04 -------------------------------------------------------------------------


class Instance(Record):
    """A process serving the notebook's topology (vLLM instance or the proxy)."""

    name: str
    node: str
    url: str | None
    kind: str
    role: str | None = None
    argv: list[str] | None = None  # its command line (None: written before it was recorded)


class Roofline(Record):
    """Decode's ceiling per stream: memory bandwidth / bytes of weights read per token."""

    memory_bandwidth_GBps: float | None
    bandwidth_source: str = ""
    weight_bytes: int | None
    max_tokens_per_s_per_stream: float | None


class Reference(Record):
    """Prompts (token ids, from a recorded seed) and their greedy output through notebook
    01's single instance: what notebook 04's prefill/decode output must equal."""

    seed: int
    max_tokens: int
    prompts: list[list[int]]
    tokens: list[list[int]]


class Proof(Record):
    """Notebook 04's proof that the KV cache moved: ok when every prompt's did."""

    ok: bool
    prompts: list[ProofRow]

    @property
    def tokens_equal(self) -> int:
        """How many prompts gave the same greedy output as notebook 01."""
        return sum(1 for r in self.prompts if r.tokens_equal)


class ServingPayload(Record):
    """What every serving notebook records: the topology, its processes, the sweep, and
    the mixed long/short run (None where it was not measured)."""

    topology: str
    instances: list[Instance]
    sweep: BenchmarkResult
    mixed: BenchmarkResult | None = None


class SwitchRun(Record):
    """One setting of the chunked-prefill switch: the mixed run's highest-concurrency point
    on the baseline instance restarted with it, and the median first token of the long
    prompts and of the others."""

    suffix: str  # the restarted instance's name suffix, and the run's name in claims
    label: str
    budget: int | None  # tokens one step may carry (None: not known)
    point: Point
    long_ttft_ms: float | None  # the median over every repeat's requests of that kind
    other_ttft_ms: float | None
    # each repeat's median, for the rule's ranges (None in files written before they were kept)
    long_ttft: Measured | None = None
    other_ttft: Measured | None = None

    def first_token(self, long: bool) -> Measured | None:
        """The long (or the other) prompts' median first token over the repeats, as the
        rule reads it: each repeat's median where they were kept, else the pooled median
        as one value."""
        kept = self.long_ttft if long else self.other_ttft
        return kept or Measured.one(self.long_ttft_ms if long else self.other_ttft_ms)


class PrefixTwice(Record):
    """One fresh long prompt sent twice, one at a time: TTFT and prefix-cache hits each time."""

    prompt_tokens: int
    first_ttft_ms: float | None
    second_ttft_ms: float | None
    first_hits_pct: float | None
    second_hits_pct: float | None
    instance: str | None = None


class Switches(Record):
    """Notebook 01's two switches (`notebook.switches`)."""

    chunked_prefill: list[SwitchRun]
    prefix_caching: PrefixTwice | None = None


class BaselinePayload(ServingPayload):
    """Notebook 01 (baseline_metrics.json)."""

    single_request: RequestRecord | None
    roofline: Roofline | None
    reference: Reference | None
    profile: EngineProfile | None = None  # the curves 03's and 04's forecasts are made from
    forecast: Forecast | None = None  # of its own sweep from its profile: the model's error
    switches: Switches | None = None  # the two switches, when their section ran


class Policies(Record):
    """03's routing policies side by side: the mixed workload once at its highest
    concurrency through the lab proxy with each policy (`notebook.compare.compare_policies`)."""

    runs: dict[str, Point]  # policy -> its point


class ReplicatedPayload(ServingPayload):
    """Notebook 03 (replicated_metrics.json)."""

    policy: str
    policies: Policies | None = None  # the routing policies compared, when that cell ran
    forecast: Forecast | None = None  # made before the sweep, from 01 and 02 only


class FrontDoors(Record):
    """Notebook 04's optional section: one sweep point through the lab's proxy, then
    through vllm-router, in front of the same instances, back to back."""

    point: str  # e.g. "concurrency 1"
    lab: BenchmarkResult
    vllm_router: BenchmarkResult
    router_version: str

    def frame(self, sweep: BenchmarkResult | None = None):
        """One row per metric (`points.metric_rows`, by vLLM's name), the lab proxy and
        vllm-router side by side, with the margin (vllm-router's value against the lab
        proxy's as a ratio: "1.3x lower") and the better one by the lab's rule ("=" when
        they do not differ or their prefix-cache hit shares differ, "invalid" when either
        run is); then validity and the hit shares. With `sweep` (04's sweep, which measured
        the same point through the lab proxy earlier), that run is shown too, and the lab
        proxy is judged by both its runs (`points.pooled`): vllm-router's one run must stand
        beyond the margin from the range the lab proxy's runs span (this one and every
        repeat of the sweep's point)."""
        import pandas as pd

        a, b = self.lab.combined[0], self.vllm_router.combined[0]
        router = f"vllm-router {self.router_version}"
        rows: list[dict[str, Any]] = metric_rows(a, b, ("lab proxy", router), mark_invalid=True)
        again = next((p for p in (sweep.combined if sweep else []) if p.load == a.load), None)
        if again is not None:  # the lab proxy measured twice: judged by both runs' range
            both = pooled([a, again])
            for row, m in zip(rows, COMPARED, strict=True):  # metric_rows: one row per COMPARED
                row["lab proxy, in the sweep"] = rounded(again.median(m))
                if not row["better"].startswith("=") and row["better"] != "invalid":
                    span = both.of(m.key)
                    runs = (f", {m.text(span.min, unit=False)}-{m.text(span.max, unit=False)}"
                            if span is not None else "")
                    row["better"] = {"a": "lab proxy", "b": router}.get(
                        compare_points(both, b, m).better or "",
                        f"= (within {MARGIN:.0%} of the range of the lab proxy's runs here and in "
                        f"the sweep{runs})")
        rows.append({"metric": "valid", "lab proxy": a.valid, router: b.valid})
        rows.append({"metric": "prefix-cache hits %", "lab proxy": a.prefix_cache_hit_pct,
                     router: b.prefix_cache_hit_pct})
        return pd.DataFrame(rows).round(2)


class DisaggregatedPayload(ServingPayload):
    """Notebook 04 (disaggregated_metrics.json)."""

    kv_buffer_device: str
    proof: Proof | None = None
    front_doors: FrontDoors | None = None
    forecast: Forecast | None = None  # made before the sweep, from 01 and 02 only


class SameOutputRow(Record):
    """One reference prompt through the split model: its greedy tokens against notebook
    01's single instance, and the verdict (`serve.tp.prove_same_output`)."""

    prompt_tokens: int
    tokens_equal: bool
    tokens_ok: bool
    diverged_at: int | None = None
    divergence_margin: float | None = None  # the split model's chosen minus 01's token, nats
    tokens_why: str = ""


class CollectiveRow(Record):
    """How one rank's all-reduces travelled, read from its log (`serve.startup.collective`):
    backend "nccl" or "gloo", net "IB" (RDMA, RoCE included), "Socket" (NCCL's TCP
    fall-back) or "TCP" (Gloo); None where the log does not say."""

    rank: int
    node: str
    backend: str | None = None
    net: str | None = None
    devices: list[str] = Field(default_factory=list)
    line: str | None = None

    @property
    def said(self) -> str:
        if self.backend is None:
            return f"rank {self.rank} ({self.node}): its log does not say"
        how = {"IB": "RDMA (NCCL's IB transport)", "Socket": "TCP sockets (NCCL's fall-back)",
               "TCP": "TCP (Gloo, the CPU build's collectives)"}.get(self.net or "", "not logged")
        on = f" on {', '.join(self.devices)}" if self.devices else ""
        return f"rank {self.rank} ({self.node}): {self.backend.upper()}, {how}{on}"


def fell_back(rows: list[CollectiveRow]) -> list[CollectiveRow]:
    """The ranks whose NCCL ran over sockets, not the RDMA link the forecast was fed."""
    return [r for r in rows if r.backend == "nccl" and r.net == "Socket"]


def collective_said(rows: list[CollectiveRow]) -> str:
    """One sentence: each rank's collectives, and what a fall-back to sockets means here."""
    if not rows:
        return "The ranks' all-reduces: not read (no rank's log)."
    text = "The ranks' all-reduces, from their logs: " + "; ".join(r.said for r in rows) + "."
    if fell_back(rows):
        text += (" NCCL fell back to sockets: this run's split model is not graded against "
                 "the forecast, which was fed the RDMA link's rate (00's link check). Check "
                 "data_netdev and the checklist's collective and rdma checks.")
    return text


class TensorParallelPayload(ServingPayload):
    """Notebook 04's optional section (tensor_parallel_metrics.json): one model split over
    `ranks` nodes, its output against 01's, measured as the other topologies are."""

    ranks: int
    same_output: list[SameOutputRow]
    forecast: Forecast | None = None  # made before the sweep, from 00, 01 and its timed requests
    collective: list[CollectiveRow] = Field(default_factory=list)  # per rank, from its log

    @property
    def output_ok(self) -> bool:
        return bool(self.same_output) and all(r.tokens_ok for r in self.same_output)

    @property
    def not_graded(self) -> str | None:
        """Why the forecast is not graded against this run: NCCL fell back to sockets, and
        the forecast was fed the RDMA link's rate (grading it would blame the model for the
        transport). None: it is graded."""
        return not_graded(self.collective)


def not_graded(rows: list[CollectiveRow]) -> str | None:
    """See `TensorParallelPayload.not_graded`."""
    gone = fell_back(rows)
    return (f"NCCL fell back to sockets on rank {', '.join(str(r.rank) for r in gone)}, and "
            "the forecast was fed the RDMA link's rate (00's link check)") if gone else None


Payload = (EnvironmentPayload | BaselinePayload | KvTransferPayload | ReplicatedPayload
           | DisaggregatedPayload | TensorParallelPayload)

PAYLOADS: dict[str, type[BaseModel]] = {
    "00": EnvironmentPayload,
    "01": BaselinePayload,
    "02": KvTransferPayload,
    "03": ReplicatedPayload,
    "04": DisaggregatedPayload,
    "tp": TensorParallelPayload,
}
