"""The forecast's records: notebook 01's engine profile (`EngineProfile`, measured by
`lab_utils.forecast.profile`: curves of measured `CurvePoint`s), the forecast notebooks 01
(of its own sweep), 03 and 04 make before they measure (`Forecast`, from
`lab_utils.forecast.run`), and its grade at one metric and load (`GradeRow`,
`lab_utils.forecast.grade`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from lab_utils.results.points import KEYS, Measured, MetricKey, differs

Edge = Literal["lo", "median", "hi"]


class CurvePoint(BaseModel):
    """One measured point: x, and the median, smallest and largest y over `n` repeats."""

    model_config = ConfigDict(extra="forbid")

    x: float
    median: float
    lo: float
    hi: float
    n: int

    def at(self, edge: Edge) -> float:
        return {"lo": self.lo, "median": self.median, "hi": self.hi}[edge]

    def measured(self) -> Measured:
        """As the lab's rule reads a value over its repeats."""
        return Measured(median=self.median, min=self.lo, max=self.hi, n=self.n)

    def span(self, unit: str = "ms") -> str:
        """"2.47 ms (2.40-2.61 over 5)": the median and what the rule reads beside it."""
        return (f"{self.median:.2f} {unit}" + (f" ({self.lo:.2f}-{self.hi:.2f} over {self.n})"
                                               if self.n > 1 else " (one run)"))


class DecodeLine(BaseModel):
    """Decode step time against requests decoding together, at one context length."""

    model_config = ConfigDict(extra="forbid")

    context: int  # prompt tokens + the mean position of the measured tokens
    points: list[CurvePoint]


class BesideBusy(BaseModel):
    """01's decode alone and beside stand-ins for the NIXL threads that share the decode's
    machine in P/D (`lab_utils.forecast.beside`)."""

    model_config = ConfigDict(extra="forbid")

    threads: int  # stand-ins, one per NIXL thread there
    policy: str  # theirs, e.g. "SCHED_OTHER nice 19 slice 0.1 ms"
    binds: list[str]  # the CPUs each was pinned to ("-": none)
    alone: CurvePoint  # x: 1 request; ms per decode step
    beside: CurvePoint | None
    ratio: float | None  # beside / alone, medians
    why: str | None = None  # why there is no ratio

    @property
    def differs(self) -> bool:
        """Whether the lab's rule sees a difference between the runs beside and alone (a
        ratio without the runs beside counts as one)."""
        return bool(self.ratio) and (self.beside is None or differs(
            self.beside.measured(), self.alone.measured()))

    @property
    def factor(self) -> float:
        """What the forecasts multiply a decode step by: the ratio where the rule sees a
        difference, else 1 (and never below 1: a step no slower beside them is noise, not a
        faster decode)."""
        return max(self.ratio or 1.0, 1.0) if self.differs else 1.0


class EngineProfile(BaseModel):
    """Notebook 01's profile of its instance (see `lab_utils.forecast.profile`)."""

    model_config = ConfigDict(extra="forbid")

    prefill: list[CurvePoint]  # x: prompt tokens; ms to the first token, direct
    decode: list[DecodeLine]  # x: requests decoding together; ms per step
    hop: CurvePoint  # x: prompt tokens; ms the proxy adds (through it - direct)
    token_budget: int  # vLLM's max_num_batched_tokens for this device (its default)
    device: str
    elapsed_s: float
    active_cores: float | None = None  # cores the instance's processes use while decoding
    host_cores: int | None = None  # cores of the machine it ran on (local instances only)
    # CPU ms the proxy and the load generator spend per streamed token (local only)
    stream_cpu_ms_per_token: CurvePoint | None = None
    beside_busy: BesideBusy | None = None  # the P/D forecast's CPU term
    # the replicated forecast's: beside the other replicas' idle workers, on one machine
    beside_replicas: BesideBusy | None = None


class TimedProfile(BaseModel):
    """The instances of 03 (the replicas) or 04 (the prefill/decode pair), timed a few fresh
    requests one at a time before the sweep (`notebook.time_split.time_instances`): what
    their forecast calibrates on (`forecast.timed`)."""

    model_config = ConfigDict(extra="forbid")

    requests: int  # fresh requests, one at a time, through the proxy
    prompt_tokens: int
    ttft_ms: float  # their median TTFT at the client
    step_ms: float | None  # their median time per decoded token, settled (ms)
    # P/D: the mean TTFT split (prefill, proxy hop, KV move, first decode step); else empty
    parts: dict[str, float] = {}


class Interval(BaseModel):
    """One metric of a forecast: the predicted value and its interval."""

    model_config = ConfigDict(extra="forbid")

    median: float | None = None
    lo: float | None = None
    hi: float | None = None


class ForecastPoint(BaseModel):
    """One load point of a forecast (`forecast.model.Ranged.point`): each metric predicted,
    with its interval (widened by the model's error band: `forecast.band.widen`)."""

    model_config = ConfigDict(extra="forbid")

    workload: str  # "standard" | "mixed"
    mode: str  # "concurrency" | "rate"
    value: float
    load: str  # "concurrency 4"
    architecture: str = ""
    metrics: dict[MetricKey, Interval] = {}
    bottleneck: str | None = None  # the busiest pool
    transfer_ms: float | None = None  # P/D: one median prompt's KV move

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        """Results files written before the point was typed hold each metric flat, its
        interval as `<key>_lo` and `<key>_hi`: they load unchanged."""
        if isinstance(data, dict) and "load" not in data and "mode" in data and "value" in data:
            data = {**data, "load": f"{data['mode']} {float(data['value']):g}"}
        if not isinstance(data, dict) or "metrics" in data:
            return data
        fields = set(cls.model_fields) - {"metrics"}
        return {**{k: v for k, v in data.items() if k in fields},
                "metrics": {k: {"median": data[k], "lo": data.get(f"{k}_lo"),
                                "hi": data.get(f"{k}_hi")} for k in KEYS if k in data}}

    def median(self, key: MetricKey) -> float | None:
        return self.interval(key).median

    def interval(self, key: MetricKey) -> Interval:
        return self.metrics.get(key) or Interval()


class Forecast(BaseModel):
    """A forecast as a notebook records it, before it measures."""

    model_config = ConfigDict(extra="forbid")

    architecture: str  # "baseline" (01's own sweep) | "replicated" | "disaggregated"
    made_at: str
    sources: dict[str, str]
    rows: list[ForecastPoint]
    splits: list[dict[str, Any]] = []
    # the model's own error measured earlier in the series (lab_utils.forecast.band), by
    # which the intervals were widened; None: recorded before the band existed
    error_band: dict[str, Any] | None = None
    # 03 and 04: their instances timed before the sweep, which the forecast calibrated on
    timed: TimedProfile | None = None


@dataclass(frozen=True)
class GradeRow:
    """One forecast metric at one load point against what was measured there."""

    metric: MetricKey
    predicted: float | None
    measured: float | None
    lo: float | None = None  # the forecast's interval
    hi: float | None = None
    architecture: str = ""
    workload: str = "standard"
    load: str = ""
    measured_lo: float | None = None  # the repeats' range (None: one run)
    measured_hi: float | None = None
    differs: bool = False  # by the lab's rule (`points.compare`)
    not_graded: str | None = None  # why it is shown but not graded

    @property
    def graded(self) -> bool:
        return self.not_graded is None

    @property
    def error_pct(self) -> float | None:
        """(predicted - measured) in % of the measurement."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured * 100

    @property
    def inside(self) -> bool:
        """Whether the measurement fell inside the forecast's interval."""
        return (self.lo is not None and self.hi is not None and self.measured is not None
                and self.lo <= self.measured <= self.hi)
