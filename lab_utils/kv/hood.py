"""Notebook 02's "open the hood": NIXL's API in a few lines, for real.

`two_agents` is meant to be read (notebook 02 prints its source) and run: two agents in
this process, each with a DRAM buffer registered with the UCX backend; the initiator
learns the target's metadata, describes both buffers, READs the target's bytes into its
own with one transfer, waits for it, and checks the copy. It is what NixlConnector does
for a request's KV blocks, with one buffer instead of a descriptor per block and layer.
"""

from __future__ import annotations

import inspect
import time


def two_agents(nbytes: int = 4 << 20) -> dict:
    """One NIXL READ of `nbytes` between two agents on this machine's DRAM."""
    import numpy as np

    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as e:
        from lab_utils.errors import LabError

        raise LabError(f"NIXL is not installed where this notebook runs ({e}); it is on the "
                       "serving nodes. Run this cell on a machine with nixl (the rehearsal "
                       "has it), or read the code above.") from None

    import logging

    logging.getLogger("nixl").setLevel(logging.WARNING)  # not its start-up chatter
    target = nixl_agent("target", nixl_agent_config(backends=["UCX"]))
    initiator = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)  # the "KV"
    dst = np.zeros(nbytes, dtype=np.uint8)
    where = {"target": (src.ctypes.data, nbytes, 0), "initiator": (dst.ctypes.data, nbytes, 0)}
    regs = [target.register_memory([(*where["target"], "")], mem_type="DRAM"),  # pin for the NIC
            initiator.register_memory([(*where["initiator"], "")], mem_type="DRAM")]
    peer = initiator.add_remote_agent(target.get_agent_metadata())  # the side channel's job
    local = initiator.get_xfer_descs([where["initiator"]], mem_type="DRAM")  # address, length, device
    remote = target.get_xfer_descs([where["target"]], mem_type="DRAM")
    handle = initiator.initialize_xfer("READ", local, remote, peer, b"done")
    times = []
    for _ in range(2):  # the first READ also opens the UCX connection
        t0 = time.perf_counter()
        state = initiator.transfer(handle)  # one-sided: the target's CPU takes no part
        while state not in ("DONE", "ERR"):
            state = initiator.check_xfer_state(handle)
        times.append((time.perf_counter() - t0) * 1e3)
    equal = bool(state == "DONE" and np.array_equal(src, dst))
    initiator.release_xfer_handle(handle)
    initiator.remove_remote_agent(peer)
    for agent, reg in zip((target, initiator), regs, strict=True):
        agent.deregister_memory(reg)
    del target, initiator  # their progress threads stop with them
    return {"bytes": nbytes, "state": state, "first READ ms": round(times[0], 3),
            "second READ ms": round(times[1], 3), "GB/s": round(nbytes / times[1] / 1e6, 2),
            "copy equals source": equal}


def show(fn) -> None:
    """Print a function's source: the notebook shows the code it is about to run."""
    print(inspect.getsource(fn))
