"""The cluster: the nodes of one profile, reached the way the config says.

`get_node(cfg, name)` builds a node: a `LocalNode` for this machine, an `SSHNode` for a
host reached over SSH. Both share the state file under the profile's results directory.
"""

from __future__ import annotations

from lab_utils.cluster.nodes import LocalNode, Node
from lab_utils.cluster.ssh import SSHNode
from lab_utils.cluster.state import StateFile
from lab_utils.config import LabConfig


def state_file(cfg: LabConfig) -> StateFile:
    return StateFile(cfg.results_dir / "state.json")


def get_node(cfg: LabConfig, name: str) -> Node:
    node_cfg = cfg.nodes[name]
    if node_cfg.connection == "local":
        return LocalNode(name, node_cfg, state_file(cfg))
    return SSHNode(name, node_cfg, state_file(cfg))
