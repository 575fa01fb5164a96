"""The cluster: the machines the lab acts on, and what it puts there.

- `cluster`: `Cluster`, the nodes of a profile (each built once), its processes, its connections.
- `nodes`: the one interface to a node (run a command, start a detached process, stop it
  by process group, copy a file, check a port), and `LocalNode` for this machine.
- `ssh`: `SSHNode`, the same interface over SSH (paramiko), one connection per node, host keys verified.
- `state`: the state file, every process the lab started and how to find it again.
- `provision`: the lab's code and the model onto the nodes (`deploy`, `model fetch`).
- `tiny_model`: the rehearsal's tiny Llama model, generated with no download.

Code that runs *on* the nodes (process tools, node facts, the NIXL probe's agent) is in
`lab_utils.on_node`.
"""

from lab_utils.cluster import tiny_model
from lab_utils.cluster.cluster import Cluster, as_cluster
from lab_utils.cluster.nodes import LocalNode, Node, RunResult
from lab_utils.cluster.provision import deploy, model_fetch
from lab_utils.cluster.state import ProcessRecord, StateFile

__all__ = ["Cluster", "LocalNode", "Node", "ProcessRecord", "RunResult", "StateFile",
           "as_cluster", "deploy", "model_fetch", "tiny_model"]
