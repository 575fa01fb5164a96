"""KV-cache arithmetic from a model's config.json.

Standard and grouped-query attention (Llama, Qwen, Mistral): per token, every layer
stores one key and one value vector per KV head, so
bytes/token = 2 x layers x KV heads x head dim x bytes per element; GQA is why KV heads
are few. Multi-head latent attention (DeepSeek V2/V3) stores one compressed latent plus
the rotary part of the key per token and layer, shared by all heads:
bytes/token = layers x (kv_lora_rank + qk_rope_head_dim) x bytes per element.
A transfer moves whole blocks, so a prompt of n tokens moves ceil(n / block_size)
blocks; at a bandwidth B it takes latency + bytes / B.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# Published config.json fields of the models the lab knows without a download: the KV layout
# (notebook 02's reference models) and what the memory plan needs to count the weights.
PUBLISHED_CONFIGS = {
    "Qwen/Qwen3-8B": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "vocab_size": 151936, "tie_word_embeddings": False,
                      "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.1-8B-Instruct": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.1-8B": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "meta-llama/Llama-3.1-70B": {
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # Models that need more than one Spark at 16 bits, for the tensor-parallel plan; their
    # linear layers' weights are quantized (the rest stays 16-bit): FP8 (8 bits) and
    # GPTQ-Int4 (4 bits), as their quantization_config says.
    "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8": {
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "bits": 8}},
    "Qwen/Qwen3-235B-A22B-GPTQ-Int4": {
        "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
        "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
        "vocab_size": 151936, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "gptq", "bits": 4}},
}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int  # 1 for MLA: the latent is shared by all heads
    head_dim: int  # for MLA: kv_lora_rank + qk_rope_head_dim
    dtype_bytes: int
    mla: bool = False

    @property
    def bytes_per_token(self) -> int:
        per_layer = self.head_dim * self.dtype_bytes * (1 if self.mla else 2 * self.kv_heads)
        return self.layers * per_layer

    def blocks(self, tokens: int, block_size: int) -> int:
        return math.ceil(tokens / block_size)

    def transfer_bytes(self, tokens: int, block_size: int) -> int:
        """Bytes a block-granular transfer of `tokens` prompt tokens moves."""
        return self.blocks(tokens, block_size) * block_size * self.bytes_per_token


def kv_shape(hf_config: dict, dtype: str | None = None) -> KVShape:
    """The KV layout described by a Hugging Face config dict. `dtype` is the KV cache's
    element type (default: the model's dtype), e.g. "fp8" for an fp8 KV cache."""
    cfg = hf_config.get("text_config", hf_config)
    dtype = dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    dtype_bytes = DTYPE_BYTES[str(dtype).removeprefix("torch.")]
    layers = cfg["num_hidden_layers"]
    if cfg.get("kv_lora_rank"):  # multi-head latent attention
        return KVShape(layers=layers, kv_heads=1, mla=True, dtype_bytes=dtype_bytes,
                       head_dim=cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    heads = cfg["num_attention_heads"]
    return KVShape(
        layers=layers,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        dtype_bytes=dtype_bytes,
    )


def kv_shape_from_dir(model_dir: str | Path, dtype: str | None = None) -> KVShape:
    return kv_shape(json.loads((Path(model_dir) / "config.json").read_text()), dtype)
