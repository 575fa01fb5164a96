"""The NIXL transfer probe of notebook 02: what does moving KV cache between nodes cost?

Two NIXL agents in separate processes, placed as in prefill/decode serving: the target on
the prefill node holds the data, the initiator on the decode node moves it with one-sided
READ (what NixlConnector does) and WRITE. Each agent registers one region per memory type
(DRAM; VRAM where CUDA exists) split into fixed-size blocks and prepares its descriptor
lists once; every transfer then selects scattered block indices, as a paged KV cache does.
Per size and operation the probe reports bandwidth from the median time, latency
percentiles, whether the destination's checksum matches the source, and the bandwidth as
a fraction of its limit: the host's memory-copy bandwidth when both agents share a
machine, else the link rate the caller gives. `run_probe` starts the target detached and
runs the initiator through the node layer; `python -m lab_utils.kv.probe agent ...` is
what runs on the nodes, and prints its result as one marked JSON line.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import socket
import struct
import sys
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lab_utils.errors import ProcessFailedError

if TYPE_CHECKING:  # the agents need only numpy and nixl; the node layer is imported lazily
    from lab_utils.cluster import Cluster
    from lab_utils.config import LabConfig

KiB, MiB = 1024, 1024 * 1024
MARK = "NIXL_PROBE"  # prefix of the lines the orchestrator reads; other output is ignored
TARGET = "nixl-probe-target"
SEG_TYPES, OPS = ("DRAM", "VRAM"), ("READ", "WRITE")
ROW_KEYS = ("seg_type", "op", "bytes", "blocks", "iterations", "median_us", "p50_us", "p90_us",
            "p99_us", "bandwidth_GBps", "bandwidth_Gbps", "limit_GBps", "limit_kind",
            "fraction_of_limit", "checksum_ok")


# ----- arithmetic (pure) ----------------------------------------------------------------

def default_sizes(min_bytes: int = 64 * KiB, max_bytes: int = 64 * MiB,
                  max_total_bytes: int | None = None) -> list[int]:
    """Powers of two from `min_bytes` to `max_bytes`; with `max_total_bytes`, the largest
    are dropped until one pass over the sizes moves at most that many bytes."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= 2
    while max_total_bytes is not None and sizes and sum(sizes) > max_total_bytes:
        sizes.pop()
    return sizes


def summarize(times_s: Sequence[float], nbytes: int) -> dict:
    """Latency percentiles (µs) and bandwidth from the median time (GB/s decimal, Gb/s)."""
    t = np.asarray(times_s, dtype=float)
    if t.size == 0 or (t <= 0).any():
        raise ValueError("need at least one positive duration")
    p50, p90, p99 = (float(v) * 1e6 for v in np.percentile(t, [50, 90, 99]))
    gbps = nbytes / float(np.median(t)) / 1e9
    return {"iterations": int(t.size), "median_us": p50, "p50_us": p50, "p90_us": p90,
            "p99_us": p99, "bandwidth_GBps": gbps, "bandwidth_Gbps": gbps * 8}


def fraction_of_limit(bandwidth_GBps: float, limit_GBps: float | None) -> float | None:
    return bandwidth_GBps / limit_GBps if limit_GBps else None


def apply_limits(rows: list[dict], same_machine: bool, memcpy_GBps: Mapping[int, float],
                 link_rate_gbps: float | None) -> list[str]:
    """Give each row its limit (memcpy on one machine, else the link) and its fraction
    of it; return notes on limits that are missing."""
    notes = []
    for row in rows:
        if same_machine:
            limit, kind = memcpy_GBps.get(row["bytes"]), "memcpy"
        else:
            limit, kind = (link_rate_gbps / 8 if link_rate_gbps else None), "link"
        row.update(limit_GBps=limit, limit_kind=kind if limit else None,
                   fraction_of_limit=fraction_of_limit(row["bandwidth_GBps"], limit))
    if rows and not same_machine and not link_rate_gbps:
        notes.append("fraction_of_limit is None: the agents are on different machines and "
                     "no link_rate_gbps was given (e.g. 200 for a ConnectX-7 port)")
    return notes


def block_crcs(blocks: np.ndarray, indices: Iterable[int]) -> list[int]:
    """CRC32 of each selected row of a (blocks, block_bytes) array, in order."""
    return [zlib.crc32(np.ascontiguousarray(blocks[int(i)])) for i in indices]


def combine_crcs(crcs: Iterable[int]) -> int:
    return zlib.crc32(np.asarray(list(crcs), dtype=np.uint32).tobytes())


def blocks_checksum(blocks: np.ndarray, indices: Iterable[int]) -> int:
    """Checksum of the selected blocks in that order (block order matters)."""
    return combine_crcs(block_crcs(blocks, indices))


def memcpy_bandwidth(sizes: Iterable[int], iterations: int = 10) -> dict[int, float]:
    """GB/s of a numpy copy of each size on this host. As a limit it is the fastest of
    `iterations` copies, so a busy moment does not lower the bar the probe is held to."""
    sizes = sorted(set(sizes))
    src = np.frombuffer(np.random.default_rng(0).bytes(sizes[-1]), dtype=np.uint8)
    dst = np.empty_like(src)
    out = {}
    for s in sizes:
        times = []
        for i in range(iterations + 2):
            t0 = time.perf_counter()
            np.copyto(dst[:s], src[:s])
            if i >= 2:
                times.append(time.perf_counter() - t0)
        out[s] = s / min(times) / 1e9
    return out


# ----- the agents (run on the nodes) ----------------------------------------------------

def _send(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock: socket.socket, limit: int = 64 * MiB) -> dict:
    def exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the other probe agent closed the connection")
            buf += chunk
        return bytes(buf)

    (n,) = struct.unpack("!I", exact(4))
    if n > limit:
        raise ConnectionError(f"control message of {n} bytes: not a probe agent")
    return json.loads(exact(n))


def _accept_initiator(srv: socket.socket, run_id: str, timeout: float) -> socket.socket:
    """The first connection that says this run's id: anything else reaching the port (a
    reachability check, a scanner) is closed and the target keeps listening."""
    deadline = time.monotonic() + timeout
    while True:
        srv.settimeout(max(0.1, deadline - time.monotonic()))
        conn, _ = srv.accept()  # socket.timeout (an OSError) once the deadline passes
        conn.settimeout(5.0)
        try:
            if _recv(conn, limit=4 * KiB).get("run_id") == run_id:
                return conn
        except (OSError, ValueError, AttributeError):
            pass
        conn.close()


def _ask(sock: socket.socket, obj: dict) -> dict:
    _send(sock, obj)
    return _recv(sock)


def _unavailable(seg: str) -> str | None:
    """Why a memory type cannot be probed on this node, or None."""
    if seg == "DRAM":
        return None
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU (torch.cuda.is_available() is False)"
    torch.zeros(1, device="cuda")  # the CUDA context exists before NIXL/UCX start
    return None


class _Region:
    """2 x `half` blocks of one memory type, registered with the agent: the first half
    is the READ side, the second the WRITE side."""

    def __init__(self, agent, seg: str, half: int, block: int):
        n = 2 * half * block
        if seg == "DRAM":
            self.buf = np.zeros(n, dtype=np.uint8)
            addr, dev = self.buf.ctypes.data, 0
        else:
            import torch

            self.buf = torch.zeros(n, dtype=torch.uint8, device="cuda")
            addr, dev = self.buf.data_ptr(), self.buf.get_device()
        self.seg, self.half, self.block, self.addr, self.dev = seg, half, block, addr, dev
        self.reg = agent.register_memory([(addr, n, dev, "")], mem_type=seg)
        self.rows = block_rows(addr, dev, 2 * half, block)

    def blocks(self):
        return self.buf.reshape(2 * self.half, self.block)

    def host_blocks(self) -> np.ndarray:
        return self.blocks() if self.seg == "DRAM" else self.blocks().cpu().numpy()

    def fill(self, first: int, seed: int) -> None:
        n = self.half * self.block
        data = np.frombuffer(np.random.default_rng(seed).bytes(n), dtype=np.uint8)
        if self.seg != "DRAM":
            import torch

            data = torch.from_numpy(data.copy()).to(self.buf.device)
        self.buf[first * self.block:first * self.block + n] = data

    def zero(self, indices: list[int]) -> None:
        self.blocks()[indices] = 0


def block_rows(addr: int, dev: int, count: int, block: int) -> np.ndarray:
    """NIXL descriptors (address, length, device) of `count` consecutive blocks."""
    rows = np.empty((count, 3), dtype=np.uint64)
    rows[:, 0] = addr + np.arange(count, dtype=np.uint64) * block
    rows[:, 1], rows[:, 2] = block, dev
    return rows


def _agent(name: str):
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
    if "UCX" not in agent.backends:
        raise RuntimeError("NIXL has no UCX backend here (is the nixl package complete?)")
    return agent


def _target(a: argparse.Namespace) -> dict:
    why = {seg: _unavailable(seg) for seg in a.seg_types}
    notes = {s: f"{s} not applicable on the target node: {w}" for s, w in why.items() if w}
    agent = _agent(f"probe-target-{a.run_id}")
    regions = {s: _Region(agent, s, a.blocks, a.block_bytes) for s in a.seg_types if not why[s]}
    for region in regions.values():
        region.fill(0, a.seed)
    crcs = {s: block_crcs(r.host_blocks(), range(a.blocks)) for s, r in regions.items()}
    # Our own exchange, not NIXL's listener thread: that one binds 0.0.0.0 (checked with
    # nixl 1.5.1), and the probe must listen on the data-plane address only. It also
    # carries the per-block checksums and the WRITE verifications.
    family = socket.AF_INET6 if ":" in a.address else socket.AF_INET
    with socket.create_server((a.address, a.port), family=family) as srv:
        print(f"{MARK} {a.run_id} ready", flush=True)
        conn = _accept_initiator(srv, a.run_id, a.timeout)
    seen: set[bytes] = set()
    with conn:
        conn.settimeout(a.timeout)
        _send(conn, {"metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
                     "regions": {s: [r.addr, r.dev] for s, r in regions.items()},
                     "crcs": crcs, "notes": notes})
        while (msg := _recv(conn))["cmd"] != "bye":
            if msg["cmd"] == "verify":  # WRITE landed once its notification is here
                deadline = time.monotonic() + a.timeout
                while msg["tag"].encode() not in seen:
                    for got in agent.get_new_notifs().values():
                        seen.update(got)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no notification {msg['tag']!r} from the initiator")
                region = regions[msg["seg"]]
                _send(conn, {"checksum": blocks_checksum(region.host_blocks(), msg["indices"])})
                region.zero(msg["indices"])
            else:
                print(f"{MARK} {a.run_id} step {msg['done']}/{msg['total']}", flush=True)
                _send(conn, {})
        _send(conn, {})
        conn.recv(1)  # the initiator closes first, so TIME_WAIT does not hold our port
    return {"role": "target", "pid": os.getpid()}


def _transfer(agent, handle, timeout: float, notif: bytes = b"") -> None:
    state, deadline = agent.transfer(handle, notif), time.monotonic() + timeout
    while state == "PROC":
        state = agent.check_xfer_state(handle)
        if time.monotonic() > deadline:
            raise TimeoutError(f"a NIXL transfer did not finish within {timeout:.0f} s")
    if state != "DONE":
        raise RuntimeError(f"NIXL transfer failed (state {state})")


def _timed(agent, a: argparse.Namespace, op: str, local, li: list[int], remote,
           ri: list[int], tag: bytes | None) -> list[float]:
    handle = agent.make_prepped_xfer(op, local, li, remote, ri)
    try:
        times = []
        for i in range(a.warmup + a.iterations):
            t0 = time.perf_counter()
            _transfer(agent, handle, a.timeout)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
        if tag is not None:  # as a KV connector does: the notification follows the data
            _transfer(agent, handle, a.timeout, tag)
        return times
    finally:
        agent.release_xfer_handle(handle)


def _initiator(a: argparse.Namespace) -> dict:
    why = {seg: _unavailable(seg) for seg in a.seg_types}
    agent = _agent(f"probe-initiator-{a.run_id}")
    sock = socket.create_connection((a.target_address, a.port), timeout=a.timeout,
                                    source_address=(a.address, 0))
    rows: list[dict] = []
    with sock:
        _send(sock, {"run_id": a.run_id})
        hello = _recv(sock)
        remote = agent.add_remote_agent(base64.b64decode(hello["metadata"]))
        notes = list(hello["notes"].values()) + [
            f"{s} not applicable on the initiator node: {w}" for s, w in why.items() if w]
        segs = [s for s in a.seg_types if not why[s] and s in hello["regions"]]
        done, total = 0, len(segs) * len(a.sizes)
        for seg in segs:
            mine = _Region(agent, seg, a.blocks, a.block_bytes)
            mine.fill(a.blocks, a.seed + 1)
            local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", mine.rows, mem_type=seg)
            theirs = block_rows(*hello["regions"][seg], 2 * a.blocks, a.block_bytes)
            far = agent.prep_xfer_dlist(remote, theirs, mem_type=seg)
            rng = np.random.default_rng(a.seed + 2)
            lperm, rperm = rng.permutation(a.blocks), rng.permutation(a.blocks)
            for size in a.sizes:
                k = size // a.block_bytes
                for op in a.ops:
                    base = 0 if op == "READ" else a.blocks
                    li, ri = (lperm[:k] + base).tolist(), (rperm[:k] + base).tolist()
                    if op == "READ":
                        mine.zero(li)
                        tag = None
                    else:
                        tag = f"{a.run_id}:{seg}:{size}".encode()
                    times = _timed(agent, a, op, local, li, far, ri, tag)
                    got = blocks_checksum(mine.host_blocks(), li)
                    if op == "READ":
                        ok = got == combine_crcs(hello["crcs"][seg][i] for i in ri)
                    else:
                        reply = _ask(sock, {"cmd": "verify", "seg": seg, "tag": tag.decode(),
                                            "indices": ri})
                        ok = reply["checksum"] == got
                    rows.append({"seg_type": seg, "op": op, "bytes": size, "blocks": k,
                                 **summarize(times, size), "checksum_ok": ok})
                done += 1
                _ask(sock, {"cmd": "step", "done": done, "total": total})
            agent.release_dlist_handle(local)
            agent.release_dlist_handle(far)
            agent.deregister_memory(mine.reg)
        _ask(sock, {"cmd": "bye"})
    memcpy = memcpy_bandwidth(a.sizes) if a.memcpy and a.sizes else {}
    return {"role": "initiator", "pid": os.getpid(), "rows": rows, "notes": notes,
            "memcpy_GBps": {str(k): v for k, v in memcpy.items()}}


# ----- the orchestrator (runs where the notebook runs) ----------------------------------

@dataclass
class ProbeResult:
    """Rows per memory type, operation and size (keys: ROW_KEYS), and where they came from."""

    rows: list[dict]
    target: str
    initiator: str
    target_address: str
    initiator_address: str
    port: int
    same_machine: bool
    env: dict[str, dict[str, str]]
    notes: list[str] = field(default_factory=list)
    memcpy_GBps: dict[int, float] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every transfer's destination matched its source."""
        return all(r["checksum_ok"] for r in self.rows)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(ROW_KEYS))


def _ucx_env(cfg: LabConfig, node: str, ucx_tls: str | None,
             ucx_net_devices: str | Mapping[str, str] | None) -> dict[str, str]:
    devices = (ucx_net_devices.get(node) if isinstance(ucx_net_devices, Mapping)
               else ucx_net_devices) or cfg.nodes[node].data_netdev
    tls = ucx_tls or cfg.kv_transfer.ucx_tls
    return {k: v for k, v in (("UCX_TLS", tls), ("UCX_NET_DEVICES", devices)) if v}


def _failure(what: str, text: str) -> ProcessFailedError:
    from lab_utils import known_failures

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
              timeout_s: float = 300.0, show_progress: bool = True) -> ProbeResult:
    """Measure NIXL READ/WRITE from the decode node (initiator) to the prefill node
    (target) for each size (bytes; rounded up to whole blocks of `block_bytes`). Takes a
    config too (a cluster is then built for the probe and closed after it)."""
    from lab_utils.cluster import Cluster
    from lab_utils.cluster.provision import deploy_node
    from lab_utils.util.progress import progress_bar

    if not isinstance(cluster, Cluster):
        with Cluster(cluster) as own:
            return run_probe(own, sizes, seg_types=seg_types, ops=ops, iterations=iterations,
                             warmup=warmup, block_bytes=block_bytes, link_rate_gbps=link_rate_gbps,
                             ucx_tls=ucx_tls, ucx_net_devices=ucx_net_devices,
                             timeout_s=timeout_s, show_progress=show_progress)

    bad = ([s for s in seg_types if s not in SEG_TYPES] + [o for o in ops if o not in OPS]
           + [s for s in (sizes or []) if s <= 0])
    if bad or iterations < 1 or block_bytes < 1 or (sizes is not None and not sizes):
        raise ValueError(f"invalid probe arguments {bad}: seg_types from {SEG_TYPES}, ops "
                         f"from {OPS}, positive sizes, iterations and block_bytes")
    asked = list(default_sizes() if sizes is None else sizes)
    moved = sorted({math.ceil(s / block_bytes) * block_bytes for s in asked})
    notes = [f"sizes rounded up to whole {block_bytes} B blocks: {s} -> {m}"
             for s in asked if (m := math.ceil(s / block_bytes) * block_bytes) != s]
    cfg = cluster.cfg
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
        argv = [node.python, "-m", "lab_utils.kv.probe", "agent", "--role", role,
                "--address", address, *common]
        env, cwd = {"PYTHONUNBUFFERED": "1", **ucx[role]}, None
        if node.cfg.connection == "ssh":  # run the deployed copy, as the proxy does
            env["PYTHONPATH"], cwd = node.cfg.workdir, node.cfg.workdir
        return argv, env, cwd

    t_argv, t_env, t_cwd = launch(t_node, "target", t_addr)
    i_argv, i_env, _ = launch(i_node, "initiator", i_addr)
    i_argv += ["--target-address", t_addr, "--sizes", ",".join(map(str, moved)),
               "--ops", ",".join(ops), "--iterations", str(iterations), "--warmup", str(warmup)]
    i_argv += ["--memcpy"] if same else []
    cluster.alive(TARGET)  # forget a dead earlier target; a live one holds the port
    t_node.ensure_port_free(t_addr, port, "the NIXL probe")
    t0 = time.monotonic()
    rec = t_node.start_detached(TARGET, t_argv, log_path=f"{cfg.log_dir_on(t_name)}/{TARGET}.log",
                                env=t_env, cwd=t_cwd, kind="probe", port=port,
                                extra={"role": "probe-target", "run_id": run_id})
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        where = f"the NIXL probe target on node {t_name} (log {rec.log_path})"
        while f"{MARK} {run_id} ready" not in t_node.log_tail(rec, 200):
            if not t_node.is_alive(rec):
                raise _failure(f"{where} exited before it was ready:\n", t_node.log_tail(rec, 30))
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
    return ProbeResult(rows=[{k: r.get(k) for k in ROW_KEYS} for r in rows], target=t_name,
                       initiator=i_name, target_address=t_addr, initiator_address=i_addr,
                       port=port, same_machine=same, env=ucx, notes=notes, memcpy_GBps=memcpy,
                       pids={"target": rec.pid, "initiator": out["pid"]},
                       elapsed_s=time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab_utils.kv.probe")
    ag = p.add_subparsers(dest="cmd", required=True).add_parser(
        "agent", help="one NIXL probe agent (started by run_probe)")
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    ag.add_argument("--role", choices=("target", "initiator"), required=True)
    ag.add_argument("--address", required=True, help="this agent's data-plane address")
    ag.add_argument("--target-address")
    ag.add_argument("--port", type=int, required=True)
    ag.add_argument("--run-id", required=True)
    ag.add_argument("--seg-types", type=csv, default=["DRAM"])
    ag.add_argument("--ops", type=csv, default=list(OPS))
    ag.add_argument("--sizes", type=lambda s: [int(x) for x in csv(s)], default=[])
    ag.add_argument("--block-bytes", type=int, default=64 * KiB)
    ag.add_argument("--blocks", type=int, required=True, help="blocks per half region")
    ag.add_argument("--iterations", type=int, default=20)
    ag.add_argument("--warmup", type=int, default=3)
    ag.add_argument("--seed", type=int, default=0)
    ag.add_argument("--timeout", type=float, default=120.0)
    ag.add_argument("--memcpy", action="store_true", help="also measure memcpy bandwidth")
    a = p.parse_args(argv)
    if a.role == "initiator" and not (a.target_address and a.sizes):
        p.error("an initiator needs --target-address and --sizes")
    try:
        out = _target(a) if a.role == "target" else _initiator(a)
    except Exception as e:
        env = {k: v for k, v in os.environ.items() if k in ("UCX_TLS", "UCX_NET_DEVICES")}
        print(f"NIXL probe {a.role} at {a.address}: {type(e).__name__}: {e} (UCX env: {env})",
              file=sys.stderr, flush=True)
        return 1
    print(f"{MARK}-RESULT {json.dumps(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
