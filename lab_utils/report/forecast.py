"""The report's forecast sections: 03's and 04's forecasts graded against their sweeps,
the forecast for two DGX Sparks made by the same model from published GB10 figures (on
a GPU profile with the proxy's cost per request its calibration record measured), and
the what-if of notebook 05.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from lab_utils.config import WorkloadConfig
from lab_utils.forecast import grade as g
from lab_utils.forecast.inputs import from_results, spark_inputs_for
from lab_utils.forecast.model import Architecture, forecast, loads_of
from lab_utils.forecast.run import rank
from lab_utils.report.data import ARCH_NOTEBOOK, ReportData, graded
from lab_utils.results import calibration
from lab_utils.results.claims import Comparison, claim, comparison, save_claims
from lab_utils.results.forecast import GradeRow
from lab_utils.results.points import BY_KEY, FORECAST, MARGIN, Measured, differs
from lab_utils.util.numbers import fmt_num

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "environment_config.json.example"


def forecast_grades(data: ReportData) -> pd.DataFrame:
    """Print what the grading says per architecture; the table of every graded value."""
    by_arch = graded(data)
    if not by_arch:
        print("no forecast recorded: re-run 01 (it measures the profile), then 03 and 04")
        return pd.DataFrame()
    for arch, rows in by_arch.items():
        print("\n".join(g.sentences(arch, rows)))
    return pd.concat([grade_table(rows).assign(architecture=arch)
                      for arch, rows in by_arch.items()], ignore_index=True)


def grade_table(rows: list[GradeRow]) -> pd.DataFrame:
    """Compact: one row per load point and metric, predicted [interval], measured, error."""
    def fmt(v):
        return "–" if v is None else fmt_num(v)

    return pd.DataFrame([{
        "workload": r.workload, "load": r.load, "metric": BY_KEY[r.metric].heading,
        "predicted [interval]": f"{fmt(r.predicted)} [{fmt(r.lo)}-{fmt(r.hi)}]",
        "measured [range]": fmt(r.measured) + (
            f" [{fmt(r.measured_lo)}-{fmt(r.measured_hi)}]"
            if r.measured_lo is not None else " (one run)"),
        "error % (predicted - measured, of measured)":
            "–" if r.error_pct is None else f"{r.error_pct:+.0f}",
        "inside": "yes" if r.inside else "no",
        "verdict": _verdict(r),
        "graded": "yes" if r.graded else f"no: {r.not_graded}"} for r in rows])


def _verdict(r: GradeRow) -> str:
    """The lab's rule on one graded value, in words that do not overstate it: inside the
    interval, outside it but not different (and which part of the rule says so), or
    different."""
    if not r.graded:
        return "–"
    if r.differs:
        return "differs"
    if r.inside:
        return "inside"
    p, m = r.predicted or 0.0, r.measured or 0.0
    if abs(m - p) <= MARGIN * min(abs(m), abs(p)):
        why = f"the measured median within {MARGIN:.0%} of the predicted one"
    elif r.measured_lo is not None and r.measured_hi is not None:
        why = "the runs' range reaches into the interval"
    else:
        why = f"the one run within {MARGIN:.0%} of the interval's nearer end"
    return f"outside; no difference by the lab's rule ({why})"


# ---- two Sparks --------------------------------------------------------------------------------


def workload_of(d: dict[str, Any]) -> WorkloadConfig:
    """A workload from a config file's or a sweep's record of it (their other keys, the
    "_" comments or a sweep's "mixed" flag, left out)."""
    return WorkloadConfig(**{k: v for k, v in d.items() if k in WorkloadConfig.model_fields})


def spark_workload(data: ReportData) -> tuple[str, WorkloadConfig]:
    """The model and workload the Spark forecast is for: this run's on a GPU profile, the
    cluster example's otherwise."""
    config = (data.envelopes["01"].config if data.device == "cuda"
              else json.loads(EXAMPLE_CONFIG.read_text()))
    return config["model"]["name"], workload_of(config["workload"])


def spark_hop(data: ReportData) -> tuple[float, str] | None:
    """The proxy's measured ms per request for the Spark forecast, with its label: on a GPU
    profile (the Sparks themselves) from its calibration records; None on the rehearsal,
    whose proxy ran beside its instances on one machine, not on a Spark cluster's
    controller."""
    if data.device != "cuda":
        return None
    kind = next((e.config.get("proxy", {}).get("kind", "lab")
                 for e in data.envelopes.values()), "lab")
    return calibration.proxy_measured(data.results_dir, data.profile, kind)


def replicas_and_splits(nodes: int) -> list[Architecture]:
    """N replicas first, then every xPyD split of the same N nodes."""
    return [Architecture(replicas=nodes)] + [Architecture(prefill=p, decode=nodes - p)
                                             for p in range(1, nodes)]


SPARK_ARCHS = (Architecture(), Architecture(replicas=2), Architecture(prefill=1, decode=1))


def spark_forecast(data: ReportData) -> tuple[pd.DataFrame, str, dict[str, str]]:
    """The forecast for two Sparks: each architecture at each load point, its inputs and
    their sources."""
    model, w = spark_workload(data)
    inputs = spark_inputs_for(model, w, hop=spark_hop(data))
    rows = []
    for workload, loads in (("standard", loads_of(w)), ("mixed", loads_of(w, mixed=True)
                                                         if w.mixed_long_len else [])):
        for load in loads:
            for arch in SPARK_ARCHS:
                p = forecast(inputs, arch, load)
                rows.append({"workload": workload, "load": load.label,
                             "architecture": arch.name,
                             **{m.heading: p.metrics.get(m.key) for m in FORECAST},
                             "bottleneck": p.bottleneck()})
    slo = " / ".join(f"{k} {v:,.0f} ms" for k, v in (("TTFT", w.slo.ttft_ms),
                                                      ("TPOT", w.slo.tpot_ms)) if v)
    about = (f"{model}, input {w.input_len} / output {w.output_len} tokens, concurrency "
             f"{w.concurrency}" + (f", mixed: one {w.mixed_long_len}-token prompt every "
                                   f"{w.mixed_long_every}" if w.mixed_long_len else "")
             + (f"; goodput counts the requests that met TTFT and TPOT SLOs of {slo}; "
                "bottleneck: the pool of instances the model found busiest, with the share of "
                "the time it was busy" if slo else ""))
    return pd.DataFrame(rows).round(2), about, inputs.sources


# ---- what if --------------------------------------------------------------------------------


def what_if(data: ReportData, *, input_len: int | None = None, output_len: int | None = None,
            concurrency: int | None = None, mixed_long_len: int | None = None,
            slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
            slo_itl_ms: float | None = None, nodes: int = 2, kv_buffer_device: str = "cpu", spark: bool = False) -> pd.DataFrame:
    """A FORECAST, not a measurement: N replicas against every xPyD split of `nodes`
    instances, for a changed workload, from this run's 01/02 curves (or, `spark=True`, the
    published GB10 figures). Prints the predicted winner by goodput and why."""
    model, w0 = (spark_workload(data) if spark  # model: read only for the Sparks
                 else ("", workload_of(data.sweeps["baseline"].workload)))
    w = w0.model_copy(update={k: v for k, v in {
        "input_len": input_len, "output_len": output_len, "mixed_long_len": mixed_long_len,
        "concurrency": [concurrency] if concurrency else None}.items() if v is not None})
    slo = w.slo.model_copy(update={k: v for k, v in {"ttft_ms": slo_ttft_ms,
                                                     "tpot_ms": slo_tpot_ms,
                                                     "itl_ms": slo_itl_ms}.items() if v})
    w = w.model_copy(update={"slo": slo})
    if spark:
        inputs = spark_inputs_for(model, w, kv_buffer_device, hop=spark_hop(data))
    else:
        base_profile = data.baseline.profile if data.baseline else None
        inputs = from_results(base_profile, data.kv_transfer, kv_buffer_device)
    load = loads_of(w, mixed=bool(w.mixed_long_len))[-1]
    load = replace(load, num_prompts=max(load.num_prompts, 8 * nodes))
    preds = [forecast(inputs, arch, load) for arch in replicas_and_splits(nodes)]
    df = pd.DataFrame([{"architecture": p.architecture,
                        **{m.heading: p.metrics.get(m.key) for m in FORECAST},
                        "requests (req/s)": p.metrics["request_throughput"],
                        "bottleneck": p.bottleneck(), "KV transfer (ms)": p.transfer_ms}
                       for p in preds]).round(2)
    best = max(preds, key=rank)
    by = "goodput" if best.metrics["request_goodput"] is not None else "requests"
    # a runner-up no different from the best by the lab's rule: a tie, no winner named
    close = [p for p in preds if p is not best
             and not differs(Measured.one(rank(p)[0]), Measured.one(rank(best)[0]))]
    print(f"FORECAST (not measured): {nodes} nodes, {w.input_len} in / {w.output_len} out, "
          f"concurrency {load.concurrency}"
          + (f", one {w.mixed_long_len}-token prompt every {w.mixed_long_every}"
             if w.mixed_long_len else "")
          + f", SLO TTFT {slo.ttft_ms} ms / TPOT {slo.tpot_ms} ms"
          + (f" / every token gap {slo.itl_ms} ms" if slo.itl_ms else "")
          + f", KV from {kv_buffer_device}, "
          + ("published GB10 figures" if spark else "this run's 01/02 curves"))
    if close:
        print(f"no predicted winner by {by}: " + ", ".join(
            f"{p.architecture} {rank(p)[0]:.3g} req/s" for p in [best, *close])
            + f" are within the lab's {MARGIN:.0%} margin of each other")
    else:
        print(f"predicted winner by {by}: {best.architecture} ({rank(best)[0]:.3g} req/s); its "
              f"busiest pool: {best.bottleneck()}")
    if not spark and nodes == 2 and load.concurrency and (
            found := _measured_beside(data, w, load.concurrency, preds)):
        said, compared = found
        print(said)
        save_claims(data.results_dir, f"what-if:{w.mixed_long_len or 0}:{load.concurrency}",
                    [claim("05", said, *compared)])
    return df


MEASURED_AS = {"2 replicas": "replicated", "1P1D": "disaggregated"}


def _shape(w: WorkloadConfig) -> tuple:
    """What makes two workloads the same requests (their loads aside)."""
    return (w.input_len, w.output_len, w.mixed_long_len, w.mixed_long_len and w.mixed_long_every,
            w.chat)


def _measured_beside(data: ReportData, w: WorkloadConfig, concurrency: int,
                     preds: list) -> tuple[str, list[Comparison]] | None:
    """When the what-if is a point this run measured (its own workload, two nodes), what
    was measured there beside what this forecast says, how far off it is, and what the
    lab's rule says of the measured ones, so neither is read for the other; with the
    comparison that makes the last true."""
    runs = data.mixed if w.mixed_long_len else data.sweeps
    run_name = "mixed" if w.mixed_long_len else "sweep"
    pairs, got = [], {}
    for p in preds:
        run = runs.get(MEASURED_AS.get(p.architecture, ""))
        if run is None or _shape(workload_of(run.workload)) != _shape(w):
            continue
        entry = next((c for c in run.combined if c.mode == "concurrency"
                      and float(c.value) == concurrency and c.valid), None)
        m = entry.of("request_throughput") if entry else None
        if entry is not None and m is not None:
            arch = MEASURED_AS[p.architecture]
            got[p.architecture] = (p.architecture, ARCH_NOTEBOOK[arch], run_name, entry)
            fc = p.metrics["request_throughput"]
            pairs.append(f"{p.architecture} measured {m.median:.3g} req/s, forecast here "
                         f"{fc:.3g} ({(fc - m.median) / m.median:+.0%})")
    if not pairs:
        return None
    said = (f"This is a point this run measured ({'mixed' if w.mixed_long_len else 'standard'} "
            f"workload, concurrency {concurrency}): " + "; ".join(pairs) + ". This what-if "
            "runs the model on 01's and 02's curves alone, without the requests 03 and 04 "
            "timed before their sweeps (their forecasts, so calibrated, are graded in "
            "'Predicted, then measured').")
    if len(got) != 2:
        return said, []
    c = comparison("request_throughput", *got.values())
    a, b = c.subject.name, c.reference.name
    said += (f" Measured, by the lab's rule: {a} {c.margin()} than {b}." if c.better
             else f" Measured, by the lab's rule: {a} and {b} do not differ.")
    return said, [c]
