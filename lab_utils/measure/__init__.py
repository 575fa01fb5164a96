"""Measuring: one ruler for every architecture the lab compares.

- `loadgen`: the load generator (streamed OpenAI completions; TTFT, ITL, TPOT, latency
  per request, the tokens the client read together).
- `workload`: the benchmark's prompts, seeded, with an exact number of tokens.
- `prompts`: prompts of an exact token count from the served model's own tokenizer.
- `benchmark`: a sweep over load points, its summaries in `vllm bench serve`'s field names
  (`BenchmarkResult`).
- `points`: the typed measured point (`Point`, one `Measured` per metric), the metric
  table (`METRICS`) and the one rule for "this differs" (`compare`, `differs`).
- `roofline`: decode's memory-bandwidth ceiling per stream (bandwidth, weight bytes).
- `stalls`: waiting in the harness when the machine itself stands still.
"""

from lab_utils.measure import points, workload
from lab_utils.measure.benchmark import BenchmarkResult, summarize, sweep
from lab_utils.measure.loadgen import RequestRecord, RequestSpec, run_point, run_sync
from lab_utils.measure.points import Measured, Point

__all__ = ["BenchmarkResult", "Measured", "Point", "RequestRecord", "RequestSpec", "run_point",
           "run_sync", "points", "summarize", "sweep", "workload"]
