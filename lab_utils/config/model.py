"""The typed profile (`LabConfig` and its parts), the checks that span fields (node
references, roles, ports per machine, addresses by where they are used), and finding,
reading and validating the file, with errors that name the field, the value and the fix."""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import json
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic_core import ErrorDetails

from lab_utils.config import values
from lab_utils.errors import ConfigError, LabError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_DIR.parent  # the checkout, when lab_utils is used from one (editable install)
DEFAULT_PROFILE = REPO_ROOT / "configs" / "local-cpu.json"
USER_CONFIG = REPO_ROOT / "environment_config.json"
EXAMPLE_NAME = "environment_config.json.example"

Port = Annotated[int, Field(ge=1, le=65535)]
Role = Literal["baseline", "replica", "prefill", "decode"]
TOPOLOGIES = ("baseline", "replicated", "disaggregated")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SSHConfig(_Strict):
    host: str
    user: str | None = None
    port: Port = 22
    key_file: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    connect_timeout_s: float = Field(10.0, gt=0)

    _host = field_validator("host")(values.check_host)
    _user = field_validator("user")(values.check_user)


class NodeConfig(_Strict):
    connection: Literal["local", "ssh"] = "local"
    ssh: SSHConfig | None = None
    roles: list[Literal["serving", "controller"]]
    lan_address: str
    data_address: str
    data_netdev: str | None = None
    # The rate the data-plane link should run at per device, in Gb/s (200 on a Spark's
    # ConnectX-7); the checklist warns when ethtool reports less. None: not compared.
    data_link_gbps: float | None = Field(None, gt=0)
    python: str | None = None
    workdir: str | None = None
    # CUDA profiles: the toolkit whose bin/ (nvcc, ptxas) vLLM's instances get on PATH,
    # for FlashInfer/Triton kernels compiled at run time (sm_121 on GB10).
    cuda_home: str = "/usr/local/cuda"
    # A GPU profile refuses a serving node whose data_address equals its lan_address (the
    # KV cache would cross the LAN, beside everyone's traffic); true says that is meant.
    data_over_lan: bool = False

    _check_addresses = field_validator("lan_address", "data_address")(values.check_ip)

    _netdevs = field_validator("data_netdev")(values.check_netdevs)
    _absolute = field_validator("python", "cuda_home")(values.check_absolute_path)
    _workdir = field_validator("workdir")(values.check_workdir)

    def machine(self, name: str) -> str:
        """Identity of the physical machine, for port-conflict checks."""
        if self.connection == "local":
            return "this machine"
        assert self.ssh is not None
        return f"{self.ssh.host}:{self.ssh.port}"


class ModelConfig(_Strict):
    name: str
    source: Literal["hub", "tiny", "path"]
    path: str | None = None
    node_path: str | None = None
    revision: str | None = None
    dtype: Literal[values.VLLM_DTYPES] = "bfloat16"  # type: ignore[valid-type]  # Literal of a tuple: mypy cannot expand it
    tiny_seed: int = 0

    _paths = field_validator("path", "node_path")(values.check_path)
    _revision = field_validator("revision")(values.check_revision)


class InstanceSettings(_Strict):
    port: Port
    side_channel_port: Port | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    cpu_kvcache_space_gib: int | None = Field(None, gt=0)
    cpu_threads_bind: str | dict[str, str] | None = None
    max_model_len: int | None = Field(None, gt=0)
    extra_args: list[str] = []
    extra_env: dict[str, str] = {}

    _args = field_validator("extra_args")(values.check_args)
    _env = field_validator("extra_env")(values.check_env)

    _bind = field_validator("cpu_threads_bind")(values.check_threads_bind)


class VllmConfig(_Strict):
    device: Literal["cpu", "cuda"]
    max_model_len: int = Field(2048, gt=0)
    block_size: int | None = Field(None, gt=0)
    seed: int = 0
    enforce_eager: bool = False
    startup_timeout_s: float = Field(900.0, gt=0)
    stop_grace_s: float = Field(15.0, ge=0)
    extra_args: list[str] = []
    extra_env: dict[str, str] = {}
    # A file (mode 600) holding the instances' API key: their /v1 API answers 401 without
    # it. Unset: the proxy's key (proxy.api_key_file), when that is set.
    api_key_file: str | None = None
    baseline: InstanceSettings
    replica: InstanceSettings
    prefill: InstanceSettings
    decode: InstanceSettings

    _args = field_validator("extra_args")(values.check_args)
    _env = field_validator("extra_env")(values.check_env)


class KVTransferConfig(_Strict):
    connector: Literal["NixlConnector"] = "NixlConnector"
    # "auto": notebook 02's recommendation when it has run, else "cpu".
    kv_buffer_device: Literal["auto", "cpu", "cuda"] = "auto"
    ucx_tls: str | None = None
    extra_config: dict[str, Any] = {}
    # The NIXL transfer probe (notebook 02) listens here on the target node's data address.
    probe_port: Port = 5800

    _tls = field_validator("ucx_tls")(values.check_ucx_tls)


class BaselineTopology(_Strict):
    node: str


class ReplicatedTopology(_Strict):
    nodes: list[str] = Field(min_length=1)
    policy: Literal["round_robin", "least_outstanding"] = "round_robin"


class DisaggregatedTopology(_Strict):
    prefill: list[str] = Field(min_length=1)
    decode: list[str] = Field(min_length=1)


class TopologyConfig(_Strict):
    baseline: BaselineTopology
    replicated: ReplicatedTopology
    disaggregated: DisaggregatedTopology


class ProxyConfig(_Strict):
    node: str
    port: Port
    # "lab": the lab's own proxy (serve.proxy); "vllm-router": vLLM's Rust router
    # (pip package vllm-router) in its place, on the same node, port and log.
    kind: Literal["lab", "vllm-router"] = "lab"
    # the vllm-router command on the proxy node; None: the one beside the node's python
    vllm_router: str | None = None
    # where vllm-router serves its Prometheus metrics (on the proxy node's lan_address)
    router_metrics_port: Port = 29000
    api_key_file: str | None = None
    connect_timeout_s: float = Field(5.0, gt=0)
    request_timeout_s: float = Field(300.0, gt=0)
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)


class JupyterConfig(_Strict):
    # `python -m lab_utils jupyter` serves the notebooks on this port of the notebook host
    # (this machine: the local node with the controller role, at its lan_address)
    port: Port = 8888


class SLOConfig(_Strict):
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)


class WorkloadConfig(_Strict):
    input_len: int = Field(128, gt=0)
    output_len: int = Field(32, gt=0)
    concurrency: list[int] = [1, 2, 4]
    request_rates: list[float] = []
    burstiness: float = Field(1.0, gt=0)
    mixed_long_len: int | None = Field(None, gt=0)
    mixed_long_every: int = Field(8, ge=2)
    chat: bool = False
    request_timeout_s: float = Field(600.0, gt=0)
    num_prompts: int = Field(32, gt=0)
    duration_s: float | None = Field(None, gt=0)
    warmup: int = Field(2, ge=0)
    repeats: int = Field(1, ge=1)
    seed: int = 0
    max_failed_fraction: float = Field(0.0, ge=0, le=1)
    slo: SLOConfig = SLOConfig()


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


class LabConfig(_Strict):
    profile: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    description: str = ""
    results_root: str = "results"
    hf_token_file: str | None = None
    nodes: dict[str, NodeConfig] = Field(min_length=1)
    model: ModelConfig
    vllm: VllmConfig
    kv_transfer: KVTransferConfig = KVTransferConfig()
    topology: TopologyConfig
    proxy: ProxyConfig
    workload: WorkloadConfig = WorkloadConfig()
    jupyter: JupyterConfig = JupyterConfig()

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("results_root")
    @classmethod
    def _results_root(cls, v: str) -> str:
        if v.startswith("/") and values.is_system_dir(v):
            raise ValueError("is the root or a system directory; results go in a directory "
                             'of the lab\'s (e.g. "results", inside the checkout)')
        return v

    # ----- derived values -------------------------------------------------------------

    def notebook_host(self) -> str | None:
        """The node the notebooks run on: the local node with the controller role (else
        the first local node); None when every node is reached over SSH."""
        local = [n for n, node in self.nodes.items() if node.connection == "local"]
        ctl = [n for n in local if "controller" in self.nodes[n].roles]
        return next(iter(ctl or local), None)

    @property
    def source(self) -> Path | None:
        return self._source

    @property
    def source_name(self) -> str:
        """The config file as a user would type it in a command (relative to the repo)."""
        if self._source is None:
            return "F"
        try:
            return str(self._source.resolve().relative_to(REPO_ROOT))
        except ValueError:
            return str(self._source)

    def with_proxy_kind(self, kind: str) -> LabConfig:
        """This config with another `proxy.kind`, checked as if the file said so (same
        source file, so paths and the profile resolve alike)."""
        cfg = parse_config({**self.model_dump(mode="json", exclude_unset=True),
                            "proxy": {**self.proxy.model_dump(mode="json", exclude_unset=True),
                                      "kind": kind}}, str(self._source or "config"))
        cfg._source = self._source
        return cfg

    def with_policy(self, policy: str) -> LabConfig:
        """This config with another `topology.replicated.policy`, checked the same way."""
        data = self.model_dump(mode="json", exclude_unset=True)
        topo = self.topology.model_dump(mode="json", exclude_unset=True)
        topo["replicated"] = {**topo.get("replicated", {}), "policy": policy}
        cfg = parse_config({**data, "topology": topo}, str(self._source or "config"))
        cfg._source = self._source
        return cfg

    def resolve_path(self, value: str | os.PathLike) -> Path:
        """A path from the config: `~` expanded, relative paths against the checkout (the
        current directory when lab_utils is installed without one)."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (REPO_ROOT if in_checkout() else Path.cwd()) / p

    @property
    def results_dir(self) -> Path:
        return self.resolve_path(self.results_root) / self.profile

    @property
    def model_path(self) -> str:
        """What vLLM's `--model` gets: a local directory or a hub id."""
        if self.model.path:
            return str(self.resolve_path(self.model.path))
        return self.model.name

    def model_path_on(self, node: str) -> str:
        """`--model` on a node. On SSH nodes a generated or pre-placed model is at
        `model.node_path` (the same on every node: vLLM's NIXL handshake compares a hash
        that includes the model path, so prefill and decode must name the same one)."""
        if self.nodes[node].connection == "ssh" and self.model.source != "hub":
            return self.model.node_path or str(self.model.path)
        return self.model_path

    def log_dir_on(self, node: str) -> str:
        """Where processes started on a node write their logs (on that node)."""
        n = self.nodes[node]
        if n.connection == "ssh":
            return f"{n.workdir}/logs/{self.profile}"
        return str(self.results_dir / "logs")

    def probe_pair(self) -> tuple[str, str]:
        """(target, initiator) of the NIXL probe: as in P/D serving, the decode node reads
        the KV that the prefill node holds."""
        d = self.topology.disaggregated
        return d.prefill[0], d.decode[0]

    def probe_nodes(self) -> list[str]:
        """Nodes where the probe listens (the target)."""
        return [self.probe_pair()[0]]

    def instances(self, topology: str) -> list[InstanceSpec]:
        t = self.topology
        placed: list[tuple[Role, list[str]]]
        if topology == "baseline":
            placed = [("baseline", [t.baseline.node])]
        elif topology == "replicated":
            placed = [("replica", t.replicated.nodes)]
        elif topology == "disaggregated":
            placed = [("prefill", t.disaggregated.prefill), ("decode", t.disaggregated.decode)]
        else:
            raise ConfigError(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
        specs: list[InstanceSpec] = []
        for role, nodes in placed:
            settings: InstanceSettings = getattr(self.vllm, role)
            per_node: dict[str, int] = {}
            for i, node in enumerate(nodes):
                k = per_node.get(node, 0)
                per_node[node] = k + 1
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

    def snapshot(self) -> dict[str, Any]:
        """The config as plain data for results files. Secrets live in files the config
        only names; in case one was put in the config anyway, `extra_env` values with a
        secret-looking name and any occurrence of a known secret value are redacted."""
        return values.redact(self.model_dump(mode="json"), known_secrets(self))


# ----- cross-field checks ----------------------------------------------------------------


def _cross_check(cfg: LabConfig) -> list[str]:
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
            services.append((spec.node, node.lan_address, spec.port, f"HTTP port of {where}", False))
            if spec.side_channel_port is not None:
                services.append((spec.node, node.data_address, spec.side_channel_port,
                                 f"side-channel port of {where}", True))
    for name in cfg.probe_nodes():
        services.append((name, cfg.nodes[name].data_address, cfg.kv_transfer.probe_port,
                         f"NIXL probe on {name}", True))
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


# ----- loading and error messages -----------------------------------------------------


def _strip_comments(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_comments(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [_strip_comments(v) for v in value]
    return value


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at `loc` (for key suggestions)."""
    current: Any = LabConfig
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    return tp


def _fmt_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


_FIXES = {
    "lan_address": "use the node's LAN IP address (e.g. 192.168.1.11); SSH host names go in ssh.host",
    "data_address": "use the node's data-plane (ConnectX) IP address, e.g. 192.168.100.10",
    "profile": "use letters, digits, '.', '_' or '-' (it names the results directory)",
}


def _describe(err: ErrorDetails) -> str:
    loc = tuple(err["loc"])
    where = _fmt_loc(loc)
    etype = err["type"]
    if etype == "extra_forbidden":
        parent = _model_at(loc[:-1])
        key = str(loc[-1])
        known = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(known)}"
        return f"{where}: unknown key {key!r}; {hint}"
    if etype == "missing":
        return f"{where}: required field is missing; add it (see {EXAMPLE_NAME} for an example)"
    value = err.get("input")
    shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else repr(value)
    msg = err["msg"].removeprefix("Value error, ")
    fix = _FIXES.get(str(loc[-1]) if loc else "", "")
    return f"{where}: {shown} is invalid: {msg}" + (f"; {fix}" if fix else "")


def in_checkout() -> bool:
    """Whether lab_utils runs from the lab's checkout (not from a wheel without one)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "notebooks").is_dir()


def checkout_path(*parts: str) -> Path:
    """A path in the lab's checkout (notebooks, shipped profiles); a clear error when
    lab_utils was installed from a wheel, which carries the package and nothing around it."""
    if not in_checkout():
        raise LabError(
            f"{'/'.join(parts)} is part of the lab's checkout, but lab_utils is installed at "
            f"{PACKAGE_DIR} without one (from a wheel): clone the lab and install it with "
            "`pip install -e .` in the clone, or name a config with --config F / $LAB_CONFIG")
    return REPO_ROOT.joinpath(*parts)


def find_config_path(explicit: str | os.PathLike | None = None) -> Path:
    """`--config F`, else `$LAB_CONFIG`, else environment_config.json, else local-cpu."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("LAB_CONFIG")
    if env:
        return Path(env).expanduser().resolve()
    if USER_CONFIG.exists():
        return USER_CONFIG
    return checkout_path("configs", DEFAULT_PROFILE.name)


def parse_config(data: Any, source: str = "<config>") -> LabConfig:
    """Validate already-parsed JSON; raise ConfigError listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a JSON object")
    try:
        cfg = LabConfig.model_validate(_strip_comments(data))
    except ValidationError as e:
        lines = [_describe(err) for err in e.errors()]
        raise ConfigError(f"{source}: invalid config:\n  - " + "\n  - ".join(lines)) from None
    problems = _cross_check(cfg)
    if problems:
        raise ConfigError(f"{source}: invalid config:\n  - " + "\n  - ".join(problems))
    return cfg


def load_config(path: str | os.PathLike | None = None) -> LabConfig:
    """Find, read and validate the config (see `find_config_path`)."""
    p = find_config_path(path)
    if not p.exists():
        hint = (
            f"copy {EXAMPLE_NAME} to environment_config.json and fill it in"
            if p == USER_CONFIG
            else "check --config / LAB_CONFIG"
        )
        raise ConfigError(f"config file {p} does not exist; {hint}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{p}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    cfg = parse_config(data, str(p))
    cfg._source = p
    return cfg


def known_secrets(cfg: LabConfig) -> tuple[str, ...]:
    """The secret values this config can reach (the files it names, readable or not, and
    the secret environment variables), longest first, for redaction by value."""
    found = {os.environ.get(v, "") for v in values.SECRET_ENV_VARS}
    for field in _secret_files(cfg):
        with contextlib.suppress(OSError):
            found.add(cfg.resolve_path(field).read_text().strip())
    return tuple(sorted((v for v in found if len(v) >= 8), key=len, reverse=True))


def _secret_files(cfg: LabConfig) -> list[str]:
    return [f for f in (cfg.hf_token_file, cfg.proxy.api_key_file, cfg.vllm.api_key_file) if f]
