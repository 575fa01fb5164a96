"""When does prefill/decode pay? A FORECAST worked out for notebooks 04 and 05: the lab's
model, fed with published GB10 figures (the Spark profile's model), compares N replicas
with every prefill/decode split of the same N nodes by goodput, over

- the prompt/output ratio: the short prompts' and the outputs' lengths, with the mixed
  workload's long prompt (one every `mixed_long_every`) as configured;
- the SLO on the ITL tail (`slo.itl_ms`: every gap between two of a request's tokens),
  from none to a bound near what the decode instance itself achieves: the long prefill a
  replica runs between two of a stream's tokens breaks it, a decode instance never
  prefills;
- the pool sizes: every xPyD split of N nodes, the best one kept.

Each case is simulated per architecture without an ITL bound, then again with each bound
set (the simulation is seeded: the same requests, counted against the bound).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from lab_utils.forecast.inputs import spark_inputs_for
from lab_utils.forecast.model import Architecture, forecast, loads_of
from lab_utils.forecast.run import EVEN, NOBODY, goodput_winner
from lab_utils.report.data import ReportData
from lab_utils.report.forecast import replicas_and_splits, spark_hop, spark_workload
from lab_utils.results.claims import claim, save_claims
from lab_utils.results.points import MARGIN
from lab_utils.util.numbers import fmt_num

# (short prompt, output) tokens: prompt/output ratios from 1 to 64
SHAPES = ((512, 512), (1024, 256), (2048, 128), (4096, 64))
# ITL bounds, as multiples of the decode instances' own ITL p99 in that case: from one
# they meet with room to one loose enough for a replica's long prefill, in most cases
ITL_BOUNDS = (1.25, 5.0, 20.0)


def _row(short: int, out: int, bound: float | None, archs: list[Architecture],
         scored: list[dict[str, Any]]) -> dict[str, Any]:
    rep = scored[0]  # replicas_and_splits puts the replicas first
    i = max(range(1, len(archs)), key=lambda k: scored[k]["request_goodput"] or 0.0)
    g_rep, g_pd = rep["request_goodput"] or 0.0, scored[i]["request_goodput"] or 0.0
    return {"prompt / output": f"{short} / {out}", "ratio": short / out, "ITL SLO ms": bound,
            "replicas": archs[0].name, "replicas' goodput (req/s)": g_rep,
            "best split": archs[i].name, "its goodput (req/s)": g_pd,
            "winner": goodput_winner(archs[i].name, g_pd, archs[0].name, g_rep),
            "P/D ITL p99 ms": scored[i]["p99_itl_ms"], "replicas' ITL p99 ms": rep["p99_itl_ms"]}


def when_pd_pays(data: ReportData, nodes: int = 2, kv_buffer_device: str = "cpu"
                 ) -> tuple[pd.DataFrame, list[str]]:
    """The table (one row per prompt/output shape and ITL SLO: the replicas' goodput, the
    best split's, the winner) and the sentences computed from it."""
    model, w0 = spark_workload(data)
    hop = spark_hop(data)
    top = max(w0.concurrency or [1])
    rows: list[dict[str, Any]] = []
    for short, out in SHAPES:
        long = max(w0.mixed_long_len or 0, 4 * short)  # the configured one, if longer
        w = w0.model_copy(update={"input_len": short, "output_len": out, "mixed_long_len": long})
        inputs = spark_inputs_for(model, w, kv_buffer_device, hop=hop)
        load = loads_of(w, mixed=True)[-1]
        load = replace(load, concurrency=top, num_prompts=max(load.num_prompts, 8 * nodes))
        archs = replicas_and_splits(nodes)
        plain = [forecast(inputs, a, load).metrics for a in archs]
        pd_tail = min(m["p99_itl_ms"] or float("inf")
                      for a, m in zip(archs, plain, strict=True) if a.disaggregated)
        for factor in (None, *ITL_BOUNDS):
            bound = None if factor is None else round(pd_tail * factor)
            scored = plain if bound is None else [
                forecast(inputs, a, replace(load, slo_itl_ms=bound)).metrics for a in archs]
            rows.append(_row(short, out, bound, archs, scored))
    frame = pd.DataFrame(rows)
    return frame, sentences(frame, nodes, model, w0)


def sentences(frame: pd.DataFrame, nodes: int, model: str, w) -> list[str]:
    """What the table says, in words (every figure from it)."""
    slo = " / ".join(f"{k} {fmt_num(v)} ms" for k, v in (("TTFT", w.slo.ttft_ms),
                                                          ("TPOT", w.slo.tpot_ms)) if v)
    bounds = ", ".join(f"{b:g}x" for b in ITL_BOUNDS)
    out = [f"FORECAST for {nodes} nodes from published GB10 figures, not a measurement "
           f"({model}, concurrency {max(w.concurrency or [1])}). Each row: short prompts and "
           f"outputs as its 'prompt / output' says, and one long prompt in every "
           f"{w.mixed_long_every} ({fmt_num(w.mixed_long_len)} tokens, or 4x the short prompt "
           "where that is longer). A request counts toward goodput only if it met every SLO"
           + (f" ({slo}" + ", and where a row sets one, the ITL SLO on every gap between two "
              "of its tokens)" if slo else "")
           + f"; the ITL SLOs tried are {bounds} the lowest ITL p99 any split reached in that "
             "shape without one."]
    pd_won = frame["winner"] == frame["best split"]
    for with_bound, what in ((False, "without an SLO on the ITL tail"),
                             (True, "with an SLO on every token gap")):
        part = frame[frame["ITL SLO ms"].notna() == with_bound]
        won = part[pd_won[part.index]]
        nobody = int((part["winner"] == NOBODY).sum())
        even = int((part["winner"] == EVEN).sum())
        where = []
        for shape, rows in won.groupby("prompt / output", sort=False):
            bounds = (", SLO " + ", ".join(fmt_num(b) for b in rows["ITL SLO ms"]) + " ms"
                      if with_bound else "")
            where.append(f"{shape} ({', '.join(dict.fromkeys(rows['best split']))}{bounds})")
        out.append(f"- {what}, P/D won goodput in {len(won)} of {len(part)} cases"
                   + "".join(f" ({n} {why})" for n, why in (
                       (even, f"where the two were within {MARGIN:.0%} of each other"),
                       (nobody, "where no architecture met every SLO")) if n)
                   + (": at prompt / output " + "; ".join(where) if where else ""))
    won = frame[pd_won]
    if len(won):
        ratio = won["its goodput (req/s)"] / won["replicas' goodput (req/s)"].where(
            won["replicas' goodput (req/s)"] > 0)
        # by the ratio of the goodputs (where the replicas met none, the largest), ties by
        # the split's own goodput
        key = list(zip(ratio.fillna(float("inf")), won["its goodput (req/s)"], strict=True))
        at = max(range(len(key)), key=lambda i: key[i])
        top, best = won.iloc[at], ratio.iloc[at]
        margin: str = ("where the replicas met none" if pd.isna(best)
                       else f"{best:.1f}x the replicas' goodput")
        out.append(f"- its largest win (by the ratio of its goodput to the replicas'; a case "
                   f"where the replicas met none ranks first): {top['best split']} at "
                   f"{top['prompt / output']}"
                   + (f" with an ITL SLO of {fmt_num(top['ITL SLO ms'])} ms"
                      if pd.notna(top["ITL SLO ms"]) else "")
                   + f": {fmt_num(top['its goodput (req/s)'])} req/s, {margin}")
    else:
        out.append("- P/D won no case here: at every shape and bound tried, the best "
                   f"split's goodput was not more than {MARGIN:.0%} above the replicas'")
    return out


def show_when_pd_pays(data: ReportData, nodes: int = 2) -> pd.DataFrame:
    """Notebooks 04 and 05: print what the forecast says, return its table for people
    (numbers formatted, no SLO shown as "none")."""
    frame, said = when_pd_pays(data, nodes)
    print("\n".join(said))
    save_claims(data.results_dir, f"when-pd:{nodes}", [claim("report", t) for t in said])
    shown = frame.drop(columns=["ratio"])
    shown["ITL SLO ms"] = shown["ITL SLO ms"].map(lambda v: "none" if pd.isna(v) else fmt_num(v))
    return shown.map(fmt_num)
