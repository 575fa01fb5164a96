"""The serving notebooks' session: what they start, and that it stops with them.

`ServingSession` starts a topology with the lab proxy in front (every architecture is
measured through the same proxy path) and stops what it started: in the notebook's last
cell, when any later cell fails or is interrupted (an IPython hook), and when the kernel
exits. Before a cell that measures what it started, it prints how long that cell should
take (`timings.cell_eta`: the cell's last runs here, else the forecast); the measuring
code itself predicts nothing. It holds the notebook's one `Cluster` (one connection per node), closed when it
stops. `tokenizer_of` is the served model's tokenizer.
"""

from __future__ import annotations

import atexit
from collections import Counter
from typing import Any

from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError
from lab_utils.kv.budget import kv_buffer_device
from lab_utils.measure.workload import server_tokenizer
from lab_utils.notebook.forecasting import TOPOLOGY
from lab_utils.notebook.starts import start_estimate
from lab_utils.notebook.timings import cell_eta
from lab_utils.serve.launcher import wait_ready
from lab_utils.serve.topology import PROXY, Served, serve, start_proxy


class ServingSession:
    """Starts topologies for one notebook and guarantees they stop with it."""

    def __init__(self, cfg: LabConfig):
        self.cfg = cfg
        self.cluster = Cluster(cfg)
        self.started: list[ProcessRecord] = []
        self.runs: Counter[str] = Counter()  # runs per name this session made (`steps.run_name`)
        self.timed: dict[str, Any] = {}  # topology -> its requests timed one at a time
        self.notebook: str | None = None  # "01", "03" or "04": what its first start says
        self._hooked = False
        atexit.register(self.stop, quiet=True)

    def start(self, topology: str) -> Served:
        """Start (or reuse) the topology and the proxy; wait until all are healthy."""
        self._hook()

        self.notebook = self.notebook or next((nb for nb, t in TOPOLOGY.items() if t == topology),
                                              None)

        found = start_estimate(self.cfg, topology)
        print(f"starting {topology} on {self.cfg.profile}: "
              + (f"about {found[0]:.0f} s ({found[1]})" if found else
                 "no start measured here yet (a vLLM instance takes 15-90 s on the CPU "
                 "rehearsal, minutes for a large model)"), flush=True)
        before = {r.name for r in self.cluster.running()}
        device = kv_buffer_device(self.cfg) if topology == "disaggregated" else None
        records = serve(self.cluster, topology, with_proxy=True, kv_buffer_device=device)
        self.started += [r for r in records if r.name not in before]
        for r in records:
            print(f"  {r.name:<12} {r.node:<12} {r.url or '(headless rank: rank 0 serves)'}")
        return Served(topology, records, device, runs=self.runs, timed=self.timed)

    def swap_front_door(self, served: Served, kind: str, policy: str | None = None) -> None:
        """Put the front door of `kind` ("lab" or "vllm-router"; `policy`: the replicated
        routing policy) in front of `served`'s instances, on the same port, replacing the
        one there; wait until it is healthy."""
        old = next(r for r in served.records if r.name == PROXY)
        rec, new = start_proxy(self.cluster, served.topology, kind=kind, policy=policy)
        if new:
            wait_ready(self.cluster, [rec], timeout=120, show_progress=False)
        served.records = [rec if r is old else r for r in served.records]
        if old in self.started or new:
            self.started = [r for r in self.started if r is not old] + [rec]

    def stop(self, quiet: bool = False) -> list[str]:
        """Stop what this session started (not instances it found running), and close the
        connections to the nodes (a later `start` opens them again)."""
        stopped = self.cluster.stop(list(reversed(self.started))) if self.started else []
        self.started = []
        self.cluster.close()
        if stopped and not quiet:
            print(f"stopped: {', '.join(stopped)}")
        return stopped

    def _hook(self) -> None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None or self._hooked:
            return
        shell.events.register("pre_run_cell", self._before_cell)
        shell.events.register("post_run_cell", self._after_cell)
        self._hooked = True

    def _before_cell(self, info) -> None:
        if self.notebook is None:  # nothing started yet
            return
        try:
            said = cell_eta(self.cfg, self.notebook, info.raw_cell or "",
                            self.timed.get("tensor-parallel"))
        except (LabError, OSError, ValueError) as e:  # an ETA never stops a cell
            said = f"no ETA ({type(e).__name__}: {e})"
        if said:
            print(f"this cell: {said}", flush=True)

    def _after_cell(self, result) -> None:
        if (result.error_in_exec or result.error_before_exec) and self.started:
            names = self.stop(quiet=True)
            print(f"a cell failed or was interrupted: stopped {', '.join(names)}. Fix the "
                  "cause and re-run from the cell that starts the topology.")


def tokenizer_of(served: Served, cfg: LabConfig):
    """Tokenize with the serving instance itself (no local copy of the model needed)."""
    return server_tokenizer(served.instance_urls()[0], cfg.model.name, api_key(cfg, "vllm"))
