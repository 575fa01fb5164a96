"""How long a topology takes to start, for the ETAs: what the calibration records measured
(`startup_seconds`), and for a first run, where a node has not started one yet, the
slowest first start measured on another (`start_estimate`)."""

from __future__ import annotations

from lab_utils.config import LabConfig
from lab_utils.results import calibration
from lab_utils.serve.plan import start_waves


def startup_seconds(cfg: LabConfig, topology: str) -> tuple[float, str]:
    """Predicted seconds to start `topology`'s instances, and where that comes from: per
    start wave (`serve.plan.start_waves`) its slowest instance's next start as its node's
    calibration record measured it (a later start where that role started on the node
    before, else a first start: `Calibration.next_start_s`); the agenda's allowance per
    topology when an instance has no measured start."""
    total, said = 0.0, []
    for wave in start_waves(cfg, cfg.instances(topology)):
        found = [cal.next_start_s(s.role) if (cal := calibration.load(cfg, s.node)) else None
                 for s in wave]
        if not found or any(f is None for f in found):
            return (calibration.STARTUP_ALLOWANCE_S,
                    "the agenda's allowance per topology, not measured yet")
        total += max(f[0] for f in found if f is not None)
        said += [f[1] for f in found if f is not None]
    return total, "; ".join(dict.fromkeys(said))


def start_estimate(cfg: LabConfig, topology: str) -> tuple[float, str] | None:
    """A topology's start for an ETA: `startup_seconds` where every node measured one, else
    the slowest first start measured on any node of the profile (the nodes of a pair are
    alike), saying so; None when no start was measured anywhere."""
    secs, where = startup_seconds(cfg, topology)
    if secs != calibration.STARTUP_ALLOWANCE_S:
        return secs, where
    firsts = [(c.first_start_s, c.node) for c in calibration.load_all(cfg.results_dir, cfg.profile)
              if c.first_start_s is not None]
    if not firsts:
        return None
    secs, node = max(firsts)
    return secs, f"the slowest first start measured, on {node}; not every node has started one"
