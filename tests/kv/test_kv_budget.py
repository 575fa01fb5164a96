"""Notebook 02's arithmetic, on hand-computed values."""

from __future__ import annotations

import pytest

from lab_utils.errors import LabError
from lab_utils.kv import budget as kv_budget
from lab_utils.kv.budget import recommend_kv_buffer_device
from lab_utils.kv.shapes import kv_shape
from lab_utils.results.checklist import CheckResult
from lab_utils.results.kv_transfer import KvRecommendation, KvTransferPayload, ProbeResult

from support import parsers_extra as extra
from support.replay import REC

LLAMA_8B = kv_budget.REFERENCE_MODELS["meta-llama/Llama-3.1-8B"]


def test_reference_models_match_published_sizes():
    assert kv_shape(LLAMA_8B).bytes_per_token == 128 * 1024
    assert kv_shape(kv_budget.REFERENCE_MODELS["meta-llama/Llama-3.1-70B"]).bytes_per_token == 320 * 1024


def test_descriptor_is_one_block_of_one_layer():
    # Llama-3.1-8B, block 16: 16 tokens x 8 KV heads x (128 K + 128 V) x 2 bytes = 64 KiB
    assert kv_budget.descriptor_bytes(kv_shape(LLAMA_8B), 16) == 64 * 1024
    # tiny model, block 32: 32 x 2 x (64 + 64) x 2 = 16 KiB; 4 layers of them = one block's KV
    tiny = kv_shape({"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 64, "num_hidden_layers": 4})
    assert kv_budget.descriptor_bytes(tiny, 32) * 4 == tiny.transfer_bytes(32, 32)


_MLA = {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B", "mla"])
@pytest.mark.parametrize("bs", [16, 128])
def test_descriptor_is_the_page_vllm_registers(model, bs):
    """The installed vLLM's NixlConnector registers each attention layer as one region
    whose descriptor is the layer's page (`block_len = layer_spec.page_size_bytes`, in
    nixl/base_worker.py), K and V packed ([num_blocks, kv_heads, block_size, 2 x
    head_size]); the lab's descriptor is that page, for the reference models and MLA."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    hf = _MLA if model == "mla" else kv_budget.PUBLISHED_CONFIGS[model]
    shape = kv_shape(hf)
    if shape.mla:
        spec = MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=shape.head_dim,
                                dtype=torch.bfloat16)
    else:
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=shape.kv_heads,
                                 head_size=shape.head_dim, dtype=torch.bfloat16)
    assert kv_budget.descriptor_bytes(shape, bs) == spec.page_size_bytes


def test_prompt_lengths_and_block_size(test_cfg):
    top = test_cfg.vllm.max_model_len  # doubling from 128 up to the longest prompt served
    lengths = kv_budget.prompt_lengths(test_cfg)
    assert lengths[0] == 128 and lengths[-1] == top
    assert all(b == 2 * a for a, b in zip(lengths, lengths[1:], strict=False))
    assert kv_budget.block_size(test_cfg) == 32


def test_predicted_vs_measured():
    shape = kv_shape(LLAMA_8B)
    rows = [{"seg_type": "DRAM", "op": "READ", "bytes": 16 * 2**20, "bandwidth_GBps": 10.0,
             "median_us": 2000.0, "p99_us": 2500.0},
            {"seg_type": "DRAM", "op": "READ", "bytes": 32 * 2**20, "bandwidth_GBps": 5.0,
             "median_us": 6711.0, "p99_us": 7000.0},
            {"seg_type": "DRAM", "op": "WRITE", "bytes": 16 * 2**20, "bandwidth_GBps": 99.0,
             "median_us": 1.0, "p99_us": 1.0}]
    out = kv_budget.predicted_vs_measured(shape, [128, 256, 512], 16, rows)
    assert [r["kv_bytes"] for r in out] == [16 * 2**20, 32 * 2**20, 64 * 2**20]
    # predicted at the best READ bandwidth (10 GB/s), never the WRITE row's
    assert out[0]["predicted_ms"] == pytest.approx(16 * 2**20 / 10e9 * 1e3)
    assert out[1]["measured_ms"] == pytest.approx(6.711)
    assert out[2]["measured_ms"] is None  # not probed


def test_recommendation_uses_measured_bandwidths(test_cfg):
    rows = [{"seg_type": "DRAM", "op": "READ", "bandwidth_GBps": 3.0}]
    rec = kv_budget.recommend(test_cfg, rows)
    assert rec.kv_buffer_device == "cpu" and rec.dram_GBps == 3.0 and rec.vram_GBps is None


def _link(reported: float) -> CheckResult:
    """The link check's result for one rail reporting `reported` Gb/s, as rdma.link_verdict
    builds it (one PCIe x4 half: at most ~100 Gb/s)."""
    from lab_utils.checks.rdma import link_verdict

    return link_verdict("spark-02 -> spark-01", [{"gbps": 92.5, "reported_gbps": reported}],
                        "ib_write_bw on one rail")


def test_link_rate_from_the_checklist():
    """What ib_write_bw moved (every configured rail at once), not a ceiling."""
    assert kv_budget.link_rate([CheckResult("ssh", "a", "pass", "ok"), _link(100)]) == 92.5
    assert kv_budget.link_rate([]) is None


def test_link_rate_scales_to_the_probes_rails(test_cfg):
    one = _link(100)  # ibstat `Rate: 100` per half (recorded two-Spark pair)
    assert kv_budget.rails(test_cfg) == 1  # no data_netdev: one path
    assert kv_budget.link_rate([one], test_cfg) == 92.5
    nodes = {n: v.model_copy() for n, v in test_cfg.nodes.items()}
    target, initiator = test_cfg.probe_pair()
    nodes[target].data_netdev = "rocep1s0f1:1,roceP2p1s0f1:1"
    nodes[initiator].data_netdev = "rocep1s0f1:1, roceP2p1s0f1:1"
    both_cfg = test_cfg.model_copy(update={"nodes": nodes})
    assert kv_budget.rails(both_cfg) == 2
    # NVIDIA's guide, both halves at once: 92.57 + 97.28 Gb/s (recorded)
    from lab_utils.checks.rdma import link_verdict

    both = link_verdict("spark-02 -> spark-01", [{"gbps": 92.57, "reported_gbps": 200},
                                                 {"gbps": 97.28, "reported_gbps": 200}], "seen")
    assert kv_budget.link_rate([both], both_cfg) == pytest.approx(189.85)
    # results of a link check that timed one rail: its ceiling, times the rails
    old = CheckResult("link", "spark-02 -> spark-01", "pass", "93%", data={
        "measured_gbps": 92.5, "reported_gbps": 200, "ceiling_gbps": 100})
    assert kv_budget.link_rate([old], both_cfg) == 200
    nodes[initiator].data_netdev = "rocep1s0f1:1"  # the path is as wide as its narrower end
    narrow = test_cfg.model_copy(update={"nodes": nodes})
    assert kv_budget.link_rate([both], narrow) == pytest.approx(189.85 / 2)


@pytest.mark.parametrize("recording", ["ethtool.grep-Speed.enp1s0f1np1.gb10.via-switch.200G.txt",
                                       "ibstat.gb10.dell-pro-max.port0-rate200.excerpt.txt"])
def test_link_rate_holds_each_rail_to_one_half(test_cfg, recording):
    """Where each half reports the port's 200 Gb/s (ethtool through a 200G switch, ibstat
    on a Dell Pro Max GB10), the link check judges each rail against ~100 Gb/s, and the
    probe is held to what the rails moved: never 2 x 200."""
    from lab_utils.checks import parsers

    text = (REC / recording).read_text()
    reported = (parsers.ethtool_speed_mbps(text) / 1000 if recording.startswith("ethtool")
                else parsers.ibstat(text)["rocep1s0f0"]["ports"][1]["rate"])
    assert reported == 200
    nodes = {n: v.model_copy() for n, v in test_cfg.nodes.items()}
    for n in test_cfg.probe_pair():
        nodes[n].data_netdev = "rocep1s0f0:1,roceP2p1s0f0:1"
    both = test_cfg.model_copy(update={"nodes": nodes})
    link = _link(reported)
    assert link.data["ceiling_gbps"] == 100 and link.summary == "92% of one PCIe x4 half's ~100 Gb/s"
    assert kv_budget.link_rate([link], both) == 185.0
    assert kv_budget.link_rate([link]) == 92.5


def _with_device(cfg, device: str):
    return cfg.model_copy(update={"kv_transfer": cfg.kv_transfer.model_copy(
        update={"kv_buffer_device": device})})


def test_choose_buffer_device(test_cfg):
    cuda = KvRecommendation(kv_buffer_device="cuda", reason="VRAM is faster")
    assert test_cfg.kv_transfer.kv_buffer_device == "auto"
    assert kv_budget.choose_buffer_device(test_cfg, cuda) == "cuda"  # auto: 02's choice
    assert kv_budget.choose_buffer_device(test_cfg, None) == "cpu"  # auto, 02 not run
    forced = _with_device(test_cfg, "cpu")
    assert kv_budget.choose_buffer_device(forced, cuda) == "cpu"  # the config overrides 02
    assert kv_budget.choose_buffer_device(_with_device(test_cfg, "cuda"), None) == "cuda"


def test_payload_is_the_model_notebook_02_records(test_cfg):
    shapes = kv_budget.shapes(test_cfg, LLAMA_8B)
    lengths = [128, 256]
    shape = shapes[test_cfg.model.name]
    bs = kv_budget.block_size(test_cfg)
    rows = [{"seg_type": "DRAM", "op": "READ", "bytes": shape.transfer_bytes(n, bs),
             "bandwidth_GBps": 2.0, "median_us": 100.0, "p99_us": 120.0} for n in lengths]
    probe = ProbeResult(rows=rows, target="a", initiator="b", target_address="x",
                        initiator_address="y", port=1, same_machine=True, env={},
                        memcpy_GBps={1024: 4.0})
    pvm = kv_budget.predicted_vs_measured(shape, lengths, bs, rows)
    rec = kv_budget.recommend(test_cfg, rows)
    p = kv_budget.payload(test_cfg, shapes, lengths, probe, pvm, rec)
    assert isinstance(p, KvTransferPayload)
    assert p.recommendation == rec and p.probe.memcpy_GBps == {1024: 4.0}
    assert [r.measured_ms for r in p.predicted_vs_measured] == [0.1, 0.1]
    assert set(p.model_dump()) == {"model", "kv_per_token_bytes", "block_size",
                                   "descriptor_bytes", "models", "prompt_lengths",
                                   "predicted_vs_measured", "recommendation", "probe"}


def test_hub_model_read_from_the_node_cache_without_downloading(test_cfg, tmp_path, monkeypatch):
    """A hub model is read from the node's Hugging Face cache, never downloaded: its
    config.json for the KV budget, its weight bytes for the roofline; a model missing
    from the cache is an error naming the exception and notebook 00."""
    import json

    from lab_utils.measure import roofline as hardware

    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA_8B))
    (snapshot / "model.safetensors").write_bytes(b"\0" * 1234)
    (snapshot / "tokenizer.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = test_cfg.model_copy(update={"model": test_cfg.model.model_copy(
        update={"name": "org/tiny", "source": "hub"})})
    assert kv_budget.model_hf_config(hub) == LLAMA_8B
    assert hardware.weight_bytes(hub) == 1234
    missing = hub.model_copy(update={"model": hub.model.model_copy(update={"name": "org/absent"})})
    with pytest.raises(LabError, match="cannot read org/absent's config.json on spark-01: "
                       r"huggingface_hub.errors.LocalEntryNotFoundError: .*; run notebook 00"):
        kv_budget.model_hf_config(missing)


# The kv_buffer_device advice on the recorded GB10 nixlbench bandwidths.


def recorded(name: str) -> str:
    return (REC / name).read_text()

def _peak(name: str) -> float:
    return extra.nixlbench(recorded(name))["peak_bw_GBps"]


@pytest.mark.parametrize("rails", ["single-rail", "dual-rail"])
@pytest.mark.parametrize("vram_rails", ["single-rail", "dual-rail"])
def test_recommend_cpu_buffer_on_recorded_spark_pair(rails: str, vram_rails: str) -> None:
    dram = _peak(f"nixlbench.gb10-pair.{rails}.DRAM.txt")
    vram = _peak(f"nixlbench.gb10-pair.{vram_rails}.VRAM.txt")
    device, reason = recommend_kv_buffer_device(dram, vram, has_gpu=True)
    assert device == "cpu"
    assert f"{dram:.2f}" in reason and f"{vram:.2f}" in reason
    assert reason.endswith(".")


def test_recommend_reason_quotes_recorded_numbers() -> None:
    dram = _peak("nixlbench.gb10-pair.single-rail.DRAM.txt")
    vram = _peak("nixlbench.gb10-pair.single-rail.VRAM.txt")
    _, reason = recommend_kv_buffer_device(dram, vram, has_gpu=True)
    assert "11.56 GB/s" in reason and "0.61 GB/s" in reason and "(5%)" in reason


def test_recommend_without_gpu_or_without_vram_measurement() -> None:
    dram = _peak("nixlbench.gb10-pair.dual-rail.DRAM.txt")
    assert recommend_kv_buffer_device(dram, None, has_gpu=False)[0] == "cpu"
    assert recommend_kv_buffer_device(dram, dram, has_gpu=False)[0] == "cpu"
    device, reason = recommend_kv_buffer_device(dram, None, has_gpu=True)
    assert device == "cpu"
    assert "not measured" in reason and "13.17" in reason
    assert recommend_kv_buffer_device(None, None, has_gpu=True)[0] == "cpu"
    assert recommend_kv_buffer_device(None, 0.5, has_gpu=True)[0] == "cpu"


def test_recommend_cuda_when_vram_keeps_up() -> None:
    # a GPUDirect-capable pair (hand-typed): VRAM at or above 80% of DRAM
    dram = _peak("nixlbench.gb10-pair.single-rail.DRAM.txt")
    assert recommend_kv_buffer_device(dram, dram, has_gpu=True)[0] == "cuda"
    assert recommend_kv_buffer_device(10.0, 8.0, has_gpu=True)[0] == "cuda"
    assert recommend_kv_buffer_device(10.0, 7.9, has_gpu=True)[0] == "cpu"
    device, reason = recommend_kv_buffer_device(12.0, 11.5, has_gpu=True)
    assert device == "cuda" and "11.50" in reason and "12.00" in reason


# --------------------------------------------------------------------------- robustness


# The probe's plan against its time limit, at the recorded GB10 rates (computed, no run).

# Qwen/Qwen3-8B's published config.json (the example profile's model): 36 layers, 8 KV
# heads of 128, bf16 = 144 KiB per token.
QWEN3_8B = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 36, "torch_dtype": "bfloat16"}


def _slowest(seg: str) -> float:
    """The slowest bandwidth nixlbench recorded between two GB10s from this memory type."""
    return min(r["bw_GBps"] for rails in ("single-rail", "dual-rail")
               for r in extra.nixlbench(recorded(f"nixlbench.gb10-pair.{rails}.{seg}.txt"))["rows"])


def _spark_cfg(tmp_path):
    """The example profile with its results (where a probe's measured rates would be)
    under tmp_path."""
    import json

    from lab_utils.config import REPO_ROOT, parse_config

    example = REPO_ROOT / "environment_config.json.example"
    data = json.loads(example.read_text())
    data["results_root"] = str(tmp_path / "results")
    return parse_config(data, str(example))


def _spark_plan(tmp_path, timeout_s: float = kv_budget.PROBE_TIMEOUT_S):
    cfg = _spark_cfg(tmp_path)
    assert cfg.model.name == "Qwen/Qwen3-8B" and cfg.vllm.device == "cuda"
    shape, bs = kv_shape(QWEN3_8B), kv_budget.block_size(cfg)
    sizes = kv_budget.probe_sizes(shape, kv_budget.prompt_lengths(cfg), bs)
    return sizes, kv_budget.probe_plan(cfg, sizes, timeout_s=timeout_s)


def test_planning_rates_are_no_faster_than_the_recordings():
    from lab_utils.kv.probe import GB10_PLAN_GBps

    assert GB10_PLAN_GBps["DRAM"] <= _slowest("DRAM") == pytest.approx(6.56, abs=0.01)
    assert GB10_PLAN_GBps["VRAM"] <= _slowest("VRAM") == pytest.approx(0.26, abs=0.01)


def test_probe_plan_fits_its_limit_at_the_recorded_gb10_rates(tmp_path):
    from lab_utils.kv.probe import PLAN_SHARE

    sizes, plan = _spark_plan(tmp_path)
    assert plan.seg_types == ("DRAM", "VRAM")
    # what the notebook asked for before plans existed: 2.4 GB per pass, 3 warm-up + 20
    # timed passes of READ and WRITE (+1 WRITE carrying the notification) = 47 passes
    asked = sum(sizes) * 47
    assert sum(sizes) == pytest.approx(2.397e9, rel=1e-3)
    assert asked / (_slowest("VRAM") * 1e9) > kv_budget.PROBE_TIMEOUT_S  # it could not fit
    rates = {"DRAM": _slowest("DRAM"), "VRAM": _slowest("VRAM")}
    seconds = sum(plan.bytes_per_seg / (rates[s] * 1e9) for s in plan.seg_types)
    assert seconds <= PLAN_SHARE * plan.timeout_s == 150.0
    assert plan.fits and plan.sizes == sizes and not plan.dropped  # every prompt length kept
    assert (plan.warmup, plan.iterations) == (1, 6)
    text = plan.describe()
    assert "71.9 GB" in text and "~149 s" in text and "limit 300 s" in text


def test_probe_plan_drops_the_largest_sizes_last(tmp_path):
    from lab_utils.kv.probe import MIN_ITERATIONS, MIN_WARMUP

    sizes, plan = _spark_plan(tmp_path, timeout_s=60)
    assert (plan.warmup, plan.iterations) == (MIN_WARMUP, MIN_ITERATIONS)
    assert plan.fits and plan.sizes == sizes[:4] and plan.dropped == sizes[4:]
    assert "largest sizes dropped" in plan.describe()


def test_probe_plan_keeps_what_fits(test_cfg):
    # the rehearsal: the tiny model's KV is a few MB, so nothing is cut at 0.25 GB/s
    sizes = [64 * 1024, 1024 * 1024]
    plan = kv_budget.probe_plan(test_cfg, sizes)
    assert (plan.warmup, plan.iterations, plan.sizes, plan.asked) == (3, 20, sizes, {})
    assert plan.planned_bytes == sum(sizes) * 47 and plan.seg_types == ("DRAM",)


def _rows(seg: str, gbps: float, sizes=(65536, 1 << 20, 1 << 24)) -> list[dict]:
    return [{"seg_type": seg, "op": op, "bytes": b, "median_us": b / (gbps * 1e3),
             "checksum_ok": True} for op in ("READ", "WRITE") for b in sizes]


def test_the_rehearsal_probe_plan_uses_the_rate_the_last_probe_measured(test_cfg):
    from lab_utils.kv.probe import CONSERVATIVE_GBps, expected_rates
    from lab_utils.results import calibration

    sizes = [64 * 1024, 1024 * 1024]
    before = kv_budget.probe_plan(test_cfg, sizes)
    assert before.rates_GBps == {"DRAM": CONSERVATIVE_GBps}
    assert "a conservative rate (no recording)" in before.describe()
    assert "measured on" not in before.describe()
    target, initiator = test_cfg.probe_pair()
    calibration.record_probe(test_cfg, initiator, target, _rows("DRAM", 4.0))
    label = f"measured on {initiator}, {calibration.load(test_cfg, initiator).updated_at[:10]}"
    assert expected_rates(test_cfg) == ({"DRAM": pytest.approx(4.0), "VRAM": CONSERVATIVE_GBps},
                                        f"DRAM {label} by the probe; VRAM: a conservative rate "
                                        "(no recording)")
    after = kv_budget.probe_plan(test_cfg, sizes)
    assert after.rates_GBps == {"DRAM": pytest.approx(4.0)}
    assert f"at DRAM 4 GB/s (DRAM {label} by the probe" in after.describe()
    assert after.estimate_s == pytest.approx(before.estimate_s * CONSERVATIVE_GBps / 4.0)
    # a probe between other nodes says nothing of this pair
    calibration.record_probe(test_cfg, initiator, "elsewhere", _rows("DRAM", 9.0))
    assert expected_rates(test_cfg)[0]["DRAM"] == CONSERVATIVE_GBps


def test_a_spark_probe_plan_takes_the_measured_vram_rate_and_keeps_dram_estimated(tmp_path):
    from lab_utils.kv.probe import GB10_PLAN_GBps
    from lab_utils.results import calibration

    cfg = _spark_cfg(tmp_path)
    target, initiator = cfg.probe_pair()
    calibration.record_probe(cfg, initiator, target, _rows("VRAM", 0.5))
    sizes, plan = _spark_plan(tmp_path)
    assert plan.rates_GBps == {"DRAM": GB10_PLAN_GBps["DRAM"], "VRAM": pytest.approx(0.5)}
    assert (f"VRAM measured on {initiator}, " in plan.describe()
            and "DRAM: slowest nixlbench rates recorded" in plan.describe())
    # twice the rate the estimate assumed: the VRAM time box shrinks in proportion
    _, estimated = _spark_plan(tmp_path / "none")
    assert plan.time_box_s["VRAM"] < estimated.time_box_s["VRAM"]
