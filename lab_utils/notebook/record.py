"""Writing the serving notebooks' results: `record_baseline`, `record_replicated` and
`record_disaggregated` build each notebook's results (`lab_utils.results.payloads`) from what it
measured and write them (`lab_utils.results`); `say` prints what a cell concludes and saves
it as claims beside them.
"""

from __future__ import annotations

from pathlib import Path

from lab_utils.config import LabConfig
from lab_utils.kv.budget import kv_buffer_device
from lab_utils.results import (
    BaselinePayload,
    DisaggregatedPayload,
    FrontDoors,
    Instance,
    Proof,
    Reference,
    ReplicatedPayload,
    Roofline,
    write_results,
)
from lab_utils.results.claims import Claim, save_claims
from lab_utils.results.forecast import EngineProfile, Forecast
from lab_utils.results.payloads import Policies
from lab_utils.results.sweep import BenchmarkResult, RequestRecord
from lab_utils.serve.topology import Served


def say(cfg: LabConfig, section: str, claims: list[Claim], bullet: str = "") -> list[str]:
    """Print the claims' sentences and save the claims beside the results (`claims.json`,
    section `section`, replaced when the cell runs again), where `audit` checks them."""
    save_claims(cfg.results_dir, section, claims)
    for c in claims:
        print(f"{bullet}{c.text}")
    return [c.text for c in claims]


def instances(served: Served) -> list[Instance]:
    """The processes serving the topology, as the results record them (with their command
    lines, which carry no secret: keys go by environment)."""
    return [Instance(name=r.name, node=r.node, url=r.url, kind=r.kind, role=r.extra.get("role"),
                     argv=list(r.argv))
            for r in served.records]


def record_baseline(cfg: LabConfig, served: Served, result: BenchmarkResult, *,
                    single: RequestRecord, roofline: Roofline, reference: Reference,
                    profile: EngineProfile | None = None,
                    forecast: Forecast | None = None,
                    mixed: BenchmarkResult | None = None) -> Path:
    """Write notebook 01's results (`BaselinePayload`)."""
    return write_results(cfg, "01", BaselinePayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=mixed,
        single_request=single, roofline=roofline, reference=reference, profile=profile,
        forecast=forecast))


def record_replicated(cfg: LabConfig, served: Served, result: BenchmarkResult,
                      mixed: BenchmarkResult | None, forecast: Forecast | None = None,
                      policies: Policies | None = None) -> Path:
    """Write notebook 03's results (`ReplicatedPayload`)."""
    return write_results(cfg, "03", ReplicatedPayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=mixed,
        policy=cfg.topology.replicated.policy, forecast=forecast, policies=policies))


def record_disaggregated(cfg: LabConfig, served: Served, result: BenchmarkResult,
                         mixed: BenchmarkResult | None, proof: Proof,
                         front_doors: FrontDoors | None = None,
                         forecast: Forecast | None = None) -> Path:
    """Write notebook 04's results (`DisaggregatedPayload`)."""
    device = served.kv_buffer_device or kv_buffer_device(cfg)
    return write_results(cfg, "04", DisaggregatedPayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=mixed,
        kv_buffer_device=device, proof=proof, front_doors=front_doors, forecast=forecast))
