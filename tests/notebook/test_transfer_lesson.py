"""Notebook 04's reading of its own run: bytes against 02's arithmetic, time against the
probe, going through the pair against 01, and the stall note only when a run stood still."""

from __future__ import annotations

import pytest

from lab_utils.notebook import transfer_lesson as lesson
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult
from tests.support.payloads import disaggregated_dict, kv_dict, model, proof_row_dict

READ_ROW = {"seg_type": "DRAM", "op": "READ", "bandwidth_GBps": 2.0}


def _kv(pvm=None):
    return model("02", kv_dict(probe_rows=[READ_ROW, {**READ_ROW, "bandwidth_GBps": 4.0},
                                           {**READ_ROW, "seg_type": "VRAM", "bandwidth_GBps": 99.0}],
                               pvm=pvm))


def _proof(*rows):
    payload = disaggregated_dict()
    payload["proof"]["prompts"] = list(rows)
    return model("04", payload).proof


def _sweep(ttft: float, *, valid: bool = True, held: list[float] = ()) -> BenchmarkResult:
    points = [BenchmarkPoint(mode="concurrency", value=1, repeat=i, summary={"held_up_s": h},
                             requests=[]) for i, h in enumerate(held)]
    return BenchmarkResult(target="t", model="m", workload={}, points=points, combined=[
        {"mode": "concurrency", "value": 1, "mixed": False, "valid": valid,
         "median_ttft_ms": ttft, "median_tpot_ms": 10.0},
        {"mode": "concurrency", "value": 2, "mixed": False, "valid": True, "median_ttft_ms": 1.0}])


def test_bytes_and_time_against_02():
    # 64 prompt tokens = 4 blocks of 16 x 16384 bytes per token = 1 MiB
    exact = {**proof_row_dict(tokens=64), "nixl_bytes": 1048576, "nixl_xfer_ms": 2.0}
    short = {**proof_row_dict(tokens=64), "nixl_bytes": 262144}
    rows = lesson.transfer_rows(_proof(exact, short), _kv(), "cpu")
    assert [r["02's arithmetic (bytes)"] for r in rows] == [1048576, 1048576]
    assert [r["bytes as predicted"] for r in rows] == [True, False]
    # DRAM's best READ (4 GB/s), not VRAM's: 1048576 B / 4e9 B/s = 0.262 ms
    assert rows[0]["probe predicts ms"] == pytest.approx(0.262144)
    assert rows[0]["measured / predicted"] == pytest.approx(2.0 / 0.262144)
    said = lesson.conclusions(rows, None)
    assert said[0].startswith("Bytes: 1 of 2 prompts") and "False" in said[0]
    assert "Through the pair: not compared" in said[-1]


def test_probe_at_the_same_size_is_quoted_when_02_measured_it():
    row = {**proof_row_dict(tokens=128), "nixl_bytes": 128 * 16384, "nixl_xfer_ms": 3.0}
    rows = lesson.transfer_rows(_proof(row), _kv(), "cpu")  # kv_dict's probe: 1.2 ms at 128
    assert rows[0]["probe, same bytes ms"] == 1.2
    time_said = lesson.conclusions(rows, None)[1]
    assert "the probe itself took 1.20 ms and vLLM's transfer 3.00 ms" in time_said
    rows = lesson.transfer_rows(_proof(row), _kv(pvm=[]), "cpu")
    assert rows[0]["probe, same bytes ms"] is None
    assert "the probe itself" not in lesson.conclusions(rows, None)[1]


def test_a_wide_spread_of_transfer_times_is_said_with_the_median():
    row = {**proof_row_dict(tokens=64), "nixl_bytes": 1048576}
    rows = lesson.transfer_rows(_proof({**row, "nixl_xfer_ms": 0.3}, {**row, "nixl_xfer_ms": 0.4},
                                       {**row, "nixl_xfer_ms": 7.0}), _kv(), "cpu")
    said = lesson.conclusions(rows, None)[1]
    assert "ranged from 1.1x to 26.7x" in said and "read the rows above" in said
    assert ("Furthest above its prediction: the 64-token prompt (7.00 ms, 26.7x), sent 3rd of "
            "3; what made it so is not measured here.") in said
    rows = lesson.transfer_rows(_proof({**row, "nixl_xfer_ms": 0.3}, {**row, "nixl_xfer_ms": 0.4}), _kv(), "cpu")
    assert "ranged" not in lesson.conclusions(rows, None)[1]


def test_no_prediction_without_a_read_from_that_memory():
    rows = lesson.transfer_rows(_proof(proof_row_dict()), model("02", kv_dict()), "cuda")
    assert rows[0]["probe predicts ms"] is None and rows[0]["measured / predicted"] is None
    assert "no prediction" in lesson.conclusions(rows, None)[1]


def test_through_the_pair_at_concurrency_one():
    proof = _proof({**proof_row_dict(), "nixl_xfer_ms": 4.0}, {**proof_row_dict(), "nixl_xfer_ms": 6.0})
    hop = lesson.hop_cost(_sweep(40.0), _sweep(65.0), proof)
    assert hop["extra_ms"] == 25.0 and hop["transfer_ms"] == 5.0
    said = lesson.conclusions([], hop)[-1]
    assert said.startswith("Through the pair: at one request at a time, TTFT was 65.0 ms "
                           "through the proxy, the prefill, the handoff and the decode against "
                           "40.0 ms on 01's one instance, asked directly: +25.0 ms per request")
    assert "the KV move itself is 5.0 ms of it" in said
    # the whole difference is not called the hop's; the parts are pointed to only when timed
    assert "every difference between the two paths, not the hop alone." in said
    split = lesson.conclusions([], hop, split="Where TTFT went: ...")
    assert "not the hop alone; the split below times the parts." in split[-2]
    assert lesson.hop_cost(_sweep(40.0), _sweep(65.0, valid=False), proof) is None
    # a move longer than the whole difference is not called a part of it
    slow = _proof({**proof_row_dict(), "nixl_xfer_ms": 30.0}, {**proof_row_dict(), "nixl_xfer_ms": 40.0})
    said = lesson.conclusions([], lesson.hop_cost(_sweep(40.0), _sweep(65.0), slow))[-1]
    assert "of it" not in said and "median of 35.0 ms, more than that whole difference" in said


def test_stall_note_only_when_a_run_stood_still():
    assert lesson.stall_note(_sweep(1.0, held=[0.0, 0.0])) is None
    note = lesson.stall_note(_sweep(1.0, held=[0.0, 2.5]), _sweep(1.0, held=[12.0]))
    assert note.startswith("Note: the machine stood still in 2 of 3 runs, 14.5 s in all")
