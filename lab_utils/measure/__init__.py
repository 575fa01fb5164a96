"""Measuring: one ruler for every architecture the lab compares.

- `loadgen`: the load generator (streamed OpenAI completions; TTFT, ITL, TPOT, latency
  per request, the tokens the client read together).
- `workload`: the benchmark's prompts, seeded, with an exact number of tokens.
- `prompts`: prompts of an exact token count from the served model's own tokenizer.
- `benchmark`: a sweep over load points, its summaries in `vllm bench serve`'s field names
  (the records, `RequestRecord` and `BenchmarkResult`, are in `lab_utils.results.sweep`;
  the typed measured point, the metric table and the rule for "this differs" in
  `lab_utils.results.points`).
- `roofline`: decode's memory-bandwidth ceiling per stream (bandwidth, weight bytes).
- `stalls`: waiting in the harness when the machine itself stands still.
"""

from lab_utils.measure import workload
from lab_utils.measure.benchmark import summarize, sweep
from lab_utils.measure.loadgen import RequestSpec, run_point, run_sync

__all__ = ["RequestSpec", "run_point", "run_sync", "summarize", "sweep", "workload"]
