"""Fair runs: every run of a series has prompts of its own (`run_seed`), every repeat
records the instances' prefix-cache hit share, hits where none were intended make it
invalid with the reason, and no winner is named between runs whose hit shares differ.

Against the stub server (own process), with a prefix cache simulated from the prompts it
logged: a prompt it was sent before counts as hits (the real counters are checked by
tests/notebook/test_fair_runs.py on vLLM)."""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import pytest

from lab_utils.bench.stub_server import spawn_until_up
from lab_utils.config import WorkloadConfig
from lab_utils.measure.benchmark import cache_hits, combine, run_seed, sweep
from lab_utils.measure.workload import build_requests
from lab_utils.notebook.compare import side_by_side
from lab_utils.on_node.proctools import stop_group
from lab_utils.results.points import Measured, Point, compare_points, unlike_caches
from lab_utils.results.sweep import RepeatSummary

from support.fakes import free_port

ADDR = "127.0.0.6"


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    log = tmp_path_factory.mktemp("fair") / "timing.jsonl"
    port = free_port(ADDR)
    url = f"http://{ADDR}:{port}"
    pid, ticks = spawn_until_up([sys.executable, "-m", "lab_utils.bench.stub_server", ADDR,
                                 str(port), "1", "1", str(log)], f"{url}/v1/completions")
    yield url, log
    stop_group(pid, ticks, 5)


def cache_of(log: Path):
    """The stub's prompts as a prefix cache would count them: a prompt sent before is all
    hits (instance "stub": prompt tokens, of them hits)."""
    def read():
        seen, total, hits = set(), 0, 0
        lines = log.read_text().splitlines() if log.exists() else []
        for line in lines:
            prompt = tuple(json.loads(line)["prompt"])
            total += len(prompt)
            hits += len(prompt) if prompt in seen else 0
            seen.add(prompt)
        return {"stub": (float(total), float(hits))}
    return read


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(w.encode()) % 500 + 3 for w in text.split()]


W = WorkloadConfig(input_len=16, output_len=4, concurrency=[1, 2], request_rates=[],
                   num_prompts=4, warmup=1, repeats=2, mixed_long_len=48, mixed_long_every=2,
                   max_failed_fraction=0.0)


def run(url, log, run_name: str, *, mixed: bool = False, w: WorkloadConfig = W):
    if mixed:
        w = w.model_copy(update={"concurrency": [2]})
    return sweep(url, "m", lambda n, seed: build_requests(w, n, tokenize, mixed=mixed, seed=seed),
                 w, mixed=mixed, run=run_name, cache_meter=cache_of(log), show_progress=False)


def test_a_series_of_runs_on_one_instance_sees_no_cache_hits(stub):
    url, log = stub
    runs = [run(url, log, "replicated/sweep"), run(url, log, "replicated/mixed", mixed=True),
            run(url, log, "replicated/policy round_robin", mixed=True),
            run(url, log, "replicated/policy least_outstanding", mixed=True)]
    points = [p for r in runs for p in r.points]
    assert all(p.summary.prefix_cache_hit_pct == 0.0 and p.summary.valid for p in points)
    assert all(c.prefix_cache_hit_pct == 0.0 and c.valid for r in runs for c in r.combined)
    assert len({p.summary.seed for p in points}) == len(points)
    # the policy comparison of the two runs names a winner only by the rule: same footing
    frame = side_by_side({"round_robin": runs[2].combined[0],
                          "least_outstanding": runs[3].combined[0]})
    assert list(frame["cache hits %"][:2]) == [0.0, 0.0]


def test_a_run_that_replays_prompts_is_invalid_and_says_why(stub, capsys):
    url, log = stub
    run(url, log, "baseline/sweep", w=W.model_copy(update={"repeats": 1}))
    again = run(url, log, "baseline/sweep", w=W.model_copy(update={"repeats": 1}))
    s = again.points[0].summary
    assert s.prefix_cache_hit_pct == 100.0 and s.prefix_cache_hit_pct_by_instance == {"stub": 100.0}
    assert not s.valid and "100.0% of the prompt tokens were prefix-cache hits" in s.invalid_reason
    c = again.combined[0]
    assert not c.valid and c.prefix_cache_hit_pct == 100.0 and "prefix-cache hits" in c.invalid_reason
    assert "INVALID POINT (concurrency 1, repeat 1)" in capsys.readouterr().out


def test_seeds_differ_by_run_point_and_repeat_and_standard_and_mixed_never_share():
    seeds = {run_seed(0, f"{name}/{kind}", mode, v, rep)
             for name in ("replicated/sweep", "replicated/policy round_robin", "disaggregated/sweep")
             for kind in ("standard", "mixed") for mode in ("concurrency", "rate")
             for v in (1, 2, 4, 2.5) for rep in range(3)}
    assert len(seeds) == 3 * 2 * 2 * 4 * 3
    assert run_seed(7, "a", "concurrency", 1, 0) == run_seed(7, "a", "concurrency", 1.0, 0)


def test_cache_hits_reads_the_counters_between_two_readings():
    before = {"replica-0": (100.0, 0.0), "replica-1": (50.0, 10.0)}
    after = {"replica-0": (300.0, 0.0), "replica-1": (250.0, 110.0), "new": (10.0, 10.0)}
    assert cache_hits(before, after) == (25.0, {"replica-0": 0.0, "replica-1": 50.0})
    assert cache_hits({}, {}) == (None, {})
    s = RepeatSummary()
    s.mark_cache_hits(0.0, {"replica-0": 0.0})
    assert s.valid and s.prefix_cache_hit_pct == 0.0
    s.mark_cache_hits(5.0, {"replica-0": 5.0}, hits_expected=True)
    assert s.valid
    s.mark_cache_hits(5.0, {"replica-0": 0.0, "replica-1": 10.0})
    assert not s.valid and "(replica-1 10.0%)" in (s.invalid_reason or "")


def test_combine_keeps_the_highest_hit_share_and_the_first_reason():
    runs = [RepeatSummary(median_ttft_ms=10, prefix_cache_hit_pct=0.0),
            RepeatSummary(valid=False, invalid_reason="hits", median_ttft_ms=5,
                          prefix_cache_hit_pct=30.0)]
    p = combine(runs, "concurrency", 1.0)
    assert p.prefix_cache_hit_pct == 30.0 and not p.valid and p.invalid_reason == "hits"
    assert combine([RepeatSummary()], "concurrency", 1.0).prefix_cache_hit_pct is None


def _point(ttft: float, hits: float | None) -> Point:
    return Point(mode="concurrency", value=4, median_ttft_ms=Measured.one(ttft),
                 prefix_cache_hit_pct=hits)


def test_no_winner_between_runs_with_different_hit_shares():
    assert compare_points(_point(300, 0.0), _point(150, 0.0), "median_ttft_ms").better == "b"
    v = compare_points(_point(300, 0.0), _point(150, 32.1), "median_ttft_ms")
    assert not v.differs and v.better is None
    assert "prefix-cache hit shares differ (0.0% vs 32.1%)" in v.basis
    assert compare_points(_point(300, None), _point(150, None), "median_ttft_ms").better == "b"
    assert unlike_caches(None, 0.0) is None and unlike_caches(0.0, 0.05) is None
    assert unlike_caches(None, 3.0) is not None
    frame = side_by_side({"round_robin": _point(300, 0.0), "least_outstanding": _point(150, 14.2)})
    assert frame.iloc[-1]["TTFT p50 (ms)"] == "="
    frame = side_by_side({"round_robin": _point(300, 0.0), "least_outstanding": _point(150, 0.0)})
    assert frame.iloc[-1]["TTFT p50 (ms)"] == "least_outstanding"
