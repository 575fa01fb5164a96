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
