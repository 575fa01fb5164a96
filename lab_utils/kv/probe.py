"""The NIXL transfer probe of notebook 02: what does moving KV cache between nodes cost?

`run_probe` places two NIXL agents (`lab_utils.on_node.nixl_agent`, which runs on the
nodes) as in prefill/decode serving: the target on the prefill node holds the data, the
initiator on the decode node moves it with one-sided READ (what NixlConnector does) and
WRITE, at scattered block indices as a paged KV cache does. It starts the target detached
and runs the initiator through the node layer, follows the target's progress lines, and
collects the initiator's rows. Per size and operation the probe reports bandwidth from
the median time, latency percentiles, whether the destination's checksum matches the
source, and the bandwidth as a fraction of its limit: the host's memory-copy bandwidth
when both agents share a machine, else the link rate the caller gives.

Before anything starts, `plan_probe` sizes the run to its time limit: the bytes it will
move (every size, READ and WRITE, warm-up and timed passes, per memory type) divided by
an expected rate per memory type must take at most PLAN_SHARE of `timeout_s`, which
also covers start-up, CUDA context, registration and checksums. On a GPU profile the
expected rates are the slowest nixlbench recorded between two GB10 Sparks
(GB10_PLAN_GBps: VRAM-sourced transfers move ~0.3-0.6 GB/s there, no GPUDirect RDMA);
elsewhere one conservative rate. Once a probe ran, its measured rate per memory type
replaces that estimate (`expected_rates`: the initiator's calibration record, written by
`run_probe` through `results.calibration.record_probe`, labelled "measured on <node>,
<date>"). Warm-up, then timed passes, then the largest sizes are cut until the estimate
fits.

Those rates are a guess for the probe's own pattern: nixlbench WRITEs one contiguous
buffer per transfer, the probe READs thousands of scattered block descriptors, and from
VRAM on a GB10 the NIC cannot DMA the GPU's memory (no GPUDirect RDMA). So each memory
type also gets a time box (`ProbePlan.time_box_s`: its share of TIME_BOX_SHARE of the
limit, in proportion to its estimate; what one leaves unused goes to the next): once it is
spent that memory type stops, its finished rows are kept, and `ProbeResult.cut_short`
says what was not measured and why. The run returns a result instead of running into
the limit, so notebook 02 always writes one.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lab_utils import known_failures
from lab_utils.cluster import as_cluster
from lab_utils.cluster.provision import deploy_node
from lab_utils.errors import ProcessFailedError
from lab_utils.on_node.nixl_agent import MARK, OPS, KiB, MiB, summarize
from lab_utils.results import calibration
from lab_utils.results.kv_transfer import ROW_KEYS, ProbeResult
from lab_utils.util.progress import progress_bar

if TYPE_CHECKING:  # the node layer is imported lazily
    from lab_utils.cluster import Cluster
    from lab_utils.config import LabConfig

__all__ = ["OPS", "SEG_TYPES", "KiB", "MiB", "ProbePlan", "apply_limits", "default_sizes",
           "expected_rates", "fraction_of_limit", "plan_probe", "planning_rates", "run_probe",
           "summarize"]

AGENT = "lab_utils.on_node.nixl_agent"
TARGET = "nixl-probe-target"
SEG_TYPES = ("DRAM", "VRAM")

# Expected NIXL rates (GB/s) for planning on a GPU profile: the slowest bandwidth nixlbench
# recorded between two GB10 Sparks (UCX WRITE, batch 1, 64 KiB-64 MiB transfers, single and
# dual rail; recordings nixlbench.gb10-pair.*.txt from elizabetht/spark 03_NixlBench.ipynb,
# see tests/fixtures/dgx-spark-recorded/SOURCES.md): DRAM 6.56-13.17, VRAM 0.26-0.61.
GB10_PLAN_GBps = {"DRAM": 6.5, "VRAM": 0.25}
# Any other profile (the CPU rehearsal, an unknown GPU): one rate slower than both.
CONSERVATIVE_GBps = 0.25
PLAN_SHARE = 0.5  # share of timeout_s the estimated transfers may take; the rest is margin
TIME_BOX_SHARE = 0.8  # share of timeout_s the memory types' time boxes add up to
MIN_ITERATIONS, MIN_WARMUP = 5, 1  # fewest timed and warm-up passes the plan cuts down to


# ----- arithmetic (pure) ----------------------------------------------------------------

def default_sizes(min_bytes: int = 64 * KiB, max_bytes: int = 64 * MiB,
                  max_total_bytes: int | None = None) -> list[int]:
    """Powers of two from `min_bytes` to `max_bytes`; with `max_total_bytes`, the largest
    are dropped until one pass over the sizes moves at most that many bytes."""
    sizes = [min_bytes << i for i in range((max_bytes // min_bytes).bit_length())]
    while max_total_bytes is not None and sizes and sum(sizes) > max_total_bytes:
        sizes.pop()
    return sizes


def fraction_of_limit(bandwidth_GBps: float, limit_GBps: float | None) -> float | None:
    return bandwidth_GBps / limit_GBps if limit_GBps else None


def apply_limits(rows: list[dict], same_machine: bool, memcpy_GBps: Mapping[int, float],
                 link_rate_gbps: float | None) -> list[str]:
    """Give each row its limit (memcpy on one machine, else the link) and its fraction
    of it; return notes on limits that are missing."""
    for row in rows:
        if same_machine:
            limit, kind = memcpy_GBps.get(row["bytes"]), "memcpy"
        else:
            limit, kind = (link_rate_gbps / 8 if link_rate_gbps else None), "link"
        row.update(limit_GBps=limit, limit_kind=kind if limit else None,
                   fraction_of_limit=fraction_of_limit(row["bandwidth_GBps"], limit))
    if rows and not same_machine and not link_rate_gbps:
        return ["fraction_of_limit is None: the agents are on different machines and "
                "no link_rate_gbps was given (e.g. 200 for a ConnectX-7 port)"]
    return []


def passes(op: str, iterations: int, warmup: int) -> int:
    """How often the initiator moves each size for `op`: warm-up and timed passes, and for
    WRITE one more that carries the notification (as a KV connector sends it)."""
    return warmup + iterations + (1 if op == "WRITE" else 0)


def planning_rates(device: str) -> tuple[dict[str, float], str]:
    """Expected GB/s per memory type for a profile's `vllm.device`, and where they come from."""
    if device == "cuda":
        return dict(GB10_PLAN_GBps), "slowest nixlbench rates recorded between two GB10 Sparks"
    return {s: CONSERVATIVE_GBps for s in SEG_TYPES}, "a conservative rate (no recording)"


def expected_rates(cfg: LabConfig) -> tuple[dict[str, float], str]:
    """`planning_rates`, with each memory type an earlier probe between the same two nodes
    measured replaced by its rate (the initiator's calibration record), and where each
    rate comes from."""
    rates, basis = planning_rates(cfg.vllm.device)
    target, initiator = cfg.probe_pair()
    cal = calibration.load(cfg, initiator)
    m = cal.measured() if cal else {}
    found = {seg: m[f"probe_GBps:{seg}"] for seg in rates if f"probe_GBps:{seg}" in m
             and cal is not None and cal.probe[seg].get("target") == target}
    if not found:
        return rates, basis
    rates.update({seg: value for seg, (value, _) in found.items()})
    said = [f"{seg} {label} by the probe" for seg, (_, label) in found.items()]
    rest = [seg for seg in rates if seg not in found]
    return rates, "; ".join(said + ([f"{'/'.join(rest)}: {basis}"] if rest else []))


@dataclass
class ProbePlan:
    """What the probe will move and how long that should take at the expected rates."""

    sizes: list[int]
    seg_types: tuple[str, ...]
    ops: tuple[str, ...]
    iterations: int
    warmup: int
    timeout_s: float
    rates_GBps: dict[str, float]
    rate_basis: str = ""
    dropped: list[int] = field(default_factory=list)
    asked: dict[str, int] = field(default_factory=dict)

    @property
    def bytes_per_seg(self) -> int:
        """Bytes the initiator moves for one memory type (every size, op and pass)."""
        return sum(self.sizes) * sum(passes(op, self.iterations, self.warmup) for op in self.ops)

    @property
    def planned_bytes(self) -> int:
        return self.bytes_per_seg * len(self.seg_types)

    @property
    def estimate_s(self) -> float:
        return sum(self.bytes_per_seg / (self.rates_GBps[s] * 1e9) for s in self.seg_types)

    @property
    def budget_s(self) -> float:
        return PLAN_SHARE * self.timeout_s

    @property
    def fits(self) -> bool:
        return self.estimate_s <= self.budget_s

    @property
    def time_box_s(self) -> dict[str, float]:
        """Seconds each memory type may move data before it is cut short: TIME_BOX_SHARE
        of the limit, shared in proportion to the estimates (a plan that fits gives each
        at least TIME_BOX_SHARE / PLAN_SHARE = 1.6 times its estimate)."""
        each = {s: self.bytes_per_seg / (self.rates_GBps[s] * 1e9) for s in self.seg_types}
        total = sum(each.values()) or 1.0
        return {s: TIME_BOX_SHARE * self.timeout_s * e / total for s, e in each.items()}

    def summary(self) -> dict:
        return {"sizes": self.sizes, "seg_types": list(self.seg_types), "ops": list(self.ops),
                "iterations": self.iterations, "warmup": self.warmup,
                "timeout_s": self.timeout_s, "rates_GBps": self.rates_GBps,
                "planned_bytes": self.planned_bytes, "estimate_s": self.estimate_s,
                "time_box_s": self.time_box_s, "dropped": self.dropped,
                "text": self.describe()}

    def describe(self) -> str:
        rates = ", ".join(f"{s} {self.rates_GBps[s]:g} GB/s" for s in self.seg_types)
        each = " + ".join(f"{op} {passes(op, self.iterations, self.warmup)}" for op in self.ops)
        text = (f"probe plan: {len(self.sizes)} sizes ({sum(self.sizes) / 1e9:.3g} GB per pass) x "
                f"{sum(passes(op, self.iterations, self.warmup) for op in self.ops)} passes "
                f"({each}: {self.warmup} warm-up + {self.iterations} timed, and for WRITE one "
                f"more that carries the notification) x {len(self.seg_types)} memory type(s) = "
                f"{self.planned_bytes / 1e9:.3g} GB; "
                f"at {rates} ({self.rate_basis}) ~{self.estimate_s:.0f} s of transfer, "
                f"limit {self.timeout_s:.0f} s for the whole probe (the plan is cut to fit "
                f"{self.budget_s:.0f} s of estimated transfer, room for the estimate to be "
                "wrong; each memory type stops when its own time box is spent: "
                + ", ".join(f"{s} {v:.0f} s" for s, v in self.time_box_s.items()) + ")")
        if self.asked:
            text += ("; cut from " + ", ".join(f"{k} {v}" for k, v in self.asked.items())
                     + " to fit")
        if self.dropped:
            text += f"; largest sizes dropped to fit: {self.dropped}"
        if not self.fits:
            text += "; still over: raise timeout_s or pass fewer sizes"
        return text


def plan_probe(sizes: Sequence[int], *, seg_types: Sequence[str], ops: Sequence[str] = OPS,
               iterations: int = 20, warmup: int = 3, timeout_s: float = 300.0,
               rates_GBps: Mapping[str, float], rate_basis: str = "") -> ProbePlan:
    """The run that fits `timeout_s`: as asked when its estimate (bytes / expected rate per
    memory type) is within PLAN_SHARE of the limit; else fewer warm-up passes (down to
    MIN_WARMUP), then fewer timed passes (down to MIN_ITERATIONS), then without the
    largest sizes (the smallest always stays)."""
    plan = ProbePlan(sizes=sorted(sizes), seg_types=tuple(seg_types), ops=tuple(ops),
                     iterations=iterations, warmup=warmup, timeout_s=timeout_s,
                     rates_GBps={s: rates_GBps[s] for s in seg_types}, rate_basis=rate_basis)
    if plan.fits:
        return plan
    seconds_per_pass = sum(sum(plan.sizes) / (plan.rates_GBps[s] * 1e9) for s in seg_types)
    writes = sum(op == "WRITE" for op in ops)
    room = max(0, int(plan.budget_s / seconds_per_pass) - writes) // max(1, len(ops))
    plan.warmup = max(min(warmup, MIN_WARMUP), min(warmup, room - iterations))
    plan.iterations = max(min(iterations, MIN_ITERATIONS), min(iterations, room - plan.warmup))
    plan.asked = {k: v for k, v, now in (("warm-up", warmup, plan.warmup),
                                         ("iterations", iterations, plan.iterations)) if now != v}
    while not plan.fits and len(plan.sizes) > 1:
        plan.dropped.insert(0, plan.sizes.pop())
    return plan


# ----- the driver (runs where the notebook runs) ----------------------------------------


def _ucx_env(cfg: LabConfig, node: str, ucx_tls: str | None,
             ucx_net_devices: str | Mapping[str, str] | None) -> dict[str, str]:
    devices = (ucx_net_devices.get(node) if isinstance(ucx_net_devices, Mapping)
               else ucx_net_devices) or cfg.nodes[node].data_netdev
    tls = ucx_tls or cfg.kv_transfer.ucx_tls
    return {k: v for k, v in (("UCX_TLS", tls), ("UCX_NET_DEVICES", devices)) if v}


def _failure(what: str, text: str) -> ProcessFailedError:
    fix = known_failures.explain(text)
    return ProcessFailedError(what + text + (f"\n--- known failure ---\n{fix}" if fix else ""))


def _last_step(log: str, run_id: str) -> tuple[int, int] | None:
    """(done, total) from the target's last progress line of this run, if any."""
    steps = [ln.split()[-1] for ln in log.splitlines() if ln.startswith(f"{MARK} {run_id} step ")]
    if not steps:
        return None
    done, total = steps[-1].split("/")
    return int(done), int(total)


def run_probe(cluster: Cluster | LabConfig, sizes: Sequence[int] | None = None, *,
              seg_types: Sequence[str] = ("DRAM",), ops: Sequence[str] = OPS,
              iterations: int = 20, warmup: int = 3, block_bytes: int = 64 * KiB,
              link_rate_gbps: float | None = None, ucx_tls: str | None = None,
              ucx_net_devices: str | Mapping[str, str] | None = None,
              timeout_s: float = 300.0, show_progress: bool = True,
              plan: ProbePlan | None = None,
              time_box_s: Mapping[str, float] | None = None) -> ProbeResult:
    """Measure NIXL READ/WRITE from the decode node (initiator) to the prefill node
    (target) for each size (bytes; rounded up to whole blocks of `block_bytes`). Takes a
    config too (a cluster is then built for the probe and closed after it).

    The run is `plan` when given (its sizes, memory types, operations, passes and limit
    replace the arguments), else `plan_probe` of the arguments at the profile's expected
    rates: passes and sizes are cut so the estimate fits `timeout_s`. The result records
    the plan (`ProbeResult.plan`). Each memory type stops when its time box is spent
    (`time_box_s`, seconds per memory type, replaces the plan's) and the result says
    what was cut short (`ProbeResult.cut_short`)."""

    if plan is not None:
        sizes, seg_types, ops = plan.sizes, plan.seg_types, plan.ops
        iterations, warmup, timeout_s = plan.iterations, plan.warmup, plan.timeout_s
    bad = ([s for s in seg_types if s not in SEG_TYPES] + [o for o in ops if o not in OPS]
           + [s for s in (sizes or []) if s <= 0])
    if bad or iterations < 1 or block_bytes < 1 or (sizes is not None and not sizes):
        raise ValueError(f"invalid probe arguments {bad}: seg_types from {SEG_TYPES}, ops "
                         f"from {OPS}, positive sizes, iterations and block_bytes")
    asked = list(default_sizes() if sizes is None else sizes)
    moved = sorted({math.ceil(s / block_bytes) * block_bytes for s in asked})
    notes = [f"sizes rounded up to whole {block_bytes} B blocks: {s} -> {m}"
             for s in asked if (m := math.ceil(s / block_bytes) * block_bytes) != s]
    with as_cluster(cluster) as cluster:
        cfg = cluster.cfg
        if plan is None:
            rates, basis = expected_rates(cfg)
            plan = plan_probe(moved, seg_types=seg_types, ops=ops, iterations=iterations,
                              warmup=warmup, timeout_s=timeout_s, rates_GBps=rates,
                              rate_basis=basis)
            moved, iterations, warmup = plan.sizes, plan.iterations, plan.warmup
        boxes = dict(plan.time_box_s if time_box_s is None else time_box_s)
        t_name, i_name = cfg.probe_pair()
        for name in dict.fromkeys((t_name, i_name)):
            if cfg.nodes[name].connection == "ssh":
                deploy_node(cluster, name)
        t_node, i_node = cluster.node(t_name), cluster.node(i_name)
        t_addr, i_addr = cfg.nodes[t_name].data_address, cfg.nodes[i_name].data_address
        port = cfg.kv_transfer.probe_port
        same = cfg.nodes[t_name].machine(t_name) == cfg.nodes[i_name].machine(i_name)
        ucx = {"target": _ucx_env(cfg, t_name, ucx_tls, ucx_net_devices),
               "initiator": _ucx_env(cfg, i_name, ucx_tls, ucx_net_devices)}
        run_id = uuid.uuid4().hex[:12]
        common = ["--port", str(port), "--run-id", run_id, "--seg-types", ",".join(seg_types),
                  "--block-bytes", str(block_bytes), "--blocks", str(moved[-1] // block_bytes),
                  "--timeout", str(timeout_s)]

        def launch(node, role: str, address: str) -> tuple[list[str], dict[str, str], str | None]:
            argv = [node.python, "-m", AGENT, "--role", role,
                    "--address", address, *common]
            env, cwd = {"PYTHONUNBUFFERED": "1", **ucx[role]}, None
            if node.cfg.connection == "ssh":  # run the deployed copy, as the proxy does
                env["PYTHONPATH"], cwd = node.cfg.workdir, node.cfg.workdir
            return argv, env, cwd

        t_argv, t_env, t_cwd = launch(t_node, "target", t_addr)
        i_argv, i_env, _ = launch(i_node, "initiator", i_addr)
        i_argv += ["--target-address", t_addr, "--sizes", ",".join(map(str, moved)),
                   "--ops", ",".join(ops), "--iterations", str(iterations), "--warmup", str(warmup),
                   "--time-box", ",".join(f"{k}={v:.3f}" for k, v in boxes.items())]
        i_argv += ["--memcpy"] if same else []
        cluster.alive(TARGET)  # forget a dead earlier target; a live one holds the port
        t_node.ensure_port_free(t_addr, port, "the NIXL probe")
        t0 = time.monotonic()
        rec = t_node.start_detached(TARGET, t_argv,
                                    log_path=f"{cfg.log_dir_on(t_name)}/{TARGET}.log",
                                    env=t_env, cwd=t_cwd, kind="probe", port=port,
                                    extra={"role": "probe-target", "run_id": run_id})
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            where = f"the NIXL probe target on node {t_name} (log {rec.log_path})"
            while f"{MARK} {run_id} ready" not in t_node.log_tail(rec, 200):
                if not t_node.is_alive(rec):
                    raise _failure(f"{where} exited before it was ready:\n",
                                   t_node.log_tail(rec, 30))
                if time.monotonic() - t0 > timeout_s:
                    raise _failure(f"{where} not ready after {timeout_s:.0f} s:\n",
                                   t_node.log_tail(rec, 30))
                time.sleep(0.1)
            run = pool.submit(i_node.run, i_argv, timeout=timeout_s, env=i_env)
            with progress_bar(total=len(seg_types) * len(moved), desc="NIXL probe", unit="size",
                              disable=not show_progress) as bar:
                while not run.done():
                    time.sleep(0.25)
                    if step := _last_step(t_node.log_tail(rec, 200), run_id):
                        bar.total = step[1]  # sizes x memory types that apply on both nodes
                        bar.update(step[0] - bar.n)
                res = run.result()
                assert bar.total is not None  # the bar was made with a total
                bar.update(bar.total - bar.n)
        finally:
            pool.shutdown(wait=False)
            t_node.stop(rec, grace_s=5.0)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith(f"{MARK}-RESULT ")]
        if not res.ok or not lines:
            raise _failure(f"the NIXL probe initiator on node {i_name} failed (exit {res.code}):\n",
                           res.stderr[-3000:] + f"\n--- target log {rec.log_path} ---\n"
                           + t_node.log_tail(rec, 20))
        out = json.loads(lines[-1].split(" ", 1)[1])
        memcpy = {int(k): v for k, v in out["memcpy_GBps"].items()}
        rows = out["rows"]
        notes += out["notes"] + apply_limits(rows, same, memcpy, link_rate_gbps)
        notes += [f"checksum mismatch: {r['seg_type']} {r['op']} of {r['bytes']} B"
                  for r in rows if not r["checksum_ok"]]
        if all(r["checksum_ok"] for r in rows) and (
                saved := calibration.record_probe(cfg, i_name, t_name, rows)):
            notes.append(f"rates recorded for the next probe's plan: {saved}")
        return ProbeResult(rows=[{k: r.get(k) for k in ROW_KEYS} for r in rows], target=t_name,
                           initiator=i_name, target_address=t_addr, initiator_address=i_addr,
                           port=port, same_machine=same, env=ucx, notes=notes, memcpy_GBps=memcpy,
                           pids={"target": rec.pid, "initiator": out["pid"]},
                           elapsed_s=time.monotonic() - t0,
                           plan={**plan.summary(), "time_box_s": boxes},
                           cut_short=out.get("cut_short", {}))

