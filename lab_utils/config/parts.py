"""The profile's parts, one pydantic model each: a node and how to reach it, the model,
the vLLM settings per role, the KV transfer, the topologies, the proxy, JupyterLab and the
benchmark workload. Each field checks its own value; checks that span fields are in
`checks`, and `schema.LabConfig` puts the parts together."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab_utils.config import values

# The ports the lab binds: unprivileged (1024-65535), so no service needs root and none
# takes a well-known port (80 was accepted). SSH ports (the nodes' own) may be any.
Port = Annotated[int, Field(ge=1024, le=65535)]
SSHPort = Annotated[int, Field(ge=1, le=65535)]


class _Strict(BaseModel):
    # strict: `true` or "8400" is not an integer (they became 1 and 8400); allow_inf_nan:
    # 1e999 (infinity) is not a timeout
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class SSHConfig(_Strict):
    host: str
    user: str | None = None
    port: SSHPort = 22
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
    # The network interface that holds data_address (`ibdev2netdev` shows it beside its
    # RDMA device: rocep1s0f1 port 1 ==> enp1s0f1np1). The tensor-parallel ranks name it
    # to NCCL and Gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) so that neither picks the
    # LAN; None: they choose by themselves.
    data_ifname: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$")
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
    dtype: Literal[values.VLLM_DTYPES] = "bfloat16"  # type: ignore[valid-type]  # a tuple unpacked into Literal at run time
    tiny_seed: int = 0

    _path = field_validator("path")(values.check_path)
    _node_path = field_validator("node_path")(values.check_node_path)
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
    stop_grace_s: float = Field(15.0, ge=0, le=600)  # cleanup waits this long per instance
    extra_args: list[str] = []
    extra_env: dict[str, str] = {}
    # A file (mode 600) holding the instances' API key: their /v1 API answers 401 without
    # it. Unset: the proxy's key (proxy.api_key_file), when that is set.
    api_key_file: str | None = None
    baseline: InstanceSettings
    replica: InstanceSettings
    prefill: InstanceSettings
    decode: InstanceSettings
    # the ranks of the tensor-parallel topology (None: the profile has none)
    tp: InstanceSettings | None = None

    _args = field_validator("extra_args")(values.check_args)
    _env = field_validator("extra_env")(values.check_env)


class KVTransferConfig(_Strict):
    connector: Literal["NixlConnector"] = "NixlConnector"
    # "auto": notebook 02's recommendation when it has run, else "cpu".
    kv_buffer_device: Literal["auto", "cpu", "cuda"] = "auto"
    ucx_tls: str | None = None
    extra_config: dict[str, Any] = {}
    # The NIXL transfer probe (notebook 02) listens here on the target node's data address;
    # the checklist's link check runs ib_write_bw's server for each rail here and on the
    # ports after it (one per device in data_netdev: 5800 and 5801 for both halves).
    probe_port: Port = 5800
    # NIXL's progress threads found busy-polling (one per prefill/decode instance without a
    # progress delay, below; none with one) lowered to nice 19 with a 0.1 ms slice once an
    # instance is up, so the engines get nearly all of the CPU, and on the CPU build each
    # worker's model thread put back on its configured CPUs (lab_utils.on_node.nixl_threads).
    # None: on for vllm.device "cpu", off for "cuda".
    lower_nixl_threads: bool | None = None
    # NIXL's progress-thread delay (nixl's `pthrDelay`, in microseconds): 0 is what vLLM's
    # NixlConnector gets from the nixl Python API, a thread that polls UCX without pause;
    # above 0 the thread waits in poll() for UCX's events, at most that long (NIXL rounds
    # it up to whole milliseconds), so it takes no core while nothing moves. The nixl API
    # has no setting for it: the lab sets it in the prefill and decode processes it starts
    # (lab_utils/on_node/nixl_site). None: 1000 for vllm.device "cpu", 0 for "cuda".
    nixl_progress_delay_us: int | None = Field(None, ge=0, le=1_000_000)

    _tls = field_validator("ucx_tls")(values.check_ucx_tls)


class BaselineTopology(_Strict):
    node: str


class ReplicatedTopology(_Strict):
    nodes: list[str] = Field(min_length=1)
    policy: Literal["round_robin", "least_outstanding"] = "round_robin"


class DisaggregatedTopology(_Strict):
    prefill: list[str] = Field(min_length=1)
    decode: list[str] = Field(min_length=1)


class TensorParallelTopology(_Strict):
    """One model across `nodes`, one rank each (vLLM's own multi-node launcher, `mp`
    backend): rank 0 on the first node serves the API and hosts the rendezvous at its
    data_address:master_port; the others run headless."""

    nodes: list[str] = Field(min_length=2)
    master_port: Port = 29500


class TopologyConfig(_Strict):
    baseline: BaselineTopology
    replicated: ReplicatedTopology
    disaggregated: DisaggregatedTopology
    tensor_parallel: TensorParallelTopology | None = None


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
    # a client's request headers must arrive within this (else 408 and the connection
    # closes), its body within body_timeout_s after them: a client that sends a byte at a
    # time would otherwise hold its connection for ever
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    body_timeout_s: float = Field(15.0, gt=0, le=3600)
    # a client that reads nothing of its response for this long is dropped (its
    # connection reset, its upstream request cancelled), as nginx's send_timeout does
    send_timeout_s: float = Field(60.0, gt=0, le=3600)
    # the most choices (`n`, `best_of`) one request may ask for: each is a KV transfer
    max_n: int = Field(8, ge=1, le=1024)


class JupyterConfig(_Strict):
    # `python -m lab_utils jupyter` serves the notebooks on this port of the notebook host
    # (this machine: the local node with the controller role, at its lan_address)
    port: Port = 8888
    # the file holding this pair's token (mode 600), made by `card` or the first `jupyter`
    # and the same at every start after, so the URL on the pair's card stays valid;
    # None: ~/.config/spark-disagg-lab/<profile>.jupyter-token
    token_file: str | None = None
    # where attendees' browsers open this pair's JupyterLab when the venue's network cannot
    # reach the notebook host (e.g. the controller's venue-side address, forwarded to the
    # host: docs/FACILITATOR.md); None: the host's lan_address and port
    public_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(:\d+)?/?$")


class SLOConfig(_Strict):
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)
    # the ITL tail per request: every gap between two of its tokens at most this
    itl_ms: float | None = Field(None, gt=0)


class WorkloadConfig(_Strict):
    input_len: int = Field(128, gt=0)
    output_len: int = Field(32, gt=0)
    concurrency: list[int] = [1, 2, 4]
    request_rates: list[float] = []
    burstiness: float = Field(1.0, gt=0)
    mixed_long_len: int | None = Field(None, gt=0)
    mixed_long_every: int = Field(8, ge=2)
    # each request's input and output length drawn from [L*(1-r), L*(1+r)], as `vllm bench
    # serve --random-range-ratio r`; 0 keeps them fixed
    range_ratio: float = Field(0.0, ge=0, lt=1)
    # prompts (and output lengths) from a file: vllm bench serve's custom JSONL or ShareGPT
    # JSON (`measure.dataset`); the lengths above then do not apply to the standard runs
    dataset: str | None = None
    chat: bool = False
    request_timeout_s: float = Field(600.0, gt=0)
    num_prompts: int = Field(32, gt=0)
    duration_s: float | None = Field(None, gt=0)
    warmup: int = Field(2, ge=0)
    repeats: int = Field(1, ge=1)
    seed: int = 0
    max_failed_fraction: float = Field(0.0, ge=0, le=1)
    slo: SLOConfig = SLOConfig()

    def describe(self, mixed: bool | None = None) -> str:
        """In words: "128-token prompts; 32 output tokens (ignore_eos); 24 requests per point;
        2 warm-up; 2 repeats; concurrency 1, 2, 4; mixed run: one 3000-token prompt in every 4
        requests". `mixed`: True, only the mixed run's load and its long prompts; False,
        without them; None, all of it."""
        conc = [max(self.concurrency or [1])] if mixed else self.concurrency
        slo = " / ".join(f"{k} {v:,.0f} ms" for k, v in (("TTFT", self.slo.ttft_ms),
                                                          ("TPOT", self.slo.tpot_ms)) if v)
        spread = f" ±{self.range_ratio:.0%}, drawn per request" if self.range_ratio else ""
        parts = [f"prompts and output lengths from {self.dataset} (ignore_eos: each request "
                 "generates exactly its output length)" if self.dataset and not mixed else None,
                 f"{self.input_len}-token prompts{spread}" if not self.dataset or mixed else None,
                 f"{self.output_len} output tokens{spread} (ignore_eos: each request generates "
                 "exactly that many)" if not self.dataset or mixed else None,
                 f"{self.num_prompts} requests per point", f"{self.warmup} warm-up requests "
                 "first, not counted",
                 f"{self.repeats} repeat{'s' if self.repeats != 1 else ''}",
                 f"concurrency {', '.join(str(c) for c in conc)}" if conc else None,
                 f"Poisson rates {', '.join(f'{r:g}' for r in self.request_rates)} req/s"
                 if self.request_rates and not mixed else None,
                 f"{'mixed run: ' if mixed is None else ''}one {self.long_len}-token prompt in "
                 f"every {self.mixed_long_every} requests"
                 if mixed or (mixed is None and self.mixed_long_len) else None,
                 f"goodput SLOs {slo}" if slo else None]
        return "; ".join(p for p in parts if p)

    @property
    def long_len(self) -> int:
        """The mixed workload's long prompt, or 4x the prompt where none is set (what the
        profile, the forecast and the notebooks' long-prompt runs use)."""
        return self.mixed_long_len or 4 * self.input_len
