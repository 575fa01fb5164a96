"""Notebook 00's verdict on the environment, and how later notebooks read it.

`record_environment` writes `environment.json` (`payloads.EnvironmentPayload`) with every
check's result, whether the environment is blessed (no check failed) and the GPU the gpu
check saw. With failures it refuses, naming them, unless
the user chose to continue knowingly; that choice is recorded, and the notebooks after
it say so when they start. `require_environment` is their first step.
"""

from __future__ import annotations

from pathlib import Path

from lab_utils.checks.frame import ChecklistReport
from lab_utils.checks.gpu import gpu_name
from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.results import EnvironmentPayload, load_results, write_results


def not_checked(cfg: LabConfig, report: ChecklistReport) -> list[str]:
    """What a verdict on this profile could not establish: the checks that applied on no
    node (n/a everywhere), and serving nodes whose LAN and data-plane addresses are one, where no port
    check can tell the two networks apart."""
    ran = {r.check for r in report.results if r.status != "n/a"}  # somewhere, for real
    na = sorted({r.check for r in report.results if r.status == "n/a"} - ran)
    same = [name for name, n in cfg.nodes.items()
            if "serving" in n.roles and n.lan_address and n.lan_address == n.data_address]
    out = [f"not established here (n/a on this profile): {', '.join(na)}"] if na else []
    if same:
        out.append(f"{', '.join(same)}: LAN and data-plane address are the same, so the port "
                   "checks cannot tell the two networks apart")
    return out


def record_environment(cfg: LabConfig, report: ChecklistReport, *,
                       continue_despite_failures: bool = False) -> Path:
    """Write environment.json; raise if a check failed and the user did not accept it."""
    failures = [f"{r.check} on {r.node}: {r.summary} (fix: {r.fix})"
                for r in report.results if r.status == "fail"]
    payload = EnvironmentPayload(
        blessed=not failures,
        continued_despite_failures=bool(failures) and continue_despite_failures,
        counts=report.counts, checks=report.results, gpu_name=gpu_name(report.results))
    path = write_results(cfg, "00", payload)
    print("verdict: " + ("blessed: no check failed" if not failures else
                         f"NOT blessed: {len(failures)} check(s) failed"
                         + (" (going on knowingly)" if continue_despite_failures else "")))
    for line in not_checked(cfg, report):
        print(f"  {line}")
    if failures and not continue_despite_failures:
        raise LabError(
            f"{len(failures)} check(s) failed, so this environment is not blessed "
            f"({path} records it):\n  - " + "\n  - ".join(failures) + "\nFix them and re-run "
            "the checklist, or set CONTINUE_DESPITE_FAILURES = True to go on knowingly.")
    return path


def require_environment(cfg: LabConfig) -> EnvironmentPayload:
    """The checklist's record; refuses an environment that failed without consent."""
    payload = load_results(cfg, "00").payload
    if payload.blessed:
        return payload
    failed = [f"{c.check} on {c.node}" for c in payload.failed_checks]
    if not payload.continued_despite_failures:
        raise LabError(f"notebook 00 found failures ({', '.join(failed)}); fix them and re-run "
                       "notebooks/00_Environment_Setup.ipynb")
    print(f"NOTE: continuing on an environment with failed checks ({', '.join(failed)}), "
          "as chosen in notebook 00; results may reflect them.")
    return payload
