"""Benchmarks of the lab's own tools, run as modules, printing figures (not tests).

- `proxy`: what the lab proxy adds per request, against the direct path
  (`python -m lab_utils.bench.proxy`).
- `loadgen`: the load generator's own ceiling, and its agreement with `vllm bench serve`
  (`python -m lab_utils.bench.loadgen`).
- `pd_stall`: the rehearsal's disaggregated topology under one config change at a time,
  and the KV hold that once stood the machine still (`python -m lab_utils.bench.pd_stall`).
- `stub_server`: a deterministic stand-in for a vLLM server, for these benchmarks and tests.
"""
