"""The environment checklist: every check the lab runs before it serves, on the nodes each
check concerns, with a status (pass / warn / fail / n/a), what it saw and, for warn and
fail, the fix. `run_checks(cfg)` runs them all; `python -m lab_utils check` prints them.

- `frame`: the Context the checks share (nodes, facts gathered once), the runner (a
  check's result, `CheckResult`, is in `lab_utils.results.checklist`).
- `software`: SSH, deployed code, Python and package versions, model, clock, HF token, logs.
- `resources`: memory and disk on every node.
- `gpu`: GPU and driver, the CUDA build of torch and vLLM.
- `rdma`: RDMA devices of the data plane (state, MTU, speed, both rails), link bandwidth.
- `nixl`: a NIXL smoke test with the node's own nixl and UCX, the locked-memory limit.
- `network`: every port the lab will use, tried from the node that will connect.
- `parsers`: pure parsers of what the diagnostic commands print on a DGX Spark.
- `views`: the tables notebook 00 shows.
"""

from __future__ import annotations

from lab_utils.checks import collective, gpu, network, nixl, rdma, resources, software, views
from lab_utils.checks.frame import ChecklistReport, Context, run_checklist
from lab_utils.cluster.nodes import Node
from lab_utils.config import LabConfig

__all__ = ["CHECKS", "ChecklistReport", "Context", "run_checks", "views"]

CHECKS = [software.check_ssh, software.check_code, software.check_python,
          software.check_os_packages, gpu.check_gpu, gpu.check_cuda_build, rdma.check_rdma, nixl.check_nixl, nixl.check_memlock,
          network.check_ports,
          network.check_link, collective.check_collective, software.check_model, resources.check_resources,
          software.check_clock, software.check_hf_token, software.check_logs]


def run_checks(cfg: LabConfig, nodes: dict[str, Node] | None = None,
               show_progress: bool = True) -> ChecklistReport:
    """Run every check; `nodes` replaces the real nodes (tests replay recordings)."""
    return run_checklist(cfg, CHECKS, nodes, show_progress)
