"""Two of the engine's switches, measured on notebook 01's node (`two_switches`):

- **chunked prefill**: how many tokens one engine step may carry (`--max-num-batched-tokens`).
  A long prompt larger than that budget is prefilled over several steps, and every stream
  decoding beside it waits for one step at a time instead of the whole prefill. The mixed
  workload runs again on the instance restarted three times: as served, with a small
  budget, and with chunking off (the whole prompt in one step).
  Each restarted instance first serves one unmeasured mixed run (`_warm_up`), so that none
  is measured on its first steps.
- **prefix caching**: one fresh long prompt sent twice, one at a time, on the instance as
  served; the second time its KV blocks are found in the cache and not computed again.
  The hits are intended here, so this runs on an instance of its own (`baseline-0-*`, its
  own log), never on one a comparison uses.

Each variant is the baseline instance with a name of its own and its setting's flags (none
as served), on the baseline's port, behind the lab proxy (started fresh for the topology), so it is
measured exactly as 01's runs are. One variant runs at a time; each stops before the next
starts, and everything stops at the end (or when a cell fails: the session's records).
Results go into notebook 01's results file (`switches`), what they show into its claims.
"""

from __future__ import annotations

import dataclasses
import random
import re
import statistics

import pandas as pd

from lab_utils.config import LabConfig, api_key
from lab_utils.measure.benchmark import cache_hits
from lab_utils.measure.loadgen import RequestSpec, run_point, run_sync
from lab_utils.measure.prompts import exact_prompt
from lab_utils.measure.workload import build_requests
from lab_utils.notebook.record import say
from lab_utils.notebook.session import ServingSession, tokenizer_of
from lab_utils.notebook.steps import cache_meter, run_sweep
from lab_utils.results import load_results, write_results
from lab_utils.results.experiments import SMALL_BUDGET, switch_claims
from lab_utils.results.payloads import PrefixTwice, Switches, SwitchRun
from lab_utils.results.points import Measured
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.serve.launcher import start_instance, wait_ready
from lab_utils.serve.topology import Served, start_proxy
from lab_utils.util.numbers import fmt_num

PREFIX_OUTPUT = 8  # output tokens of each prefix-caching request


# vLLM 0.32's step budget for its API server when none is given, on a CPU
# (`EngineArgs.get_batch_defaults`); on a GPU it depends on the device's memory
CPU_DEFAULT_BUDGET = 2048


def budget_as_served(cfg: LabConfig, log_text: str) -> int | None:
    """The step budget of the instance as served: from vLLM's start-up line when it wrote
    one (it does when the budget was given), else vLLM's CPU default on a CPU profile
    (None: not known)."""
    found = re.findall(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)", log_text)
    if found:
        return int(found[-1])
    return CPU_DEFAULT_BUDGET if cfg.vllm.device == "cpu" else None


def _warm_up(cfg: LabConfig, served: Served) -> None:
    """One unmeasured mixed run with prompts of its own, so a restarted instance has
    served every step shape once, as 01's instance had by its mixed run."""
    tokenize, detokenize = tokenizer_of(served, cfg)
    w = cfg.workload
    c = max(w.concurrency or [1])
    specs = build_requests(w, c * w.mixed_long_every, tokenize, detokenize, mixed=True,
                           seed=random.SystemRandom().randrange(2**31))
    run_sync(run_point(served.proxy_url, cfg.model.name, specs, concurrency=c,
                       show_progress=False, api_key=api_key(cfg, "proxy")))


def variants(cfg: LabConfig) -> list[tuple[str, str, list[str]]]:
    """(name suffix, label, flags added to the baseline's): as served, a small budget, and
    chunking off with a budget that holds the longest prompt."""
    longest = cfg.vllm.baseline.max_model_len or cfg.vllm.max_model_len
    return [("served", "as served", []),
            ("steps256", f"chunked, {SMALL_BUDGET}-token steps",
             ["--max-num-batched-tokens", str(SMALL_BUDGET)]),
            ("unchunked", "chunked prefill off",
             ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(longest)])]


def _start_variant(session: ServingSession, suffix: str, flags: list[str]) -> Served:
    cfg, cluster = session.cfg, session.cluster
    base = cfg.instances("baseline")[0]
    settings = base.settings.model_copy(update={"extra_args": [*base.settings.extra_args, *flags]})
    spec = dataclasses.replace(base, name=f"{base.name}-{suffix}", settings=settings)
    how = f"with {' '.join(flags)}" if flags else "as served"
    print(f"starting {spec.name} on {spec.node}: the baseline instance {how}", flush=True)
    rec, _ = start_instance(cluster, spec)
    session.started.append(rec)
    wait_ready(cluster, [rec])
    proxy, new = start_proxy(cluster, "baseline")
    if new:
        session.started.append(proxy)
        wait_ready(cluster, [proxy], timeout=60, show_progress=False)
    return Served("baseline", [rec, proxy])


def _stop_instance(session: ServingSession, served: Served) -> None:
    inst = served.instance_records()
    session.cluster.stop(inst)
    session.started = [r for r in session.started if r not in inst]


def switch_run(suffix: str, label: str, budget: int | None, result: BenchmarkResult,
               long: int) -> SwitchRun:
    """One setting's record from its mixed run: the point at the highest concurrency, the
    first token of the long prompts and of the others."""
    point = max((p for p in result.combined if p.mode == "concurrency"), key=lambda p: p.value)
    firsts = result.first_tokens(point.value, long)
    ttft = {k: [v for rep in firsts[k] for v in rep] for k in (True, False)}
    # each repeat's median of each kind, so that the rule can hold two settings' ranges apart
    each = {k: Measured.of(statistics.median(rep) if rep else None for rep in firsts[k])
            for k in (True, False)}
    return SwitchRun(suffix=suffix, label=label, budget=budget, point=point,
                     long_ttft_ms=statistics.median(ttft[True]) if ttft[True] else None,
                     other_ttft_ms=statistics.median(ttft[False]) if ttft[False] else None,
                     long_ttft=each[True], other_ttft=each[False])


def switches_frame(sw: Switches) -> pd.DataFrame:
    """The chunked-prefill table, one row per setting."""
    return pd.DataFrame([{
        "engine": r.label, "step budget (tokens)": r.budget, "concurrency": int(r.point.value),
        "ITL p50 ms": r.point.median("median_itl_ms"), "ITL p99 ms": r.point.median("p99_itl_ms"),
        "long prompts' TTFT p50 ms": getattr(r.first_token(True), "median", None),
        "other prompts' TTFT p50 ms": getattr(r.first_token(False), "median", None),
        "prefix-cache hits %": r.point.prefix_cache_hit_pct} for r in sw.chunked_prefill
    ]).set_index("engine").map(fmt_num)


def prefix_twice(cfg: LabConfig, served: Served) -> PrefixTwice:
    """One fresh prompt of the mixed workload's long length, sent twice, one at a time:
    TTFT and the share of its prompt tokens the prefix cache served, each time."""
    tokenize, _ = tokenizer_of(served, cfg)
    length = cfg.workload.long_len
    spec = RequestSpec(exact_prompt(tokenize, length, random.Random(random.SystemRandom().random())),
                       PREFIX_OUTPUT)
    meter = cache_meter(served)
    got: dict[str, float | None] = {}
    for which in ("first", "second"):
        before = meter()
        records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, [spec], concurrency=1,
                                        show_progress=False, api_key=api_key(cfg, "proxy")))
        pct, _ = cache_hits(before, meter())
        got[f"{which}_ttft_ms"], got[f"{which}_hits_pct"] = records[0].ttft_ms, pct
    return PrefixTwice(prompt_tokens=length, **got)


def two_switches(cfg: LabConfig, session: ServingSession) -> pd.DataFrame:
    """Measure both switches (module docstring); add them to 01's results; print the
    computed conclusions (saved as claims); return the chunked-prefill table. 01's
    instance, if still running, is stopped first: the variants take its port."""
    long = cfg.workload.long_len
    runs, prefix = [], None
    session.stop(quiet=True)
    try:
        for suffix, label, flags in variants(cfg):
            served = _start_variant(session, suffix, flags)
            _warm_up(cfg, served)
            result = run_sweep(cfg, served, mixed=True, run=f"switch {suffix}")
            if flags:
                budget: int | None = int(flags[flags.index("--max-num-batched-tokens") + 1])
            else:  # vLLM's own choice, and the configuration every comparison uses
                inst = served.instance_records()[0]
                budget = budget_as_served(cfg, session.cluster.node(inst.node).log_tail(inst, 5000))
                prefix = prefix_twice(cfg, served).model_copy(update={"instance": inst.name})
            runs.append(switch_run(suffix, label, budget, result, long))
            _stop_instance(session, served)
    finally:
        session.stop(quiet=True)
    sw = Switches(chunked_prefill=runs, prefix_caching=prefix)
    baseline = load_results(cfg, "01").payload
    write_results(cfg, "01", baseline.model_copy(update={"switches": sw}))
    say(cfg, "01:switches", switch_claims(sw))
    return switches_frame(sw)
