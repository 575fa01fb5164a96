"""Hardware figures for the decode roofline: memory bandwidth and the bytes of weights.

Decode reads every weight matrix once per step, so one stream cannot go faster than
memory bandwidth / bytes read per token tokens per second. The input embedding is the
exception: a lookup reads one row per token (hidden_size elements), not the matrix, so
its bytes are left out; when the embedding is tied to the LM head the same matrix is read
whole as the LM head, so it then counts once (`decode_weight_bytes`). On a GB10 the bandwidth is the published
273 GB/s (NVIDIA's DGX Spark specifications); on a CPU node it is measured there (a streaming read of a
large array, best of a few); elsewhere it is unknown and the roofline is not drawn. Both
figures take the cluster a caller holds, or a config (a cluster is built for the call).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lab_utils.cluster import Cluster, as_cluster
from lab_utils.cluster.provision import run_in_model_dir
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
import struct
names = [n for n in os.listdir(where) if n.endswith(".safetensors")] or \\
        [n for n in os.listdir(where) if n.endswith(".bin")]
files = sum(os.path.getsize(os.path.join(where, n)) for n in names)
tensors = {}
try:  # a safetensors header: 8-byte little-endian length, then JSON name -> data_offsets
    for n in (n for n in names if n.endswith(".safetensors")):
        with open(os.path.join(where, n), "rb") as f:
            head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        tensors.update({k: v["data_offsets"][1] - v["data_offsets"][0]
                        for k, v in head.items() if k != "__metadata__"})
except Exception:
    tensors = {}
try:
    with open(os.path.join(where, "config.json")) as f:
        c = json.load(f)
    tied = c.get("tie_word_embeddings", (c.get("text_config") or {}).get("tie_word_embeddings"))
except Exception:
    tied = None
print(json.dumps({"files": files, "tensors": tensors, "tied": tied}))
"""

# Input embedding and LM head tensors by name (Llama/Qwen/Mistral, GPT-2, BLOOM/Falcon,
# original Llama checkpoints; multimodal models nest them under a language model).
_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings)\.weight$")
_LM_HEAD = re.compile(r"(^|\.)lm_head\.weight$|^output\.weight$")


def _run(cluster: Cluster | LabConfig, code: str, in_model_dir: bool = False) -> Any:
    """Run `code` on the baseline node (in the model's directory if asked); its last line."""

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


def decode_weight_bytes(files: int, tensors: dict[str, int], tied: bool | None) -> int:
    """Bytes of weights one decode step reads: every tensor of the checkpoint (`tensors`:
    name -> bytes, from the safetensors headers) except the input embedding, which a
    lookup reads one row of per token. Tied embeddings (`tied`, config.json's
    tie_word_embeddings, or no separate LM head tensor) are read whole as the LM head, so
    then the embedding counts once. Without tensor names (.bin files, unreadable headers)
    the weight files' size `files`, embedding included."""
    if not tensors:
        return files
    total = sum(tensors.values())
    if tied or not any(_LM_HEAD.search(n) for n in tensors):
        return total
    return total - sum(b for n, b in tensors.items() if _EMBEDDING.search(n))


def weight_bytes(cluster: Cluster | LabConfig) -> int:
    """Bytes of the model's weights one decode step reads (`decode_weight_bytes`), from the
    weight files on the baseline node."""
    found = _run(cluster, _WEIGHT_BYTES, in_model_dir=True)
    return int(decode_weight_bytes(found["files"], found["tensors"], found["tied"]))
