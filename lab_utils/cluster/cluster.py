"""The cluster: the nodes of one profile, reached the way the config says.

`Cluster(cfg)` is what the lab acts on. It builds each node once, when first asked for
it (a `LocalNode` for this machine, an `SSHNode` for a host reached over SSH, whose one
connection is opened on first use and reused for every command), gives them the
profile's state file, tells which recorded processes still run, stops them, and closes
its connections when it is closed (use it in a `with` block). Tests hand in nodes of
their own (`nodes=`). `as_cluster` lets a function take either a config (a cluster is
built for the call and closed after it) or a cluster its caller owns.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping

from lab_utils.cluster.nodes import LocalNode, Node
from lab_utils.cluster.ssh import SSHNode
from lab_utils.cluster.state import ProcessRecord, StateFile
from lab_utils.config import LabConfig
from lab_utils.errors import LabError

log = logging.getLogger("lab_utils.cluster")


class Cluster:
    """The nodes of `cfg`'s profile, each built once; `nodes` replaces them (tests)."""

    def __init__(self, cfg: LabConfig, nodes: Mapping[str, Node] | None = None):
        self.cfg = cfg
        self.state = StateFile(cfg.results_dir / "state.json")
        self._given = nodes is not None  # then these nodes and no others
        self._nodes: dict[str, Node] = dict(nodes or {})
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        """The node names, in the config's order (those handed in, if any)."""
        return list(self._nodes) if self._given else list(self.cfg.nodes)

    def node(self, name: str) -> Node:
        """The node called `name`, built on first use and the same object after."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                if self._given or name not in self.cfg.nodes:
                    raise LabError(f"no node {name!r} in profile {self.cfg.profile}; its nodes: "
                                   f"{', '.join(self.names()) or 'none'}")
                node_cfg = self.cfg.nodes[name]
                kind = LocalNode if node_cfg.connection == "local" else SSHNode
                node = self._nodes[name] = kind(name, node_cfg, self.state)
        return node

    def nodes(self, role: str | None = None) -> list[Node]:
        """Every node, or those with `role` ("serving", "controller")."""
        return [self.node(n) for n in self.names()
                if role is None or role in self.node(n).cfg.roles]

    def serving(self) -> list[Node]:
        return self.nodes("serving")

    def knows(self, name: str) -> bool:
        return name in self.names()

    # ----- processes the lab started --------------------------------------------------
    def running(self, topology: str | None = None) -> list[ProcessRecord]:
        """The records of the profile's state file (optionally of one topology)."""
        recs = self.state.records()
        if topology:
            recs = [r for r in recs if r.extra.get("topology") == topology]
        return recs

    def alive(self, record: ProcessRecord | str) -> ProcessRecord | None:
        """The record (or the record named so) if its process still runs. A dead one is
        forgotten, with its private temporary directory, and what is left of its process
        group is stopped (and said so in the log). A record of a node this profile
        does not have is left alone and counts as not running."""
        rec = self.state.get(record) if isinstance(record, str) else record
        if rec is None or not self.knows(rec.node):
            return None
        node = self.node(rec.node)
        if not node.is_alive(rec):
            # the rest of its process group (a vLLM API server's engine core and workers)
            # would otherwise run on, orphaned, until `cleanup`
            if node.stop(rec, grace_s=min(self.cfg.vllm.stop_grace_s, 5.0)):
                log.warning("%s on node %s had died; the processes it left running (its "
                            "process group) were stopped", rec.name, rec.node)
            return None
        return rec

    def stop(self, records: list[ProcessRecord], grace_s: float | None = None) -> list[str]:
        """Stop each record's process group, in order (TERM, then KILL after `grace_s`,
        by default vllm.stop_grace_s); return the names that were running. Records of
        nodes this profile does not have are skipped."""
        grace = self.cfg.vllm.stop_grace_s if grace_s is None else grace_s
        stopped = []
        for rec in records:
            if self.knows(rec.node) and self.node(rec.node).stop(rec, grace):
                stopped.append(rec.name)
        return stopped

    # ----- connections ----------------------------------------------------------------
    def close(self) -> None:
        """Close every connection the nodes hold. A node used again reconnects, so a
        cluster can be closed whenever it goes idle."""
        with self._lock:
            nodes = list(self._nodes.values())
        for node in nodes:
            node.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Cluster({self.cfg.profile}: {', '.join(self.names())})"


@contextlib.contextmanager
def as_cluster(target: LabConfig | Cluster) -> Iterator[Cluster]:
    """The cluster given (its owner closes it), or one built from a config for the
    duration of the `with` block and closed at its end."""
    if isinstance(target, Cluster):
        yield target
        return
    with Cluster(target) as cluster:
        yield cluster
