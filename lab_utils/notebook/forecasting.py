"""What the serving notebooks ask the forecast (`lab_utils.forecast`): how long a sweep
will take (`eta`, `eta_lines` for `python -m lab_utils eta`), the forecast 01 (of its own
sweep), 03 and 04 print and record before they measure (`predict`), and that forecast
graded against what they then measured (`grade_forecast`).

Each forecast's interval includes the model's own error on the forecasts graded earlier
in the series (`earlier_gradings`: 01's of its own sweep, then 03's), as
`lab_utils.forecast.band` computes it.
"""

from __future__ import annotations

from typing import Any

from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.forecast.grade import grade_frame, grade_rows, sentences
from lab_utils.forecast.inputs import from_results, spark_inputs_for
from lab_utils.forecast.run import architecture_of, forecast_for, show
from lab_utils.forecast.timing import minutes, notebook_seconds, sweep_seconds
from lab_utils.notebook.session import kv_buffer_device
from lab_utils.results import load_optional, load_results
from lab_utils.results.forecast import EngineProfile, Forecast
from lab_utils.results.sweep import BenchmarkResult


def eta_inputs(cfg: LabConfig):
    """The forecast inputs an ETA is made from, 01's machine's cores (`architecture_of`
    applies them where the nodes share it) and where the inputs come from: 01's profile when it exists, else on a GPU profile the published
    GB10 figures; None when neither applies (the CPU rehearsal before 01)."""
    base = load_optional(cfg, "01")
    profile = base.payload.profile if base else None
    if profile is not None:
        kv = load_optional(cfg, "02")
        return (from_results(profile, kv.payload if kv else None, kv_buffer_device(cfg)),
                profile.host_cores, "01's engine profile")
    if cfg.vllm.device == "cuda":
        return spark_inputs_for(cfg.model.name, cfg.workload), None, "published GB10 figures"
    return None


def eta(cfg: LabConfig, topology: str, w, mixed: bool = False) -> str | None:
    """'about N min (...)': the forecast model's time for this sweep; None: no inputs yet."""
    found = eta_inputs(cfg)
    if found is None:
        return None
    inputs, cores, source = found
    secs = sweep_seconds(inputs, architecture_of(cfg, topology, cores), w, mixed=mixed)
    return f"about {minutes(secs)} (forecast from {source})"


def eta_lines(cfg: LabConfig) -> list[str]:
    """What `python -m lab_utils eta` prints: the predicted measuring time of 01, 03 and 04
    with this config's workload (one line saying why not, when there is nothing to
    predict from)."""
    found = eta_inputs(cfg)
    if found is None:
        return ["nothing to predict from yet: run notebook 01 (its engine profile), or use a "
                "GPU profile (published GB10 figures)"]
    inputs, cores, source = found
    times = notebook_seconds(inputs, cfg, cores)
    w = cfg.workload
    lines = [f"predicted measuring time per notebook, forecast from {source}, workload "
             f"{w.input_len} in / {w.output_len} out, concurrency {w.concurrency}, "
             f"{w.num_prompts} prompts x {w.repeats} repeat(s)"
             + (f", mixed {w.mixed_long_len} every {w.mixed_long_every}"
                if w.mixed_long_len else "")]
    lines += [f"  {nb}: {minutes(secs)}" for nb, secs in times.items()]
    lines.append(f"  total: {minutes(sum(times.values()))} (instance start-up, the checklist, "
                 "the probe and reading time come on top)")
    return lines


# what the series grades before each forecast: (notebook, what it forecast, in words)
EARLIER = {"baseline": (), "replicated": (("01", "01's single-instance sweep"),),
           "disaggregated": (("01", "01's single-instance sweep"),
                             ("03", "03's replicated serving"))}


def earlier_gradings(cfg: LabConfig, kind: str) -> dict[str, list[dict[str, Any]]]:
    """The recorded forecasts of the notebooks before `kind`'s, graded against their own
    sweeps: {what was forecast: graded rows}. One not run, not forecast, or unreadable
    counts with no row (the band's source says so)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for nb, name in EARLIER[kind]:
        try:
            env = load_optional(cfg, nb)
        except LabError:
            env = None
        fc = getattr(env.payload, "forecast", None) if env else None
        out[name] = (grade_rows(fc, {"standard": env.payload.sweep, "mixed": env.payload.mixed})
                     if env and fc else [])
    return out


def make_forecast(cfg: LabConfig, kind: str, profile: EngineProfile | None = None) -> Forecast:
    """Forecast `kind` ("baseline", "replicated" or "disaggregated") from 01's profile
    (`profile`: the one 01 just measured, before it records it) and 02's results, its
    interval widened by the error of the forecasts graded earlier in the series."""
    kv = load_optional(cfg, "02") if kind != "baseline" else None
    if profile is None:
        profile = load_results(cfg, "01").payload.profile
    return forecast_for(cfg, kind, profile, kv.payload if kv else None, kv_buffer_device(cfg),
                        earlier_gradings(cfg, kind))


def predict(cfg: LabConfig, kind: str, profile: EngineProfile | None = None) -> Forecast:
    """`make_forecast`, printed, for the notebook to record before it measures."""
    fc = make_forecast(cfg, kind, profile)
    show(fc)
    return fc


def grade_forecast(fc: Forecast, result: BenchmarkResult, mixed: BenchmarkResult | None = None):
    """The forecast against this notebook's measurements: what it says, and the table."""
    rows = grade_rows(fc, {"standard": result, "mixed": mixed})
    print("\n".join(sentences(fc.architecture, rows)))
    return grade_frame(rows)
