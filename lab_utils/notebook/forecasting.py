"""What the serving notebooks ask the forecast (`lab_utils.forecast`): how long a sweep
will take (`eta_lines` for `python -m lab_utils eta`; a single serving cell's is
`timings.cell_eta`), the forecast 01 (of its own sweep), 03 and 04 print and record before they measure (`predict`), and that forecast
graded against what they then measured (`grade_forecast`).

What the calibration records (`results.calibration`) measured replaces an estimate here:
a topology's start-up (`startup_seconds`: the measured first or later start of each
instance, else the agenda's allowance) and, on a GPU profile before 01, the proxy's cost
per request in the published GB10 figures (`eta_inputs`).

Each forecast's interval includes the model's own error on the forecasts graded earlier
in the series (`earlier_gradings`: 01's of its own sweep, then 03's), as
`lab_utils.forecast.band` computes it.
"""

from __future__ import annotations

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.forecast.grade import grade_claims, grade_frame, grade_rows
from lab_utils.forecast.inputs import from_results, spark_inputs_for
from lab_utils.forecast.run import SPLITS_HEAD, forecast_for, show
from lab_utils.forecast.timing import (
    SWITCH_RESTARTS,
    minutes,
    notebook_seconds,
    switches_seconds,
)
from lab_utils.kv.budget import kv_buffer_device
from lab_utils.kv.memory import hidden_state
from lab_utils.notebook.record import say
from lab_utils.notebook.starts import startup_seconds
from lab_utils.results import calibration, load_optional, load_results
from lab_utils.results.claims import claim, save_claims
from lab_utils.results.forecast import EngineProfile, Forecast, GradeRow, TimedProfile
from lab_utils.results.payloads import not_graded
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.serve.topology import Served
from lab_utils.serve.tp import TOPOLOGY as TP_ARCH
from lab_utils.serve.tp import collective

TOPOLOGY = {"01": "baseline", "03": "replicated", "04": "disaggregated"}  # what each starts


def eta_inputs(cfg: LabConfig):
    """The forecast inputs an ETA is made from, 01's machine's cores (`architecture_of`
    applies them where the nodes share it) and where the inputs come from: 01's profile
    when it exists, else on a GPU profile the published GB10 figures (with the proxy's
    measured cost per request when a calibration record holds it); None when neither
    applies (the CPU rehearsal before 01)."""
    base = load_optional(cfg, "01")
    profile = base.payload.profile if base else None
    if profile is not None:
        kv = load_optional(cfg, "02")
        return (from_results(profile, kv.payload if kv else None, kv_buffer_device(cfg)),
                profile.host_cores, "01's engine profile")
    if cfg.vllm.device == "cuda":
        hop = calibration.proxy_ms(cfg)
        return (spark_inputs_for(cfg.model.name, cfg.workload, hop=hop), None,
                "published GB10 figures"
                + (f", the proxy's {hop[0]:.2g} ms per request {hop[1]}" if hop else ""))
    return None


def eta_lines(cfg: LabConfig) -> list[str]:
    """What `python -m lab_utils eta` prints: the predicted measuring time of 01, 03 and 04
    with this config's workload and the start-up of each one's topology
    (`startup_seconds`: measured, or the agenda's allowance); one line saying why not,
    when there is nothing to predict from."""
    found = eta_inputs(cfg)
    if found is None:
        return ["nothing to predict from yet: run notebook 01 (its engine profile), or use a "
                "GPU profile (published GB10 figures)"]
    inputs, cores, source = found
    times = notebook_seconds(inputs, cfg, cores)
    starts = {nb: startup_seconds(cfg, TOPOLOGY[nb]) for nb in times}
    w = cfg.workload
    lines = [f"predicted time per notebook, measuring forecast from {source}, workload "
             f"{w.input_len} in / {w.output_len} out, concurrency {w.concurrency}, "
             f"{w.num_prompts} prompts x {w.repeats} repeat(s)"
             + (f", mixed {w.mixed_long_len} every {w.mixed_long_every}"
                if w.mixed_long_len else "")]
    lines += [f"  {nb}: {minutes(secs)} measuring + {minutes(starts[nb][0])} start-up "
              f"({starts[nb][1]})" for nb, secs in times.items()]
    if (extra := switches_seconds(inputs, cfg, cores)):
        once = starts["01"][0]
        lines.append(f"  01's optional two switches: {minutes(extra)} measuring + "
                     f"{minutes(SWITCH_RESTARTS * once)} start-up ({SWITCH_RESTARTS} starts; "
                     "not in the total)")
    if "04" not in times:
        lines.append("  04: not predicted: its forecast needs notebook 02's KV transfer probe")
    total = sum(times.values()) + sum(s for s, _ in starts.values())
    lines.append(f"  total: {minutes(total)} (the checklist, the probe and reading time "
                 "come on top)")
    return lines


# what the series grades before each forecast: (notebook, what it forecast, in words)
_SERIES = (("01", "01's single-instance sweep"), ("03", "03's replicated serving"),
           ("04", "04's disaggregated serving"))
EARLIER = {"baseline": _SERIES[:0], "replicated": _SERIES[:1], "disaggregated": _SERIES[:2],
           "tensor-parallel": _SERIES}


def earlier_gradings(cfg: LabConfig, kind: str) -> dict[str, list[GradeRow]]:
    """The recorded forecasts of the notebooks before `kind`'s, graded against their own
    sweeps: {what was forecast: graded rows}. One not run, not forecast, or unreadable
    counts with no row (the band's source says so)."""
    out: dict[str, list[GradeRow]] = {}
    for nb, name in EARLIER[kind]:
        try:
            env = load_optional(cfg, nb)
        except LabError:
            env = None
        fc = getattr(env.payload, "forecast", None) if env else None
        out[name] = (grade_rows(fc, {"standard": env.payload.sweep, "mixed": env.payload.mixed})
                     if env and fc else [])
    return out


def make_forecast(cfg: LabConfig, kind: str, profile: EngineProfile | None = None,
                  timed: TimedProfile | None = None) -> Forecast:
    """Forecast `kind` ("baseline", "replicated", "disaggregated" or "tensor-parallel") from 01's profile
    (`profile`: the one 01 just measured, before it records it) and 02's results, and for
    03 and 04 their instances timed before the sweep (`timed`), its interval widened by the
    error of the forecasts graded earlier in the series."""
    kv = load_optional(cfg, "02") if kind != "baseline" else None
    if profile is None:
        profile = load_results(cfg, "01").payload.profile
    return forecast_for(cfg, kind, profile, kv.payload if kv else None, kv_buffer_device(cfg),
                        earlier_gradings(cfg, kind), timed,
                        allreduce_inputs(cfg) if kind == "tensor-parallel" else None)


def allreduce_inputs(cfg: LabConfig) -> tuple[int, float | None, str]:
    """What a split model's all-reduces move per token (2 per layer x hidden size x the
    model's element size) and the link's rate as notebook 00 measured it (None: not
    measured), with the sentence that says where they come from."""
    layers, hidden, size = hidden_state(cfg)
    per_token = 2 * layers * hidden * size
    env = load_optional(cfg, "00")
    link = next((c.data for c in (env.payload.checks if env else []) if c.check == "link"
                 and (c.data or {}).get("measured_gbps")), None)
    rate = link["measured_gbps"] * 1e9 / 8 / 1e3 if link else None
    said = (f"2 all-reduces per layer x {layers} layers x {hidden} x "
            f"{size} B = {per_token:,} B per token in a step, over the link at "
            + (f"{link['measured_gbps']:.1f} Gb/s (00's link check)" if link else
               "an unmeasured rate (00's link check did not run): the bytes are left out"))
    return per_token, rate, said


def predict(cfg: LabConfig, kind: str, profile: EngineProfile | None = None,
            timed: TimedProfile | dict | None = None) -> Forecast:
    """`make_forecast`, printed, for the notebook to record before it measures. `timed`:
    the instances timed before the sweep (`time_instances`'s result or its `TimedProfile`)."""
    if isinstance(timed, dict):
        timed = timed.get("timed")
    fc = make_forecast(cfg, kind, profile, timed)
    show(fc)
    nb = FORECAST_NOTEBOOK[fc.architecture]
    save_claims(cfg.results_dir, f"{nb}:forecast-inputs",
                [claim(nb, f"{k}: {v}") for k, v in fc.sources.items()]
                + ([claim(nb, SPLITS_HEAD)] if fc.splits else []))
    return fc


FORECAST_NOTEBOOK = {t: nb for nb, t in TOPOLOGY.items()} | {"tensor-parallel": "tp"}


def grade_forecast(cfg: LabConfig, fc: Forecast, result: BenchmarkResult,
                   mixed: BenchmarkResult | None = None, served: Served | None = None):
    """The forecast against this notebook's measurements: what it says (printed, and saved
    as claims the audit re-grades from the notebook's results file), and the table. The
    split model's is not graded when its ranks' NCCL fell back to sockets (`served`'s
    ranks, as read when they started)."""
    why = None
    if fc.architecture == TP_ARCH:
        why = not_graded(served.collective if served else collective(Cluster(cfg)))
    rows = grade_rows(fc, {"standard": result, "mixed": mixed}, not_graded=why)
    nb = FORECAST_NOTEBOOK[fc.architecture]
    say(cfg, f"{nb}:forecast", grade_claims(nb, nb, fc.architecture, rows))
    return grade_frame(rows)
