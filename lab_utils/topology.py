"""Topologies: the sets of vLLM instances the serving notebooks stand up.

`serve` starts a topology's instances (baseline: one; replicated: one per listed node;
disaggregated: prefill and decode instances with NixlConnector), reusing any already
running so a second call starts no duplicates, and waits until all are healthy. If
anything fails or the user interrupts, what this call started is stopped again.
`cleanup` stops everything the profile's state file lists, on every node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lab_utils.config import LabConfig
from lab_utils.launcher import start_instance, stop_records, wait_ready
from lab_utils.nodes import state_file
from lab_utils.provision import deploy
from lab_utils.state import ProcessRecord


def serve(cfg: LabConfig, *topologies: str, show_progress: bool = True) -> list[ProcessRecord]:
    """Start (or reuse) every instance of the topologies, all at once; return their
    records once all are healthy."""
    records: list[ProcessRecord] = []
    started: list[ProcessRecord] = []
    specs = [s for t in topologies for s in cfg.instances(t)]
    deploy(cfg, sorted({s.node for s in specs if cfg.nodes[s.node].connection == "ssh"}))
    try:
        for spec in specs:
            rec, new = start_instance(cfg, spec)
            records.append(rec)
            if new:
                started.append(rec)
        wait_ready(cfg, records, show_progress=show_progress)
    except BaseException:
        stop_records(cfg, started)
        raise
    return records


def running(cfg: LabConfig, topology: str | None = None) -> list[ProcessRecord]:
    """Records of the profile (optionally of one topology)."""
    recs = state_file(cfg).records()
    if topology:
        recs = [r for r in recs if r.extra.get("topology") == topology]
    return recs


def stop_topology(cfg: LabConfig, topology: str) -> list[str]:
    return stop_records(cfg, running(cfg, topology))


def cleanup(cfg: LabConfig) -> list[str]:
    """Stop everything recorded for the profile; safe to call any number of times."""
    return stop_records(cfg, running(cfg))


@contextlib.contextmanager
def topology_running(cfg: LabConfig, topology: str, *,
                     show_progress: bool = True) -> Iterator[list[ProcessRecord]]:
    """Serve `topology` for the duration of a `with` block, then stop it."""
    records = serve(cfg, topology, show_progress=show_progress)
    try:
        yield records
    finally:
        stop_records(cfg, records)


def urls(records: list[ProcessRecord], role: str) -> list[str]:
    return [r.url for r in records if r.extra.get("role") == role and r.url]
