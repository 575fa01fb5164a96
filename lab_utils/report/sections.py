"""The report as a document: a list of `Block`s (heading, paragraph, warning, list, table,
plot) that `lab_utils.report.render` renders the same way to HTML and to Markdown. The
sections, in order: the first screen (the verdict in one sentence, the CPU rehearsal's
banner, the system under test: `lab_utils.report.summary`), what was run and what is
missing, a one-screen verdict table, the plots, the headline tables, the conclusions and
the comparison at every load point (folded), the forecasts graded against the
measurements, the expected figures and the forecast for two Sparks, the estimates against
what real starts measured, one section per notebook 00-04 with what it recorded, what
each results file holds, and what production systems add beyond this lab.

Over 400 lines on purpose: one short builder per section, in the order the report reads,
so that the document's outline is this file's outline.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import pandas as pd

from lab_utils.forecast import grade as g
from lab_utils.forecast.band import band_sentence
from lab_utils.report.blocks import UL, Block, H, P, T, W, fold
from lab_utils.report.conclusions import Conclusions
from lab_utils.report.data import ARCHITECTURES, ReportData, graded, recorded_forecasts, run_hint
from lab_utils.report.expected import EXPECTED_TWO_SPARK, expected_figures
from lab_utils.report.export import fields_table
from lab_utils.report.forecast import grade_table, spark_forecast, workload_of
from lab_utils.report.plots import Plot, roofline_text
from lab_utils.report.summary import (
    REHEARSAL_BANNER,
    experiment_claims,
    machine_claim,
    system_under_test,
    together_claim,
)
from lab_utils.report.tables import (
    calibration_table,
    checks_table,
    display_table,
    key_value_table,
    kv_table,
    scalar_table,
    workload_rows,
)
from lab_utils.report.verdict import verdict_sentence
from lab_utils.results import RESULTS, collective_said, reference_origin
from lab_utils.results.claims import Comparison
from lab_utils.results.points import BY_KEY, MARGIN, RULE, MetricKey, factor
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.util.numbers import fmt_num, join_words

FILE_MEANINGS = {
    "00": "the bring-up checklist on every node: SSH, GPU, CUDA, vLLM build, NIXL and UCX, "
          "RDMA devices and link rate, MTU, ports, model presence, disk, clock skew",
    "01": "one vLLM instance behind the proxy: one request timed in detail, the load sweep "
          "(per-request records, per-point summaries in `vllm bench serve` field names, "
          "median and spread over repeats) and the inputs of the decode roofline",
    "02": "KV bytes per token of the model, the NIXL probe (bandwidth and latency per size), "
          "predicted vs measured transfer time per prompt length, the kv_buffer_device choice",
    "03": "one instance per node behind the proxy's router, the same sweep as 01",
    "04": "prefill and decode instances joined by NixlConnector, the same sweep, and the proof "
          "that the KV cache really moved (decode-side counters, greedy output equal to 01's)",
    "tp": "04's optional section: one model split over the nodes (tensor parallel), its "
          "greedy output against 01's, the same sweep and mixed run",
}


TERMS = ("Terms: TTFT, time to first token; ITL, the gap between two streamed tokens; TPOT, "
         "time per output token after the first; p50 and p99, the median and the 99th "
         "percentile over a load point's requests; P/D, prefill/decode disaggregation, a split "
         "written xPyD (x prefill and y decode instances, 1P1D for one of each); goodput, "
         "requests per second that met the workload's SLOs; 'the lab's rule', how every "
         "comparison here is judged (stated under Verdict).")


def _first_screen(data: ReportData, concl: Conclusions) -> list[Block]:
    """The verdict in one sentence, the terms it uses, the rehearsal's banner, the system
    under test."""
    blocks = [P(f"Verdict: {verdict_sentence(concl, data)}")]
    if (machine := machine_claim(data)) is not None:
        blocks.append(P(machine.text))
    blocks.append(P(TERMS))
    if data.device == "cpu":
        blocks.append(W(REHEARSAL_BANNER))
    return blocks + [T(system_under_test(data))]


def _intro(data: ReportData, concl: Conclusions) -> list[Block]:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    model = data.sweeps["baseline"].model
    return [H(f"Benchmark report: profile {data.profile}", 1), *_first_screen(data, concl),
            P(f"Written {now} from the results in {data.results_dir}. Model: {model}. "
              f"Engine device: {data.device}."),
            P(_architectures_measured(data))]


ARCH_TEXT = {"baseline": "baseline (one vLLM instance, notebook 01)",
             "replicated": "replicated (one instance per node behind the proxy's router, 03)",
             "disaggregated": "disaggregated (prefill and decode instances joined by NIXL, 04)",
             "tensor-parallel": "tensor-parallel (one model split over the nodes, 04's last "
                                "section)"}
COUNT = {1: "The one", 2: "Both", 3: "All three", 4: "All four"}


def _architectures_measured(data: ReportData) -> str:
    """The architectures this run measured, counted from its results."""
    archs = [a for a in ARCHITECTURES if a in data.sweeps]
    return (f"Architectures measured: {join_words([ARCH_TEXT[a] for a in archs])}. "
            f"{COUNT.get(len(archs), f'All {len(archs)}')} measured by the same load generator "
            "through the same proxy, with vLLM bench serve's metric names.")


def _missing_blocks(data: ReportData) -> list[Block]:
    refs = [f"notebook {nb} ({reference_origin(env.reference)})"
            for nb, env in sorted(data.envelopes.items()) if env.reference]
    warn = [W("Some results here are a REFERENCE run's, loaded to catch up, not this "
              "cluster's: " + "; ".join(refs) + ". Their numbers describe that run.")] if refs else []
    if not data.missing:
        return warn + [P("Every notebook's results were found.")]
    items = [f"Notebook {nb}: {msg}" for nb, msg in sorted(data.missing.items())]
    return warn + [H("Missing results"),
            W("This report shows only what exists. To complete it: "
              + "; ".join(f"{run_hint(nb)}" for nb in sorted(data.missing)) + "."),
            UL(items)]


def _ranking(fs: list[Comparison]) -> str:
    """The architectures compared at one load point on one metric, best first: tiers joined
    by ">" (with the smallest margin between them) and members of a tier by "=", but only
    where that chain is true of every pair by the lab's rule (each one in a higher tier
    beats each one in a lower, none within a tier differs); otherwise every pair is named
    ("replicated > disaggregated (1.4x); baseline = replicated; ...")."""
    m = BY_KEY[fs[0].metric]
    values = {s.name: s.value.median for f in fs for s in (f.subject, f.reference)}
    by_pair = {frozenset((f.subject.name, f.reference.name)): f for f in fs}
    order = sorted(values, key=lambda a: values[a], reverse=m.higher_is_better)
    complete = all(frozenset((a, b)) in by_pair for i, a in enumerate(order) for b in order[i + 1:])
    tiers: list[list[str]] = []
    for a in order if complete else []:
        if tiers and all(by_pair[frozenset((a, t))].winner is None for t in tiers[-1]):
            tiers[-1].append(a)
        else:
            tiers.append([a])
    tier_of = {a: i for i, t in enumerate(tiers) for a in t}
    chain_holds = complete and all(
        (f.winner is None) == (ti == tj) and (ti == tj or f.winner == (a if ti < tj else b))
        for f in fs for a, b in [(f.subject.name, f.reference.name)]
        for ti, tj in [(tier_of[a], tier_of[b])])
    if chain_holds:
        out = " = ".join(tiers[0])
        for upper, lower in zip(tiers, tiers[1:], strict=False):
            gap = min(by_pair[frozenset((u, lo))].ratio for u in upper for lo in lower)
            out += f" > {' = '.join(lower)} ({factor(gap)})"
    else:
        out = "; ".join(
            f"{f.winner} > {f.subject.name if f.winner == f.reference.name else f.reference.name}"
            f" ({factor(f.ratio)})" if f.winner else f"{f.subject.name} = {f.reference.name}"
            for f in fs)
    notes = [_tie_beyond_margin(f) for f in fs if f.winner is None and f.ratio > 1 + MARGIN]
    return out + (f" [{'; '.join(notes)}]" if notes else "")


def _tie_beyond_margin(f: Comparison) -> str:
    """Why two sides further apart than the margin are still "=": the ranges over their
    repeats (shown, so the tie can be checked here), or the reason the rule gives."""
    a, b = f.subject, f.reference
    if a.value.n > 1 and b.value.n > 1:
        x, y = a.value, b.value
        why = ("their ranges over the repeats overlap" if x.min <= y.max and y.min <= x.max
               else "the medians are no further apart than one side's runs moved")
        return f"{a.name} = {b.name} though {factor(f.ratio)} apart: {why} ({f.spans()})"
    return f"{a.name} = {b.name} though {factor(f.ratio)} apart: {f.basis}"


def verdict_table(concl: Conclusions) -> tuple[pd.DataFrame, str]:
    """One screen: every architecture measured, one row per workload and metric (the
    request throughput row left out where it ranks and measures as the output throughput
    row does, as with a fixed output length), one column per load point, each cell the
    architectures best first, ">" with the margin where the lab's rule (`points.compare`)
    says two differ, "=" where not. Also says which architectures are in it."""
    if not concl.findings:
        return pd.DataFrame(), ""
    loads = list(dict.fromkeys(f.load for f in concl.findings))
    cells: dict[tuple[str, MetricKey], dict[str, list[Comparison]]] = {}
    for f in concl.findings:
        cells.setdefault((f.workload, f.metric), {}).setdefault(f.load, []).append(f)
    rows: dict[tuple[str, MetricKey], dict[str, str]] = {}
    for (workload, key), by_load in cells.items():
        m = BY_KEY[key]
        rows[(workload, key)] = {"workload": workload, "metric": f"{m.label} ({m.way} is better)",
                                 **{load: _ranking(fs) for load, fs in by_load.items()}}
    for workload in dict.fromkeys(w for w, _ in rows):
        req, out = rows.get((workload, "request_throughput")), rows.get((workload, "output_throughput"))
        if req and out and {**req, "metric": ""} == {**out, "metric": ""}:
            del rows[(workload, "request_throughput")]
            out["metric"] = "output throughput (higher is better; request throughput ranks the same)"
    archs = [a for a in ARCHITECTURES
             if any(a in (f.subject.name, f.reference.name) for f in concl.findings)]
    df = pd.DataFrame(list(rows.values())).reindex(columns=["workload", "metric", *loads])
    return df.fillna("–"), join_words(archs)


def _verdict_blocks(concl: Conclusions) -> list[Block]:
    df, archs = verdict_table(concl)
    if df.empty:
        return [H("Verdict"), P("No two architectures share a valid load point yet.")]
    blocks = [H("Verdict"),
              P(f"{archs}, at every load point measured by more than one: per metric, the "
                "architectures best first; \">\" with the margin (the larger value over the "
                "smaller) where the two differ, \"=\" where they do not: "
                f"{RULE}. Details, every pair and every sentence behind this table, are "
                "further down.")]
    blocks.append(T(df))
    if concl.excluded:
        blocks.append(UL([f"excluded (invalid): {e}" for e in concl.excluded]))
    return blocks


def _conclusion_blocks(concl: Conclusions) -> list[Block]:
    inner = [P("Computed from the numbers below; nothing here is assumed."), UL(concl.headline)]
    if concl.by_metric:
        inner += [H("By metric", 3), UL(concl.by_metric)]
    return [H("Conclusions"), fold(f"{len(concl.sentences)} sentences, one per finding", inner)]


def _table_blocks(table: pd.DataFrame, data: ReportData) -> list[Block]:
    blocks = [H("Headline table"),
              P("One row per architecture and load point: median over repeats. Spread is the "
                "widest (max - min) / median over the repeats among the metrics shown. Invalid "
                "points (too many failed requests) show INVALID with the reason and are left "
                "out of plots and conclusions. The note also names the repeats during which "
                "the machine running the benchmark stood still, and for how long: their "
                "latencies include it; and those in which many tokens reached the load "
                "generator in one read with the token before (\"read together\"): their "
                "inter-token gaps count as 0 ms, so ITL there is not the decode step. Each p99 "
                "shows the n it is over (requests; for ITL, inter-token gaps, in the repeat "
                "with fewest): over fewer than 100, \"~max\" says it is close to the largest "
                "value, not a 1-in-100 tail.")]
    blocks.append(T(display_table(workload_rows(table, "standard"))))
    mixed = workload_rows(table, "mixed")
    if not mixed.empty:
        blocks += [H("Mixed long/short workload", 3),
                   P("Long prompts interleaved with short ones: the case where a long prefill "
                     "can stall other requests' decode steps."), T(display_table(mixed))]
    fields = fields_table(data).map(fmt_num)
    blocks.append(fold(f"Every field vllm bench serve reports, per point ({len(fields)} "
                       "points)", [
        P("In vLLM's names and units (ms; duration in s; throughputs per s): completed and "
          "failed requests, the run's duration, request, output and total token "
          "throughput, and the mean, median and p99 of TTFT, TPOT, ITL and end-to-end "
          "latency; each the median over the point's repeats. Every run is also in "
          "export/: runs.csv, and one JSON file per run in the layout of `vllm bench "
          "serve --save-result`."), T(fields)]))
    return blocks


def _plot_blocks(plots: list[Plot]) -> list[Block]:
    blocks = [H("Plots"),
              P("Invalid points are not plotted as values: each line has a gap at an invalid "
                "point and a cross on the x axis marks it.")]
    for p in plots:
        if p.name != "forecast":  # shown with the forecasts' grades
            blocks += [H(p.title, 3), Block("img", plot=p)]
    names = {p.name for p in plots}
    if "kv_transfer" not in names:
        blocks.append(P(f"No KV transfer plot: {run_hint('02')}."))
    if "mixed_itl" not in names:
        blocks.append(P("No mixed long/short workload plot: neither 03 nor 04 recorded a mixed "
                        "sweep (set workload.mixed_long_len and re-run them)."))
    return blocks


def _comparison_blocks(concl: Conclusions) -> list[Block]:
    if not concl.findings:
        return [H("Comparison at every load point"),
                P("No two architectures share a valid load point yet.")]
    df = concl.table()
    for col in ("subject_value", "reference_value"):
        df[col] = df[col].map(fmt_num)
    df["winner"] = df["winner"].fillna("no difference")
    df["differs"] = df["differs"].map({True: "yes", False: "no"})
    df = df.rename(columns={"label": "metric", "subject_value": "subject value",
                            "reference_value": "reference value"})
    return [H("Comparison at every load point"),
            fold(f"{len(df)} comparisons", [
                P("Ratio: the larger value over the smaller, with the winner's direction in "
                  "words (\"1.7x lower\"), or how far apart when neither wins. It counts "
                  f"only by the lab's rule (basis column): {RULE}."), T(df)])]


def forecast_blocks(data: ReportData, plots: list[Plot]) -> list[Block]:
    by_arch = graded(data)
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
                + ("" if data.nixl_delay_us > 0 else
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
                   T(grade_table(rows))]
    blocks += [Block("img", plot=p) for p in plots if p.name == "forecast"]
    return blocks


def spark_forecast_blocks(data: ReportData) -> list[Block]:
    df, about, sources = spark_forecast(data)
    return [H("Forecast for two DGX Sparks", 3),
            P(f"The same model, fed with published GB10 figures instead of this run's "
              f"measurements ({about}). A forecast, not a measurement: when the lab runs "
              "on the Sparks, notebooks 03 and 04 forecast from their own 01 and 02, and "
              "the section above grades it. Inputs and their sources:"),
            UL([f"{k}: {v}" for k, v in sources.items()]), T(df)]


def _expected_blocks(data: ReportData, table: pd.DataFrame) -> list[Block]:
    df = expected_figures(data, table)
    blocks = [H("Expected figures for two DGX Sparks"),
              P(f"Source: {EXPECTED_TWO_SPARK['source']}.")]
    if data.device != "cuda":
        blocks.append(P("This is the CPU rehearsal: what two Sparks are expected to measure, "
                        "for the Spark profile's model; none of this run's figures is set "
                        "beside them, since a CPU and a tiny model measure something else."))
    else:
        bad = df[df["verdict"].str.startswith("WARNING")]
        for _, r in bad.iterrows():
            why = r["verdict"].removeprefix("WARNING: ")
            blocks.append(W(f"{r['figure']}: this run {r['this run']} vs expected "
                            f"{r['expected (two Sparks)']}: {why}; check the hardware "
                            "(notebook 00) before trusting the comparison."))
    return blocks + [T(df)] + spark_forecast_blocks(data)


def _calibration_blocks(data: ReportData) -> list[Block]:
    df = calibration_table(data)
    text = ("What the serving plan (`serve --dry-run`), the workshop's start-up allowance "
            "(`eta`), the NIXL probe's plan and the proxy's cost in the forecasts estimate, "
            "beside what this profile's real runs measured (results/<profile>/calibration/); "
            "each uses a measured figure instead of its estimate from then on.")
    return [H("Estimated vs measured"), P(text),
            P("Nothing was measured yet.") if df.empty else T(df)]


def _nb00_blocks(data: ReportData) -> list[Block]:
    env = data.envelopes["00"]
    p = env.payload
    tally = ", ".join(f"{n} {status}" for status, n in p.counts.items())
    if p.blessed:
        verdict = P(f"Written {env.timestamp}. Blessed: no check failed ({tally}).")
    elif p.continued_despite_failures:
        verdict = W(f"Written {env.timestamp}. Not blessed ({tally}): the later notebooks ran "
                    "despite the failed checks, as chosen in notebook 00, so their numbers may "
                    "reflect them.")
    else:
        verdict = W(f"Written {env.timestamp}. Not blessed ({tally}): fix the failed checks "
                    f"and {run_hint('00')}.")
    return [verdict, T(checks_table(p))]


def _nb01_blocks(data: ReportData) -> list[Block]:
    p = data.baseline
    assert p is not None  # each notebook's section is built only from its results
    blocks = [P(_sweep_text(data.sweeps["baseline"]))]
    if p.single_request is not None:
        blocks += [H("Single request", 3), P(p.single_request.describe().replace("\n  ", "; ")),
                   T(key_value_table(asdict(p.single_request)))]
    blocks += [H("Roofline", 3), P(roofline_text(data)),
               T(key_value_table(p.roofline.model_dump() if p.roofline else {}))]
    if (said := experiment_claims(data).get("01")) is not None:
        blocks += [H("Two switches", 3),
                   P("The mixed workload on the instance restarted as served, with small "
                     "prefill steps and with chunked prefill off, and one long prompt sent "
                     "twice:"), UL([c.text for c in said])]
    return blocks


def _sweep_text(sweep: BenchmarkResult) -> str:
    """Where a sweep was sent and with what workload."""
    return f"Target {sweep.target}; {workload_of(sweep.workload).describe(False)}."


def _nb02_blocks(data: ReportData) -> list[Block]:
    p = data.kv_transfer
    assert p is not None
    per_token = p.kv_per_token_bytes
    blocks = [P(f"KV cache per token of {p.model}: {fmt_num(per_token)} bytes "
                f"({per_token / 1024:.1f} KiB), moved in blocks of {fmt_num(p.block_size)} "
                "tokens."),
              P(f"Recommended kv_buffer_device: {p.recommendation.kv_buffer_device} "
                f"({p.recommendation.reason or 'no reason recorded'}).")]
    kv = kv_table(p)
    if not kv.empty:
        blocks += [H("Predicted vs measured transfer time", 3), T(kv.map(fmt_num))]
    if p.probe.rows:
        blocks += [H("NIXL probe", 3), T(scalar_table(p.probe.rows))]
    return blocks


def _nb03_blocks(data: ReportData) -> list[Block]:
    assert data.replicated is not None
    policy = data.replicated.policy
    mixed = "measured" if "replicated" in data.mixed else "not measured"
    blocks = [P(f"Routing policy: {policy}. {_sweep_text(data.sweeps['replicated'])} Mixed "
                f"workload: {mixed}.")]
    if (said := experiment_claims(data).get("03")) is not None:
        blocks += [P("Both routing policies, the mixed workload once each at the highest "
                     "concurrency (the configured one also in the mixed sweep):"),
                   UL([c.text for c in said])]
    return blocks


def _nb04_blocks(data: ReportData) -> list[Block]:
    p = data.disaggregated
    assert p is not None
    blocks = [P(f"kv_buffer_device: {p.kv_buffer_device}. "
                f"{_sweep_text(data.sweeps['disaggregated'])}")]
    proof = p.proof
    if proof is None:
        blocks.append(W("No proof that the KV cache moved was recorded."))
    else:
        verdict = "passed" if proof.ok else "FAILED"
        text = (f"Proof that the KV cache moved: {verdict}. Greedy output equal to the baseline "
                f"for {proof.tokens_equal} of {len(proof.prompts)} prompts.")
        blocks.append(P(text) if proof.ok else W(text))
        rows = [r.model_dump() for r in proof.prompts]
        blocks += [T(scalar_table(rows))] if rows else []
    if p.front_doors is not None:
        d = p.front_doors
        blocks += [P(f"The same instances behind two front doors, one sweep point ({d.point}) "
                     f"through the lab's proxy, then through vllm-router {d.router_version}, back "
                     "to back, beside the same point through the lab proxy in 04's sweep:"),
                   T(d.frame(data.sweeps.get("disaggregated")))]
    return blocks


def _tp_blocks(data: ReportData) -> list[Block]:
    p = data.payload("tp")
    assert p is not None
    rows = p.same_output
    text = (f"Split over {p.ranks} ranks. Output against 01's: "
            f"{'passed' if p.output_ok else 'FAILED'}; {sum(r.tokens_equal for r in rows)} of "
            f"{len(rows)} prompts gave the same greedy tokens, "
            f"{sum(r.tokens_ok and not r.tokens_equal for r in rows)} parted at a near tie. "
            f"{_sweep_text(data.sweeps['tensor-parallel'])}")
    said = collective_said(p.collective)
    return [P(text) if p.output_ok else W(text), T(scalar_table([r.model_dump() for r in rows])),
            W(said) if p.not_graded else P(said)]


def _files_blocks(data: ReportData) -> list[Block]:
    rows = []
    for nb, spec in RESULTS.items():
        env = data.envelopes.get(nb)
        status = f"found, written {env.timestamp}" if env else "missing"
        rows.append({"file": spec.file_name, "notebook": spec.notebook_file,
                     "holds": FILE_MEANINGS.get(nb, ""), "status": status})
    rows += [{"file": "report.html / report.md", "notebook": "05_Benchmark_Report.ipynb",
              "holds": "this report (HTML with embedded plots; Markdown linking plots/)",
              "status": "written"},
             {"file": "plots/*.png", "notebook": "05_Benchmark_Report.ipynb",
              "holds": "the plots above", "status": "written"},
             {"file": "export/runs.csv, export/*.json", "notebook": "05_Benchmark_Report.ipynb",
              "holds": "every run (one repeat of one load point) as a CSV row, and as a JSON "
                       "file in the layout of `vllm bench serve --save-result`, in its field "
                       "names and units, for the tools that load those",
              "status": "written"}]
    return [H("What each result file means"),
            P("Every results file is one envelope: schema version, kind, notebook, UTC "
              "timestamp, profile, config snapshot (no secrets), software versions, hardware "
              "facts and the notebook's payload. The previous version of a file is kept under "
              "history/ when it is rewritten."), T(pd.DataFrame(rows))]


def _beyond_blocks() -> list[Block]:
    return [H("Beyond this lab"),
            P("Production systems add what this lab leaves out: KV-aware routing (send a "
              "request where its prefix is already cached), prefill and decode pools that "
              "scale on their own load, service discovery instead of a static config, and "
              "fault handling for lost transfers. Next reading: vLLM's disaggregated prefill "
              "and KV connector docs, NIXL's documentation, and llm-d or NVIDIA Dynamo for "
              "orchestrated disaggregated serving.")]


def report_blocks(data: ReportData, table: pd.DataFrame, concl: Conclusions,
                  plots: list[Plot], guesses: pd.DataFrame | None = None) -> list[Block]:
    """The whole report as a list of blocks (`guesses`: the attendee's, beside the
    forecast and the measurement, when any was entered)."""
    blocks = _intro(data, concl) + _missing_blocks(data) + _verdict_blocks(concl)
    blocks += _plot_blocks(plots) + _table_blocks(table, data) + _conclusion_blocks(concl)
    blocks += _comparison_blocks(concl) + forecast_blocks(data, plots)
    if guesses is not None:
        blocks += [H("Your guesses, the forecast and the measurement", 3),
                   P("What was written down before each notebook forecast and measured, beside "
                     "the lab's forecast and the measurement; 'closer' is whichever was nearer "
                     "the measurement."), T(guesses)]
    blocks += _expected_blocks(data, table)
    blocks += _calibration_blocks(data)
    sections = [("00", "environment checklist", _nb00_blocks),
                ("01", "single-instance baseline", _nb01_blocks),
                ("02", "KV cache transfer", _nb02_blocks),
                ("03", "replicated serving", _nb03_blocks),
                ("04", "disaggregated serving", _nb04_blocks),
                ("tp", "one model across the nodes (04's optional section)", _tp_blocks)]
    for nb, title, make in sections:
        found = nb in data.envelopes  # a broken sweep's envelope is dropped when loading
        blocks += [H(f"Notebook {nb}: {title}" if nb != "tp" else f"Notebook 04: {title}"),
                   *(make(data) if found else [P(f"Not run: {run_hint(nb)}.")])]
    return blocks + _files_blocks(data) + _beyond_blocks()
