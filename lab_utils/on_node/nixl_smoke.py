"""NIXL smoke test, run by the node's own Python with the nixl package vLLM will use.

Two NIXL agents in one process, each with the UCX backend as vLLM's NixlConnector makes it
(nixl_agent_config(backends=["UCX"])), so it is the UCX that the nixl wheel brings along
(nixl_cu13.libs/libucp-*, its own libuct_ib_mlx5), not the system's `ucx_info`. Agent "b"
registers a host buffer of random bytes, agent "a" an empty one; "a" reads "b"'s buffer
once (a one-sided READ, as the connector moves KV blocks) and compares the bytes. The
caller sets UCX_NET_DEVICES (and UCX_TLS) as vLLM gets them, and UCX_PROTO_INFO=y so UCX
prints which transport it chose for each operation (parsed by
`lab_utils.checks.parsers.ucx_proto_info`). Prints one line, `NIXL_SMOKE {json}`:
ok, the stage reached, the error if any, bytes moved and seconds.

    python - <nbytes> < nixl_smoke.py

Standard library, numpy and nixl only: sent as source, nothing deployed is needed.
"""

from __future__ import annotations

import json
import sys
import time

MARK = "NIXL_SMOKE"


def smoke(nbytes: int, timeout_s: float = 60.0) -> dict:
    out: dict = {"ok": False, "stage": "import", "error": None, "bytes": nbytes,
                 "seconds": None}
    try:
        import numpy as np
        from nixl._api import nixl_agent, nixl_agent_config

        out["stage"] = "agent"
        agents = [nixl_agent(n, nixl_agent_config(backends=["UCX"])) for n in ("a", "b")]
        if any("UCX" not in ag.backends for ag in agents):
            raise RuntimeError("NIXL has no UCX backend here (is the nixl package complete?)")
        a, b = agents
        out["stage"] = "register"
        src = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8).copy()
        dst = np.zeros_like(src)
        regs = [(a, a.register_memory([(dst.ctypes.data, nbytes, 0, "")], mem_type="DRAM")),
                (b, b.register_memory([(src.ctypes.data, nbytes, 0, "")], mem_type="DRAM"))]
        out["stage"] = "connect"
        peer = a.add_remote_agent(b.get_agent_metadata())
        local = a.get_xfer_descs([(dst.ctypes.data, nbytes, 0)], mem_type="DRAM")
        remote = b.get_xfer_descs([(src.ctypes.data, nbytes, 0)], mem_type="DRAM")
        out["stage"] = "transfer"
        t0 = time.perf_counter()
        handle = a.initialize_xfer("READ", local, remote, peer)
        state = a.transfer(handle)
        while state == "PROC":
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"the READ did not finish within {timeout_s:.0f} s")
            state = a.check_xfer_state(handle)
        out["seconds"] = time.perf_counter() - t0
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer failed (state {state})")
        out["stage"] = "compare"
        if not np.array_equal(src, dst):
            raise RuntimeError("the bytes read differ from the source")
        a.release_xfer_handle(handle)
        for agent, reg in regs:
            agent.deregister_memory(reg)
        out.update(ok=True, stage="done")
    except Exception as e:  # reported, not raised: the caller judges it
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def main(argv: list[str]) -> int:
    result = smoke(int(argv[0]) if argv else 1 << 20)
    # UCX writes its tables through C's stdio, whose buffer reaches a pipe in blocks that
    # need not end a line: flush it first, and start the answer on a line of its own
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    sys.stdout.flush()
    print(f"\n{MARK} {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
