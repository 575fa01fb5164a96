"""What the forecast says a serving cell of notebooks 01, 03 and 04 will take
(`forecast_cell`), for the notebooks' ETAs (`timings`), and what it leaves out until this
machine has measured it (`unmeasured`)."""

from __future__ import annotations

from typing import Any

from lab_utils.config import LabConfig
from lab_utils.forecast.model import loads_of
from lab_utils.forecast.run import architecture_of, with_allreduce
from lab_utils.forecast.timed import calibrate
from lab_utils.forecast.timing import SWITCH_RESTARTS, sweep_seconds, switches_seconds
from lab_utils.notebook.forecasting import TOPOLOGY, allreduce_inputs
from lab_utils.notebook.starts import start_estimate
from lab_utils.results import calibration, load_optional

Found = tuple | None  # what `forecasting.eta_inputs` returns: (inputs, cores, source) or None


def runs_of(w, mixed: bool = False) -> int:
    """Measured runs of `w`'s sweep (or mixed run): a load point's repeats, every point."""
    return len(loads_of(w, mixed=mixed)) * w.repeats

def forecast_cell(cfg: LabConfig, nb: str, kind: str, found: Found, overhead: float,
                  swap: float = 0.0, timed: Any = None) -> float | None:
    """The forecast's seconds for a cell of `kind` in notebook `nb` (`found`: the forecast's
    inputs, `forecasting.eta_inputs`; `overhead`: seconds per run the forecast leaves out;
    `swap`: seconds to put a front door in place); None when it cannot say (no engine
    profile yet, no start measured, a notebook that starts nothing); `timed`: see
    `_split_inputs`."""

    topology = TOPOLOGY.get(nb)
    if topology is None:
        return None
    if kind == "start":
        return _start(cfg, topology)
    if kind == "tp start":  # 04's optional section (`notebook.sharded`)
        return _start(cfg, "tensor-parallel") if cfg.instances("tensor-parallel") else 0.0
    if kind in ("tp sweep", "tp mixed") and not cfg.instances("tensor-parallel"):
        return 0.0
    if found is None:
        return None
    inputs, cores, _ = found
    arch, w = architecture_of(cfg, topology, cores), cfg.workload
    one = w.model_copy(update={"repeats": 1})
    if kind in ("sweep", "mixed", "tp sweep", "tp mixed"):
        if kind.startswith("tp "):
            inputs, arch = _split_inputs(cfg, inputs, cores, timed)
        mixed = kind.endswith("mixed")
        return sweep_seconds(inputs, arch, w, mixed=mixed) + overhead * runs_of(w, mixed)
    if kind == "policies":
        return 2 * (sweep_seconds(inputs, arch, one, mixed=True) + overhead) + SWAPS * swap
    if kind == "front doors":
        lowest = one.model_copy(update={"concurrency": [min(w.concurrency or [1])],
                                        "request_rates": []})
        return 2 * (sweep_seconds(inputs, arch, lowest) + overhead) + SWAPS * swap
    if kind == "switches":
        start = _start(cfg, topology)
        if start is None:
            return None
        return (switches_seconds(inputs, cfg, cores)
                + SWITCH_RESTARTS * (start + 2 * w.repeats * overhead))
    return None

SWAPS = 3  # front doors started by each comparison: one per run, and the configured one back

def unmeasured(cfg: LabConfig, kind: str, timed: Any = None) -> str | None:
    """What the forecast of 04's cell of `kind` leaves out because nothing here measured it
    yet (None: nothing): the first prefill/decode start (its handshake, each pair's
    warm-up), the split model's first start, and its sweeps' all-reduce latency, which only
    timing the split instance shows."""
    started = {s.get("role") for c in calibration.load_all(cfg.results_dir, cfg.profile)
               for s in c.starts}
    if kind == "start" and cfg.instances("disaggregated") and not started & {"prefill", "decode"}:
        return "the first prefill/decode start (its handshake, each pair's warm-up)"
    if kind == "tp start" and cfg.instances("tensor-parallel") and "tp" not in started:
        return "the split model's first start"
    if kind in ("tp sweep", "tp mixed") and cfg.instances("tensor-parallel") and timed is None:
        last = load_optional(cfg, "tp")
        if not (last and last.payload.forecast and last.payload.forecast.timed):
            return "the split model's all-reduce latency (its sweeps)"
    return None

def _split_inputs(cfg: LabConfig, inputs, cores, timed: Any = None):
    """The forecast's inputs for the split model (its all-reduces, `forecasting.
    allreduce_inputs`), calibrated on the split instance's timed requests: `timed` (this
    kernel's, `Served.timed`), else an earlier run's recorded ones; else without the
    all-reduces' latency, which only timing the split instance shows."""
    split = with_allreduce(inputs, allreduce_inputs(cfg))
    arch = architecture_of(cfg, "tensor-parallel", cores)
    if timed is None and (last := load_optional(cfg, "tp")) and last.payload.forecast:
        timed = last.payload.forecast.timed
    if timed is not None:
        split, _ = calibrate(split, arch, timed, cfg.workload.output_len, cfg.workload.seed)
    return split, arch

def _start(cfg: LabConfig, topology: str) -> float | None:
    found = start_estimate(cfg, topology)
    return found[0] if found else None
