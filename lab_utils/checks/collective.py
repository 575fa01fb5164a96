"""The split model's collectives, tried before it starts: one all-reduce across the nodes
of `topology.tensor_parallel`, run as its ranks will run theirs (their environment from
`serve.launcher.rank_env`, the rendezvous at rank 0's data_address:master_port), at the
size of one of the 2 x layers all-reduces a decode step makes per token (one hidden state)
and at 16 MiB.

On a GPU profile NCCL logs which network it chose (NCCL_DEBUG=INFO in the ranks'
environment, in their own line-buffered file): over RDMA ("IB", RoCE included) the check
passes; a fall-back to sockets warns, because the forecast of the split model is fed the
RDMA link's rate. NCCL pairs the two nodes' devices by their position in the list it logs,
so the check compares those lists (NCCL's own order: versions differ in how they sort
devices, so the system's device order is not read in its place). On the CPU
rehearsal the same check runs with Gloo over TCP. A rank that fails or hangs fails the
check with its log and, where the lab recognises the failure, the known fix (HCAs paired
in another order, a kernel that cannot register memory, a firewall).
"""

from __future__ import annotations

import inspect
import json
import time

from lab_utils.checks import rdma
from lab_utils.checks.frame import Context
from lab_utils.errors import LabError
from lab_utils.known_failures import match_failures
from lab_utils.kv.memory import hidden_state
from lab_utils.on_node import allreduce as on_node
from lab_utils.results.checklist import CheckResult
from lab_utils.serve.launcher import nccl_lines, nccl_log, rank_env
from lab_utils.serve.startup import collective

TOPOLOGY = "tensor-parallel"
LARGE = 16 * 2**20  # NVIDIA's NCCL tests on a Spark pair reach the link's rate from here up
WAIT_S = 180.0  # torch's import and NCCL's set-up on each node, then the all-reduces
FALLBACK_HIDDEN = (4096, 2)  # an 8B model's hidden state in bf16, when no config is at hand
_SOURCE = inspect.getsource(on_node)  # sent with -c: the lab need not be deployed yet


def decode_bytes(ctx: Context) -> tuple[int, str]:
    """What a decode step all-reduces per token: one hidden state (bytes, and where from)."""
    try:
        _, hidden, size = hidden_state(ctx.cfg)
        return hidden * size, f"one token's hidden state ({hidden} x {size} B)"
    except LabError:
        hidden, size = FALLBACK_HIDDEN
        return hidden * size, (f"{hidden} x {size} B: the model's config.json is not on this "
                               "host, so an 8B model's hidden state stands in")


def check_collective(ctx: Context) -> list[CheckResult]:
    specs = ctx.cfg.instances(TOPOLOGY)
    where = " / ".join(s.node for s in specs) or "cluster"
    if len({s.node for s in specs}) < 2:
        return [CheckResult("collective", where, "n/a",
                            "no split model across nodes in this profile (topology."
                            "tensor_parallel)")]
    if {s.node for s in specs} & set(ctx.unreachable):
        return [CheckResult("collective", where, "n/a", "not tried: a node is unreachable")]
    cluster = ctx.cluster
    if any(cluster.alive(s.name) for s in specs):
        return [CheckResult("collective", where, "n/a",
                            "not tried: the split model is running (its ranks hold the "
                            "rendezvous); it already answers for its collectives")]
    small, small_why = decode_bytes(ctx)
    first, port = specs[0].master or (specs[0].node, 0)
    master = f"{ctx.cfg.nodes[first].data_address}:{port}"
    backend = "nccl" if ctx.cfg.vllm.device == "cuda" else "gloo"
    running = []
    try:
        ctx.node(first).ensure_port_free(ctx.cfg.nodes[first].data_address, port,
                                         "the all-reduce check (topology.tensor_parallel."
                                         "master_port)")
        for spec in specs:
            node = ctx.node(spec.node)
            name = f"check-allreduce-{spec.name}"
            log = f"{ctx.cfg.log_dir_on(spec.node)}/{name}.log"
            node.run(["sh", "-c", f"rm -f {log} " + nccl_log(ctx.cfg, spec.node, name, "*")])
            argv = [node.python, "-c", _SOURCE, "allreduce", str(spec.rank), str(len(specs)),
                    master, backend, str(small), str(LARGE)]
            env = rank_env(ctx.cfg, spec) | {"PYTHONUNBUFFERED": "1"}
            if "NCCL_DEBUG_FILE" in env:  # the check's own, not the instance's
                env["NCCL_DEBUG_FILE"] = nccl_log(ctx.cfg, spec.node, name)
            running.append((spec, node.start_detached(name, argv, log_path=log, kind="check",
                                                      env=env)))
        logs = _wait(ctx, running)
    except LabError as e:
        return [CheckResult("collective", where, "fail", f"the all-reduce did not start: {e}",
                            fix="free the port it names, or read the error")]
    finally:
        for spec, rec in running:
            ctx.node(spec.node).stop(rec, grace_s=2)
    return [collective_verdict(where, backend, logs, small_why)]


def _wait(ctx: Context, running: list) -> dict[str, str]:
    """Each rank's log once every rank has exited (or WAIT_S has passed)."""
    deadline = time.time() + WAIT_S
    while time.time() < deadline and any(ctx.node(s.node).is_alive(r) for s, r in running):
        time.sleep(0.5)
    out = {}
    for s, r in running:
        node = ctx.node(s.node)
        out[s.node] = node.log_tail(r, 4000) + "\n" + nccl_lines(ctx.cfg, node, r)
    return out


def _answer(log: str) -> dict | None:
    """The rank's JSON line, wherever it starts on its line (another library's output
    may precede it without a newline)."""
    for line in reversed(log.splitlines()):
        at = line.find('{"rank"')
        if at >= 0:
            try:
                return json.loads(line[at:])
            except ValueError:
                continue
    return None


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def _pairing(nets: dict[str, dict]) -> CheckResult | None:
    """NCCL pairs the nodes' devices by their position in the list it logged ("NET/IB :
    Using [0]... [1]..."): position i must be the same half of the port on every node.
    Read from NCCL's own lines, so whatever order a NCCL version picks is the one judged.
    None: the orders agree, or a node did not log its list."""
    lists = {n: c["devices"] for n, c in nets.items() if c["net"] == "IB" and c["devices"]}
    if len(lists) < 2 or len(lists) < len(nets):
        return None
    halves = {n: [rdma.half_of(d) for d in devs] for n, devs in lists.items()}
    if len({tuple(h) for h in halves.values()}) == 1:
        return None
    return CheckResult(
        "collective", " / ".join(nets), "fail",
        "NCCL lists the port's halves in a different order on the nodes: it would pair "
        "devices that cannot reach each other",
        evidence="; ".join(f"{n}: {', '.join(d)}" for n, d in lists.items())
        + " (NCCL's own list, 'NET/IB : Using [0]...')",
        fix="NCCL ignores the order written in data_netdev. Give each node's data_netdev the "
            "one half cabled to the same half on the other node (NCCL then has one device to "
            "pair), or bring the device names back in line on both nodes, then run the "
            "checklist again")


def collective_verdict(where: str, backend: str, logs: dict[str, str],
                       small_why: str) -> CheckResult:
    """The check's verdict from the ranks' logs (node: log text)."""
    # Gloo says nothing of its network: it is TCP, on GLOO_SOCKET_IFNAME
    nets = {n: collective(t) if backend == "nccl" else
            {"backend": "gloo", "net": "TCP", "devices": []} for n, t in logs.items()}
    if (paired := _pairing(nets)) is not None:  # the likeliest cause of a hang, named first
        return paired
    answers = {n: _answer(t) for n, t in logs.items()}
    bad = [n for n, a in answers.items() if a is None]
    if bad:
        text = "\n".join(logs[n] for n in bad)
        known = match_failures(text, include_warnings=False)
        tail = " | ".join(logs[bad[0]].strip().splitlines()[-4:])[-600:]
        return CheckResult(
            "collective", where, "fail",
            f"the all-reduce across the nodes did not complete ({', '.join(bad)})",
            evidence=(f"{known[0].name}: {known[0].explanation} " if known else "") + tail,
            fix=(known[0].fix if known else
                 "read the rank's log above; check the ports check (a port the system picks "
                 "between the nodes), data_ifname, and on a GPU the rdma check"))
    got = {n: a for n, a in answers.items() if a is not None}
    wrong = [n for n, a in got.items() if not all(s["sum_ok"] for s in a["sizes"])]
    sizes = next(a for a in got.values() if a["rank"] == 0)["sizes"]
    world = len(got)
    timed = "; ".join(
        f"{_size(s['bytes'])} in {s['ms']:.2f} ms"
        + (f" ({s['bytes'] * 8 * 2 * (world - 1) / world / s['ms'] / 1e6:.1f} Gb/s bus "
           "bandwidth)" if s["bytes"] >= LARGE else "") for s in sizes)
    how = "; ".join(f"{n}: {c['backend'] or backend} over {c['net'] or 'a network not logged'}"
                    + (f" ({', '.join(c['devices'])})" if c["devices"] else "")
                    for n, c in nets.items())
    evidence = f"{how}. Rank 0: {timed}; the small size is {small_why}"
    if wrong:
        return CheckResult("collective", where, "fail",
                           f"the all-reduce returned a wrong sum on {', '.join(wrong)}",
                           evidence=evidence, fix="read the ranks' logs; report it with them")
    if backend == "nccl" and any(c["net"] != "IB" for c in nets.values()):
        return CheckResult(
            "collective", where, "warn",
            "NCCL did not use RDMA on every node (sockets, or not logged): the split model "
            "would run slower than its forecast",
            evidence=evidence,
            fix="check the rdma check and data_netdev (NCCL_IB_HCA); the log "
                "line 'NET/IB : No device found' means NCCL saw no usable RDMA device")
    return CheckResult("collective", where, "pass",
                       f"all-reduce across the nodes ({backend}): {timed}", evidence=evidence,
                       data={"backend": backend, "sizes": sizes,
                             "net": {n: c["net"] for n, c in nets.items()}})
