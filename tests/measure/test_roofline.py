"""The decode roofline's memory bandwidth: from the GPU's name notebook 00 recorded (GB10:
the published figure), measured on a CPU node."""

from __future__ import annotations

from lab_utils.measure import roofline


def _cuda(cfg):
    return cfg.model_copy(update={"vllm": cfg.vllm.model_copy(update={"device": "cuda"})})


def test_memory_bandwidth_of_a_gb10(test_cfg):
    cfg = _cuda(test_cfg)
    assert roofline.memory_bandwidth(cfg, "NVIDIA GB10") == (
        roofline.GB10_BANDWIDTH_GBPS, "GB10 LPDDR5x, published figure")
    assert roofline.memory_bandwidth(cfg, "NVIDIA GB10, NVIDIA GB10")[0] == 273.0


def test_memory_bandwidth_unknown_for_other_gpus(test_cfg):
    cfg = _cuda(test_cfg)
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA GB10, NVIDIA H100 80GB HBM3", None, ""):
        assert roofline.memory_bandwidth(cfg, name) == (None, "unknown for this GPU"), name


def test_memory_bandwidth_measured_on_cpu(test_cfg, monkeypatch):
    ran = []
    monkeypatch.setattr(roofline, "_run", lambda cfg, code, in_model_dir=False: ran.append(code) or 12.5)
    bw, source = roofline.memory_bandwidth(test_cfg, None)
    assert bw == 12.5 and source.startswith(f"measured on {test_cfg.topology.baseline.node}")
    assert ran == [roofline._READ_BANDWIDTH]


# Qwen3-8B-like shapes in bf16 (vocab 151936 x hidden 4096 = 1.24 GB per matrix).
EMB = 151936 * 4096 * 2
LAYERS = {f"model.layers.{i}.mlp.down_proj.weight": 10**8 for i in range(36)}


def test_decode_bytes_leave_out_the_input_embedding():
    tensors = {"model.embed_tokens.weight": EMB, "lm_head.weight": EMB,
               "model.norm.weight": 8192, **LAYERS}
    got = roofline.decode_weight_bytes(sum(tensors.values()) + 100, tensors, tied=False)
    assert got == sum(tensors.values()) - EMB  # one row per token, not the matrix
    assert roofline.decode_weight_bytes(0, tensors, tied=None) == sum(tensors.values()) - EMB


def test_tied_embeddings_count_once_as_the_lm_head():
    tensors = {"model.embed_tokens.weight": EMB, **LAYERS}  # no lm_head.weight: tied
    for tied in (True, None, False):
        assert roofline.decode_weight_bytes(0, tensors, tied=tied) == sum(tensors.values())
    nested = {"model.language_model.embed_tokens.weight": EMB, "lm_head.weight": EMB, **LAYERS}
    assert roofline.decode_weight_bytes(0, nested, tied=True) == sum(nested.values())
    assert roofline.decode_weight_bytes(0, nested, tied=False) == sum(nested.values()) - EMB


def test_without_tensor_names_the_file_sizes_count():
    assert roofline.decode_weight_bytes(1234, {}, tied=False) == 1234


def test_weight_bytes_read_from_safetensors_headers(test_cfg, tmp_path, monkeypatch):
    import json
    import struct
    import subprocess
    import sys

    from lab_utils.cluster.provision import _LOCATE_MODEL

    def safetensors(path, shapes):
        head, off = {}, 0
        for name, n in shapes.items():
            head[name] = {"dtype": "BF16", "shape": [n // 2], "data_offsets": [off, off + n]}
            off += n
        raw = json.dumps(head).encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * off)

    safetensors(tmp_path / "model-00001.safetensors", {"model.embed_tokens.weight": 4000,
                                                      "model.layers.0.w.weight": 600})
    safetensors(tmp_path / "model-00002.safetensors", {"lm_head.weight": 4000})
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))

    def run_here(cluster, code, in_model_dir=False):  # what run_in_model_dir runs, here
        r = subprocess.run([sys.executable, "-c", _LOCATE_MODEL + code, "path", str(tmp_path),
                            ""], capture_output=True, text=True, check=True, timeout=60)
        return json.loads(r.stdout.strip().splitlines()[-1])

    monkeypatch.setattr(roofline, "_run", run_here)
    assert roofline.weight_bytes(test_cfg) == 600 + 4000
