"""Each memory type of the NIXL probe has its own time box: its expected rate is a guess
(nixlbench WRITE of one buffer, against the probe's READs of scattered descriptors, and
VRAM the NIC cannot DMA on a GB10), so a memory slower than planned is cut short, keeps
the rows it finished and says what was not measured, and notebook 02 still writes its
results. The arithmetic on the Spark plan; a real run on the rehearsal whose box trips."""

from __future__ import annotations

import socket

import pytest

from lab_utils.cluster import Cluster
from lab_utils.config import REPO_ROOT, load_config
from lab_utils.kv import budget as kv_budget
from lab_utils.kv import memory
from lab_utils.kv.probe import PLAN_SHARE, TIME_BOX_SHARE, run_probe
from lab_utils.on_node.nixl_agent import KiB
from lab_utils.results.kv_transfer import KvTransferPayload


def test_time_boxes_share_the_limit_in_proportion_to_the_estimates():
    cfg = load_config(REPO_ROOT / "environment_config.json.example")
    from lab_utils.kv.shapes import PUBLISHED_CONFIGS, kv_shape

    shape = kv_shape(PUBLISHED_CONFIGS[cfg.model.name])
    bs = kv_budget.block_size(cfg)
    plan = kv_budget.probe_plan(cfg, kv_budget.probe_sizes(shape, kv_budget.prompt_lengths(cfg), bs))
    boxes = plan.time_box_s
    assert set(boxes) == {"DRAM", "VRAM"}
    assert sum(boxes.values()) == pytest.approx(TIME_BOX_SHARE * plan.timeout_s)
    for seg, box in boxes.items():
        estimate = plan.bytes_per_seg / (plan.rates_GBps[seg] * 1e9)
        assert box >= TIME_BOX_SHARE / PLAN_SHARE * estimate * 0.999
    assert boxes["VRAM"] > 20 * boxes["DRAM"]  # planned at 0.25 against 6.5 GB/s
    assert "time box is spent: DRAM" in plan.describe() and plan.summary()["time_box_s"] == boxes


@pytest.fixture
def cfg(test_cfg):
    with socket.create_server(("127.0.0.2", 0)) as s:
        test_cfg.kv_transfer.probe_port = s.getsockname()[1]
    return test_cfg


@pytest.mark.slow
def test_a_memory_slower_than_its_box_is_cut_short_and_keeps_its_rows(cfg):
    sizes = [64 * KiB * 2**i for i in range(11)]  # 64 KiB .. 64 MiB: ~6 GB in 23 passes x 2
    r = run_probe(cfg, sizes, seg_types=("DRAM",), iterations=20, warmup=3,
                  time_box_s={"DRAM": 0.5}, show_progress=False, timeout_s=120)
    why = r.cut_short["DRAM"]
    assert why.startswith("DRAM cut short by its time box") and "slower than the plan" in why
    assert why in r.notes and r.plan["time_box_s"] == {"DRAM": 0.5}
    kept = sorted({row["bytes"] for row in r.rows})
    assert len(kept) < len(sizes) and kept == sizes[:len(kept)]  # the smallest, in order
    assert sorted((row["bytes"], row["op"]) for row in r.rows) == sorted(
        (b, op) for b in kept for op in ("READ", "WRITE"))  # no size half measured
    assert r.ok and all(row["iterations"] == 20 for row in r.rows)
    assert f"not measured from {sizes[len(kept)]} B" in why
    assert Cluster(cfg).running() == []
    # what notebook 02 writes carries the rows and what was cut
    shape = kv_budget.shapes(cfg, memory.model_config(cfg)[0])  # the tiny model's recipe
    lengths = kv_budget.prompt_lengths(cfg)
    bs = kv_budget.block_size(cfg)
    model = shape[cfg.model.name]
    pvm = kv_budget.predicted_vs_measured(model, lengths, bs, r.rows)
    payload = kv_budget.payload(cfg, shape, lengths, r, pvm, kv_budget.recommend(cfg, r.rows))
    again = KvTransferPayload.model_validate_json(payload.model_dump_json())
    assert again.probe.cut_short == {"DRAM": why} and len(again.probe.rows) == len(r.rows)
