"""KV-cache arithmetic from a model's config.json.

Per token, every layer stores one key and one value vector per KV head:
bytes/token = 2 x layers x KV heads x head dim x bytes per element. Grouped-query
attention is why KV heads are few. A transfer moves whole blocks, so a prompt of n
tokens moves ceil(n / block_size) blocks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def blocks(self, tokens: int, block_size: int) -> int:
        return math.ceil(tokens / block_size)

    def transfer_bytes(self, tokens: int, block_size: int) -> int:
        """Bytes a block-granular transfer of `tokens` prompt tokens moves."""
        return self.blocks(tokens, block_size) * block_size * self.bytes_per_token


def kv_shape(hf_config: dict, dtype: str | None = None) -> KVShape:
    """The KV layout described by a Hugging Face config dict."""
    cfg = hf_config.get("text_config", hf_config)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dtype = dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return KVShape(
        layers=cfg["num_hidden_layers"],
        kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=head_dim,
        dtype_bytes=DTYPE_BYTES[str(dtype).removeprefix("torch.")],
    )


def kv_shape_from_dir(model_dir: str | Path, dtype: str | None = None) -> KVShape:
    return kv_shape(json.loads((Path(model_dir) / "config.json").read_text()), dtype)
