"""Benchmarks of the lab's own tools, run as modules, printing figures (not tests).

- `proxy`: what the lab proxy adds per request, against the direct path
  (`python -m lab_utils.bench.proxy`).
- `loadgen`: the load generator's own ceiling, and its agreement with `vllm bench serve`
  (`python -m lab_utils.bench.loadgen`).
- `stub_server`: a deterministic stand-in for a vLLM server, for these benchmarks and tests.

Investigations that answered one question about the rehearsal live in `tools/`, outside
the package.
"""
