"""What a load point measured, as the serving notebooks record it: one request's
measurements (`RequestRecord`, from the load generator `lab_utils.measure.loadgen`), one
load point of one repeat (`BenchmarkPoint`, its figures a `RepeatSummary`) and a sweep
(`BenchmarkResult`), in vLLM's field names (`lab_utils.measure.benchmark` builds them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from lab_utils.results.points import Point


@dataclass
class RequestRecord:
    """One request's measurements (ms) and counts; `error` is None when it succeeded."""

    index: int
    prompt_len: int
    max_tokens: int
    scheduled_s: float = 0.0  # when the schedule said to send, from the point's start
    sent_s: float = -1.0  # when it was sent, same clock (-1: never sent)
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    # tokens that came out of the same socket read as the token before them: their
    # inter-token gap is the client's parsing time, not the server's (see TokenReader)
    read_together: int = 0
    e2el_ms: float | None = None
    tpot_ms: float | None = None
    prompt_tokens: int | None = None  # from the server's usage
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """What this one request measured, in words and ms."""
        if self.error:
            return f"the request failed: {self.error}"
        itl = sorted(self.itl_ms)
        together = (f"; {self.read_together} of them 0 ms: tokens the client read together, late"
                    if self.read_together else "; none read together")
        if self.ttft_ms is None or self.tpot_ms is None or self.e2el_ms is None or not itl:
            return f"prompt {self.prompt_len} tokens: too few tokens came back to time"
        gaps = (self.completion_tokens or len(itl) + 1) - 1
        last = self.ttft_ms + self.tpot_ms * gaps
        return (f"prompt {self.prompt_tokens or self.prompt_len} tokens, {self.completion_tokens} "
                f"generated\n  TTFT {self.ttft_ms:.1f} ms (queue + prefill + first token)\n"
                f"  TPOT {self.tpot_ms:.2f} ms per output token after the first (first to last "
                f"token, {last - self.ttft_ms:.1f} ms, over {gaps} gaps)\n"
                f"  ITL  median {itl[len(itl) // 2]:.2f} ms, max {itl[-1]:.2f} ms "
                f"({len(itl)} gaps{together})\n  end-to-end {self.e2el_ms:.1f} ms (the stream "
                f"closed {self.e2el_ms - last:.1f} ms after its last token)")


class RepeatSummary(BaseModel):
    """What one repeat of one load point measured (`measure.benchmark.summarize`): first
    `vllm bench serve`'s result fields, by its names (ms; throughputs per s), then the
    lab's. Saved as a flat JSON object; fields of other versions are kept as they are."""

    model_config = ConfigDict(extra="allow")

    duration: float = 0.0
    completed: int = 0
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float | None = None
    request_goodput: float | None = None  # None: no SLO configured
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    # the lab's: how far to trust the figures above
    itl_read_together_fraction: float | None = None  # gaps between tokens read together
    p99_send_lag_ms: float | None = None  # how late the load generator sent
    errors: list[str] = []  # the first distinct ones
    failed_fraction: float = 0.0
    valid: bool = True
    invalid_reason: str | None = None
    prefix_cache_hit_pct: float | None = None  # of the prompt tokens, over the instances
    prefix_cache_hit_pct_by_instance: dict[str, float] = {}
    held_up_s: float = 0.0  # the machine stood still this long (`measure.stalls`)
    stalls: int = 0
    # where it belongs: the load point, the run and its prompts' seed, when
    mode: str | None = None
    value: float | None = None
    repeat: int | None = None
    mixed: bool = False
    run: str | None = None
    seed: int | None = None
    date: str | None = None

    def mark_cache_hits(self, pct: float | None, per: dict[str, float],
                        hits_expected: bool = False) -> None:
        """Record the run's prefix-cache hit share; with hits where none were expected,
        mark it invalid and say why."""
        self.prefix_cache_hit_pct, self.prefix_cache_hit_pct_by_instance = pct, per
        if pct and not hits_expected:
            where = ", ".join(f"{k} {v:.1f}%" for k, v in per.items() if v)
            reason = (f"{pct:.1f}% of the prompt tokens were prefix-cache hits ({where}): the "
                      "instances had seen these prompts, so TTFT and throughput are not a "
                      "prefill's; restart the instances or re-run with fresh prompts")
            self.valid = False
            self.invalid_reason = (f"{self.invalid_reason}; {reason}" if self.invalid_reason
                                   else reason)


class BenchmarkPoint(BaseModel):
    """One load point of one repeat."""

    mode: str  # "concurrency" | "rate"
    value: float
    repeat: int
    summary: RepeatSummary
    requests: list[dict[str, Any]]


class SweepCpu(BaseModel):
    """CPU seconds the processes used during a standard sweep, over its wall time, on a
    machine of `host_cores` cores: read from /proc where every instance is local."""

    wall_s: float
    host_cores: int
    by_process: dict[str, float]

    @property
    def cores(self) -> float:
        """Cores in use on average: CPU seconds over wall seconds."""
        return sum(self.by_process.values()) / self.wall_s if self.wall_s else 0.0


class BenchmarkResult(BaseModel):
    """A sweep: the workload, every point, and the per-point combination of repeats."""

    target: str
    model: str
    workload: dict[str, Any]
    points: list[BenchmarkPoint]
    combined: list[Point]
    # the CPU its processes used (None: on nodes reached over SSH, or not recorded)
    cpu: SweepCpu | None = None

    def point_at(self, value: float, mode: str = "concurrency",
                 mixed: bool = False) -> Point | None:
        """The combined point at one load (of the mixed run's points with `mixed`), if any."""
        return next((p for p in self.combined if p.mode == mode and p.value == value
                     and p.mixed == mixed), None)

    def first_tokens(self, value: float, long: int) -> dict[bool, list[list[float]]]:
        """Each repeat's TTFTs (ms) at concurrency `value`: of the prompts of `long` tokens
        or more (True) and of the others (False); failed requests left out."""
        out: dict[bool, list[list[float]]] = {True: [], False: []}
        for p in self.points:
            if p.value != value:
                continue
            ok = [r for r in p.requests if not r.get("error") and r.get("ttft_ms") is not None]
            for kind in (True, False):
                out[kind].append([r["ttft_ms"] for r in ok if (r["prompt_len"] >= long) == kind])
        return out
