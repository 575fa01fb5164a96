"""The report's forecast sections: each forecast of this run graded against what was then
measured ("Predicted, then measured"), and the same model's forecast for two DGX Sparks."""

from __future__ import annotations

from lab_utils.forecast import grade as g
from lab_utils.forecast.band import band_sentence
from lab_utils.report import forecast as fc
from lab_utils.report.blocks import UL, Block, H, P, T
from lab_utils.report.data import ReportData, recorded_forecasts
from lab_utils.report.plots import Plot
from lab_utils.report.summary import together_claim
from lab_utils.results.points import RULE


def forecast_blocks(data: ReportData, plots: list[Plot]) -> list[Block]:
    by_arch = fc.graded(data)
    blocks = [H("Predicted, then measured"),
              P("Before measuring, notebook 01 forecasts its own sweep from the engine profile "
                "it has just measured, and notebooks 03 and 04 forecast their architecture "
                "from what each forecast lists as its sources (below; lab_utils.forecast.model: "
                "a step-by-step simulation of the engines, the proxy hop and the KV move). Here "
                "each forecast meets its measurement: the error is in % of the measured "
                "value, and 'inside' says whether the measurement fell in the forecast's "
                "interval: the range over the edges of 01's and 02's measured curves, widened "
                "by the model's own error on what was graded earlier in the same series (each "
                "forecast's 'interval' line below names those sources): per kind of metric, the 90% "
                "quantile of |log(measured / predicted)| over those graded values, at least "
                "10% (lab_utils.forecast.band). Coverage and the median interval width are "
                "given together: an interval that holds only because it is huge says nothing. "
                f"'verdict' is the lab's one rule with that interval as the forecast's range: "
                f"{RULE}. Goodput is vLLM bench serve's: the requests per second that met "
                "every SLO the workload sets (workload.slo). Points where the machine stood "
                "still are shown but not graded; where the load generator read tokens late, "
                "ITL and TPOT are not graded."),
              UL([f"{arch}: " + "; ".join(f"{k}: {v}" for k, v in f.sources.items())
                  for arch, f in recorded_forecasts(data).items()]),
              *([P("A forecast calibrated on requests timed one at a time through its own "
                   "instances before the sweep takes its per-token costs from those requests: "
                   "its rows at concurrency 1 mostly check that calibration, not the model; "
                   "the loads above it are the prediction.")]
                if any(f.timed is not None for f in recorded_forecasts(data).values()) else []),
              P("What the model leaves out, so where to look when it misses: the CPU that the "
                "proxy, the load generator and NIXL's progress threads use beyond what 01 "
                "measured beside stand-ins for them"
                + ("" if data.nixl_waited else
                   " (on the 2-core rehearsal, each prefill or decode instance's NIXL thread "
                   "busy-polls a core, which slows every engine handoff: the P/D forecast "
                   "misses by most there)") + "; "
                "vLLM's handling of a P/D request beyond the bytes moved (the side-channel "
                "handshake, the notification); memory limits and preemption. On separate "
                "machines with cores to spare (two Sparks) the first of these should be "
                "small; the grading of a real run says whether it was.")]
    if not by_arch:
        return blocks + [P("No forecast was recorded: notebooks 03 and 04 record one when 01 "
                           "has an engine profile (re-run 01, then 03 and 04).")]
    recorded = recorded_forecasts(data)
    if (together := together_claim(data)) is not None:
        blocks.append(P(together.text))
    for arch, rows in by_arch.items():
        blocks += [H(arch, 3), UL(g.sentences(arch, rows)
                                  + ["interval: " + band_sentence(recorded[arch].error_band)]),
                   T(fc.grade_table(rows))]
    blocks += [Block("img", plot=p) for p in plots if p.name == "forecast"]
    return blocks


def spark_forecast_blocks(data: ReportData) -> list[Block]:
    df, about, sources = fc.spark_forecast(data)
    return [H("Forecast for two DGX Sparks", 3),
            P(f"The same model, fed with published GB10 figures instead of this run's "
              f"measurements ({about}). A forecast, not a measurement: when the lab runs "
              "on the Sparks, notebooks 03 and 04 forecast from their own 01 and 02, and "
              "the section above grades it. Inputs and their sources:"),
            UL([f"{k}: {v}" for k, v in sources.items()]), T(df)]
