"""The report's first screen: one computed sentence that states the verdict
(`verdict_sentence`: which architecture won what, by how much, at which load, and what
it cost), the banner of a CPU rehearsal (`REHEARSAL_BANNER`), and the system under test
(`system_under_test`: hardware, OS and kernel, software versions, the lab's commit, the
model, each role's vLLM flags, the workload and the dates), read from what the results
files recorded; what a file did not record says so.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lab_utils.forecast.band import coverage, coverage_sentence
from lab_utils.forecast.grade import grade_claims
from lab_utils.report.conclusions import Conclusions, shared_machine
from lab_utils.report.data import ARCH_NOTEBOOK, FORECAST_NB, ReportData, graded
from lab_utils.report.forecast import workload_of
from lab_utils.report.plots import roofline_claim
from lab_utils.results import RESULTS
from lab_utils.results.claims import Claim, Comparison, claim, comparison
from lab_utils.results.experiments import policy_claims, switch_claims
from lab_utils.results.points import BY_KEY, MetricKey, Point
from lab_utils.util.numbers import join_words

HEADLINE: tuple[MetricKey, ...] = ("output_throughput", "median_ttft_ms", "p99_itl_ms")  # the verdict's
NAMES = {"baseline": "the single instance", "replicated": "replicated serving",
         "disaggregated": "disaggregated serving", "tensor-parallel": "the model split over the nodes"}

REHEARSAL_BANNER = (
    "CPU REHEARSAL, NOT A DGX SPARK: every number here comes from vLLM's CPU build serving a "
    "tiny model on this one machine, with all instances, the proxy and the load generator "
    "sharing its cores. It shows that the lab runs end to end and how to read its results; "
    "it says nothing about what two Sparks measure: absolute figures, and often which "
    "architecture wins, differ on GPUs joined by RDMA.")

NOT_RECORDED = "not recorded"
# vLLM flags the box leaves out: paths, addresses and names the profile sets per node
_PER_NODE = {"--model", "--served-model-name", "--host", "--port"}


def _best(fs: list[Comparison]) -> tuple[str | None, list[str], list[Comparison]]:
    """At one load point on one metric: the architecture that beats every other measured
    there by the lab's rule, else None; the ones nothing beats (tied at the top); and the
    comparisons that show it."""
    archs = list(dict.fromkeys(n for f in fs for n in (f.subject.name, f.reference.name)))
    for a in archs:
        mine = [f for f in fs if a in (f.subject.name, f.reference.name)]
        if len(mine) == len(archs) - 1 and all(f.winner == a for f in mine):
            return a, [a], mine
    beaten = {n for f in fs if f.winner for n in (f.subject.name, f.reference.name)
              if n != f.winner}
    return None, [a for a in archs if a not in beaten], fs


def _join_loads(loads: list[str]) -> str:
    """"concurrency 1, 2 and 4" from "concurrency 1", "concurrency 2", "concurrency 4"."""
    by_mode: dict[str, list[str]] = {}
    for load in loads:
        mode, _, value = load.partition(" ")
        by_mode.setdefault(mode, []).append(value)
    return " and ".join(f"{mode} {join_words(v)}" for mode, v in by_mode.items())


def names_of(data: ReportData | None) -> dict[str, str]:
    """How the verdict names each architecture: replicated serving with the routing policy
    its sweeps used, since 03 also measured another."""
    rep = data.replicated if data is not None else None
    if rep is None or not rep.policy:
        return NAMES
    return {**NAMES, "replicated": f"{rep.policy.replace('_', '-')} replicated serving"}


def _tail_cost(best: str, key: MetricKey, loads: list[str], mine: list[Comparison],
               names: dict[str, str], used: list[Comparison]) -> str:
    """A median's winner that lost the same metric's 99th percentile there: who beat it on
    the tail (a median can land on the fast side of a two-humped spread)."""
    tail = f"p99_{key.removeprefix('median_')}"
    if not key.startswith("median_") or tail not in BY_KEY:
        return ""
    lost = [f for f in mine if f.metric == tail and f.load in loads and f.winner
            and best in (f.subject.name, f.reference.name) and f.winner != best]
    if not lost:
        return ""
    used += lost
    return (f", though on {BY_KEY[tail].label} "
            f"{join_words(list(dict.fromkeys(names[f.winner or ''] for f in lost)))} beat it")


def _point_of(data: ReportData, arch: str, key: MetricKey, load: str,
              mine: list[Comparison]) -> tuple[str, Point] | None:
    """The run ("sweep" or "mixed") and point a finding of `arch` at `load` on `key` used."""
    f0 = next((f for f in mine if f.metric == key and f.load == load
               and arch in (f.subject.name, f.reference.name)), None)
    if f0 is None:
        return None
    side = f0.subject if f0.subject.name == arch else f0.reference
    runs = (data.sweeps if side.run == "sweep" else data.mixed).get(arch)
    point = next((p for p in (runs.combined if runs else [])
                  if (p.mode, p.value) == (side.mode, side.load)), None)
    return None if point is None else (side.run, point)


def _routed_otherwise(data: ReportData | None, leaders: list[str], key: MetricKey, load: str,
                      mine: list[Comparison], used: list[Comparison]) -> str:
    """Where 03 also ran the replicas with another routing policy at this load (one run of
    the mixed workload): whether that run beat every leader by the rule, or matched the one
    winner, with the values; the verdict's replicated serving is the configured policy's."""
    rep = data.replicated if data is not None else None
    if data is None or rep is None or rep.policies is None:
        return ""
    out = []
    for name, p in rep.policies.runs.items():
        cs = []
        for arch in leaders:
            at = _point_of(data, arch, key, load, mine)
            if (at is None or name == rep.policy or (p.mode, p.value) != (at[1].mode, at[1].value)
                    or p.mixed != at[1].mixed or p.of(key) is None or at[1].of(key) is None):
                break
            cs.append(comparison(key, (f"replicated, {name}", "03", f"policy {name}", p),
                                 (arch, ARCH_NOTEBOOK[arch], at[0], at[1])))
        if len(cs) != len(leaders):
            continue
        routed = f"03's replicas routed {name.replace('_', '-')}"
        if all(c.better == "subject" for c in cs):
            used.extend(cs)
            them = "it" if len(cs) == 1 else "them"
            out.append(f"{routed} beat {them} at {load} in their one run ("
                       + "; ".join(f"{c.values()}, {c.margin()}" for c in cs) + ")")
        elif len(cs) == 1 and cs[0].better is None:
            used.extend(cs)
            out.append(f"{routed} matched it at {load} in their one run ({cs[0].values()}, no "
                       "difference by the lab's rule)")
    return "; ".join(out)


def _runs(arch: str, key: MetricKey, loads: list[str],
          cells: dict[str, list[Comparison]]) -> str:
    """What `arch` measured on `key` at `loads`, as the rule read it: "15.0 ms (14.1-15.9)";
    several loads joined by "/"."""
    m = BY_KEY[key]
    out = []
    for load in loads:
        side = next((c.subject if c.subject.name == arch else c.reference
                     for c in cells.get(load, []) if arch in (c.subject.name, c.reference.name)),
                    None)
        if side is not None:
            v = side.value
            out.append(m.text(v.median) + (f" ({m.text(v.min, unit=False)}-"
                                           f"{m.text(v.max, unit=False)})" if v.ranged else ""))
    return " / ".join(out)


def _metric_verdict(key: MetricKey, cells: dict[str, list[Comparison]], one: bool,
                    used: list[Comparison], mine: list[Comparison] | None = None,
                    data: ReportData | None = None) -> str:
    """"output throughput: the single instance at concurrency 2 and 4 (up to 1.6x higher
    than the next); no single best at concurrency 1 (replicated serving and the single
    instance tie at the top)"; a median's winner that lost the tail says who beat it there,
    and a winner that 03's other routing policy beat says so."""
    m = BY_KEY[key]
    names = names_of(data)
    said: dict[tuple[str | None, tuple[str, ...]], list[tuple[str, float]]] = {}
    for load, fs in cells.items():
        best, leaders, why = _best(fs)
        used += why
        lead = min(f.ratio for f in why) if best else 0.0
        said.setdefault((best, tuple(leaders)), []).append((load, lead))
    bits = []
    for (best, top), where in said.items():
        at = "" if one else f" at {_join_loads([w for w, _ in where])}"
        if best:
            lead = max(r for _, r in where)
            ahead = m.times(lead, 1) if m.higher_is_better else m.times(1, lead)
            loads = [w for w, _ in where]
            routed = [r for w in loads if (r := _routed_otherwise(data, [best], key, w,
                                                                   mine or [], used))]
            bits.append(f"{names[best]}{at} ("
                        + ("" if one or len(where) == 1 else "up to ") + f"{ahead} than the next)"
                        + _tail_cost(best, key, loads, mine or [], names, used)
                        + (f", but {'; '.join(routed)}" if routed else ""))
        else:
            # unbeaten is not tied: a side whose runs spread wide beats nothing and loses to
            # nothing, so each is shown with its runs
            loads = [w for w, _ in where]
            shown = join_words([f"{names[a]} {_runs(a, key, loads, cells)}" for a in top])
            routed = [r for w, _ in where if (r := _routed_otherwise(data, list(top), key, w,
                                                                      mine or [], used))]
            bits.append((f"no single best{at} (beaten by none, by the lab's rule: {shown})"
                         if len(top) > 1 else f"no single best{at}")
                        + (f", but {'; '.join(routed)}" if routed else ""))
    return f"{m.label}: " + "; ".join(bits)


def verdict_claim(concl: Conclusions, data: ReportData | None = None) -> Claim:
    """The report's first sentence: for each workload and headline metric (`HEADLINE`),
    the architecture that was best at each load point by the lab's rule against every other
    one measured there (the single instance included), with its margin over the closest,
    or that none was and which tie at the top; the loads named, a single one said to be
    one. With `data`: replicated serving named with its routing policy, and 03's run with
    the other policy set against the winner where it beat it."""
    if not concl.findings:
        return claim("report", "No verdict: no two architectures were measured at a common "
                     "valid load point (run notebooks 01, 03 and 04).")
    parts: list[str] = []
    used: list[Comparison] = []
    for workload in dict.fromkeys(f.workload for f in concl.findings):
        mine = [f for f in concl.findings if f.workload == workload]
        loads = list(dict.fromkeys(f.load for f in mine))
        one = len(loads) == 1
        per_metric = []
        for key in HEADLINE:
            cells: dict[str, list[Comparison]] = {}
            for f in mine:
                if f.metric == key:
                    cells.setdefault(f.load, []).append(f)
            if cells:
                per_metric.append(_metric_verdict(key, cells, one, used, mine, data))
        name = "Standard workload" if workload == "standard" else f"{workload.capitalize()} workload"
        where = f"{loads[0]} only, one load point" if one else _join_loads(loads)
        parts.append(f"{name} ({where}): " + "; ".join(per_metric))
    names = names_of(data)
    archs = join_words([names[a] for a in dict.fromkeys(
        n for f in concl.findings for n in (f.subject.name, f.reference.name))])
    return claim("report", f"Best of {archs}, each against every other measured at the same "
                 f"load by the lab's rule. {'. '.join(parts)}.", *used)


def verdict_sentence(concl: Conclusions, data: ReportData | None = None) -> str:
    """`verdict_claim`'s sentence."""
    return verdict_claim(concl, data).text


def machine_claim(data: ReportData) -> Claim | None:
    """Where the profile's nodes are one machine: says so, with the cores each
    architecture's sweep used on average (CPU seconds over wall seconds, recorded by the
    notebooks), so that "two nodes" is read as what it was."""
    if not shared_machine(data):
        return None
    used = {arch: r.cpu for arch, r in data.sweeps.items() if r.cpu is not None}
    cores = data.envelopes["01"].hardware.get("cpu_count")
    head = (f"Every node of this profile is the same machine{f' ({cores} cores)' if cores else ''}"
            ": the two-node architectures did not get more hardware than the single instance")
    if not used:
        return claim("report", head + " (the CPU each sweep used was not recorded).")
    shown = "; ".join(f"{NAMES[a]} {c.cores:.1f} of {c.host_cores} "
                      f"({sum(c.by_process.values()):.1f} CPU-s in {c.wall_s:.1f} s)"
                      for a, c in used.items())
    return claim("report", f"{head}. Cores in use on average during each standard sweep "
                 f"(CPU seconds of its processes and the load generator over its wall time): "
                 f"{shown}.", figures={f"{a} cores": c.cores for a, c in used.items()})


def report_claims(data: ReportData, concl: Conclusions) -> list[Claim]:
    """Every sentence of the report's that states a result, as claims: the verdict, the
    machine the nodes shared, the conclusions, each forecast's grade, the roofline."""
    machine = machine_claim(data)
    graded_claims = [c for arch, rows in graded(data).items()
                     for c in grade_claims("report", FORECAST_NB[arch], arch, rows)]
    return [verdict_claim(concl, data), *([machine] if machine else []), *concl.claims,
            *graded_claims, *([together] if (together := together_claim(data)) else []),
            *(c for said in experiment_claims(data).values() for c in said),
            *([roof] if (roof := roofline_claim(data)) else [])]


def experiment_claims(data: ReportData) -> dict[str, list[Claim]]:
    """What each notebook's side experiments said, by notebook: 01's switches, 03's
    routing policies."""
    out: dict[str, list[Claim]] = {}
    if data.baseline is not None and data.baseline.switches is not None:
        out["01"] = switch_claims(data.baseline.switches, "report")
    rep = data.replicated
    if rep is not None and rep.policies is not None:
        out["03"] = policy_claims(rep.policies.runs, "report", rep.mixed, rep.policy)
    return out


def together_claim(data: ReportData) -> Claim | None:
    """How often the measurements of 03 and 04 fell inside their forecasts' intervals."""
    later = [r for arch, rows in graded(data).items() if arch != "baseline" for r in rows]
    if not later:
        return None
    return claim("report", "The forecasts of 03 and 04 together: "
                 + coverage_sentence(coverage(later)) + ".")


# ---- the system under test ---------------------------------------------------------------


def _gb(n: Any) -> str:
    return f"{n / 1e9:.0f} GB" if isinstance(n, (int, float)) else NOT_RECORDED


def _get(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return NOT_RECORDED if v is None or v == "" else str(v)


def _flags(argv: list[str]) -> str:
    """A vLLM command line's flags after the module, without the per-node ones."""
    try:
        start = argv.index("-m") + 2
    except ValueError:
        start = 1
    out, skip = [], False
    for arg in argv[start:]:
        if skip:
            skip = False
            continue
        if arg in _PER_NODE:
            skip = True
            continue
        out.append(arg)
    return " ".join(out)


def _role_flags(data: ReportData) -> list[tuple[str, str]]:
    rows = []
    for arch, nb in ARCH_NOTEBOOK.items():
        payload = data.payload(nb)
        if payload is None:
            continue
        seen: set[str] = set()
        for inst in payload.instances:
            role = inst.role or inst.name
            if inst.kind != "vllm" or role in seen:
                continue
            seen.add(role)
            flags = _flags(inst.argv) if inst.argv else (
                f"{NOT_RECORDED} (results written before the lab recorded command lines)")
            where = RESULTS[nb].notebook_file[:2]  # "tp" is a section of 04
            rows.append((f"vLLM flags: {role} ({arch}, notebook {where})", flags))
    return rows


def _workload(w: dict[str, Any]) -> str:
    return workload_of(w).describe() if w else NOT_RECORDED


def workloads_text(data: ReportData) -> str:
    """The two workloads as 01's sweep recorded them: "standard: ...", and "mixed: ..." where
    a mixed run was measured."""
    w = data.sweeps["baseline"].workload if "baseline" in data.sweeps else {}
    if not w:
        return f"workloads: {NOT_RECORDED}"
    lines = [f"standard workload: {workload_of(w).describe(False)}"]
    if data.mixed:
        lines.append(f"mixed workload: {workload_of(w).describe(True)}")
    return "\n".join(lines)


def _nixl_threads(data: ReportData) -> list[tuple[str, str]]:
    """What the lab did to NIXL's progress threads in notebook 04 (set through the
    environment, so not among the flags), from its config snapshot."""
    env = data.envelopes.get("04")
    if env is None:
        return []
    delay = data.nixl_delay_us
    lowered = (env.config.get("kv_transfer") or {}).get("lower_nixl_threads")
    lowered = data.device == "cpu" if lowered is None else lowered
    text = (f"each waits in poll() up to {math.ceil(delay / 1000)} ms between rounds, set "
            f"by the lab for these runs (kv_transfer.nixl_progress_delay_us = {delay}; as vLLM "
            "starts NIXL, without it, the thread polls without pause)" if delay else
            "poll without pause, as vLLM starts them")
    if lowered:
        text += ("; any found busy lowered to nice 19, and each worker's model thread put back "
                 "on its CPUs (kv_transfer.lower_nixl_threads)")
    return [("NIXL progress threads (prefill, decode)", text)]


def system_under_test(data: ReportData) -> pd.DataFrame:
    """The system under test, two columns (what, value), from the results files: the
    machine and software of the baseline's file (the one every report has), the model
    from its config snapshot, each role's vLLM flags from the instances' command lines,
    the workload of the baseline's sweep, and when the serving notebooks were run."""
    env = data.envelopes["01"]
    hw, sw, cfg = env.hardware, env.software, env.config
    gpu = hw.get("gpu") or "none"
    nodes_gpu = data.environment.gpu_name if data.environment else None
    model = cfg.get("model", {})
    commit = sw.get("lab_commit")
    lab = (f"commit {NOT_RECORDED}" if commit is None else
           f"commit {commit[:12]}" + (", with local modifications (the tree differs from it)"
                                      if sw.get("lab_tree_modified") else ", tree unmodified"))
    # when the runs were measured (their own dates), else when the files were written
    stamps = sorted([p.summary.date for r in (*data.sweeps.values(), *data.mixed.values())
                     for p in r.points if p.summary.date]
                    or [e.timestamp for nb, e in data.envelopes.items()
                        if nb in ARCH_NOTEBOOK.values()])
    when = stamps[0][:16].replace("T", " ") + (
        f" to {stamps[-1][:16].replace('T', ' ')}" if stamps[-1][:16] != stamps[0][:16] else "")
    rows = [
        ("engine", f"vLLM on {data.device}" + (" (the CPU rehearsal)" if data.device == "cpu" else "")),
        ("hardware (where the notebooks ran)",
         f"{_get(hw, 'cpu_model')}, {_get(hw, 'cpu_count')} cores ({_get(hw, 'machine')}), "
         f"{_gb(hw.get('memory_total_bytes'))} memory; GPU: {gpu}; host {_get(hw, 'hostname')}"),
        *([("GPU of the nodes (notebook 00)", nodes_gpu)] if nodes_gpu else []),
        ("OS and kernel", f"{_get(hw, 'os')}; kernel {_get(hw, 'kernel')}"),
        ("software", f"vLLM {_get(sw, 'vllm')}, NIXL {_get(sw, 'nixl')}, torch "
                     f"{_get(sw, 'torch')}, UCX {_get(sw, 'ucx')}, GPU driver "
                     f"{sw.get('gpu_driver') or 'none'}, Python {_get(sw, 'python')}"),
        ("the lab", f"spark-disagg-lab {_get(sw, 'lab_utils')}, {lab}"),
        ("model", f"{model.get('name', NOT_RECORDED)}, dtype {model.get('dtype', NOT_RECORDED)}, "
                  f"revision {model.get('revision') or 'not pinned (as fetched)'}"),
        *_role_flags(data),
        *_nixl_threads(data),
        ("workload", _workload(data.sweeps["baseline"].workload)),
        ("date (UTC)", when),
    ]
    return pd.DataFrame(rows, columns=["system under test", "value"])
