"""Fair comparisons on a real vLLM instance: a sweep, then notebook 03's policy
comparison on the same instance, each run on prompts of its own, with the instance's
prefix-cache counters read around every run: 0% hits in both. Replaying the sweep's
prompts shows the counter is read (hits) and marks that run invalid.

Slow: uses the session's rehearsal instances (tests/conftest.py `rehearsal`) and leaves
them running for the tests after it: its `ServingSession` finds them running, so it stops
only what it started (the lab proxy in front); the test checks that they are the same
processes, alive, when it ends.
"""

from __future__ import annotations

import random

import pytest

from lab_utils import notebook as lab
from lab_utils.cluster import Cluster
from lab_utils.config import api_key
from lab_utils.measure.benchmark import sweep
from lab_utils.measure.workload import build_requests
from lab_utils.notebook.compare import side_by_side

pytestmark = pytest.mark.slow


def _instances(cfg) -> dict[str, int]:
    """The rehearsal's vLLM instances that run: role -> PID."""
    with Cluster(cfg) as cluster:
        return {r.extra["role"]: r.pid for r in cluster.running()
                if r.kind == "vllm" and cluster.alive(r)}


def test_sweep_then_policy_comparison_see_no_prefix_cache_hits(rehearsal, engine_cfg):
    rehearsal.up()
    shared = _instances(engine_cfg)
    assert set(shared) == {"baseline", "prefill", "decode"}, shared
    # a seed of its own, so that no other test's or run's prompts are these
    w = engine_cfg.workload.model_copy(update={
        "concurrency": [1, 2], "request_rates": [], "num_prompts": 6, "warmup": 1,
        "repeats": 1, "mixed_long_len": 512, "mixed_long_every": 3,
        "seed": random.SystemRandom().randrange(2**20)})
    cfg = engine_cfg.model_copy(update={"workload": w})
    session = lab.ServingSession(cfg)
    try:
        served = session.start("baseline")
        result = lab.run_sweep(cfg, served)
        policies = lab.compare_policies(cfg, session, served)

        hits = [p.summary.prefix_cache_hit_pct for p in result.points]
        assert hits == [0.0, 0.0], result.points[0].summary
        assert all(c.valid and c.prefix_cache_hit_pct == 0.0 for c in result.combined)
        table = side_by_side(policies.runs)
        runs = table[table["run"] != "better"]
        assert list(runs["run"]) == ["round_robin", "least_outstanding"]
        assert list(runs["cache hits %"]) == [0.0, 0.0] and all(runs["valid"])
        seeds = {p.summary.seed for p in result.points}
        assert len(seeds) == len(result.points)

        # the same prompts again on the same instance: the counters see the hits, and the
        # run is invalid, saying why
        first = result.points[0]
        tokenize, detokenize = lab.tokenizer_of(served, cfg)
        one = w.model_copy(update={"concurrency": [1]})
        again = sweep(served.proxy_url, cfg.model.name,
                      lambda n, seed: build_requests(one, n, tokenize, detokenize, seed=seed),
                      one, run=first.summary.run, api_key=api_key(cfg, "proxy"),
                      cache_meter=lab.cache_meter(served), show_progress=False)
        replay = again.points[0].summary
        assert replay.seed == first.summary.seed
        assert replay.prefix_cache_hit_pct > 50, replay
        assert not replay.valid and "prefix-cache hits" in replay.invalid_reason
        assert not again.combined[0].valid
    finally:
        stopped = session.stop()
    # the session started the front door alone; the shared instances run on, the same
    assert stopped == ["proxy"], stopped
    assert _instances(engine_cfg) == shared
