"""Checks that span fields of a profile: node references and their roles, what SSH
nodes need, addresses judged by where they are used, and ports that must be distinct on
one machine. Each problem names the field, the value and the fix."""

from __future__ import annotations

import difflib
import ipaddress

from lab_utils.config import values
from lab_utils.config.parts import NodeConfig
from lab_utils.config.schema import LabConfig
from lab_utils.config.topology import TOPOLOGIES


def _tensor_parallel_problems(cfg: LabConfig, node_ref) -> list[str]:
    """The tensor-parallel topology and its ranks' settings come together; one rank per
    distinct serving node; on a GPU profile each names its data-plane interface to NCCL."""
    tp, out = cfg.topology.tensor_parallel, []
    if (tp is None) != (cfg.vllm.tp is None):
        have, need = (("topology.tensor_parallel", "vllm.tp") if tp else
                      ("vllm.tp", "topology.tensor_parallel"))
        out.append(f"{need}: missing; {have} is set and the tensor-parallel topology needs both "
                   '(e.g. "tensor_parallel": {"nodes": ["spark-01", "spark-02"], '
                   '"master_port": 29500} and vllm.tp {"port": 8500}), or drop ' + have)
    if tp is None:
        return out
    for i, n in enumerate(tp.nodes):
        node_ref(f"topology.tensor_parallel.nodes[{i}]", n, "serving")
    if len(set(tp.nodes)) != len(tp.nodes):
        out.append(f"topology.tensor_parallel.nodes: {tp.nodes} names a node twice; one rank "
                   "per node (vLLM's multi-node launcher runs one rank per --node-rank)")
    if cfg.vllm.device == "cuda":
        for n in tp.nodes:
            if n in cfg.nodes and not cfg.nodes[n].data_ifname:
                out.append(
                    f"nodes.{n}.data_ifname: missing; the tensor-parallel ranks give NCCL and "
                    "Gloo the interface of the data-plane link (NCCL_SOCKET_IFNAME), else they "
                    "may pick the LAN: name the interface that holds data_address, as "
                    "`ibdev2netdev` shows it (e.g. \"enp1s0f1np1\")")
    return out


def cross_check(cfg: LabConfig) -> list[str]:
    """Every problem that spans fields, each naming the field, the value and the fix;
    [] when there is none."""
    problems: list[str] = []
    names = list(cfg.nodes)

    def node_ref(field: str, name: str, need_role: str | None) -> None:
        if name not in cfg.nodes:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known nodes: {', '.join(names)}"
            problems.append(f"{field}: node {name!r} is not defined under `nodes`; {hint}")
        elif need_role and need_role not in cfg.nodes[name].roles:
            problems.append(
                f"{field}: node {name!r} does not have the role {need_role!r}; "
                f'add "{need_role}" to nodes.{name}.roles or pick another node'
            )

    t = cfg.topology
    node_ref("topology.baseline.node", t.baseline.node, "serving")
    for i, n in enumerate(t.replicated.nodes):
        node_ref(f"topology.replicated.nodes[{i}]", n, "serving")
    for side in ("prefill", "decode"):
        for i, n in enumerate(getattr(t.disaggregated, side)):
            node_ref(f"topology.disaggregated.{side}[{i}]", n, "serving")
    node_ref("proxy.node", cfg.proxy.node, "controller")
    problems += _tensor_parallel_problems(cfg, node_ref)

    for role in ("baseline", "replica", "prefill", "decode", "tp"):
        bind = getattr(getattr(cfg.vllm, role), "cpu_threads_bind", None)
        if isinstance(bind, dict):  # a binding for a node that is not there binds nothing
            for name in bind:
                node_ref(f"vllm.{role}.cpu_threads_bind", name, None)

    for name, node in cfg.nodes.items():
        if node.connection == "ssh" and node.ssh is None:
            problems.append(
                f"nodes.{name}.ssh: missing; a node with connection \"ssh\" needs an ssh block "
                '(e.g. {"host": "192.168.1.11", "user": "lab"})'
            )
        if node.connection == "ssh" and not node.python:
            problems.append(
                f"nodes.{name}.python: missing; an SSH node needs the Python interpreter to "
                'run there (e.g. "/home/lab/spark-disagg-lab/.venv/bin/python")'
            )
        if node.connection == "ssh" and not (node.workdir or "").startswith("/"):
            problems.append(
                f"nodes.{name}.workdir: {node.workdir!r} is invalid: an SSH node needs an "
                'absolute directory for the lab\'s code and logs (e.g. "/home/lab/spark-disagg-lab")'
            )
    ssh_serving = [n for n, c in cfg.nodes.items() if c.connection == "ssh" and "serving" in c.roles]
    remote_path = cfg.model.node_path or (cfg.model.path if cfg.model.source == "path" else None)
    if ssh_serving and cfg.model.source != "hub" and not (remote_path or "").startswith("/"):
        problems.append(
            f"model.node_path: {cfg.model.node_path!r} is invalid: serving nodes reached over SSH "
            f"({', '.join(ssh_serving)}) need an absolute path where the model is (or is copied) "
            'on every node, the same on each (e.g. "/home/lab/models/tiny-llama")'
        )
    if cfg.proxy.kind == "vllm-router" and cfg.proxy.api_key_file:
        problems.append(
            "proxy.api_key_file: set with proxy.kind \"vllm-router\", which does not check its "
            "clients' key (its own --api-key is the one it sends to workers); keep the key with "
            "proxy.kind \"lab\", or move it to vllm.api_key_file (the instances' key, which "
            "vllm-router sends them) and drop proxy.api_key_file"
        )
    for role in ("prefill", "decode"):
        if getattr(cfg.vllm, role).side_channel_port is None:
            problems.append(
                f"vllm.{role}.side_channel_port: missing; NixlConnector needs a side-channel "
                "port per instance (e.g. 5600 for prefill, 5700 for decode)"
            )
    tls = cfg.kv_transfer.ucx_tls
    if cfg.vllm.device == "cuda" and tls and not values.tls_enables_cuda(tls):
        problems.append(
            f"kv_transfer.ucx_tls: {tls!r} is refused on a CUDA profile: it enables no CUDA "
            "transport, and nixl's UCX backend refuses such a UCX_TLS on a node with a GPU "
            "unless UCX can register GPU memory without one (GPUDirect RDMA, which a DGX "
            "Spark lacks): \"does not enable CUDA memory support\", then NIXL_ERR_BACKEND; add "
            'cuda_copy (e.g. "rc,cuda_copy"), or leave ucx_tls null for UCX\'s own choice'
        )
    if cfg.kv_transfer.lower_nixl_threads and cfg.vllm.device == "cuda":
        problems.append(
            "kv_transfer.lower_nixl_threads: true with vllm.device \"cuda\"; it is for the CPU "
            "rehearsal, where NIXL's busy progress threads take the engines' cores. On a GPU "
            "node the thread costs one of many cores and drives the KV transfers, so it keeps "
            "its priority there: set it to null or false")
    problems += _address_problems(cfg)
    problems += values.control_characters(cfg.model_dump(mode="json"))
    if problems:
        return problems  # port checks need valid node references
    for topo in TOPOLOGIES:
        for spec in cfg.instances(topo):
            for what, port in (("port", spec.port), ("side_channel_port", spec.side_channel_port)):
                if port is not None and port > 65535:
                    problems.append(
                        f"vllm.{spec.role}.{what}: {spec.name} on {spec.node} would get port "
                        f"{port} (the role's port + {spec.index}, one per instance on a node), "
                        "past 65535; lower the role's port")
    if problems:
        return problems

    # Services on one machine need distinct ports: HTTP ports of all topologies (so any
    # two topologies can run side by side) and the proxy may share a port number only on
    # different bind addresses; NIXL side-channel ports must be unique per machine.
    services: list[tuple[str, str, int, str, bool]] = []
    for topo in TOPOLOGIES:
        for spec in cfg.instances(topo):
            node = cfg.nodes[spec.node]
            where = f"{spec.name} on {spec.node}"
            if not spec.headless:  # a rank other than 0 serves no HTTP
                services.append((spec.node, node.lan_address, spec.port, f"HTTP port of {where}",
                                 False))
            if spec.side_channel_port is not None:
                services.append((spec.node, node.data_address, spec.side_channel_port,
                                 f"side-channel port of {where}", True))
    if cfg.topology.tensor_parallel is not None:
        rdv = cfg.topology.tensor_parallel.nodes[0]
        services.append((rdv, cfg.nodes[rdv].data_address, cfg.topology.tensor_parallel.master_port,
                         f"tensor-parallel rendezvous on {rdv}", True))
    target = cfg.probe_pair()[0]  # the probe listens on its target only
    services.append((target, cfg.nodes[target].data_address, cfg.kv_transfer.probe_port,
                     f"NIXL probe on {target}", True))
    proxy_node = cfg.nodes[cfg.proxy.node]
    services.append((cfg.proxy.node, proxy_node.lan_address, cfg.proxy.port,
                     f"proxy on {cfg.proxy.node}", False))
    if cfg.proxy.kind == "vllm-router":
        services.append((cfg.proxy.node, proxy_node.lan_address, cfg.proxy.router_metrics_port,
                         f"vllm-router's metrics (proxy.router_metrics_port) on {cfg.proxy.node}",
                         False))
    if (host := cfg.notebook_host()) is not None:
        services.append((host, cfg.nodes[host].lan_address, cfg.jupyter.port,
                         f"JupyterLab (jupyter.port) on {host}", False))
    for i, (node_a, addr_a, port_a, what_a, side_a) in enumerate(services):
        machine = cfg.nodes[node_a].machine(node_a)
        for node_b, addr_b, port_b, what_b, side_b in services[:i]:
            if port_a != port_b or cfg.nodes[node_b].machine(node_b) != machine:
                continue
            if addr_a != addr_b and not (side_a or side_b):
                continue
            kind = ("side-channel port shared by two instances on one host" if side_a and side_b
                    else "two services on one host and port")
            problems.append(
                f"port {port_a} on {machine}: {kind}: {what_b} and {what_a}; give each its own "
                "port (side-channel ports must be unique per instance on a host)"
            )
            break
    return problems


def loopback_problems(name: str, node: NodeConfig, ssh_host: str) -> list[str]:
    """A node reached over SSH at a host other than this machine cannot serve on a loopback
    address (the other nodes would reach their own loopback). `ssh_host` is the address SSH
    connects to; a host name is judged once ~/.ssh/config and DNS have resolved it."""
    try:
        if ipaddress.ip_address(ssh_host).is_loopback:
            return []
    except ValueError:
        return []
    return [f"nodes.{name}.{field}: {getattr(node, field)!r} is a loopback address on a node "
            f"reached over SSH at {ssh_host}: the other nodes cannot reach it there; use the "
            "node's own address on that network"
            for field in ("lan_address", "data_address")
            if ipaddress.ip_address(getattr(node, field)).is_loopback]


def _address_problems(cfg: LabConfig) -> list[str]:
    """Addresses that are valid IPs but wrong for where they are used."""
    problems = []
    for name, node in cfg.nodes.items():
        if node.connection == "ssh" and node.ssh is not None:
            problems += loopback_problems(name, node, node.ssh.host)
        if (cfg.vllm.device == "cuda" and "serving" in node.roles
                and node.data_address == node.lan_address and not node.data_over_lan):
            problems.append(
                f"nodes.{name}.data_address: {node.data_address!r} equals its lan_address: the "
                "KV cache would cross the LAN (and NIXL's unauthenticated side channel would "
                "listen there); use the ConnectX-7 link's address, or set "
                f"nodes.{name}.data_over_lan: true if that is really meant")
    return problems
