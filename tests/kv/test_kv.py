"""KV arithmetic against hand-computed values for public model configs (the fields that
matter, as published in each model's config.json) and the rehearsal's tiny model."""

from __future__ import annotations

import pytest

from lab_utils.kv.shapes import kv_shape

LLAMA_31_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "num_hidden_layers": 32, "torch_dtype": "bfloat16"}
LLAMA_31_70B = {"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
                "num_hidden_layers": 80, "torch_dtype": "bfloat16"}
MISTRAL_7B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "torch_dtype": "bfloat16"}
QWEN3_06B = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "num_hidden_layers": 28, "torch_dtype": "bfloat16"}
DEEPSEEK_V3 = {"hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
               "num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
TINY = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "num_hidden_layers": 4, "dtype": "bfloat16"}


@pytest.mark.parametrize("config,expected", [
    (LLAMA_31_8B, 2 * 32 * 8 * 128 * 2),        # 128 KiB
    (LLAMA_31_70B, 2 * 80 * 8 * 128 * 2),       # 320 KiB
    (MISTRAL_7B, 2 * 32 * 8 * 128 * 2),
    (QWEN3_06B, 2 * 28 * 8 * 128 * 2),          # head_dim given, not hidden/heads (= 64)
    (DEEPSEEK_V3, 61 * (512 + 64) * 2),         # MLA: one latent + rope key per layer
    (TINY, 2 * 4 * 2 * 64 * 2),
])
def test_bytes_per_token(config, expected):
    assert kv_shape(config).bytes_per_token == expected


def test_reference_sizes_in_kib():
    assert kv_shape(LLAMA_31_8B).bytes_per_token == 128 * 1024
    assert kv_shape(LLAMA_31_70B).bytes_per_token == 320 * 1024


def test_fp8_cache_halves_and_text_config_is_used():
    assert kv_shape(LLAMA_31_8B, dtype="fp8").bytes_per_token == 64 * 1024
    assert kv_shape({"text_config": LLAMA_31_8B}).bytes_per_token == 128 * 1024


def test_blocks_bytes_and_predicted_time():
    kv = kv_shape(LLAMA_31_8B)
    assert kv.blocks(1000, 16) == 63 and kv.blocks(1024, 16) == 64
    assert kv.transfer_bytes(1000, 16) == 63 * 16 * 128 * 1024
