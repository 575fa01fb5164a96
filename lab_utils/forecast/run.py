"""What notebooks 01, 03 and 04 do with the model: forecast the architecture they are about
to measure, from 01's and 02's results and their own instances timed before the sweep,
print it, and keep it in their results.

`forecast_for(cfg, "baseline" | "replicated" | "disaggregated", profile, kv, device, earlier)`
returns a `Forecast`: one row per load point of the standard workload (and the mixed one,
for 03 and 04): the median prediction and its interval, which is the range over the
curves' edges widened by the model's own error on the forecasts graded earlier in the
series (`earlier`: {name: graded rows}; `band`), the inputs' sources, and for P/D the best
prefill/decode split for 2, 4 and 8 nodes. The model's inputs come from 01 and 02; 03's and
04's forecasts also take figures from their own instances, timed a few requests one at a
time before the sweep (`forecast.timed`; the best splits, each instance on a machine of
its own, do not); the earlier gradings only set how wide the interval is.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from lab_utils.config import LabConfig
from lab_utils.forecast.band import band_sentence, error_band, widen
from lab_utils.forecast.inputs import edges, from_results
from lab_utils.forecast.model import (
    Architecture,
    Inputs,
    Load,
    Prediction,
    forecast,
    loads_of,
    ranged,
)
from lab_utils.forecast.timed import calibrate, calibrated_edges, timed_errors
from lab_utils.results.forecast import (
    EngineProfile,
    Forecast,
    ForecastPoint,
    GradeRow,
    TimedProfile,
)
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.points import FORECAST, MARGIN, Measured, MetricKey, differs
from lab_utils.util.numbers import fmt_num

SPLIT_NODES = (2, 4, 8)


def architecture_of(cfg: LabConfig, kind: str, host_cores: int | None = None) -> Architecture:
    """The topology `kind` of this config; `host_cores` (01's profile): the cores of the
    machine its instances share, when every node is this machine."""
    t = cfg.topology
    shared = host_cores if all(n.connection == "local" for n in cfg.nodes.values()) else None
    if kind == "replicated":
        return Architecture(replicas=len(t.replicated.nodes), policy=t.replicated.policy,
                            shared_cores=shared)
    if kind == "disaggregated":
        return Architecture(prefill=len(t.disaggregated.prefill),
                            decode=len(t.disaggregated.decode), shared_cores=shared)
    if kind == "tensor-parallel" and t.tensor_parallel is not None:
        return Architecture(ranks=len(t.tensor_parallel.nodes), shared_cores=shared)
    return Architecture(shared_cores=shared)


def with_allreduce(inputs: Inputs, allreduce: tuple[int, float | None, str]) -> Inputs:
    """`inputs` for a split model: its all-reduces' bytes per token and the link's rate
    (bytes per ms; None: not measured), and where they come from (`allreduce`, as
    `notebook.forecasting.allreduce_inputs` gives it)."""
    per_token, rate, said = allreduce
    return replace(inputs, allreduce_bytes_per_token=per_token, link_bytes_per_ms=rate,
                   sources={**inputs.sources, "all-reduce": said})


def predict_rows(inputs: Inputs, edges_of, arch: Architecture, loads: list[Load],
                 workload: str) -> list[ForecastPoint]:
    # a Load has a concurrency or a rate (`loads_of`)
    return [ranged(inputs, arch, load, edges_of).point(
                workload, "concurrency" if load.concurrency else "rate",
                float(load.concurrency or load.rate or 0.0)) for load in loads]


NOBODY = "neither (no request met every SLO)"
EVEN = f"neither (within {MARGIN:.0%})"


def goodput_winner(split: str, g_split: float | None, replicas: str,
                   g_replicas: float | None) -> str:
    """Which of a split and N replicas a forecast puts ahead on goodput, by the lab's margin
    (one predicted value each): its name, `EVEN` within the margin, `NOBODY` at 0 both."""
    a, b = g_split or 0.0, g_replicas or 0.0
    if a == b == 0:
        return NOBODY
    if not differs(Measured.one(a), Measured.one(b)):
        return EVEN
    return split if a > b else replicas


def best_splits(inputs: Inputs, load: Load, nodes=SPLIT_NODES) -> list[dict[str, Any]]:
    """For each node count, every xPyD split and N replicas at `load`, scaled to the
    nodes (concurrency x nodes/2); the best split by goodput, then TTFT p50."""
    out = []
    for n in nodes:
        scaled = replace(load, concurrency=(load.concurrency or 1) * n // 2,
                         num_prompts=max(load.num_prompts, 4 * n))
        best = max((forecast(inputs, Architecture(prefill=p, decode=n - p), scaled)
                    for p in range(1, n)), key=rank)
        rep = forecast(inputs, Architecture(replicas=n), scaled).metrics
        out.append({"nodes": n, "concurrency": scaled.concurrency,
                    "best split": best.architecture,
                    "its goodput (req/s)": best.metrics["request_goodput"],
                    "its TTFT p50 (ms)": best.metrics["median_ttft_ms"],
                    "its ITL p99 (ms)": best.metrics["p99_itl_ms"],
                    "replicas goodput (req/s)": rep["request_goodput"],
                    "replicas ITL p99 (ms)": rep["p99_itl_ms"],
                    "ahead on goodput": goodput_winner(
                        best.architecture, best.metrics["request_goodput"], f"{n} replicas",
                        rep["request_goodput"]),
                    "bottleneck": best.bottleneck()})
    return out


def rank(p: Prediction) -> tuple[float, float]:
    """How predictions are ranked: by goodput under the SLO (requests served, without an
    SLO), then by the lower TTFT p50."""
    m = p.metrics
    # request_throughput is always a number (its `or` only tells the type checker so)
    return (m["request_goodput"] if m["request_goodput"] is not None
            else m["request_throughput"] or 0.0,
            -(m["median_ttft_ms"] or 0.0))


def forecast_for(cfg: LabConfig, kind: str, profile: EngineProfile | None,
                 kv: KvTransferPayload | None, buffer_device: str,
                 earlier: dict[str, list[GradeRow]] | None = None,
                 timed: TimedProfile | None = None,
                 allreduce: tuple[int, float | None, str] | None = None) -> Forecast:
    """Forecast `kind` ("baseline", "replicated" or "disaggregated") for this config's
    workload from 01's profile and 02's results (`kv`, None if 02 has not run), and for 03
    and 04 their instances timed before the sweep (`timed`, `forecast.timed`), its interval
    widened by the error of the forecasts graded before it (`earlier`)."""
    inputs, edges_of = from_results(profile, kv, buffer_device), edges(profile, kv, buffer_device)
    if allreduce is not None:  # a split model: its all-reduces over the link (assumption 9)
        inputs, base_edges = with_allreduce(inputs, allreduce), edges_of
        edges_of = lambda edge: with_allreduce(base_edges(edge), allreduce)  # noqa: E731
    arch = architecture_of(cfg, kind, profile.host_cores if profile else None)
    w = cfg.workload
    sim, sim_edges, said = inputs, edges_of, None
    earlier = dict(earlier or {})
    if timed is not None and kind in ("replicated", "disaggregated", "tensor-parallel"):
        sim, said = calibrate(inputs, arch, timed, w.output_len, w.seed)
        sim_edges = calibrated_edges(edges_of, sim)
        earlier[f"this {kind} forecast at its timed point, before calibration"] = timed_errors(
            inputs, arch, timed, w.output_len, w.seed)
    rows = predict_rows(sim, sim_edges, arch, loads_of(w), "standard")
    if w.mixed_long_len and kind != "baseline":  # 01's sweep has no mixed run
        rows += predict_rows(sim, sim_edges, arch, loads_of(w, mixed=True), "mixed")
    band = error_band(earlier)
    rows = [widen(r, band) for r in rows]
    splits = (best_splits(inputs, loads_of(w, mixed=bool(w.mixed_long_len))[-1])
              if kind == "disaggregated" else [])
    only = {"NIXL's threads": "disaggregated", "other replicas": "replicated",
            "all-reduce": "tensor-parallel"}
    sources = {k: v for k, v in inputs.sources.items() if only.get(k, kind) == kind}
    if said:  # a split model keeps neither stand-ins' source (`only`)
        stand_ins = "NIXL's threads" if kind == "disaggregated" else "other replicas"
        if timed is not None and timed.step_ms and stand_ins in sources:
            sources[stand_ins] += " (superseded by the timed instances' own time per token, below)"
        sources["timed before the sweep"] = said
    sources["interval"] = band_sentence(band)
    slo = [f"{name} {v:g} ms" for name, v in (("TTFT", w.slo.ttft_ms), ("TPOT", w.slo.tpot_ms),
                                              ("every token gap", w.slo.itl_ms),
                                              ("end-to-end", w.slo.e2el_ms)) if v]
    sources["goodput"] = ("requests per second that met the workload's SLOs (workload.slo): "
                          + (", ".join(slo) if slo else "none set, so every request counts"))
    return Forecast(architecture=kind, made_at=datetime.now(UTC).isoformat(),
                    sources=sources, rows=rows, splits=splits, error_band=band,
                    timed=timed if said else None)


def forecast_frame(rows: list[ForecastPoint]):
    """One row per workload and load point: each metric as `median [lo-hi]`."""
    import pandas as pd

    def cell(r: ForecastPoint, k: MetricKey) -> str:
        got = r.interval(k)
        v, lo, hi = got.median, got.lo, got.hi
        if v is None:
            return "–"
        if lo is None or hi is None or abs(hi - lo) < 0.005 * max(abs(v), 1e-9):
            return fmt_num(v)
        return f"{fmt_num(v)} [{fmt_num(lo)}-{fmt_num(hi)}]"

    return pd.DataFrame([{"workload": r.workload, "load": r.load,
                          **{m.heading: cell(r, m.key) for m in FORECAST},
                          "bottleneck": r.bottleneck} for r in rows])


SPLITS_HEAD = ("Predicted best prefill/decode split for 2, 4 and 8 nodes, each instance on a "
               "machine of its own running at 01's speed, at the mixed workload's load scaled "
               "with the nodes (best by goodput under the SLO, then TTFT):")


def show(fc: Forecast) -> None:
    """Print a forecast the way 03 and 04 show it before they measure."""
    from IPython.display import display

    print(f"FORECAST for {fc.architecture} serving, made {fc.made_at[:19]} UTC before "
          "the sweep, from:")
    for k, v in fc.sources.items():
        print(f"  {k}: {v}")
    display(forecast_frame(fc.rows))
    if fc.splits:
        import pandas as pd

        print(SPLITS_HEAD)
        display(pd.DataFrame(fc.splits).round(2))
