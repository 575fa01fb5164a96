"""The notebooks' exercises: every serving-series notebook has one, each answer is folded
(<details>), and every figure or message an answer states is recomputed here with the
lab's own code, so an answer cannot drift from what the lab does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from lab_utils.config import parse_config
from lab_utils.forecast.curves import Curve
from lab_utils.forecast.inputs import GB10, GB10_NIXL_US, dense_params
from lab_utils.forecast.model import Architecture, EngineCosts, Inputs, Load, forecast
from lab_utils.kv.shapes import PUBLISHED_CONFIGS, kv_shape
from lab_utils.runner import find_notebooks

ROOT = Path(__file__).resolve().parents[1]


def answers() -> dict[str, str]:
    out = {}
    for path in find_notebooks():
        for c in nbformat.read(path, as_version=4).cells:
            if c.get("id", "").startswith("ex"):
                m = re.search(r"<details><summary>Answer</summary>(.*?)</details>", c.source, re.S)
                assert m, f"{path.name} {c.id}: the answer is not folded"
                out[c.id] = " ".join(m.group(1).split())
    return out


ANSWERS = answers()


@pytest.mark.parametrize("nb", ["00", "01", "02", "03", "04", "05"])
def test_every_notebook_has_an_exercise(nb):
    assert any(k.startswith(f"ex{nb}") for k in ANSWERS), nb


def test_ex01_roofline():
    _, read = dense_params(PUBLISHED_CONFIGS["Qwen/Qwen3-8B"])  # the Spark example's model
    bw = GB10["memory_bandwidth_GBps"][0] * 1e9
    a = ANSWERS["ex01"]
    assert f"**{read / 1e9:.1f} GB**" in a and f"about {round(bw / read)} tokens/s" in a


def test_ex02_kv_of_another_model():
    shape = kv_shape(PUBLISHED_CONFIGS["Qwen/Qwen3-8B"])
    size = shape.transfer_bytes(4096, 16)
    a = ANSWERS["ex02"]
    assert f"{shape.bytes_per_token:,} bytes ({shape.bytes_per_token // 1024} KiB) per token" in a
    assert f"{shape.blocks(4096, 16)} blocks of 16" in a and f"**{size / 2**20:.0f} MiB**" in a
    assert f"about **{round(size / 11e9 * 1e3)} ms**" in a
    vram_GBps = GB10_NIXL_US["VRAM"][-1][0] / GB10_NIXL_US["VRAM"][-1][1] / 1e3
    assert "~0.4 GB/s" in a and 0.35 < vram_GBps < 0.5 and size / (vram_GBps * 1e9) > 1


def test_ex03_policies_agree_at_concurrency_1():
    engine = EngineCosts(prefill=Curve((32.0, 1024.0), (6.0, 40.0)),
                         decode=((150.0, Curve((1.0, 8.0), (2.0, 3.5))),))
    inputs = Inputs(engine=engine, hop_ms=1.0, transfer=None, kv_bytes_per_token=1,
                    block_size=16, jitter_ms=0.5)
    load = Load(input_len=128, output_len=32, num_prompts=24, concurrency=1)
    rr, lo = (forecast(inputs, Architecture(replicas=2, policy=p), load).metrics
              for p in ("round_robin", "least_outstanding"))
    assert rr == lo and "the same at concurrency 1" in ANSWERS["ex03"]


def test_ex00_memory_plan_of_the_spark_example():
    from lab_utils.kv.memory import GiB, instance_memory, weights

    cfg = parse_config(json.loads((ROOT / "environment_config.json.example").read_text()))
    hf = PUBLISHED_CONFIGS["Qwen/Qwen3-8B"]
    mem_total = 125511968 * 1024  # the recorded GB10's MemTotal, as the answer quotes it
    plan = instance_memory(cfg, hf, weights(cfg, hf, None), mem_total, utilization=0.45,
                           kv_cache_bytes=None, cpu_kvcache_gib=None, mirror=True)
    a = ANSWERS["ex00"]
    assert plan.pool is not None
    assert f"**{plan.pool / GiB:.1f} GiB**" in a and f"**{plan.kv_bytes / GiB:.1f} GiB**" in a
    assert f"about **{round(plan.kv_tokens / 1000)}k tokens**" in a
    assert f"{plan.items[0].bytes / GiB:.1f} GiB" in a and f"{mem_total / GiB:.1f} GiB" in a


def test_predict_first_exercises_come_before_what_answers_them():
    """An exercise that asks for a prediction sits above the cell that computes it."""
    cells = {path.name[:2]: [c.get("id") for c in nbformat.read(path, as_version=4).cells]
             for path in find_notebooks()}
    for nb, ex, answered_by in (("01", "ex01", "c10"), ("03", "ex03", "c09i"),
                                ("04", "ex04a", "c12w"), ("04", "ex04b", "c12x")):
        assert cells[nb].index(ex) < cells[nb].index(answered_by), (nb, ex)
