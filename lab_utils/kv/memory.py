"""What one vLLM instance takes from its node's memory, computed before anything starts.

On a CUDA node vLLM asks for a pool of `gpu_memory_utilization x total` and fills what
the weights and its overhead leave with the KV cache (v1/worker/gpu_worker.py
`determine_available_memory`); `--kv-cache-memory-bytes` fixes the KV cache instead. With
NixlConnector and `kv_buffer_device` "cpu" on a non-CPU platform vLLM then allocates a
host tensor as big as every layer's KV cache (nixl/base_worker.py
`initialize_host_xfer_buffer`), after the pool was sized, so outside it. On GB10 host and
GPU memory are one ~120 GiB pool, so that mirror counts against the same `MemTotal`. On
the CPU build the KV cache is `cpu_kvcache_space_gib` (VLLM_CPU_KVCACHE_SPACE) and there
is no mirror (`use_host_buffer` is False on a CPU platform). Weights come from the model's
weight files when they are readable here, else from config.json's shape; the overheads are
assumptions, named as such, until a real run measured them: `MeasuredMemory` carries a node's
calibration (`results.calibration`) and replaces each estimate it has, labelled with the
node and date of the measurement.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.cluster.tiny_model import MODEL_SHAPE, VOCAB_SIZE
from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.kv.shapes import DTYPE_BYTES, PUBLISHED_CONFIGS, kv_shape
from lab_utils.results.calibration import cuda_total

GiB = 2**30
# Inside vLLM's pool, besides weights and KV: peak activations of a profile run at
# max_num_batched_tokens, CUDA graphs (counted since vLLM 0.21) and non-torch memory
# (CUDA context, cuBLAS/NCCL workspaces). vLLM measures it at startup and logs
# "Available KV cache memory"; 3 GiB is an assumption for an 8B model.
CUDA_OVERHEAD = 3 * GiB
# Outside the pool on every node: the API server and engine-core Python processes (torch,
# tokenizer), assumed 2 GiB per instance; and the OS with what else runs there, assumed
# 8 GiB on a Spark (recorded idle Sparks used 4.9 and 12 GiB: free.kB.gb10.spark-7d19.txt,
# free-h.gb10.txt in tests/fixtures/dgx-spark-recorded) and 2 GiB on a rehearsal machine.
PROCESS_HOST = 2 * GiB
OS_RESERVE = {"cuda": 8 * GiB, "cpu": 2 * GiB}
# vLLM's default --gpu-memory-utilization (config/cache.py).
DEFAULT_UTILIZATION = 0.92
# vLLM's pool is utilization x CUDA's total (`calibration.cuda_total`). At start-up it
# refuses to go on unless the free memory, which on an integrated GPU is MemAvailable, is
# at least the pool (vllm/v1/worker/utils.py, request_memory). Free memory at that check
# on a GB10 running nothing else of the lab: 104.5 GiB in the recorded message
# (tests/fixtures/dgx-spark-recorded/vllm-error.free-memory-below-utilization.gb10.reflowed.txt),
# 101.3-102.2 GiB reported in public GB10 threads (not recorded here); the lowest is the
# estimate of what a start leaves free until the node's own start is measured.
GB10_FREE_AT_CHECK = int(101.3 * GiB)
GB10_MEMTOTAL = 125511968 * 1024  # 119.7 GiB: proc-meminfo.head-20.gb10.txt, same fixtures

@dataclass(frozen=True)
class MeasuredMemory:
    """Figures measured on a node (bytes, and "measured on <node>, <date>"); None: the
    estimate stands."""

    cuda_overhead: tuple[int, str] | None = None
    process: tuple[int, str] | None = None
    os_reserve: tuple[int, str] | None = None
    kv_bytes: tuple[int, str] | None = None  # what vLLM logged for this role's KV cache

    def overhead_bytes(self) -> int:
        return self.cuda_overhead[0] if self.cuda_overhead else CUDA_OVERHEAD

    def process_bytes(self) -> int:
        return self.process[0] if self.process else PROCESS_HOST

    def reserve_bytes(self, device: str) -> int:
        return self.os_reserve[0] if self.os_reserve else OS_RESERVE[device]


ESTIMATED = MeasuredMemory()


@dataclass(frozen=True)
class Item:
    """One line of a budget: what, how many bytes, whether vLLM's pool holds it, and where
    the figure comes from ("" when it is exact arithmetic)."""

    what: str
    bytes: int
    in_pool: bool
    note: str = ""


@dataclass
class InstanceMemory:
    """One instance's memory on its node; `pool` is None on the CPU build."""

    items: list[Item]
    pool: int | None
    kv_bytes: int
    kv_tokens: int
    mirror: bool
    notes: list[str] = field(default_factory=list)
    needs_free: int | None = None  # what vLLM's start-up check wants free (GPU only)

    @property
    def total(self) -> int:
        inside = sum(i.bytes for i in self.items if i.in_pool)
        return max(self.pool or 0, inside) + sum(i.bytes for i in self.items if not i.in_pool)


def param_count(hf: dict) -> int:
    """Parameters of a dense or MoE decoder from config.json's shape (norms included)."""
    c = hf.get("text_config", hf)
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    attn = h * heads * hd * 2 + h * kv_heads * hd * 2
    experts = c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts")
    if experts:
        inter = c.get("moe_intermediate_size") or c["intermediate_size"]
        shared = (c.get("n_shared_experts") or 0) * 3 * h * inter
        mlp = experts * 3 * h * inter + shared + h * experts
    else:
        mlp = 3 * h * c["intermediate_size"]
    per_layer = attn + mlp + 2 * h + 2 * hd
    embed = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return layers * per_layer + embed + h


def weight_files_bytes(model_dir: Path) -> int | None:
    """Bytes of the weight files in a local model directory (None: none readable)."""
    try:
        files = [p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin")]
        return sum(p.stat().st_size for p in files) or None
    except OSError:
        return None


def model_config(cfg: LabConfig, hf_config: dict | None = None) -> tuple[dict, Path | None, str]:
    """The model's config.json (given, local, in this host's HF cache, or published),
    the local directory holding it if any, and where it came from."""
    if hf_config is not None:
        return hf_config, None, "config.json given by the caller"
    if cfg.model.source == "tiny":
        shape = {**MODEL_SHAPE, "vocab_size": VOCAB_SIZE, "torch_dtype": cfg.model.dtype}
        return shape, Path(cfg.model_path), "the tiny model's recipe"
    where: Path | None = None
    if cfg.model.source == "path":
        where = Path(cfg.model_path)
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(cfg.model.name, "config.json",
                                           revision=cfg.model.revision)
            where = Path(found).parent if isinstance(found, str) else None
        except Exception:  # no hub client, or a bad cache: fall back to published values
            where = None
    if where is not None and (where / "config.json").is_file():
        return json.loads((where / "config.json").read_text()), where, f"{where}/config.json"
    if cfg.model.name in PUBLISHED_CONFIGS:
        return PUBLISHED_CONFIGS[cfg.model.name], None, "published config.json (built in)"
    raise LabError(f"no config.json for {cfg.model.name} on this host: run `python -m lab_utils "
                   "model fetch`, or pass the model's config.json to the plan")


def hidden_state(cfg: LabConfig, hf_config: dict | None = None) -> tuple[int, int, int]:
    """(layers, hidden size, bytes per element) of the served model: what one token's
    hidden state weighs, which a split model's ranks all-reduce twice per layer."""
    hf, _, _ = model_config(cfg, hf_config)
    c = hf.get("text_config", hf)
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else str(
        c.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    return int(c["num_hidden_layers"]), int(c["hidden_size"]), DTYPE_BYTES[dtype]


def weight_bits(hf: dict) -> int | None:
    """Bits per weight of the quantized linear layers, from config.json's
    quantization_config (`bits`, a compressed-tensors group's `num_bits`, or FP8's 8);
    None: not quantized."""
    q = hf.get("quantization_config") or hf.get("text_config", {}).get("quantization_config")
    if not q:
        return None
    if q.get("bits"):
        return int(q["bits"])
    for group in (q.get("config_groups") or {}).values():
        if (group.get("weights") or {}).get("num_bits"):
            return int(group["weights"]["num_bits"])
    return 8 if "fp8" in str(q.get("quant_method", "")).lower() else None


def weights(cfg: LabConfig, hf: dict, model_dir: Path | None) -> Item:
    files = weight_files_bytes(model_dir) if model_dir else None
    if files:
        return Item("weights", files, True, f"size of the weight files in {model_dir}")
    dtype = str(cfg.model.dtype if cfg.model.dtype != "auto" else
                hf.get("torch_dtype") or hf.get("dtype") or "bfloat16").removeprefix("torch.")
    n = param_count(hf)
    bits = weight_bits(hf)
    if bits:  # the embeddings and the LM head stay at the model's dtype
        c = hf.get("text_config", hf)
        embed = c["vocab_size"] * c["hidden_size"] * (1 if c.get("tie_word_embeddings") else 2)
        total = (n - embed) * bits // 8 + embed * DTYPE_BYTES[dtype]
        return Item("weights", total, True,
                    f"estimate: {n / 1e9:.2f} B parameters, linear layers at {bits} bits "
                    f"(quantization_config), embeddings at {dtype}; scales not counted")
    return Item("weights", n * DTYPE_BYTES[dtype], True,
                f"estimate: {n / 1e9:.2f} B parameters x {DTYPE_BYTES[dtype]} B ({dtype}) from config.json")


def instance_memory(cfg: LabConfig, hf: dict, weights_item: Item, mem_total: int, *,
                    utilization: float | None, kv_cache_bytes: int | None,
                    cpu_kvcache_gib: int | None, mirror: bool,
                    measured: MeasuredMemory = ESTIMATED, ranks: int = 1,
                    api_server: bool = True) -> InstanceMemory:
    """One instance's budget on a node of `mem_total` bytes; `measured` replaces the
    estimates it has. With `ranks` > 1 it is one rank of a model split that many ways by
    tensor parallelism: 1/ranks of the weights, and per token of KV cache only the KV
    heads of this rank (each rank holds every token; vLLM repeats a KV head on several
    ranks when there are fewer KV heads than ranks)."""
    shape = kv_shape(hf, None if cfg.model.dtype == "auto" else cfg.model.dtype)
    w = weights_item.bytes // ranks
    items = [weights_item if ranks == 1 else
             Item("weights (this rank's share)", w, True,
                  f"1/{ranks} of {weights_item.bytes / GiB:.1f} GiB: {weights_item.note}")]
    notes: list[str] = []
    per_token = shape.bytes_per_token
    if ranks > 1 and not shape.mla:
        per_token = per_token * max(1, shape.kv_heads // ranks) // shape.kv_heads
        notes.append(f"tensor parallel over {ranks} ranks: {max(1, shape.kv_heads // ranks)} of "
                     f"{shape.kv_heads} KV heads per rank, {per_token:,} B per token here")
    needs_free = 0
    if cfg.vllm.device == "cpu":
        pool = None
        if kv_cache_bytes is None and cpu_kvcache_gib:
            kv_cache_bytes = cpu_kvcache_gib * GiB
        if kv_cache_bytes is not None:
            kv = kv_cache_bytes
            src = "--kv-cache-memory-bytes" if cpu_kvcache_gib is None else "cpu_kvcache_space_gib"
            items.append(Item("KV cache", kv, False, f"{src} (VLLM_CPU_KVCACHE_SPACE)"))
        else:
            u = utilization or DEFAULT_UTILIZATION
            kv = int(u * mem_total) - w - measured.process_bytes()
            items.append(Item("KV cache", kv, False, f"{u} x MemTotal less weights and process "
                              "(vLLM's CPU default without cpu_kvcache_space_gib)"))
        items[0] = Item(items[0].what, w, False, items[0].note)
        notes.append("CPU platform: NixlConnector uses the KV cache in place, no host mirror")
    else:
        u = utilization or DEFAULT_UTILIZATION
        pool = needs_free = math.ceil(u * cuda_total(mem_total))
        overhead = measured.overhead_bytes()
        items.append(Item("activations, CUDA graphs, CUDA context", overhead, True,
                          measured.cuda_overhead[1] if measured.cuda_overhead else
                          "estimate (vLLM measures it at startup)"))
        if kv_cache_bytes is not None:
            kv = kv_cache_bytes
            items.append(Item("KV cache", kv, True, "--kv-cache-memory-bytes"))
            pool = w + overhead + kv
            notes.append(f"--kv-cache-memory-bytes: vLLM still needs {u} x total "
                         f"({needs_free / GiB:.1f} GiB) free at startup")
        else:
            kv = pool - w - overhead
            items.append(Item("KV cache", kv, True,
                              f"pool {u} x CUDA total less weights and overhead"))
    if mirror:
        items.append(Item("NIXL host mirror of the KV cache", kv, False,
                          'kv_buffer_device "cpu": host copy of every layer, outside the pool'))
    if api_server:
        items.append(Item("API server and engine processes", measured.process_bytes(), False,
                          measured.process[1] if measured.process else "estimate"))
    else:  # a headless rank: the engine's worker only, no API server
        items.append(Item("engine process (no API server)",
                          measured.process_bytes() // 2, False,
                          "estimate: half the API server and engine estimate" if not measured.process else
                          f"half of what was {measured.process[1]}"))
    if measured.kv_bytes:
        notes.append(f"vLLM logged a {measured.kv_bytes[0] / GiB:.2f} GiB KV cache "
                     f"({measured.kv_bytes[1]})")
    return InstanceMemory(items=items, pool=pool, kv_bytes=kv,
                          kv_tokens=max(kv, 0) // per_token, mirror=mirror,
                          notes=notes, needs_free=None if pool is None else needs_free)


def fitting_utilization(mem_total: int, instances: list[tuple[int, bool]],
                        measured: MeasuredMemory = ESTIMATED) -> float:
    """The highest `gpu_memory_utilization`, one value for every instance on a node, that
    fits: `instances` are (weights bytes, mirror) pairs. Rounded down to 0.01."""
    free = (mem_total - measured.reserve_bytes("cuda")
            - measured.process_bytes() * len(instances)
            # the mirror is the pool less weights and overhead
            + sum(w + measured.overhead_bytes() for w, mirror in instances if mirror))
    slope = sum(2 if mirror else 1 for _, mirror in instances)
    return max(0.0, int(100 * free / (slope * cuda_total(mem_total))) / 100)


def fitting_kv_bytes(mem_total: int, instances: list[tuple[int, bool]],
                     measured: MeasuredMemory = ESTIMATED) -> int:
    """The largest `--kv-cache-memory-bytes`, the same for every instance on a CUDA node,
    that fits; rounded down to whole GiB."""
    free = mem_total - measured.reserve_bytes("cuda") - sum(
        w + measured.overhead_bytes() + measured.process_bytes() for w, _ in instances)
    per = sum(2 if mirror else 1 for _, mirror in instances)
    return max(0, free // per // GiB * GiB)
