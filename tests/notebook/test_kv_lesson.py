"""Notebook 02's explanation of the KV cache: the configured model's own figures, from
its config.json, never a fixed model's."""

from __future__ import annotations

from lab_utils.config import REPO_ROOT, load_config
from lab_utils.kv.memory import model_config
from lab_utils.kv.shapes import PUBLISHED_CONFIGS, kv_shape
from lab_utils.notebook.kv_lesson import explain_kv, recorded_GBps


def test_spark_profile_explains_with_qwen3_8b():
    cfg = load_config(REPO_ROOT / "environment_config.json.example")
    assert cfg.model.name == "Qwen/Qwen3-8B"
    text = explain_kv(cfg, PUBLISHED_CONFIGS[cfg.model.name])
    shape = kv_shape(PUBLISHED_CONFIGS[cfg.model.name])
    assert shape.bytes_per_token == 147_456
    assert "32 query heads share 8 KV heads (4 per KV head)" in text
    assert "2 (K and V) x 36 layers x 8 KV heads x 128 x 2 bytes = 147,456 bytes (144 KiB)" in text
    # 2,048 tokens in blocks of 16: 128 blocks, 288 MiB
    assert "fills 128 blocks of 16 tokens: 2,048 x 144 KiB = 288.0 MiB" in text
    size = shape.transfer_bytes(2048, 16)
    assert f"~{size / (recorded_GBps('DRAM') * 1e9) * 1e3:.0f} ms" in text
    assert "Llama" not in text and "128 KiB" not in text


def test_rehearsal_explains_with_the_tiny_model():
    cfg = load_config(REPO_ROOT / "configs" / "local-cpu.json")
    hf, _, _ = model_config(cfg)
    text = explain_kv(cfg, hf)
    per = kv_shape(hf).bytes_per_token
    assert text.startswith(f"{cfg.model.name}:") and f"= {per:,} bytes" in text


def test_recorded_rates_are_the_nixlbench_ones():
    # 64 MiB in 5803.6 us from DRAM, 32 MiB in 75632.9 us from VRAM (single rail)
    assert abs(recorded_GBps("DRAM") - 11.56) < 0.01
    assert abs(recorded_GBps("VRAM") - 0.444) < 0.001


def test_mla_and_plain_multi_head_layouts():
    cfg = load_config(REPO_ROOT / "environment_config.json.example")
    mla = {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert "multi-head latent attention: one latent of 576" in explain_kv(cfg, mla)
    mha = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
           "hidden_size": 256, "torch_dtype": "bfloat16"}
    assert "has its own KV head (no GQA)" in explain_kv(cfg, mha)
