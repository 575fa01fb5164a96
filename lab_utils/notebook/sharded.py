"""Notebook 04's optional section: the third way to use two nodes, one model split across
them (the tensor-parallel topology, `serve.tp`), started, checked against notebook 01's
output and recorded like the other architectures (its sweeps are `steps.run_sweep`'s).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError
from lab_utils.notebook.record import instances, say
from lab_utils.notebook.session import ServingSession
from lab_utils.results import (
    Reference,
    SameOutputRow,
    TensorParallelPayload,
    collective_said,
    write_results,
)
from lab_utils.results.claims import claim
from lab_utils.results.forecast import Forecast
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.serve.topology import Served
from lab_utils.serve.tp import TOPOLOGY, collective, prove_same_output


def start_tensor_parallel(cfg: LabConfig, session: ServingSession) -> Served | None:
    """Start the ranks (and the lab proxy in front of rank 0); None, saying why, when the
    profile has no tensor-parallel topology."""
    if not cfg.instances(TOPOLOGY):
        print("skipped: this profile has no tensor-parallel topology (topology.tensor_parallel "
              "and vllm.tp; configs/local-cpu.json and environment_config.json.example have "
              "both)")
        return None
    served = session.start(TOPOLOGY)
    served.collective = collective(Cluster(cfg))
    say(cfg, "tp:collective", [claim("tp", collective_said(served.collective))])
    return served


def prove_split(cfg: LabConfig, served: Served, reference: Reference) -> list[SameOutputRow]:
    """Notebook 01's reference prompts through the split model, one at a time, each judged
    against 01's greedy tokens (`serve.tp.prove_same_output`)."""
    (url,) = served.urls("tp")
    found = prove_same_output(url, cfg.model.name, reference.prompts, reference.tokens,
                              api_key=api_key(cfg, "vllm"))
    return [SameOutputRow(prompt_tokens=s.prompt_tokens, tokens_equal=s.tokens == s.baseline,
                          tokens_ok=s.verdict.ok, diverged_at=s.verdict.diverged_at,
                          divergence_margin=s.verdict.margin, tokens_why=s.verdict.why)
            for s in found]


def same_output_frame(rows: list[SameOutputRow]) -> pd.DataFrame:
    return pd.DataFrame([{"prompt tokens": r.prompt_tokens, "same tokens as 01": r.tokens_equal,
                          "diverged at output token (from 0)": r.diverged_at, "log-probability gap (nats)": r.divergence_margin,
                          "tokens": r.tokens_why, "ok": r.tokens_ok} for r in rows])


def require_same_output(rows: list[SameOutputRow]) -> None:
    """Raise, with each failing prompt's reason, unless every prompt passed."""
    bad = [f"prompt {i} ({r.prompt_tokens} tokens): {r.tokens_why}"
           for i, r in enumerate(rows) if not r.tokens_ok]
    if not rows or bad:
        raise LabError("the split model's output is not 01's: " + ("; ".join(bad) or "no prompt"))


def record_tensor_parallel(cfg: LabConfig, served: Served, result: BenchmarkResult,
                           mixed: BenchmarkResult | None, same: list[SameOutputRow],
                           forecast: Forecast | None = None) -> Path:
    """Write the section's results (tensor_parallel_metrics.json, `TensorParallelPayload`)."""
    ranks = len([r for r in served.instance_records() if r.extra.get("role") == "tp"])
    return write_results(cfg, "tp", TensorParallelPayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=mixed,
        ranks=ranks, same_output=same, forecast=forecast, collective=served.collective))
