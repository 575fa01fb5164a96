"""How long a sweep will take, predicted by the forecast model: printed as an ETA before
each sweep, and summed per notebook to size a workshop.

A sweep's time is, for every load point and repeat, the warm-up requests (sent one at a
time) plus the measured requests at the predicted request rate. The inputs are 01's
engine profile when it exists (the same inputs as 03's and 04's forecasts); before 01 has
run on a GPU profile, the published GB10 figures.
"""

from __future__ import annotations

from dataclasses import replace

from lab_utils.config import LabConfig, WorkloadConfig
from lab_utils.forecast.model import Architecture, Inputs, forecast, loads_of
from lab_utils.forecast.run import architecture_of


def sweep_seconds(inputs: Inputs, arch: Architecture, w: WorkloadConfig,
                  mixed: bool = False) -> float:
    """Predicted wall time of `w`'s sweep (or its mixed run) on `arch`."""
    total = 0.0
    for load in loads_of(w, mixed=mixed):
        m = forecast(inputs, arch, load).metrics
        alone = forecast(inputs, arch, replace(load, concurrency=1, rate=None, num_prompts=1))
        warm = w.warmup * (alone.metrics["median_e2el_ms"] or 0.0) / 1e3
        total += w.repeats * (load.num_prompts / max(m["request_throughput"] or 0.0, 1e-9) + warm)
    return total


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


SWITCH_RESTARTS = 3  # instances 01's optional "two switches" starts (notebook.switches)


def switches_seconds(inputs: Inputs, cfg: LabConfig, host_cores: int | None = None) -> float:
    """Predicted measuring time of 01's optional switches: per restarted instance a warm-up
    run (about one repeat of the mixed run) and the mixed run; 0 without a mixed workload."""
    w = cfg.workload
    if not w.mixed_long_len:
        return 0.0
    mixed = sweep_seconds(inputs, architecture_of(cfg, "baseline", host_cores), w, mixed=True)
    return SWITCH_RESTARTS * mixed * (w.repeats + 1) / w.repeats


def notebook_seconds(inputs: Inputs, cfg: LabConfig, host_cores: int | None = None
                     ) -> dict[str, float]:
    """Predicted measuring time of 01 (the sweep), 03 and 04 (sweep and mixed run), on
    the config's topologies (`architecture_of`; `host_cores`: 01's profile's); 04 only
    when the inputs have a KV transfer curve (02's probe)."""
    w = cfg.workload
    out: dict[str, float] = {}
    kinds = (("01", "baseline"), ("03", "replicated")) + (
        (("04", "disaggregated"),) if inputs.transfer else ())
    for nb, kind in kinds:
        arch = architecture_of(cfg, kind, host_cores)
        out[nb] = sweep_seconds(inputs, arch, w)
        if w.mixed_long_len:
            out[nb] += sweep_seconds(inputs, arch, w, mixed=True)
    return out
