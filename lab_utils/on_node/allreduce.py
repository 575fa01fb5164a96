"""One rank of the checklist's all-reduce across the split model's nodes
(`lab_utils.checks.collective`), run as its ranks run theirs: torch.distributed with the
rendezvous at rank 0's ADDRESS:PORT, NCCL on the GPU, Gloo on the CPU build.

    python -c SOURCE allreduce RANK WORLD ADDRESS:PORT BACKEND BYTES...

Its source is sent to the node's Python with `-c`, like `facts` (so the lab need not be
deployed there yet), but it needs that Python's torch: the serving node's vLLM
environment. It prints one JSON line: each size's median time over a few all-reduces
after a warm-up one, and whether every element of the sum came back right.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time


def allreduce(rank: int, world: int, target: str, backend: str, sizes: list[int],
              iters: int = 5) -> dict:
    import torch
    import torch.distributed as dist

    host, _, port_text = target.rpartition(":")
    port = int(port_text)
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    dtype = torch.bfloat16 if cuda else torch.float32
    each = torch.tensor([], dtype=dtype).element_size()
    out = []
    try:
        for nbytes in sizes:
            x = torch.ones(max(1, nbytes // each), dtype=dtype, device="cuda" if cuda else "cpu")
            times = []
            for i in range(iters + 1):  # the first warms the connections up
                x.fill_(1)
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x)
                if cuda:
                    torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - start)
            ok = bool((x == world).all().item())
            out.append({"bytes": x.numel() * each, "ms": statistics.median(times) * 1e3,
                        "sum_ok": ok})
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "backend": backend, "sizes": out}


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "allreduce":
        raise SystemExit("usage: allreduce RANK WORLD ADDRESS:PORT BACKEND BYTES...")
    rank, world, target, backend, *sizes = argv[1:]
    print(json.dumps(allreduce(int(rank), int(world), target, backend, [int(a) for a in sizes])),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
