"""The plan of a topology: every instance's node, command line, environment, ports and
memory, built before anything starts and printed by `serve --dry-run`.

`make_plan` renders each instance exactly as `launcher.server_command` and `server_env`
would (secrets shown only as set/unset), and sums its memory on its node
(`kv.memory.instance_memory`: weights, overhead, KV cache, the NIXL host mirror when the
effective kv_buffer_device is "cpu" on a CUDA profile, the processes) with the OS reserve,
against the node's `MemTotal`: read from the node when it answers, else the caller's
value, else (CUDA profiles only) the recorded GB10 figure. `Plan.check` refuses a plan
that does not fit, with the numbers and the fixes (a utilization that fits, a
`--kv-cache-memory-bytes` that fits, or `kv_buffer_device: "cuda"`). Where a real run left
a node's calibration record (`results.calibration`, written by `serve`), its measured
activation and CUDA-graph overhead, per-process memory and OS reserve replace the
estimates, each labelled "measured on <node>, <date>". `start_waves` is the
order `serve` starts the instances in, shown in the plan. Offline by design:
no node needs to be reachable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lab_utils.cluster import Cluster
from lab_utils.config import InstanceSpec, LabConfig
from lab_utils.errors import LabError
from lab_utils.kv import memory
from lab_utils.kv.memory import GB10_MEMTOTAL, GiB, InstanceMemory
from lab_utils.results import calibration
from lab_utils.serve.launcher import buffer_device, instance_url, server_command, server_env
from lab_utils.serve.plan_text import render

_SECRET = re.compile(r"TOKEN|SECRET|PASSW|KEY", re.I)


@dataclass
class InstancePlan:
    name: str
    role: str
    node: str
    argv: list[str]
    env: dict[str, str]  # secrets already replaced by "<set>"
    url: str | None
    side_channel: str | None
    kv_buffer_device: str | None
    memory: InstanceMemory


@dataclass
class NodeBudget:
    """One machine's sum (nodes that are the same machine share it, as in the rehearsal)."""

    node: str  # the node names on this machine, comma-separated
    mem_total: int | None  # None: not known (the plan then cannot refuse)
    mem_source: str
    instances: list[str]
    total: int
    reserve: int
    fixes: list[str] = field(default_factory=list)
    reserve_source: str = "estimate"
    no_kv: list[str] = field(default_factory=list)  # instances whose pool leaves no KV cache
    checks: list[StartCheck] = field(default_factory=list)  # vLLM's, per instance (GPU)

    @property
    def fits(self) -> bool:
        return (not self.no_kv and all(c.passes for c in self.checks)
                and (self.mem_total is None or self.total <= self.mem_total))


@dataclass
class StartCheck:
    """vLLM's start-up memory check of one instance on a GPU machine: it wants `needs`
    bytes free (utilization x CUDA total) and about `free` will be (what the start leaves
    free, less the instances on the machine started before it)."""

    instance: str
    needs: int
    free: int
    source: str

    @property
    def passes(self) -> bool:
        return self.free >= self.needs

    def text(self) -> str:
        margin = (self.free - self.needs) / GiB
        return (f"vLLM's start-up check, {self.instance}: needs {self.needs / GiB:.1f} GiB free, "
                f"about {self.free / GiB:.1f} GiB will be ({self.source}): "
                + (f"{margin:.1f} GiB margin" if margin >= 0 else
                   f"REFUSED, short by {-margin:.1f} GiB"))


def _start_checks(cfg: LabConfig, plans: list[InstancePlan], total: int | None,
                  found: memory.MeasuredMemory) -> list[StartCheck]:
    """The start-up check of each GPU instance of one machine, in start order: free is
    MemTotal less what a start of one instance uses before vLLM checks (the OS's share and
    the instance's own processes, as measured here, else `GB10_FREE_AT_CHECK`), less the
    whole of every instance started on the machine before it."""
    if cfg.vllm.device != "cuda" or not total:
        return []
    out, earlier = [], 0
    for p in plans:
        if p.memory.needs_free is None:
            continue
        if found.os_reserve and found.process:
            free, source = (total - found.os_reserve[0] - found.process[0],
                            f"the OS's share and the processes {found.os_reserve[1]}")
        else:
            free = total - (GB10_MEMTOTAL - memory.GB10_FREE_AT_CHECK)
            source = "estimate: the lowest free memory reported at this check on a GB10"
        if earlier:
            source += f", less {earlier / GiB:.1f} GiB of the instances started before it"
        out.append(StartCheck(p.name, p.memory.needs_free, free - earlier, source))
        earlier += p.memory.total
    return out


@dataclass
class Plan:
    profile: str
    topology: str
    instances: list[InstancePlan]
    nodes: dict[str, NodeBudget]
    weights_source: str
    mem_totals: dict[str, tuple[int | None, str]]  # per node: bytes (None: unknown), source
    start_order: list[list[str]] = field(default_factory=list)  # instance names per wave

    @property
    def fits(self) -> bool:
        return all(n.fits for n in self.nodes.values())

    def check(self) -> None:
        """Raise a LabError naming every node that does not fit, its numbers and fixes."""
        bad = [n for n in self.nodes.values() if not n.fits]
        if not bad:
            return
        lines = [f"the {self.topology} plan of profile {self.profile} does not fit in memory:"]
        for n in bad:
            if n.no_kv:
                lines.append(f"  {n.node}: {', '.join(n.no_kv)}: the weights and overhead fill "
                             "vLLM's pool, leaving no KV cache; fix:")
                lines += [f"    - {f}" for f in n.fixes]
                continue
            refused = [c.text() for c in n.checks if not c.passes]
            lines.append(f"  {n.node}: " + ("; ".join(refused) if refused and n.mem_total
                                             and n.total <= n.mem_total else
                         f"needs {n.total / GiB:.1f} GiB of {(n.mem_total or 0) / GiB:.1f} "
                         f"GiB MemTotal ({n.mem_source}) for {', '.join(n.instances)}") + "; fix:")
            lines += [f"    - {f}" for f in n.fixes]
        lines.append("  (see it all: python -m lab_utils serve --topology "
                     f"{self.topology} --dry-run)")
        raise LabError("\n".join(lines))

    def text(self) -> str:
        return render(self)


def shown_env(env: dict[str, str], hub: bool) -> dict[str, str]:
    out = {k: ("<set>" if _SECRET.search(k) and v else v) for k, v in env.items()}
    if hub and "HF_TOKEN" not in out:
        out["HF_TOKEN"] = "<unset>"
    return out


def kv_cache_bytes_arg(argv: list[str]) -> int | None:
    """`--kv-cache-memory-bytes` from a command line (vLLM's human-readable forms)."""
    for i, a in enumerate(argv):
        if a.startswith("--kv-cache-memory-bytes"):
            v = a.split("=", 1)[1] if "=" in a else argv[i + 1]
            m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", v.strip())
            if not m:
                raise LabError(f"--kv-cache-memory-bytes {v!r}: not a byte count")
            mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
                    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)]
            return int(float(m.group(1)) * mult)
    return None


def read_mem_total(cluster: Cluster, name: str, why: list[str] | None = None) -> int | None:
    """The node's MemTotal in bytes, or None when it cannot be read now (then the reason,
    one line, is appended to `why`)."""
    try:
        return cluster.node(name).meminfo().get("MemTotal")
    except (LabError, OSError) as e:
        (why if why is not None else []).append(str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None


def _mem_total(cluster: Cluster, name: str, given, read_nodes: bool) -> tuple[int | None, str]:
    value = given.get(name) if isinstance(given, dict) else given
    if value:
        return int(value), "given"
    why: list[str] = []
    found = read_mem_total(cluster, name, why) if read_nodes else None
    if found:
        return found, f"/proc/meminfo on {name}"
    not_read = (f"node not read ({why[0]})" if why else "node not read")
    if cluster.cfg.vllm.device == "cuda":
        return GB10_MEMTOTAL, f"assumed: the recorded GB10 /proc/meminfo, {not_read}"
    return None, f"unknown: {not_read}; give --mem-total-gib"


def _fixes(cfg: LabConfig, budget: NodeBudget, plans: list[InstancePlan], weights: int,
           found: memory.MeasuredMemory = memory.ESTIMATED) -> list[str]:
    if cfg.vllm.device == "cpu":
        return ["lower vllm.<role>.cpu_kvcache_space_gib, or place fewer instances on "
                f"{budget.node} (topology)"]
    assert budget.mem_total is not None  # asked only of a budget that does not fit
    refused = [c for c in budget.checks if not c.passes]
    if refused and budget.total <= budget.mem_total and not budget.no_kv:
        most = min(c.free for c in refused) / calibration.cuda_total(budget.mem_total)
        return [f"gpu_memory_utilization {int(100 * most) / 100:.2f} (or lower) for "
                f"vllm.{'/'.join(sorted({p.role for p in plans}))}: vLLM refuses to start "
                "when less than that share of the total is free"]
    inst = [(weights, p.memory.mirror) for p in plans]
    u = memory.fitting_utilization(budget.mem_total, inst, found)
    kv = memory.fitting_kv_bytes(budget.mem_total, inst, found)
    roles = sorted({p.role for p in plans})
    if budget.no_kv:
        whole = max(p.memory.items[0].bytes for p in plans)
        return [f"a gpu_memory_utilization whose pool holds the weights "
                f"({whole / GiB:.1f} GiB here) with room for a KV cache, if the node has it",
                "split the model over the nodes: the tensor-parallel topology "
                "(python -m lab_utils serve --topology tensor-parallel --dry-run)",
                "a smaller or more quantized model"]
    out = [f"gpu_memory_utilization {u:.2f} (or lower) for vllm.{'/'.join(roles)}"]
    if kv > 0:
        out.append(f'"--kv-cache-memory-bytes", "{kv // GiB}G" in vllm.<role>.extra_args '
                   f"({kv / GiB:.0f} GiB KV cache per instance)")
    if any(p.memory.mirror for p in plans):
        out.append('kv_transfer.kv_buffer_device "cuda" (no host mirror; but NIXL reads '
                   "VRAM at ~0.4-0.6 GB/s on GB10 against 11-13 GB/s from DRAM)")
    return out


def start_waves(cfg: LabConfig, specs: list[InstanceSpec]) -> list[list[InstanceSpec]]:
    """The instances in the order they start: each wave starts together once the one
    before is healthy. On a CUDA profile an instance that shares its machine with an
    earlier one goes in the next wave. On GB10 (one memory for CPU and GPU) vLLM reads
    free memory system-wide (`psutil.virtual_memory().available`, vLLM 0.32.0
    utils/mem_utils.py `MemorySnapshot.measure`) and sizes the KV cache from how much of
    it went between its start and the end of its profiling run
    (`memory_profiling`: `total_consumed`); an instance loading its weights meanwhile is
    counted as this one's, or frees memory and trips "Error in memory profiling"
    (v1/worker/gpu_worker.py `determine_available_memory`). The CPU build's KV cache is
    a fixed VLLM_CPU_KVCACHE_SPACE, not measured, so the rehearsal starts all at once."""
    if cfg.vllm.device != "cuda":
        return [list(specs)] if specs else []
    waves: list[list[InstanceSpec]] = []
    seen: dict[str, int] = {}
    for spec in specs:
        machine = cfg.nodes[spec.node].machine(spec.node)
        i = seen.get(machine, 0)
        seen[machine] = i + 1
        if i == len(waves):
            waves.append([])
        waves[i].append(spec)
    return waves


def make_plan(cluster: Cluster, topology: str, *, kv_buffer_device: str | None = None,
              mem_total: int | dict[str, int] | None = None, hf_config: dict | None = None,
              read_nodes: bool = True) -> Plan:
    """The plan of `topology` (see the module docstring). `mem_total`: bytes, for every
    node or per node name; `read_nodes` False never contacts a node."""
    cfg = cluster.cfg
    hf, model_dir, source = memory.model_config(cfg, hf_config)
    weights = memory.weights(cfg, hf, model_dir)
    specs = cfg.instances(topology)
    totals = {n: _mem_total(cluster, n, mem_total, read_nodes)
              for n in dict.fromkeys(s.node for s in specs)}
    plans = [_instance(cluster, spec, kv_buffer_device, hf, weights, totals[spec.node][0],
                       measured(cfg, spec.node, spec.role))
             for spec in specs]
    return Plan(cfg.profile, topology, plans, _budgets(cfg, plans, totals, weights.bytes),
                f"{weights.note} ({source})", totals,
                [[s.name for s in wave] for wave in start_waves(cfg, specs)])


def measured(cfg: LabConfig, node: str, role: str | None = None) -> memory.MeasuredMemory:
    """What the node's calibration record measured (nothing: the estimates stand)."""
    cal = calibration.load(cfg, node)
    if cal is None:
        return memory.ESTIMATED
    m = cal.measured()

    def pick(key: str) -> tuple[int, str] | None:
        return (int(m[key][0]), m[key][1]) if key in m else None

    process = pick(f"process:{role}") if role else None
    return memory.MeasuredMemory(cuda_overhead=pick("cuda_overhead"),
                                 process=process or pick("process"),
                                 os_reserve=pick("os_reserve"),
                                 kv_bytes=pick(f"kv_bytes:{role}") if role else None)


def _budgets(cfg: LabConfig, plans: list[InstancePlan], totals: dict,
             weights: int) -> dict[str, NodeBudget]:
    """Per machine (nodes that are one machine share its memory)."""
    machines: dict[str, list[str]] = {}
    for node in dict.fromkeys(p.node for p in plans):
        machines.setdefault(cfg.nodes[node].machine(node), []).append(node)
    out: dict[str, NodeBudget] = {}
    for machine, names in machines.items():
        total, src = totals[names[0]]
        found = measured(cfg, names[0])
        reserve = found.reserve_bytes(cfg.vllm.device)
        mine = [p for p in plans if p.node in names]
        label = ", ".join(names) + (f" ({machine})" if len(names) > 1 else "")
        b = NodeBudget(label, total, src, [p.name for p in mine],
                       sum(p.memory.total for p in mine) + reserve, reserve,
                       reserve_source=found.os_reserve[1] if found.os_reserve else "estimate",
                       no_kv=[p.name for p in mine if p.memory.kv_bytes <= 0],
                       checks=_start_checks(cfg, mine, total, found))
        if not b.fits:
            b.fixes = _fixes(cfg, b, mine, weights, found)
        out[machine] = b
    return out


def merge_plans(cfg: LabConfig, plans: list[Plan]) -> Plan:
    """Several topologies served together: their instances summed per machine."""
    instances = [i for p in plans for i in p.instances]
    totals = {k: v for p in plans for k, v in p.mem_totals.items()}
    weights = instances[0].memory.items[0].bytes if instances else 0
    specs = {s.name: s for p in plans for s in cfg.instances(p.topology)}
    order = start_waves(cfg, [specs[i.name] for i in instances])
    return Plan(plans[0].profile, "+".join(p.topology for p in plans), instances,
                _budgets(cfg, instances, totals, weights), plans[0].weights_source, totals,
                [[s.name for s in wave] for wave in order])


def _instance(cluster: Cluster, spec: InstanceSpec, kv_buffer_device: str | None, hf: dict,
              weights: memory.Item, mem_total: int | None,
              found: memory.MeasuredMemory = memory.ESTIMATED) -> InstancePlan:
    cfg = cluster.cfg
    argv = server_command(cluster, spec, kv_buffer_device=kv_buffer_device)
    device = buffer_device(argv)
    mem = memory.instance_memory(
        cfg, hf, weights, mem_total or 0, utilization=spec.settings.gpu_memory_utilization,
        kv_cache_bytes=kv_cache_bytes_arg(argv), cpu_kvcache_gib=spec.settings.cpu_kvcache_space_gib,
        mirror=cfg.vllm.device == "cuda" and device == "cpu", measured=found, ranks=spec.ranks,
        api_server=not spec.headless)
    side = (f"{cfg.nodes[spec.node].data_address}:{spec.side_channel_port}"
            if spec.side_channel_port is not None and device else None)
    return InstancePlan(spec.name, spec.role, spec.node, argv,
                        shown_env(server_env(cfg, spec), cfg.model.source == "hub"),
                        instance_url(cfg, spec), side, device, mem)
