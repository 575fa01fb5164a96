"""Where notebook 04's time went: TTFT's parts from two /metrics readings per instance, the
sentence that names the part that dominated (it follows the data), and the CPU table."""

from __future__ import annotations

import pytest

from lab_utils.notebook import time_split, transfer_lesson
from lab_utils.serve.metrics import MetricsSnapshot, Sample


def _snap(ttft_s: float, n: float, xfer_s: float = 0.0) -> MetricsSnapshot:
    return MetricsSnapshot([
        Sample("vllm:time_to_first_token_seconds_sum", {}, ttft_s),
        Sample("vllm:time_to_first_token_seconds_count", {}, n),
        Sample("vllm:nixl_xfer_time_seconds_sum", {}, xfer_s),
        Sample("vllm:nixl_xfer_time_seconds_count", {}, n),
    ])


def test_ttft_parts_from_the_instances_metrics():
    # 4 requests: the prefill's TTFT 0.2 s in all (50 ms each), the decode's 0.12 s (30 ms
    # each), of which NIXL's transfers 0.04 s (10 ms each); the client saw 100 ms
    prefill = (_snap(1.0, 10), _snap(1.2, 14))
    decode = (_snap(0.5, 10, 0.1), _snap(0.62, 14, 0.14))
    parts = time_split.ttft_parts(100.0, prefill, decode)
    assert parts == pytest.approx({"prefill": 50.0, "proxy hop": 20.0, "KV move": 10.0,
                                   "first decode step": 20.0})


@pytest.mark.parametrize("top", time_split.PARTS)
def test_the_sentence_names_the_part_that_dominated(top):
    parts = {k: 5.0 for k in time_split.PARTS} | {top: 80.0}
    said = time_split.split_sentence(parts, 95.0)
    assert f"the {top} took the most, 80.0 ms (84% of it)" in said
    assert "single instance" not in said  # the "through the pair" sentence compares with 01
    for other in set(time_split.PARTS) - {top}:
        assert f"{other} 5.0 ms" in said


def test_the_sentence_changes_with_the_data():
    said = {time_split.split_sentence({k: (50.0 if k == top else 1.0) for k in time_split.PARTS},
                                      53.0) for top in time_split.PARTS}
    assert len(said) == len(time_split.PARTS)


def test_the_conclusions_carry_the_computed_sentence_not_a_fixed_one():
    hop = {"single_ttft_ms": 40.0, "pd_ttft_ms": 65.0, "extra_ms": 25.0, "transfer_ms": 5.0}
    split = time_split.split_sentence({"prefill": 1.0, "proxy hop": 2.0, "KV move": 50.0,
                                       "first decode step": 3.0}, 65.0)
    said = transfer_lesson.conclusions([], hop, split)
    assert said[-1] == split and "the KV move took the most" in split
    assert not any("decode scheduling the request" in s for s in said)


def test_cpu_table_largest_first():
    frame = time_split.cpu_frame({"proxy": 1.0, "decode-0 (engine, worker)": 9.5,
                                  time_split.BUSY_NIXL: 0.2})
    assert list(frame["during the sweep"]) == ["decode-0 (engine, worker)", "proxy",
                                                time_split.BUSY_NIXL]
    assert time_split.cpu_frame(None).empty


def test_a_mean_far_above_the_sweeps_median_is_said_to_be_one():
    parts = {"prefill": 9.6, "proxy hop": 4.9, "KV move": 180.5, "first decode step": 11.1}
    said = time_split.split_sentence(parts, 206.1, 6, 27.8)
    assert said.startswith("Where TTFT went: over 6 fresh requests sent one at a time after "
                           "the sweep, the mean TTFT through the pair was 206.1 ms;")
    assert ("The sweep's own median at concurrency 1 was 27.8 ms: these requests were slower "
            "than the sweep's") in said
    assert "sweep's own median" not in time_split.split_sentence(parts, 29.0, 6, 27.8)
    before = time_split.split_sentence(parts, 35.9, 12, 29.6, "before")  # 21% apart
    assert "sent one at a time before the sweep" in before and "were slower" in before


def test_cpu_counts_the_model_thread_put_back_with_its_instance_not_with_nixl(test_cfg,
                                                                            monkeypatch):
    """An instance's record lists its worker main thread (put back on its CPUs) beside any
    busy NIXL thread; only the latter is NIXL's CPU."""
    import os
    from types import SimpleNamespace

    from lab_utils.on_node import nixl_threads

    me = os.getpid()
    rec = SimpleNamespace(name="decode-0", node="spark-02", kind="vllm", pgid=os.getpgid(0),
                          extra={"nixl_threads": [{"pid": me, "tid": me,
                                                   "thread": nixl_threads.MAIN_THREAD}]})

    class FakeCluster:
        def __init__(self, cfg):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def running(self):
            return [rec]

    monkeypatch.setattr(time_split, "Cluster", FakeCluster)
    sum(range(2_000_000))  # some CPU in this thread
    out = time_split.cpu_now(test_cfg, SimpleNamespace(records=[rec]))
    assert out[time_split.BUSY_NIXL] == 0.0
    assert out["decode-0 (engine, worker)"] > 0


def test_two_parts_within_the_margin_are_a_tie_not_a_ranking():
    """A run's split had the first decode step at 12.7 ms and prefill at 12.6 ms: neither
    is named the larger."""
    said = time_split.split_sentence({"prefill": 12.6, "proxy hop": 3.0, "KV move": 8.0,
                                      "first decode step": 12.7}, 36.3)
    assert ("the first decode step and the prefill took the most, within 10% of each other: "
            "12.7 ms (35%), 12.6 ms (35%); proxy hop 3.0 ms, KV move 8.0 ms.") in said
    assert "took the most, 12.7 ms" not in said
