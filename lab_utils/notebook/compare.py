"""The serving notebooks' comparison tables: a sweep as a table (`sweep_frame`), two
notebooks' sweeps side by side (`compare_frame`), this run against a loaded reference run
(`versus_reference`), and the front doors (04: the lab proxy against vllm-router) and
routing policies (03) measured one after the other on the same instances.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pandas as pd
from IPython.display import display

from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.notebook.record import say
from lab_utils.notebook.session import ServingSession
from lab_utils.notebook.steps import run_sweep
from lab_utils.results import FrontDoors, ResultsEnvelope, load_reference_results, reference_origin
from lab_utils.results.experiments import policy_claims, policy_sides
from lab_utils.results.payloads import Policies
from lab_utils.results.points import (
    COMPARED,
    Point,
    compare_points,
    metric_rows,
    rounded,
    unlike_caches,
)
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.serve import router
from lab_utils.serve.topology import Served


def sweep_frame(result: BenchmarkResult):
    """One row per load point: the headline metrics with units, whether the point is
    valid, and the spread (the widest max - min over repeats, in % of the median, among
    the metrics shown)."""
    rows = []
    for c in result.combined:
        row = {"load": c.load, "valid": c.valid}
        row.update({m.heading: c.median(m) for m in COMPARED})
        spreads = [x.spread / x.median * 100 for m in COMPARED if (x := c.of(m)) and x.median]
        row["spread %"] = max(spreads) if spreads and c.repeats > 1 else None
        row["cache hits %"] = c.prefix_cache_hit_pct
        rows.append(row)
    return pd.DataFrame(rows).round(2)


def compare_front_doors(cfg: LabConfig, session: ServingSession, served: Served,
                        concurrency: int | None = None) -> FrontDoors | None:
    """One sweep point (the sweep's lowest concurrency unless given), once through the
    lab's proxy, then once through vllm-router on the same port in front of the same
    instances; the lab's proxy is put back afterwards, whatever happens. None, with the reason printed,
    when vllm-router cannot stand in here."""
    if cfg.proxy.api_key_file:
        print("skipped: proxy.api_key_file is set, and vllm-router checks no client key")
        return None
    try:
        got = version("vllm-router")
    except PackageNotFoundError:
        print(f"skipped: vllm-router is not installed (pip install vllm-router=={router.VERSION})")
        return None
    c = concurrency or min(cfg.workload.concurrency or [1])
    # one repeat through each: a side-by-side look, not a ranking (the sweep has the spread)
    w = cfg.workload.model_copy(update={"concurrency": [c], "request_rates": [], "repeats": 1})
    runs = {}
    try:
        for kind in ("lab", "vllm-router"):
            session.swap_front_door(served, kind)
            print(f"concurrency {c} through {'the lab proxy' if kind == 'lab' else kind} "
                  f"({w.num_prompts} requests)", flush=True)
            runs[kind] = run_sweep(cfg, served, workload=w, run=f"front door {kind}")
    finally:
        session.swap_front_door(served, "lab")
    return FrontDoors(point=f"concurrency {c}", lab=runs["lab"], vllm_router=runs["vllm-router"],
                      router_version=got)


def compare_policies(cfg: LabConfig, session: ServingSession, served: Served,
                     mixed: BenchmarkResult | None = None) -> Policies | None:
    """03's look at routing: the mixed workload once at its highest concurrency through the
    lab proxy with each routing policy in turn (the configured one is put back after),
    shown side by side with what it says (claims); returned for 03's results. `mixed`: the
    mixed sweep just run with the configured policy, its point at that load a second run of
    that policy (`experiments.policy_sides`)."""
    w = cfg.workload
    if not w.mixed_long_len:
        print("skipped: workload.mixed_long_len is not set (the policies differ only when "
              "requests of different lengths overlap)")
        return None
    one = w.model_copy(update={"repeats": 1})
    points: dict[str, Point] = {}
    try:
        for policy in ("round_robin", "least_outstanding"):
            session.swap_front_door(served, "lab", policy=policy)
            print(f"{policy}: the mixed workload at concurrency {max(w.concurrency)}", flush=True)
            points[policy] = run_sweep(cfg, served, mixed=True, workload=one,
                                       run=f"policy {policy}").combined[0]
    finally:
        session.swap_front_door(served, "lab", policy=cfg.topology.replicated.policy)
    configured = cfg.topology.replicated.policy
    sides = policy_sides(points, mixed, configured)
    display(side_by_side({name: p for name, (_, p) in sides.items()}))
    if sides[configured][0] != f"policy {configured}":
        print(f"{configured}: its row pools its own run and the mixed sweep's point at the same "
              "load (one configuration measured more than once: their range is what it moved by)")
    say(cfg, "03:policies", policy_claims(points, "03", mixed, configured))
    return Policies(runs=points)


def side_by_side(points: dict[str, Point]):
    """Two runs of one load point (name -> its Point), one row each: the headline metrics,
    validity, the prefix-cache hit share, and a last row naming the better one per metric
    by the lab's one rule (`points.compare_points`): none ("=") when they do not differ or
    their hit shares differ, none ("invalid") when either run is invalid."""
    (na, a), (nb, b) = points.items()
    rows: list[dict] = [{"run": name, "valid": p.valid, "cache hits %": p.prefix_cache_hit_pct,
                         **{m.heading: rounded(p.median(m)) for m in COMPARED}}
                        for name, p in points.items()]
    both = a.valid and b.valid
    rows.append({"run": "better", "valid": None, "cache hits %": None,
                 **{m.heading: ({"a": na, "b": nb}.get(compare_points(a, b, m).better or "", "=")
                                if both else "invalid") for m in COMPARED}})
    for name, p in points.items():
        if not p.valid:
            print(f"INVALID ({name}): {p.invalid_reason}; no winner is named")
    if why := unlike_caches(a.prefix_cache_hit_pct, b.prefix_cache_hit_pct):
        print(f"{na} vs {nb}: {why}")
    return pd.DataFrame(rows).round(2)


def compare_frame(reference: ResultsEnvelope, result: BenchmarkResult, names: tuple[str, str],
                  key: str = "sweep"):
    """Headline metrics of a reference notebook's sweep (or `key`: "mixed") and this one's,
    side by side at each load both measured (`points.metric_rows`, by heading), with the
    margin (the second against the first as a ratio: "1.3x lower"), which is better by the
    lab's one rule ("=" where they do not differ) and whether both runs are valid."""
    theirs: BenchmarkResult | None = getattr(reference.payload, key)
    if theirs is None:
        raise LabError(f"notebook {reference.notebook}'s results have no {key!r} run; re-run it")
    ref = {(c.mode, c.value): c for c in theirs.combined}
    rows = [{"load": c.load, **row, "both valid": bool(r.valid and c.valid)}
            for c in result.combined if (r := ref.get((c.mode, c.value))) is not None
            for row in metric_rows(r, c, names)]
    return pd.DataFrame(rows).round(2)


def versus_reference(cfg: LabConfig, notebook: str, result: BenchmarkResult, key: str = "sweep"):
    """This run's sweep (or `key`: "mixed") beside the reference run's of the same notebook
    (`python -m lab_utils reference`); None when no reference is loaded, saying so and how
    to load one."""
    ref = load_reference_results(cfg, notebook)
    if ref is None or getattr(ref.payload, key, None) is None:
        print(f"No reference run loaded for notebook {notebook}: nothing to set beside yours. "
              "To compare with another run's results: python -m lab_utils reference DIR "
              "--compare-only (DIR: that run's results folder for this profile).")
        return None
    print(f"NOTE: notebook {notebook}'s comparison is with a REFERENCE run's, not this "
          f"cluster's ({reference_origin(ref.reference or {})})")
    return compare_frame(ref, result, ("reference", "yours"), key=key)
