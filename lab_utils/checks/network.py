"""Network checks: every port the lab will use, tried from the node that will connect,
on the address it will use; and a short measured transfer on the data-plane link.

Ports are tried for real before anything is launched: a short-lived listener binds each
address and port on the node that will serve it (which also proves the port is free),
and the connecting node opens a TCP connection to it. HTTP goes over the LAN (proxy to
instances); NIXL side channels and the probe go over the data plane (decode to prefill),
and so do the tensor-parallel ranks, each way, on a port the system picks as well as the
rendezvous.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import NamedTuple

from lab_utils.checks import rdma
from lab_utils.checks.frame import Context
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.results.checklist import CheckResult

EPHEMERAL = 0  # a port the listener's system picks


class Connection(NamedTuple):
    src: str
    dst: str
    address: str
    port: int
    what: str

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"


def connections(cfg: LabConfig) -> list[Connection]:
    """Who connects to what, as the lab will when it serves."""
    found: dict[tuple[str, str, str, int], Connection] = {}

    def add(c: Connection) -> None:  # the first of several that differ only in `what`
        found.setdefault((c.src, c.dst, c.address, c.port), c)

    proxy = cfg.proxy.node
    for topo in ("baseline", "replicated", "disaggregated", "tensor-parallel"):
        for spec in cfg.instances(topo):
            if not spec.headless:  # a rank other than 0 serves no HTTP
                add(Connection(proxy, spec.node, cfg.nodes[spec.node].lan_address, spec.port,
                               f"HTTP of {topo} {spec.name}"))
    add(Connection(proxy, proxy, cfg.nodes[proxy].lan_address, cfg.proxy.port, "the proxy"))
    specs = cfg.instances("disaggregated")
    for d in (s for s in specs if s.role == "decode"):
        for p in (s for s in specs if s.role == "prefill"):
            assert p.side_channel_port is not None  # the config requires it of P/D instances
            add(Connection(d.node, p.node, cfg.nodes[p.node].data_address, p.side_channel_port,
                           f"NIXL side channel of {p.name} (from {d.name})"))
    for spec in cfg.instances("tensor-parallel"):  # every other rank to rank 0's rendezvous
        if spec.headless and spec.master is not None:
            first, port = spec.master
            add(Connection(spec.node, first, cfg.nodes[first].data_address, port,
                           f"tensor-parallel rendezvous (from {spec.name})"))
    # beyond the rendezvous, vLLM's multi-node mode listens on ZMQ ports it picks at
    # VLLM_HOST_IP and NCCL (Gloo on the CPU build) on its own, in both directions: a
    # firewall that opens only the configured ports lets the ranks meet, then hangs them
    ranks = [s.node for s in cfg.instances("tensor-parallel")]
    for src in ranks:
        for dst in ranks:
            if src != dst:
                add(Connection(src, dst, cfg.nodes[dst].data_address, EPHEMERAL,
                               f"a port the system picks, as vLLM's ZMQ queues and NCCL/Gloo "
                               f"do (from {src})"))
    target, initiator = cfg.probe_pair()
    add(Connection(initiator, target, cfg.nodes[target].data_address, cfg.kv_transfer.probe_port,
                   "NIXL transfer probe"))
    return list(found.values())


def _wait_ready(ctx: Context, name: str, rec: ProcessRecord, timeout: float = 20.0) -> dict:
    node = ctx.node(name)
    deadline = time.time() + timeout
    while time.time() < deadline:
        for line in node.log_tail(rec, 20).splitlines():
            if line.startswith("{") and '"ready"' in line:
                return json.loads(line)
        if not node.is_alive(rec):
            raise LabError(f"the check's listener on {name} exited: {node.log_tail(rec, 10)}")
        time.sleep(0.1)
    raise LabError(f"the check's listener on {name} did not start within {timeout:.0f} s")


def _start(ctx: Context, name: str, label: str, *args: str) -> ProcessRecord:
    node = ctx.node(name)
    log = f"{ctx.cfg.log_dir_on(name)}/check-{label}-{name}.log"
    node.run(["rm", "-f", log])
    return node.start_detached(f"check-{label}-{name}", ctx.facts_argv(name, *args),
                               log_path=log, kind="check")


def check_ports(ctx: Context) -> list[CheckResult]:
    conns, out = [], []
    for c in connections(ctx.cfg):
        if {c.src, c.dst} & set(ctx.unreachable):
            out.append(CheckResult("ports", f"{c.src} -> {c.dst}", "n/a",
                                   f"{c.target} ({c.what}): not checked, a node is unreachable"))
        else:
            conns.append(c)
    by_dst: dict[str, list[Connection]] = defaultdict(list)
    for c in conns:
        by_dst[c.dst].append(c)
    running = []
    try:
        unbound, picked = set(), {}
        for dst, cs in by_dst.items():
            targets = sorted({c.target for c in cs})
            rec = _start(ctx, dst, "listen", "listen", "120", *targets)
            running.append((dst, rec))
            ready = _wait_ready(ctx, dst, rec)
            for failure in ready["failed"]:
                unbound.add((dst, failure["target"]))
            picked.update({(dst, t): got for t, got in ready.get("ports", {}).items()})
        by_src: dict[str, list[Connection]] = defaultdict(list)
        for c in conns:
            by_src[c.src].append(c)
        for src, cs in by_src.items():
            real = {c: picked.get((c.dst, c.target), c.target) for c in cs}
            answers = ctx.facts(src, "connect", "3", *sorted(set(real.values())))
            out += [_port_result(ctx, c, answers[real[c]], (c.dst, c.target) in unbound,
                                 real[c]) for c in cs]
    finally:
        for dst, rec in running:
            ctx.node(dst).stop(rec, grace_s=2)
    return out


def _port_result(ctx: Context, c: Connection, answer: dict, unbound: bool,
                 tried: str) -> CheckResult:
    label = f"{c.target if c.port != EPHEMERAL else tried} ({c.what})"
    where = f"{c.src} -> {c.dst}"
    if c.port == EPHEMERAL and not unbound and not answer["ok"]:
        src_addr = ctx.cfg.nodes[c.src].data_address
        return CheckResult(
            "ports", where, "fail", f"{label}: not reachable from {c.src}",
            evidence=answer["error"],
            fix=f"allow TCP on every port from {c.src} ({src_addr}) to {c.dst} ({c.address}) "
                f"on the data-plane network: vLLM's multi-node mode and NCCL listen on ports "
                f"they pick at start, so opening the configured ports is not enough, e.g. "
                f"`sudo ufw allow from {src_addr} to {c.address} proto tcp` on {c.dst}")
    if unbound and c.port == EPHEMERAL:  # no port is taken: the address is not there
        return CheckResult("ports", where, "fail", f"{label}: cannot listen on {c.address} on "
                           f"{c.dst}", fix=f"check that {c.address} (data_address) is "
                           f"{c.dst}'s address on the data-plane network (`ip addr` there)")
    if unbound:
        holders = ctx.node(c.dst).port_report(c.address, c.port).who()
        return CheckResult("ports", where, "fail", f"{label}: port already in use on {c.dst}",
                           evidence=f"held by: {holders}",
                           fix=f"stop what holds {c.address}:{c.port} on {c.dst} (if it is the "
                               f"lab's: `python -m lab_utils cleanup --config "
                               f"{ctx.cfg.source_name}`) or change that port in the config")
    if not answer["ok"]:
        return CheckResult(
            "ports", where, "fail", f"{label}: not reachable from {c.src}",
            evidence=answer["error"],
            fix=f"open TCP {c.port} on {c.dst} ({c.address}) for {c.src}, e.g. "
                f"`sudo ufw allow from <{c.src} address> to any port {c.port} proto tcp`, and "
                f"check that {c.address} is {c.dst}'s address on that network")
    return CheckResult("ports", where, "pass", f"{label} reachable",
                       evidence=f"connected in {answer['ms']:.1f} ms")


def check_link(ctx: Context) -> list[CheckResult]:
    target, initiator = ctx.cfg.probe_pair()
    if {target, initiator} & set(ctx.unreachable):
        return [CheckResult("link", "cluster", "n/a", "not checked: a node is unreachable")]
    if target == initiator:
        return [CheckResult("link", "cluster", "n/a",
                            "prefill and decode share one node: no link between them")]
    if ctx.cfg.uses_rdma(target) and ctx.cfg.uses_rdma(initiator):
        return [rdma.rdma_bandwidth(ctx, target, initiator)]
    return [_tcp_bandwidth(ctx, target, initiator)]


def _tcp_bandwidth(ctx: Context, target: str, initiator: str) -> CheckResult:
    cfg = ctx.cfg
    addr = f"{cfg.nodes[target].data_address}:{cfg.kv_transfer.probe_port}"
    nbytes = 256 * 1024**2 if cfg.vllm.device == "cpu" else 4 * 1024**3
    ctx.node(target).ensure_port_free(cfg.nodes[target].data_address,
                                      cfg.kv_transfer.probe_port, "the link check")
    rec = _start(ctx, target, "sink", "sink", addr)
    try:
        _wait_ready(ctx, target, rec)
        m = ctx.facts(initiator, "send", addr, str(nbytes), timeout=120)
    finally:
        ctx.node(target).stop(rec, grace_s=2)
    where = f"{initiator} -> {target}"
    seen = (f"TCP, one stream: {m['received'] / 1e6:.0f} MB in {m['seconds']:.2f} s = "
            f"{m['gbps']:.1f} Gb/s to {addr}")
    if m["received"] != m["bytes"]:
        return CheckResult("link", where, "fail", "the transfer lost data", evidence=seen,
                           fix="check the data-plane network between the nodes (`ip -s link`)")
    rate = cfg.nodes[initiator].data_link_gbps
    data = {"measured_gbps": m["gbps"], "reported_gbps": rate, "method": "tcp"}
    if rate is None:
        return CheckResult("link", where, "pass",
                           f"{m['gbps']:.1f} Gb/s over the data plane, measured, not judged "
                           "(no link rate to hold it against)",
                           evidence=seen + "; no reported rate to compare with "
                                           "(data_link_gbps not set, e.g. loopback): the pass "
                                           "says the transfer ran whole, not that it was fast",
                           data=data)
    frac = m["gbps"] / rate
    if frac < rdma.LINK_FRACTION_WARN:
        return CheckResult("link", where, "warn", f"moves {frac:.0%} of its {rate:g} Gb/s",
                           evidence=seen, fix="configure data_netdev with the RDMA devices so the "
                                              "check (and NIXL) use RDMA, not one TCP stream",
                           data=data)
    return CheckResult("link", where, "pass", f"{frac:.0%} of {rate:g} Gb/s", evidence=seen,
                       data=data)
