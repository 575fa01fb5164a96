"""The report's first screen: the verdict (`report.verdict`), the machine the nodes
shared, the banner of a CPU rehearsal (`REHEARSAL_BANNER`), and the system under test
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
from lab_utils.report.data import ARCH_NOTEBOOK, ReportData, graded
from lab_utils.report.forecast import workload_of
from lab_utils.report.plots import roofline_claim
from lab_utils.report.verdict import NAMES, verdict_claim
from lab_utils.results import RESULTS
from lab_utils.results.claims import Claim, claim
from lab_utils.results.experiments import policy_claims, switch_claims

REHEARSAL_BANNER = (
    "CPU REHEARSAL, NOT A DGX SPARK: every number here comes from vLLM's CPU build serving a "
    "tiny model on this one machine, with all instances, the proxy and the load generator "
    "sharing its cores. It shows that the lab runs end to end and how to read its results; "
    "it says nothing about what two Sparks measure: absolute figures, and often which "
    "architecture wins, differ on GPUs joined by RDMA.")

NOT_RECORDED = "not recorded"
# vLLM flags the box leaves out: paths, addresses and names the profile sets per node
_PER_NODE = {"--model", "--served-model-name", "--host", "--port"}


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
                     for c in grade_claims("report", ARCH_NOTEBOOK[arch], arch, rows)]
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
    out, args = [], iter(argv[start:])
    for arg in args:
        if arg in _PER_NODE:
            next(args, None)  # its value
        else:
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
    w = data.sweeps["baseline"].workload
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
        ("workload", workload_of(w).describe() if w else NOT_RECORDED),
        ("date (UTC)", when),
    ]
    return pd.DataFrame(rows, columns=["system under test", "value"])
