"""What a topology's instances are and where they run, derived from the profile's parts:
the instances of each topology (role, node, ports). `LabConfig.instances` calls this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lab_utils.config.parts import InstanceSettings, TopologyConfig, VllmConfig
from lab_utils.errors import ConfigError

Role = Literal["baseline", "replica", "prefill", "decode", "tp"]
TOPOLOGIES = ("baseline", "replicated", "disaggregated", "tensor-parallel")


@dataclass(frozen=True)
class InstanceSpec:
    """One vLLM instance of a topology: where it runs and on which ports."""

    name: str
    topology: str
    role: Role
    node: str
    index: int
    port: int
    side_channel_port: int | None
    settings: InstanceSettings
    # a rank of one model across nodes (tensor-parallel): its rank, how many there are,
    # and where rank 0 holds the rendezvous (its node, the port); None for a whole instance
    rank: int | None = None
    ranks: int = 1
    master: tuple[str, int] | None = None

    @property
    def headless(self) -> bool:
        """A rank other than 0: no API server, no HTTP port of its own."""
        return bool(self.rank)

    @property
    def cpu_bind(self) -> str | None:
        """Its VLLM_CPU_OMP_THREADS_BIND on the CPU build (the node's, where it is set per
        node); None where none is set."""
        bind = self.settings.cpu_threads_bind
        return bind.get(self.node) if isinstance(bind, dict) else bind


def instances(layout: TopologyConfig, vllm: VllmConfig, topology: str) -> list[InstanceSpec]:
    """The instances of one topology: one per node listed for each of its roles, with the
    role's ports plus one per instance already on that node."""
    if topology == "tensor-parallel":
        return _ranks(layout, vllm)
    placed: dict[str, list[tuple[Role, list[str]]]] = {
        "baseline": [("baseline", [layout.baseline.node])],
        "replicated": [("replica", layout.replicated.nodes)],
        "disaggregated": [("prefill", layout.disaggregated.prefill),
                          ("decode", layout.disaggregated.decode)]}
    if topology not in placed:
        raise ConfigError(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    specs: list[InstanceSpec] = []
    for role, nodes in placed[topology]:
        settings: InstanceSettings = getattr(vllm, role)
        for i, node in enumerate(nodes):
            k = nodes[:i].count(node)  # instances of this role already on that node
            side = settings.side_channel_port
            specs.append(
                InstanceSpec(
                    name=f"{role}-{i}",
                    topology=topology,
                    role=role,
                    node=node,
                    index=i,
                    port=settings.port + k,
                    side_channel_port=None if side is None else side + k,
                    settings=settings,
                )
            )
    return specs


def _ranks(layout: TopologyConfig, vllm: VllmConfig) -> list[InstanceSpec]:
    """The tensor-parallel topology's ranks, one per node; none when the profile has no
    such topology (`serve` says what to add)."""
    tp, settings = layout.tensor_parallel, vllm.tp
    if tp is None or settings is None:
        return []
    return [InstanceSpec(name=f"tp-{rank}", topology="tensor-parallel", role="tp", node=node,
                         index=rank, port=settings.port, side_channel_port=None,
                         settings=settings, rank=rank, ranks=len(tp.nodes),
                         master=(tp.nodes[0], tp.master_port))
            for rank, node in enumerate(tp.nodes)]
