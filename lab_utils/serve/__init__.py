"""Serving: the vLLM instances a topology needs, the lab's proxy in front of them, and
prefill/decode by hand.

- `launcher`: one vLLM instance's command line and environment, started on its node,
  watched until healthy, stopped by process group.
- `plan`: every instance of a topology before it starts: node, command line, environment
  (secrets as set/unset), ports, and the memory budget per node; refused if it does not
  fit (`plan_text` prints it, for `serve --dry-run`); the start order (on a CUDA
  profile, one instance at a time per machine); measured figures where a start left them.
- `startup`: what a start-up log says: the step reached, the figures vLLM measured.
- `calibrate`: after a start, those figures and timings into the node's calibration record.
- `topology`: the sets of instances notebooks 01, 03 and 04 stand up (baseline,
  replicated, disaggregated, and 04's optional tensor-parallel), with the proxy; what is
  running; cleanup; `Served`, a started topology as the notebooks hold it.
- `tp`: the tensor-parallel ranks as one instance (a rank is never left alone), and the
  check that the split model's output is 01's.
- `proxy`: the lab's HTTP front door (replicated and P/D modes), one for every architecture.
- `router`: vLLM's router (`vllm-router`) in the proxy's place, with `proxy.kind`.
- `pd`: prefill then decode by hand, and the proof that the KV cache really moved.
- `metrics`: a vLLM instance's Prometheus `/metrics`, parsed into the lab's counters.
- `demo`: the short end-to-end run behind `python -m lab_utils demo`.

The proxy's web framework (fastapi) is imported only by `serve.proxy`: the notebooks,
the CLI and the nodes' commands load `serve` without it.
"""

from lab_utils.serve.launcher import healthy, start_instance, wait_ready
from lab_utils.serve.plan import Plan, make_plan
from lab_utils.serve.topology import PROXY, Served, cleanup, serve, topology_running, urls
from lab_utils.serve.tp import stop_lone_ranks

# `proxy`, `router` and `demo` are exported as modules but imported only when asked for,
# so that starting an instance does not load the proxy's web stack.
__all__ = ["PROXY", "Plan", "Served", "cleanup", "demo", "healthy", "make_plan", "proxy", "router",
           "serve", "start_instance", "stop_lone_ranks", "topology_running", "urls",
           "wait_ready"]
