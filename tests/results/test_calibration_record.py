"""The calibration record beyond start-up: the NIXL probe's measured rate per memory type
(on the initiator's record) and the proxy's cost per request (on the proxy node's), each
written, read back, and labelled "measured on <node>, <date>"; the next start of a role
taken from the measured first or later starts. On the rehearsal profile (CPU figures),
with made-up rows and a results directory under tmp_path."""

from __future__ import annotations

import json

import pytest

from lab_utils.results import calibration
from lab_utils.results.calibration import Calibration
from lab_utils.results.forecast import CurvePoint


def probe_rows(gbps: dict[tuple[str, str], float], sizes=(262144, 1 << 20, 1 << 22)) -> list[dict]:
    """Rows as the probe returns them: each size moved at `gbps[(seg, op)]`."""
    return [{"seg_type": seg, "op": op, "bytes": b, "iterations": 20,
             "median_us": b / (rate * 1e9) * 1e6, "p99_us": None, "bandwidth_GBps": rate,
             "checksum_ok": True}
            for (seg, op), rate in gbps.items() for b in sizes]


def label(cfg, node: str) -> str:
    return f"measured on {node}, {calibration.load(cfg, node).updated_at[:10]}"


def test_probe_rates_divide_a_pass_of_bytes_by_its_median_times():
    rows = probe_rows({("DRAM", "READ"): 4.0, ("DRAM", "WRITE"): 2.0})
    rates = calibration.probe_rates(rows + [{"seg_type": "VRAM", "op": "READ", "bytes": 1,
                                             "median_us": None}])
    assert set(rates) == {"DRAM"}  # a memory type without a timed row is not a rate
    dram = rates["DRAM"]
    # the same bytes at 4 and at 2 GB/s take 1/4 + 1/2 of a second per GB each: 2.67 GB/s
    assert dram["GBps"] == pytest.approx(2 / (1 / 4 + 1 / 2), rel=1e-3)
    assert dram["by_op"] == pytest.approx({"READ": 4.0, "WRITE": 2.0}, rel=1e-3)
    assert dram["sizes"] == 3 and dram["bytes"] == 2 * (262144 + (1 << 20) + (1 << 22))


def test_the_probe_rate_is_recorded_on_the_initiator_and_read_back(test_cfg):
    target, initiator = test_cfg.probe_pair()
    assert calibration.record_probe(test_cfg, initiator, target, []) is None  # nothing timed
    assert calibration.load(test_cfg, initiator) is None
    path = calibration.record_probe(test_cfg, initiator, target,
                                    probe_rows({("DRAM", "READ"): 3.0}))
    assert path == test_cfg.results_dir / "calibration" / f"{initiator}.json"
    cal = calibration.load(test_cfg, initiator)
    assert (cal.node, cal.profile, cal.device) == (initiator, test_cfg.profile, "cpu")
    assert cal.probe["DRAM"]["target"] == target
    assert cal.measured()["probe_GBps:DRAM"] == (pytest.approx(3.0), label(test_cfg, initiator))
    assert [c.node for c in calibration.load_all(test_cfg.results_dir, test_cfg.profile)] == [
        initiator]


def test_the_proxy_cost_is_recorded_on_the_proxy_node_and_read_back(test_cfg):
    node = test_cfg.proxy.node
    assert calibration.proxy_ms(test_cfg) is None
    calibration.record_proxy(test_cfg, node, CurvePoint(x=128, median=0.98, lo=-0.8, hi=2.8, n=5),
                             backend="spark-01")
    cal = calibration.load(test_cfg, node)
    assert cal.proxy["backend"] == "spark-01" and cal.proxy["kind"] == "lab"
    assert cal.proxy["n"] == 5 and cal.proxy["prompt_tokens"] == 128
    assert calibration.proxy_ms(test_cfg) == (0.98, label(test_cfg, node))
    # a hop inside the noise of the direct request is no negative cost
    calibration.record_proxy(test_cfg, node, CurvePoint(x=128, median=-0.2, lo=-1, hi=1, n=5),
                             backend="spark-01")
    assert calibration.proxy_ms(test_cfg) == (0.0, label(test_cfg, node))
    # measured through vLLM's router, it is not the lab proxy's cost
    other = test_cfg.model_copy(update={"proxy": test_cfg.proxy.model_copy(
        update={"kind": "vllm-router"})})
    assert calibration.proxy_ms(other) is None


def test_the_next_start_is_a_first_one_until_the_role_started_on_the_node(test_cfg):
    cal = Calibration("spark-01", test_cfg.profile, "cpu")
    assert cal.next_start_s("baseline") is None
    cal.starts = [{"instance": "baseline-0", "role": "baseline", "s": 25.0, "first": True,
                   "at": "2026-11-26T11:15:02Z"}]
    calibration.save(test_cfg, cal)
    cal = calibration.load(test_cfg, "spark-01")
    # baseline started here once, and no later start was measured: the first one stands
    assert cal.next_start_s("baseline") == (25.0, "measured on spark-01, 2026-11-26, first start")
    assert cal.next_start_s("prefill") == (25.0, "measured on spark-01, 2026-11-26, first start")
    cal.starts.append({"instance": "baseline-0", "role": "baseline", "s": 21.0, "first": False,
                       "at": "2026-11-27T09:00:00Z"})
    assert cal.next_start_s("baseline") == (21.0, "measured on spark-01, 2026-11-27, later start")
    assert cal.next_start_s("prefill")[0] == 25.0  # prefill never started here


def test_a_record_written_before_the_probe_and_proxy_figures_still_loads(test_cfg):
    old = {"node": "spark-01", "profile": test_cfg.profile, "device": "cpu",
           "mem_total_bytes": 1 << 34, "os_reserve_bytes": None, "os_reserve_at": None,
           "instances": {}, "starts": [], "updated_at": "2026-11-26T11:15:02Z"}
    p = calibration.path(test_cfg, "spark-01")
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(old))
    cal = calibration.load(test_cfg, "spark-01")
    assert cal.probe == {} and cal.proxy == {} and cal.measured() == {}
    # recording onto it keeps what it held
    calibration.record_probe(test_cfg, "spark-01", "spark-02", probe_rows({("DRAM", "READ"): 1.0}))
    assert calibration.load(test_cfg, "spark-01").mem_total_bytes == 1 << 34
