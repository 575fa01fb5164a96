"""Start, watch and stop vLLM instances on the nodes.

`server_command` and `server_env` build what an instance runs with: the OpenAI API
server module (it works for both the CUDA and the CPU build, whose `vllm` console script
is broken), the node's LAN address for HTTP, and for prefill/decode the NixlConnector
with the side channel on the node's data-plane address and its own port; the environment
has HF_HUB_OFFLINE=1 (the model is put on the node before start) and, on a CUDA profile,
CUDA_HOME with its bin on PATH (run-time kernel compilation). Secrets (the HF token, the
instances' API key as VLLM_API_KEY) reach the process through its environment, never its
command line. With a key, every route but /health and /metrics wants it
(`lab_utils.on_node.api_guard`, loaded with --middleware). A rank of the tensor-parallel
topology runs `vllm serve` as a module instead (`lab_utils.on_node.vllm_serve`: vLLM's
multi-node launcher), with the rendezvous on rank 0's data-plane address (`rank_args`)
and the data-plane interface named to NCCL and Gloo (`rank_env`); only rank 0 serves
HTTP, the others run headless, with no URL. `start_instance` refuses a
port already taken (naming the holder) and reuses an instance that is already running;
each instance gets its own TMPDIR (its ZMQ sockets and rendezvous files), removed when it
is stopped;
`wait_ready` polls `/health` with a progress bar while checking the process is alive,
shows each waiting instance's start-up step from its log (`serve.startup`: a first start
may be compiling kernels, silent for minutes, which is not a hang), and on death raises
with the log tail and the fix for any known failure in it.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
from typing import Any

import httpx

from lab_utils import known_failures
from lab_utils.cluster import Cluster, Node
from lab_utils.cluster.provision import ensure_model_on
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import PACKAGE_DIR, InstanceSpec, LabConfig, api_key, hf_token
from lab_utils.errors import ProcessFailedError
from lab_utils.kv.budget import choose_buffer_device
from lab_utils.measure.loadgen import auth_headers
from lab_utils.serve import startup
from lab_utils.util import interrupts
from lab_utils.util.progress import progress_bar

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# `vllm serve` for the ranks of one model across nodes (see the module)
SERVE_MODULE = "lab_utils.on_node.vllm_serve"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# vLLM wants the key only under /v1, /v2, /inference and /cohere; this wants it elsewhere too
KEY_GUARD = "lab_utils.on_node.api_guard.RequireKey"
# the directory whose sitecustomize sets NIXL's progress-thread delay, and its variable
NIXL_SITE = "lab_utils/on_node/nixl_site"
NIXL_DELAY_ENV = "LAB_NIXL_PROGRESS_DELAY_US"
BASE_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]


def instance_url(cfg: LabConfig, spec: InstanceSpec) -> str | None:
    """Where its API answers; None for a headless rank (only rank 0 serves HTTP)."""
    return None if spec.headless else f"http://{cfg.nodes[spec.node].lan_address}:{spec.port}"


def rank_args(cfg: LabConfig, spec: InstanceSpec) -> list[str]:
    """A tensor-parallel rank's part of `vllm serve`: the model split over `ranks` nodes
    by vLLM's own launcher (`mp` backend, no Ray), rank 0 hosting the rendezvous on its
    data-plane address; the other ranks are headless."""
    assert spec.rank is not None and spec.master is not None  # a rank's spec
    node, port = spec.master
    args = ["--tensor-parallel-size", str(spec.ranks), "--distributed-executor-backend", "mp",
            "--nnodes", str(spec.ranks), "--node-rank", str(spec.rank),
            "--master-addr", cfg.nodes[node].data_address, "--master-port", str(port)]
    return args + (["--headless"] if spec.headless else [])


def kv_transfer_config(cfg: LabConfig, spec: InstanceSpec, *,
                       kv_buffer_device: str | None = None) -> dict | None:
    """NixlConnector's settings for a prefill or decode instance (None for the others).
    `kv_buffer_device` is the one the caller resolved (`kv.budget.choose_buffer_device`);
    without it, the configured one ("cpu" for "auto": nothing measured was passed)."""
    role = KV_ROLES.get(spec.role)
    if role is None:
        return None
    out: dict[str, Any] = {
        "kv_connector": cfg.kv_transfer.connector,
        "kv_role": role,
        "kv_buffer_device": kv_buffer_device or choose_buffer_device(cfg, None),
    }
    if cfg.kv_transfer.extra_config:
        out["kv_connector_extra_config"] = cfg.kv_transfer.extra_config
    return out


def buffer_device(argv: list[str]) -> str | None:
    """The kv_buffer_device a vLLM command line gives NIXL (None: no KV connector)."""
    if "--kv-transfer-config" not in argv:
        return None
    return json.loads(argv[argv.index("--kv-transfer-config") + 1]).get("kv_buffer_device")


def server_command(cluster: Cluster, spec: InstanceSpec, *,
                   kv_buffer_device: str | None = None) -> list[str]:
    cfg = cluster.cfg
    node = cfg.nodes[spec.node]
    s = spec.settings
    python = cluster.node(spec.node).python
    if spec.rank is None:
        argv = [python, "-m", API_SERVER_MODULE, "--model", cfg.model_path_on(spec.node)]
    else:  # `vllm serve MODEL`: the positional model, then the same flags
        argv = [python, "-m", SERVE_MODULE, cfg.model_path_on(spec.node)]
    argv += ["--served-model-name", cfg.model.name]
    if not spec.headless:
        argv += ["--host", node.lan_address, "--port", str(spec.port)]
    argv += [
        "--max-model-len", str(s.max_model_len or cfg.vllm.max_model_len),
        "--dtype", cfg.model.dtype,
        "--seed", str(cfg.vllm.seed),
    ]
    if cfg.model.revision:
        argv += ["--revision", cfg.model.revision]
    if cfg.vllm.block_size:
        argv += ["--block-size", str(cfg.vllm.block_size)]
    if cfg.vllm.device == "cuda" and s.gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if cfg.vllm.enforce_eager:
        argv.append("--enforce-eager")
    kv = kv_transfer_config(cfg, spec, kv_buffer_device=kv_buffer_device)
    if kv:
        argv += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    if spec.rank is not None:
        argv += rank_args(cfg, spec)
    if api_key(cfg, "vllm") and not spec.headless:  # the key on every route but /health, /metrics
        argv += ["--middleware", KEY_GUARD]
    return argv + list(cfg.vllm.extra_args) + list(s.extra_args)


def server_env(cfg: LabConfig, spec: InstanceSpec) -> dict[str, str]:
    """The instance's environment (added to the node's): offline Hugging Face (the model
    is on the node before it starts), CUDA's tools on PATH on a CUDA profile (PATH is
    replaced, not extended: the toolkit's bin, the node Python's bin, the system dirs),
    the CPU build's KV space and thread binding, NIXL's side channel and UCX settings,
    and for a prefill or decode instance NIXL's progress-thread delay when the profile sets
    one (`LabConfig.nixl_progress_delay_us`)."""
    node = cfg.nodes[spec.node]
    python = node.python or sys.executable
    s = spec.settings
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
           # start_instance puts the model (a hub model's snapshot) on the node first
           "HF_HUB_OFFLINE": "1"}
    if cfg.vllm.device == "cuda":
        env["CUDA_HOME"] = node.cuda_home
        env["PATH"] = ":".join([f"{node.cuda_home}/bin", posixpath.dirname(python), *BASE_PATH])
    if cfg.vllm.device == "cpu":
        if s.cpu_kvcache_space_gib:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kvcache_space_gib)
        if spec.cpu_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_bind
    if spec.role in KV_ROLES:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = node.data_address
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(spec.side_channel_port)
        if cfg.kv_transfer.ucx_tls:
            env["UCX_TLS"] = cfg.kv_transfer.ucx_tls
        if node.data_netdev:
            env["UCX_NET_DEVICES"] = node.data_netdev
    if spec.rank is not None:
        env.update(rank_env(cfg, spec))
    env.update(cfg.vllm.extra_env)
    env.update(s.extra_env)
    token = hf_token(cfg)
    if token:
        env["HF_TOKEN"] = token
    # the lab's code: the deployed copy on an SSH node
    lab = (node.workdir or "") if node.connection == "ssh" else str(PACKAGE_DIR.parent)
    first = []  # what goes before the node's PYTHONPATH
    if spec.role in KV_ROLES and cfg.nixl_progress_delay_us() > 0:
        # its sitecustomize sets NIXL's progress-thread delay in every process of the
        # instance (lab_utils/on_node/nixl_site)
        env[NIXL_DELAY_ENV] = str(cfg.nixl_progress_delay_us())
        first.append(posixpath.join(lab, NIXL_SITE))
    # vLLM's API server requires it on /v1 (read from VLLM_API_KEY: never on the command
    # line, which `ps` shows and the state file records)
    key = api_key(cfg, "vllm")
    if key:
        env["VLLM_API_KEY"] = key
    # the lab's code: on_node.unit, which leads the instance's group, SERVE_MODULE for a
    # rank and KEY_GUARD where a key is set (after the sitecustomize directory)
    env["PYTHONPATH"] = ":".join(p for p in (*first, lab, env.get("PYTHONPATH") or (
        os.environ.get("PYTHONPATH", "") if node.connection == "local" else "")) if p)
    return env


def nccl_log(cfg: LabConfig, node: str, name: str, pid: str = "%p") -> str:
    """Where a rank's NCCL writes its lines (NCCL_DEBUG_FILE, one file per process: NCCL
    puts %p's PID in). NCCL line-buffers that file; on stdout, redirected to the log, C's
    stdio would hold its lines back in blocks until the process ends."""
    return posixpath.join(cfg.log_dir_on(node), f"{name}-nccl.{pid}.log")


def nccl_lines(cfg: LabConfig, node: Node, rec: ProcessRecord) -> str:
    """What a rank's NCCL wrote to its files (`nccl_log`), '' when there are none."""
    got = node.run(["sh", "-c", f"cat {nccl_log(cfg, rec.node, rec.name, '*')} 2>/dev/null; true"],
                   timeout=30)
    return got.stdout if got.ok else ""


def rank_env(cfg: LabConfig, spec: InstanceSpec) -> dict[str, str]:
    """What a tensor-parallel rank needs to find the others over the data-plane link:
    VLLM_HOST_IP (the node's own address as vLLM reports it) and, where the profile names
    the interface that holds data_address, GLOO_SOCKET_IFNAME (torch's CPU collectives,
    the whole TP traffic on the CPU build) and on a CUDA profile NCCL_SOCKET_IFNAME
    ("=" + name: exactly that interface, NCCL's bootstrap and its socket fallback) and
    NCCL_IB_HCA ("=" + data_netdev: exactly those RDMA devices and ports, both halves of
    a Spark's ConnectX-7 port, for the all-reduces over RoCE), with NCCL_DEBUG=INFO for
    its INIT and NET lines (which network it chose) in their own file (`nccl_log`)."""
    node = cfg.nodes[spec.node]
    env = {"VLLM_HOST_IP": node.data_address}
    if node.data_ifname:
        env["GLOO_SOCKET_IFNAME"] = node.data_ifname
    if cfg.vllm.device == "cuda":
        # NCCL says which network it chose only at INFO; INIT,NET keeps it to those lines
        # (serve.startup.collective reads them: an RDMA run or a fall-back to sockets)
        env |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                "NCCL_DEBUG_FILE": nccl_log(cfg, spec.node, spec.name)}
        if node.data_ifname:
            env["NCCL_SOCKET_IFNAME"] = "=" + node.data_ifname
        if node.data_netdev:
            env["NCCL_IB_HCA"] = "=" + node.data_netdev
    return env


def healthy(url: str, timeout: float = 2.0, api_key: str | None = None) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=timeout,
                         headers=auth_headers(api_key)).status_code == 200
    except httpx.HTTPError:
        return False


def start_instance(cluster: Cluster, spec: InstanceSpec, *,
                   kv_buffer_device: str | None = None) -> tuple[ProcessRecord, bool]:
    """Start one instance; return (record, started_now). A running one is reused."""
    cfg, node = cluster.cfg, cluster.node(spec.node)
    existing = cluster.alive(spec.name)
    if existing is not None:
        return existing, False
    node_cfg = cfg.nodes[spec.node]
    if not spec.headless:
        node.ensure_port_free(node_cfg.lan_address, spec.port, f"vLLM instance {spec.name}")
    if spec.rank == 0 and spec.master is not None:  # torch's store listens on every address
        node.ensure_port_free("0.0.0.0", spec.master[1],
                              "the tensor-parallel rendezvous (topology.tensor_parallel.master_port)")
    if spec.side_channel_port is not None:
        node.ensure_port_free(node_cfg.data_address, spec.side_channel_port,
                              f"the NIXL side channel of {spec.name}")
    ensure_model_on(cluster, spec.node)
    if spec.rank is not None and cfg.vllm.device == "cuda":  # an earlier start's NCCL lines
        node.run(["sh", "-c", "rm -f " + nccl_log(cfg, spec.node, spec.name, "*")])
    tmp = node.private_tmp(spec.name)  # removed when the instance is stopped
    try:
        rec = node.start_detached(
            spec.name, server_command(cluster, spec, kv_buffer_device=kv_buffer_device),
            env={"TMPDIR": tmp, **server_env(cfg, spec)},
            log_path=f"{cfg.log_dir_on(spec.node)}/{spec.name}.log", kind="vllm",
            unit_grace_s=cfg.vllm.stop_grace_s,
            port=None if spec.headless else spec.port, url=instance_url(cfg, spec),
            extra={"topology": spec.topology, "role": spec.role,
                   "side_channel_port": spec.side_channel_port, "tmpdir": tmp,
                   **({"rank": spec.rank, "ranks": spec.ranks} if spec.rank is not None else {})},
        )
    except BaseException:
        node.remove_private_tmp(tmp)
        raise
    return rec, True


def process_failure(node: Node, rec: ProcessRecord, why: str) -> ProcessFailedError:
    tail = node.log_tail(rec, 40)
    full = node.log_tail(rec, 400)
    fix = known_failures.explain(full)
    msg = f"{rec.kind} process {rec.name} on node {rec.node} {why}.\nLog: {rec.log_path}\n--- last lines ---\n{tail}"
    if fix:
        msg += f"\n--- known failure ---\n{fix}"
    return ProcessFailedError(msg)


def wait_ready(cluster: Cluster, records: list[ProcessRecord], timeout: float | None = None,
               show_progress: bool = True) -> dict[str, float]:
    """Poll every instance's /health until all answer; return seconds to ready per name.
    A headless rank (no URL) is watched for being alive, and is ready with the rest."""
    timeout = timeout or cluster.cfg.vllm.startup_timeout_s
    t0 = time.monotonic()
    pending = {r.name: r for r in records}
    ready: dict[str, float] = {}
    nodes = {r.node: cluster.node(r.node) for r in records}
    keys = {s: api_key(cluster.cfg, s) for s in ("proxy", "vllm")}
    watch = startup.Watch()
    with progress_bar(total=len(records), desc="waiting for vLLM /health", unit="instance",
                      disable=not show_progress) as bar:
        while pending:
            interrupts.check()
            for name, rec in list(pending.items()):
                node = nodes[rec.node]
                served = [r for r in pending.values() if r.url]
                # a headless rank is ready once the ranks it serves with are up
                if (rec.url is None and not served and node.is_alive(rec)) or (
                        rec.url is not None and healthy(
                            rec.url, api_key=keys["proxy" if rec.kind == "proxy" else "vllm"])):
                    ready[name] = time.monotonic() - t0
                    del pending[name]
                    bar.update(1)
                elif not node.is_alive(rec):
                    # what it left running (its engine core, workers) is stopped too
                    orphans = node.stop(rec, grace_s=min(cluster.cfg.vllm.stop_grace_s, 5.0))
                    raise process_failure(node, rec, "exited before it became ready" + (
                        " (the processes it left running were stopped)" if orphans else ""))
            if pending and time.monotonic() - t0 > timeout:
                rec = next(iter(pending.values()))
                raise process_failure(nodes[rec.node], rec,
                               f"was not ready after {timeout:.0f} s (vllm.startup_timeout_s)")
            if pending:
                tails = {n: (lambda r=r: nodes[r.node].log_tail(r, 80)) for n, r in pending.items()}
                bar.set_postfix_str(watch.line(time.monotonic(), time.monotonic() - t0, tails))
                time.sleep(1.0)
    return ready
