"""The P/D forecast's CPU term: 01's decode beside stand-ins for NIXL's threads."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from forecast.test_forecast import ONE, hand_inputs, profile_dict

from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import load_config
from lab_utils.forecast import beside
from lab_utils.forecast.curves import point
from lab_utils.forecast.inputs import from_results
from lab_utils.forecast.model import Architecture, forecast
from lab_utils.on_node import nixl_threads
from lab_utils.results.forecast import BesideBusy, EngineProfile


def test_one_stand_in_per_nixl_thread_on_the_decodes_machine(test_cfg):
    # the rehearsal: every instance on this machine, each pinned as vLLM pins it
    assert beside.stand_ins(test_cfg) == ["0", "1"]
    # two Sparks: only the decode's node counts, and a GPU profile pins nothing
    spark = load_config("environment_config.json.example")
    assert beside.stand_ins(spark) == ["-"]
    # the prefill's idle worker: beside the decode on the rehearsal, on its own node there
    assert beside.prefill_stand_ins(test_cfg) == ["0"]
    assert beside.prefill_stand_ins(spark) == []


def test_the_stand_ins_run_at_once_pinned_and_lowered():
    got = nixl_threads.spin(0.6, True, [{0}, nixl_threads.cpu_set("1"), None])
    assert got["processes"] == 3 and got["cpus"] == [[0], [1], None]
    assert got["policy"] == "SCHED_OTHER nice 19 slice 0.1 ms"
    assert 0.55 <= got["end"] - got["start"] < 5
    assert nixl_threads.cpu_set("0,2|4-5") == {0, 2, 4, 5} and nixl_threads.cpu_set("auto") is None


def _lowered_and_running() -> int:
    """Processes on this machine running (R) at nice 19, from /proc."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (f := nixl_threads._stat(d / "stat")) and f[0] == "R" and f[16] == "19":
            n += 1
    return n


def _waiting_stand_ins() -> int:
    """Processes on this machine started as waiting stand-ins (`spin-wait`), from /proc."""
    n = 0
    for d in Path("/proc").iterdir():
        try:
            n += d.name.isdigit() and b"\0spin-wait\0" in (d / "cmdline").read_bytes()
        except OSError:
            continue
    return n


REC = ProcessRecord(name="baseline-0", node="spark-01", pid=1, pgid=1, start_ticks=0,
                    log_path="/dev/null", argv=[])


def test_measure_runs_alone_then_beside_real_stand_ins(test_cfg):
    """The stand-ins really run on the node (this machine) while, and only while, the runs
    beside them happen: each run reports 2.0 when it sees two busy nice-19 processes. With
    no progress delay NIXL's threads poll without pause, and so do the stand-ins."""
    def one_decode() -> float:
        time.sleep(0.05)
        return 2.0 if _lowered_and_running() >= 2 else 1.0
    busy_cfg = test_cfg.model_copy(deep=True)
    busy_cfg.kv_transfer.nixl_progress_delay_us = 0
    got = beside.measure(busy_cfg, REC, one_decode, repeats=2)
    assert got.threads == 3 and got.binds == ["0", "1", "0"], got
    assert got.policy == ("SCHED_OTHER nice 19 slice 0.1 ms; and 1 yielding, for the "
                          "prefill's idle worker"), got
    assert got.alone.median == 1.0 and got.ratio == pytest.approx(2.0) and got.why is None, got
    assert _lowered_and_running() < 2  # they ended with the measurement


def test_with_a_progress_delay_the_stand_ins_wait_as_nixls_threads_then_do(test_cfg):
    """The CPU profile's default delay (1000 us): the stand-ins wait 1 ms per round at
    normal priority instead of spinning lowered, beside one yielding for the prefill's idle
    worker; each run reports 2.0 when it sees the three of them (and their parent) alive."""
    def one_decode() -> float:
        time.sleep(0.05)
        return 2.0 if _waiting_stand_ins() >= 4 else 1.0
    assert test_cfg.nixl_progress_delay_us() == 1000
    got = beside.measure(test_cfg, REC, one_decode, repeats=2)
    assert got.threads == 3, got
    assert got.policy.endswith(", waiting 1 ms per poll; and 1 yielding, for the prefill's "
                               "idle worker"), got
    assert "nice 19" not in got.policy, got
    assert got.alone.median == 1.0 and got.ratio == pytest.approx(2.0), got
    assert _waiting_stand_ins() == 0


def _profile(ratio: float | None) -> EngineProfile:
    p = EngineProfile(**profile_dict())
    if ratio is None:
        return p
    return p.model_copy(update={"beside_busy": BesideBusy(
        threads=2, policy="SCHED_OTHER nice 19 slice 0.1 ms", binds=["0", "1"],
        alone=point(1, [1.0]), beside=point(1, [ratio]), ratio=ratio)})


def test_the_factor_slows_only_a_pd_decode_and_is_named_in_the_sources():
    plain, slowed = from_results(_profile(None), None), from_results(_profile(2.5), None)
    assert plain.decode_beside == 1.0 and "NIXL's threads" not in plain.sources
    assert slowed.decode_beside == 2.5
    assert "1.00 ms (one run) alone, medians 2.50x" in slowed.sources["NIXL's threads"]
    # below 1 is noise, not a faster decode
    faster = from_results(_profile(0.9), None)
    assert faster.decode_beside == 1.0
    assert "no factor (a step no slower beside them is noise)" in faster.sources["NIXL's threads"]
    # 1.06x whose runs overlap the step alone is no difference by the rule: no factor
    overlap = _profile(1.06).model_copy()
    assert overlap.beside_busy is not None
    overlap.beside_busy.alone = point(1, [0.95, 1.0, 1.1])
    overlap.beside_busy.beside = point(1, [1.0, 1.06, 1.12])
    same = from_results(overlap, None)
    assert same.decode_beside == 1.0
    # the sentence shows what the rule read: both ranges, and why they are no difference
    said = same.sources["NIXL's threads"]
    assert "1.06 ms (1.00-1.12 over 3) beside, 1.00 ms (0.95-1.10 over 3) alone" in said
    assert "no factor (no difference by the lab's rule: gap 6.0% of the smaller value" in said
    by_hand = hand_inputs()
    doubled = dataclasses.replace(by_hand, decode_beside=2.0)
    pd, one = Architecture(prefill=1, decode=1), Architecture()
    assert forecast(doubled, pd, ONE).metrics["median_tpot_ms"] == pytest.approx(
        2 * forecast(by_hand, pd, ONE).metrics["median_tpot_ms"])
    assert forecast(doubled, one, ONE).metrics == forecast(by_hand, one, ONE).metrics


def test_one_yielding_stand_in_per_other_replica_on_this_machine(test_cfg):
    # 01's instance is bound to CPU 1; the replicas to 0 and 1: the other one is on 0
    assert beside.replica_stand_ins(test_cfg) == ["0"]
    assert beside.replica_stand_ins(load_config("environment_config.json.example")) == []
    got = nixl_threads.spin(0.3, False, [{0}], yielding=True)
    assert got["processes"] == 1 and got["policy"].startswith("SCHED_OTHER nice 0 "), got


def test_the_replicas_factor_slows_only_replicas_sharing_a_machine():
    by_hand = hand_inputs()
    doubled = dataclasses.replace(by_hand, replica_beside=2.0)
    two, one, pd = Architecture(replicas=2), Architecture(), Architecture(prefill=1, decode=1)
    assert forecast(doubled, two, ONE).metrics["median_tpot_ms"] == pytest.approx(
        2 * forecast(by_hand, two, ONE).metrics["median_tpot_ms"])
    assert forecast(doubled, one, ONE).metrics == forecast(by_hand, one, ONE).metrics
    assert forecast(doubled, pd, ONE).metrics == forecast(by_hand, pd, ONE).metrics
