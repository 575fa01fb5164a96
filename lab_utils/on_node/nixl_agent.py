"""One NIXL probe agent: what runs on the serving nodes, from the deployed copy.

`lab_utils.kv.probe.run_probe` (the driver, where the notebook runs) starts two of these
through the node layer, placed as in prefill/decode serving: the target on the prefill
node holds the data, the initiator on the decode node moves it with one-sided READ (what
vLLM's NixlConnector does) and WRITE. Each agent registers one region per memory type
(DRAM; VRAM where CUDA exists) split into fixed-size blocks and prepares its descriptor
lists once; every transfer then selects scattered block indices, as a paged KV cache does.
The agents talk over one TCP connection of their own (NIXL metadata, per-block checksums,
WRITE verifications, progress); the initiator prints its rows (latency percentiles,
bandwidth, checksum verdict) as one `NIXL_PROBE-RESULT` JSON line. With `--time-box`
each memory type has its own time (plus what the ones before left unused): once it is
spent, that type stops, keeps the rows it finished, and `cut_short` says what was not
measured and why, so a memory slower than planned still leaves a result.

    python -m lab_utils.on_node.nixl_agent --role target --address A --port P \
        --run-id R --blocks N
    python -m lab_utils.on_node.nixl_agent --role initiator --address B \
        --target-address A --port P --run-id R --blocks N --sizes 65536,131072

Only the standard library, numpy, nixl and (for VRAM) torch: nothing else of lab_utils.
A little over 400 lines: both halves of one exchange stay in the one file that runs on
the nodes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

KiB, MiB = 1024, 1024 * 1024
MARK = "NIXL_PROBE"  # prefix of the lines the driver reads; other output is ignored
OPS = ("READ", "WRITE")


# ----- statistics and checksums (pure) ---------------------------------------------------

def summarize(times_s: Sequence[float], nbytes: int) -> dict:
    """Latency percentiles (µs) and bandwidth from the median time (GB/s decimal, Gb/s)."""
    t = np.asarray(times_s, dtype=float)
    if t.size == 0 or (t <= 0).any():
        raise ValueError("need at least one positive duration")
    p50, p90, p99 = (float(v) * 1e6 for v in np.percentile(t, [50, 90, 99]))
    gbps = nbytes / float(np.median(t)) / 1e9
    return {"iterations": int(t.size), "median_us": p50, "p50_us": p50, "p90_us": p90,
            "p99_us": p99, "bandwidth_GBps": gbps, "bandwidth_Gbps": gbps * 8}


def block_crcs(blocks: np.ndarray, indices: Iterable[int]) -> list[int]:
    """CRC32 of each selected row of a (blocks, block_bytes) array, in order."""
    return [zlib.crc32(np.ascontiguousarray(blocks[int(i)]).data) for i in indices]


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


# ----- the exchange between the two agents ----------------------------------------------

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
        self.buf: Any  # a numpy array (DRAM) or a torch tensor (VRAM)
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
        data: Any = np.frombuffer(np.random.default_rng(seed).bytes(n), dtype=np.uint8)
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


class TimeBoxSpent(Exception):
    """A memory type's time box ran out; `in_flight`: during a transfer."""

    def __init__(self, in_flight: bool):
        super().__init__("time box spent")
        self.in_flight = in_flight


def _transfer(agent, handle, timeout: float, notif: bytes = b"",
              box_end: float | None = None) -> None:
    state, deadline = agent.transfer(handle, notif), time.monotonic() + timeout
    while state == "PROC":
        state = agent.check_xfer_state(handle)
        if box_end is not None and time.monotonic() > box_end and state == "PROC":
            raise TimeBoxSpent(in_flight=True)
        if time.monotonic() > deadline:
            raise TimeoutError(f"a NIXL transfer did not finish within {timeout:.0f} s")
    if state != "DONE":
        raise RuntimeError(f"NIXL transfer failed (state {state})")


def _timed(agent, a: argparse.Namespace, op: str, local, li: list[int], remote,
           ri: list[int], tag: bytes | None, box_end: float | None = None) -> list[float]:
    handle = agent.make_prepped_xfer(op, local, li, remote, ri)
    released = False
    try:
        times = []
        for i in range(a.warmup + a.iterations):
            if box_end is not None and time.monotonic() > box_end:
                raise TimeBoxSpent(in_flight=False)
            t0 = time.perf_counter()
            _transfer(agent, handle, a.timeout, box_end=box_end)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
        if tag is not None:  # as a KV connector does: the notification follows the data
            _transfer(agent, handle, a.timeout, tag)
        return times
    except TimeBoxSpent as e:
        released = e.in_flight  # a transfer still in flight keeps its handle
        raise
    finally:
        if not released:
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
        cut: dict[str, str] = {}
        spare = 0.0  # what the memory types before left of their time boxes
        for seg in segs:
            box = a.time_box.get(seg)
            t_seg = time.monotonic()
            box_end = t_seg + box + spare if box is not None else None
            mine = _Region(agent, seg, a.blocks, a.block_bytes)
            mine.fill(a.blocks, a.seed + 1)
            local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", mine.rows, mem_type=seg)
            their_addr, their_dev = hello["regions"][seg]
            theirs = block_rows(their_addr, their_dev, 2 * a.blocks, a.block_bytes)
            far = agent.prep_xfer_dlist(remote, theirs, mem_type=seg)
            rng = np.random.default_rng(a.seed + 2)
            lperm, rperm = rng.permutation(a.blocks), rng.permutation(a.blocks)
            measured: list[int] = []
            in_flight = False
            for size in a.sizes:
                k = size // a.block_bytes
                if seg in cut:  # the box is spent: the rest of this memory is skipped
                    done += 1
                    _ask(sock, {"cmd": "step", "done": done, "total": total})
                    continue
                for op in a.ops:
                    base = 0 if op == "READ" else a.blocks
                    li, ri = (lperm[:k] + base).tolist(), (rperm[:k] + base).tolist()
                    if op == "READ":
                        mine.zero(li)
                        tag = None
                    else:
                        tag = f"{a.run_id}:{seg}:{size}".encode()
                    try:
                        times = _timed(agent, a, op, local, li, far, ri, tag, box_end)
                    except TimeBoxSpent as e:
                        in_flight = e.in_flight
                        spent = time.monotonic() - t_seg
                        rate = sum(len(a.ops) * s * (a.warmup + a.iterations) for s in measured) / spent
                        cut[seg] = (
                            f"{seg} cut short by its time box ({spent:.0f} s of "
                            f"{box + spare:.0f} s): measured sizes {measured or 'none'}, not "
                            f"measured from {size} B {op} on ({len(a.sizes) - len(measured)} of "
                            f"{len(a.sizes)} sizes); {seg} moved about {rate / 1e9:.3g} GB/s, "
                            "slower than the plan expected")
                        break
                    got = blocks_checksum(mine.host_blocks(), li)
                    if op == "READ":
                        ok = got == combine_crcs(hello["crcs"][seg][i] for i in ri)
                    else:
                        assert tag is not None
                        reply = _ask(sock, {"cmd": "verify", "seg": seg, "tag": tag.decode(),
                                            "indices": ri})
                        ok = reply["checksum"] == got
                    rows.append({"seg_type": seg, "op": op, "bytes": size, "blocks": k,
                                 **summarize(times, size), "checksum_ok": ok})
                if seg in cut:  # a size cut between its operations keeps none of its rows
                    rows = [r for r in rows if (r["seg_type"], r["bytes"]) != (seg, size)]
                else:
                    measured.append(size)
                done += 1
                _ask(sock, {"cmd": "step", "done": done, "total": total})
            if box_end is not None:
                spare = max(0.0, box_end - time.monotonic())
            if in_flight:  # NIXL still owns a transfer on these: left to the process's exit
                continue
            agent.release_dlist_handle(local)
            agent.release_dlist_handle(far)
            agent.deregister_memory(mine.reg)
        _ask(sock, {"cmd": "bye"})
    memcpy = memcpy_bandwidth(a.sizes) if a.memcpy and a.sizes else {}
    return {"role": "initiator", "pid": os.getpid(), "rows": rows,
            "notes": notes + list(cut.values()), "cut_short": cut,
            "memcpy_GBps": {str(k): v for k, v in memcpy.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab_utils.on_node.nixl_agent",
                                description="one NIXL probe agent (started by run_probe)")
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--role", choices=("target", "initiator"), required=True)
    p.add_argument("--address", required=True, help="this agent's data-plane address")
    p.add_argument("--target-address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--seg-types", type=csv, default=["DRAM"])
    p.add_argument("--ops", type=csv, default=list(OPS))
    p.add_argument("--sizes", type=lambda s: [int(x) for x in csv(s)], default=[])
    p.add_argument("--block-bytes", type=int, default=64 * KiB)
    p.add_argument("--blocks", type=int, required=True, help="blocks per half region")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--memcpy", action="store_true", help="also measure memcpy bandwidth")
    p.add_argument("--time-box", type=lambda s: {k: float(v) for k, v in
                                                 (x.split("=") for x in csv(s))},
                   default={}, help="seconds per memory type, e.g. DRAM=20,VRAM=120")
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
