"""spark-disagg-lab: the package behind the notebooks.

The notebooks stay thin and call into it; each folder's `__init__` is its front door:

- `lab_utils.config`: the profile, one typed object (`load_config`).
- `lab_utils.cluster`: the machines and what the lab puts on them.
- `lab_utils.on_node`: code that runs on the nodes themselves.
- `lab_utils.serve`: vLLM instances, topologies, the proxy, prefill/decode and its proof.
- `lab_utils.measure`: the load generator, workloads, sweeps, the decode roofline.
- `lab_utils.kv`: KV-cache sizes and the NIXL transfer probe (notebook 02).
- `lab_utils.checks`: the bring-up checklist (notebook 00).
- `lab_utils.results`: the typed results files that chain the notebooks.
- `lab_utils.notebook`: what notebooks 00-04 call, one call per step.
- `lab_utils.report`: the benchmark report (notebook 05).
- `lab_utils.bench`: benchmarks of the lab's own tools.
- `lab_utils.cli`, `lab_utils.runner`: `python -m lab_utils` / `spark-lab`, `make lab`.
"""

from lab_utils.config import LabConfig, load_config

__all__ = ["LabConfig", "load_config"]
