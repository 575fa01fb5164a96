"""What the benchmark report reads: the results of notebooks 00-04, loaded from the
profile's results directory into one `ReportData`, with the benchmark sweeps of 01, 03 and
04 parsed per architecture (standard and mixed long/short workload). Only notebook 01 is
required; a missing or broken optional file is recorded with the notebook to run. Each
notebook's payload is its typed model (`ReportData.baseline`, `.kv_transfer`, ...). Also
the vocabulary the other report modules share: the architectures and a few formatting
helpers (the metrics and their labels are `lab_utils.results.points`'s table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_utils.config import LabConfig
from lab_utils.errors import ResultsMissingError
from lab_utils.forecast import grade as g
from lab_utils.results import (
    RESULTS,
    BaselinePayload,
    DisaggregatedPayload,
    EnvironmentPayload,
    ReplicatedPayload,
    ResultsEnvelope,
    load_results,
)
from lab_utils.results.forecast import Forecast, GradeRow
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.sweep import BenchmarkResult

ARCHITECTURES = ("baseline", "replicated", "disaggregated", "tensor-parallel")
# tensor-parallel: 04's optional section, its own results file ("tp")
ARCH_NOTEBOOK = {"baseline": "01", "replicated": "03", "disaggregated": "04",
                 "tensor-parallel": "tp"}
OPTIONAL_NOTEBOOKS = ("00", "02", "03", "04", "tp")
PER_STREAM = "decode_tokens_per_s_per_stream"


@dataclass
class ReportData:
    """Everything the report reads: the envelopes found, what is missing and why, and the
    parsed sweeps per architecture (standard and mixed long/short workload)."""

    profile: str
    device: str
    results_dir: Path
    envelopes: dict[str, ResultsEnvelope]
    missing: dict[str, str]
    sweeps: dict[str, BenchmarkResult]
    mixed: dict[str, BenchmarkResult]

    def payload(self, notebook: str):
        """A notebook's payload (its model in `lab_utils.results.payloads`), None if not found."""
        env = self.envelopes.get(notebook)
        return env.payload if env else None

    @property
    def nixl_delay_us(self) -> int:
        """Notebook 04's NIXL progress delay from its config (0: none, or not recorded, as
        in results from before the setting): its threads waited in poll() between rounds
        when above 0, else polled without pause."""
        env = self.envelopes.get("04")
        return int((env.config.get("kv_transfer") or {}).get("nixl_progress_delay_us") or 0
                   if env else 0)

    @property
    def environment(self) -> EnvironmentPayload | None:
        return self.payload("00")

    @property
    def baseline(self) -> BaselinePayload | None:
        return self.payload("01")

    @property
    def kv_transfer(self) -> KvTransferPayload | None:
        return self.payload("02")

    @property
    def replicated(self) -> ReplicatedPayload | None:
        return self.payload("03")

    @property
    def disaggregated(self) -> DisaggregatedPayload | None:
        return self.payload("04")


def load_report_data(cfg: LabConfig) -> ReportData:
    """Load every results file; 01 is required (ResultsMissingError names the notebook),
    the others are optional and recorded in `missing` with the notebook to run (a file
    that is not valid results counts as missing, with the reason)."""
    envelopes = {"01": load_results(cfg, "01")}
    missing: dict[str, str] = {}
    for nb in OPTIONAL_NOTEBOOKS:
        try:
            envelopes[nb] = load_results(cfg, nb)
        except ResultsMissingError as e:
            missing[nb] = str(e)
    data = ReportData(cfg.profile, cfg.vllm.device, cfg.results_dir,
                      dict(sorted(envelopes.items())), missing, {}, {})
    for arch, nb in ARCH_NOTEBOOK.items():
        if nb in data.envelopes:
            payload = data.envelopes[nb].payload
            data.sweeps[arch] = payload.sweep
            if payload.mixed is not None:
                data.mixed[arch] = payload.mixed
    return data


def run_hint(notebook: str) -> str:
    spec = RESULTS[notebook]
    n = spec.notebook_file[:2]  # "tp" is a section of 04
    return (f"run notebooks/{spec.notebook_file} "
            f"(or `python -m lab_utils run --from {n} --to {n}`)")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def num_or_nan(value: Any) -> float:
    return float(value) if is_number(value) else math.nan


def recorded_forecasts(data: ReportData) -> dict[str, Forecast]:
    return {arch: p.forecast for arch, nb in ARCH_NOTEBOOK.items()
            if getattr(p := data.payload(nb), "forecast", None) is not None}


def graded(data: ReportData) -> dict[str, list[GradeRow]]:
    """Each recorded forecast against its notebook's sweep and mixed run."""
    return {arch: g.grade_rows(fc, {"standard": data.sweeps.get(arch),
                                    "mixed": data.mixed.get(arch)},
                               not_graded=getattr(data.payload(ARCH_NOTEBOOK[arch]), "not_graded",
                                                  None))
            for arch, fc in recorded_forecasts(data).items()}
