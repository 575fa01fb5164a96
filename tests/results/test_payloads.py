"""Unit tests of lab_utils.results.payloads: files of every notebook, also as the lab wrote
them before the payload models, load typed and are written back with the same keys."""

from __future__ import annotations

import json

import pytest

from lab_utils import results

from support.results_files import old_file

# tp (04's optional section) was first written by the payload model it has now
WITH_OLD_FORMAT = sorted(set(results.RESULTS) - {"tp"})


@pytest.mark.parametrize("notebook", WITH_OLD_FORMAT)
def test_old_format_loads_typed_and_rewrites_the_same_keys(cfg, notebook):
    from lab_utils.results import PAYLOADS

    from support.payloads import OLD_FORMAT

    old = OLD_FORMAT[notebook]()
    old_file(cfg, notebook, old)
    env = results.load_results(cfg, notebook)
    assert isinstance(env.payload, PAYLOADS[notebook])
    path = results.write_results(cfg, notebook, env.payload, software={}, hardware={})
    again = json.loads(path.read_text())["payload"]
    kept, added = _without_new_keys(again, json.loads(json.dumps(old)))
    assert added == NEW_KEYS.get(notebook, set())
    assert kept == json.loads(json.dumps(old))
    assert results.load_results(cfg, notebook).payload == env.payload


# Keys the payload models added since the old format (with defaults, so old files load).
NEW_KEYS = {
    "00": {"gpu_name"},
    "01": {"profile", "forecast", "instances[].argv", "switches"},
    "02": {"probe.plan", "probe.cut_short"},
    "03": {"forecast", "instances[].argv", "policies"},
    "04": {f"proof.prompts[].{k}" for k in ("strict", "tokens_ok", "diverged_at",
                                            "divergence_margin", "tokens_why")}
    | {"front_doors", "forecast", "instances[].argv"},
}


def _without_new_keys(new, old, where: str = ""):
    """`new` without the dict keys `old` lacks (at any depth), and those keys' paths."""
    if isinstance(new, dict) and isinstance(old, dict):
        kept, added = {}, set()
        for k, v in new.items():
            path = f"{where}.{k}" if where else k
            if k not in old:
                added.add(path)
                continue
            kept[k], more = _without_new_keys(v, old[k], path)
            added |= more
        return kept, added
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        pairs = [_without_new_keys(a, b, where + "[]") for a, b in zip(new, old, strict=True)]
        return [p[0] for p in pairs], set().union(*(p[1] for p in pairs))
    return new, set()


def test_typed_attributes_of_each_notebook(cfg):
    from lab_utils.results.checklist import CheckResult

    from support.payloads import OLD_FORMAT

    assert sorted(OLD_FORMAT) == WITH_OLD_FORMAT
    for nb in WITH_OLD_FORMAT:
        old_file(cfg, nb, OLD_FORMAT[nb]())
    env = results.load_results(cfg, "00").payload
    assert env.blessed and env.checks[0].check == "ssh" and env.gpu_name is None
    base = results.load_results(cfg, "01").payload
    assert base.reference.tokens == [[9, 9, 9, 9], [8, 8, 8, 8]] and base.mixed is None
    assert base.single_request.ttft_ms == 40.0 and base.roofline.weight_bytes is None
    assert base.instances[1].role == "proxy" and base.sweep.model == "tiny-llama"
    kv = results.load_results(cfg, "02").payload
    assert kv.recommendation.kv_buffer_device == "cpu" and kv.probe.memcpy_GBps == {1048576: 5.0}
    assert kv.predicted_vs_measured[0].measured_ms == 1.2
    assert results.load_results(cfg, "03").payload.policy == "round_robin"
    dis = results.load_results(cfg, "04").payload
    assert dis.proof.ok and dis.proof.tokens_equal == 1 and dis.kv_buffer_device == "cpu"
    # 00 written before gpu_name existed: the name the gpu check's summary starts with
    gpu = CheckResult("gpu", "spark-a", "pass", "NVIDIA GB10, driver 580.82.09, CUDA 13.0")
    old_file(cfg, "00", OLD_FORMAT["00"](gpu))
    assert results.load_results(cfg, "00").payload.gpu_name == "NVIDIA GB10"
