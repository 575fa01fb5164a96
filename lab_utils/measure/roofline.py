"""Hardware figures for the decode roofline: memory bandwidth and the bytes of weights.

Decode reads every weight once per step, so one stream cannot go faster than memory
bandwidth / weight bytes tokens per second. On a GB10 the bandwidth is the published
273 GB/s (DESIGN section 8); on a CPU node it is measured there (a streaming read of a
large array, best of a few); elsewhere it is unknown and the roofline is not drawn. Both
figures take the cluster a caller holds, or a config (a cluster is built for the call).
"""

from __future__ import annotations

import json

from lab_utils.cluster import Cluster, as_cluster
from lab_utils.config import LabConfig
from lab_utils.errors import LabError

GB10_BANDWIDTH_GBPS = 273.0

_READ_BANDWIDTH = """
import json, time
import numpy as np
a = np.ones(64 * 2**20, dtype=np.float64)  # 512 MiB
best = min((lambda t0: (a.sum(), time.perf_counter() - t0)[1])(time.perf_counter())
           for _ in range(5))
print(json.dumps(a.nbytes / best / 1e9))
"""

_WEIGHT_BYTES = """
names = [n for n in os.listdir(where) if n.endswith(".safetensors")] or \\
        [n for n in os.listdir(where) if n.endswith(".bin")]
print(json.dumps(sum(os.path.getsize(os.path.join(where, n)) for n in names)))
"""


def _run(cluster: Cluster | LabConfig, code: str, in_model_dir: bool = False) -> float:
    """Run `code` on the baseline node (in the model's directory if asked); its last line."""
    from lab_utils.cluster.provision import run_in_model_dir

    with as_cluster(cluster) as cluster:
        name = cluster.cfg.topology.baseline.node
        node = cluster.node(name)
        r = (run_in_model_dir(cluster, name, code, timeout=300) if in_model_dir
             else node.run([node.python, "-c", code], timeout=300))
    if not r.ok:
        raise LabError(f"on {name}: {r.why}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def memory_bandwidth(cluster: Cluster | LabConfig,
                     gpu_name: str | None) -> tuple[float | None, str]:
    """(GB/s, where the figure comes from) for the baseline node; `gpu_name` is the GPU
    notebook 00 recorded (None without a GPU)."""
    cfg = cluster.cfg if isinstance(cluster, Cluster) else cluster
    if cfg.vllm.device == "cuda":
        names = gpu_name.split(", ") if gpu_name else []  # one per GPU model seen
        if names and all("GB10" in n for n in names):
            return GB10_BANDWIDTH_GBPS, "GB10 LPDDR5x, published figure"
        return None, "unknown for this GPU"
    bw = _run(cluster, _READ_BANDWIDTH)
    return bw, f"measured on {cfg.topology.baseline.node}: streaming read of 512 MiB, best of 5"


def weight_bytes(cluster: Cluster | LabConfig) -> int:
    """Bytes of the model's weight files on the baseline node."""
    return int(_run(cluster, _WEIGHT_BYTES, in_model_dir=True))
