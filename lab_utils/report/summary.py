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

from lab_utils.report.conclusions import Conclusions, Finding
from lab_utils.report.data import ARCH_NOTEBOOK, ReportData, join_words
from lab_utils.results import RESULTS
from lab_utils.results.points import BY_KEY

# Which pair the sentence is about: the first of these both measured.
PAIRS = (("disaggregated", "replicated"), ("replicated", "baseline"),
         ("disaggregated", "baseline"))
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


def _ratio(f: Finding) -> float:
    big = max(abs(f.subject_value), abs(f.reference_value))
    small = min(abs(f.subject_value), abs(f.reference_value))
    return big / small if small else float("inf")


def _won(f: Finding, who: str = "") -> str:
    """"ITL p99 at concurrency 4 (2.6x lower: 12 ms vs 31 ms)", `who` before the ratio."""
    m = BY_KEY[f.metric]
    win, lose = ((f.subject_value, f.reference_value) if f.winner == f.subject
                 else (f.reference_value, f.subject_value))
    where = f.load if f.workload == "standard" else f"{f.load} under the {f.workload} workload"
    return f"{m.label} at {where} ({who}{m.times(win, lose)}: {m.text(win)} vs {m.text(lose)})"


def _loads(fs: list[Finding]) -> str:
    """"concurrency 1, 2 and 4" (and "rate 2 and 4 req/s")."""
    parts = []
    for mode, unit in (("concurrency", ""), ("rate", " req/s")):
        values = list(dict.fromkeys(f"{f.value:g}" for f in fs if f.mode == mode))
        if values:
            parts.append(f"{mode} {join_words(values)}{unit}")
    return " and ".join(parts)


def verdict_sentence(concl: Conclusions) -> str:
    """The verdict in one sentence, computed from the findings of every workload for the
    first pair measured (disaggregated vs replicated, else replicated vs baseline, else
    disaggregated vs baseline): the subject's largest win (as a ratio), its largest loss
    (what the win cost), the hardware each used, and how many comparisons showed no
    difference by the lab's rule."""
    for subject, reference in PAIRS:
        found = [f for f in concl.findings if (f.subject, f.reference) == (subject, reference)]
        if found:
            break
    else:
        return ("No verdict: no two architectures were measured at a common valid load point "
                "(run notebooks 01, 03 and 04).")
    a, b = NAMES[subject], NAMES[reference]
    wins = sorted((f for f in found if f.winner == subject), key=_ratio, reverse=True)
    losses = sorted((f for f in found if f.winner == reference), key=_ratio, reverse=True)
    ties = len(found) - len(wins) - len(losses)
    workloads = list(dict.fromkeys(f.workload for f in found))
    every = ("every metric at every load" if len(workloads) == 1
             else f"every metric at every load of the {join_words(workloads)} workloads")
    tally = (f"{len(wins)} won, {len(losses)} lost and {ties} without a difference of the "
             f"{len(found)} comparisons ({every})")
    where = f"; {tally}, measured at {_loads(found)}{HARDWARE[reference]}."
    head = a[0].upper() + a[1:]
    if wins and losses:
        return f"{head} beat {b} on {_won(wins[0])}, at a cost in {_won(losses[0], f'{b} ')}{where}"
    if wins:
        return f"{head} beat {b} on {_won(wins[0])} and lost on nothing{where}"
    if losses:
        return (f"{head} did not beat {b} on any metric at any load; {b} won most on "
                f"{_won(losses[0])}{where}")
    return f"{head} and {b} did not differ on any metric by the lab's rule{where}"


HARDWARE = {"replicated": ", both on the same two nodes",
            "baseline": ", on two nodes against the single instance's one"}


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
    if not w:
        return NOT_RECORDED
    parts = [f"{w['input_len']}-token prompts" if w.get("input_len") else None,
             f"{w['output_len']} output tokens (ignore_eos)" if w.get("output_len") else None,
             f"{w['num_prompts']} requests per point" if w.get("num_prompts") else None,
             f"{w['warmup']} warm-up" if w.get("warmup") is not None else None,
             f"{w['repeats']} repeat{'s' if w['repeats'] != 1 else ''}" if w.get("repeats") else None,
             f"concurrency {', '.join(str(c) for c in w['concurrency'])}"
             if w.get("concurrency") else None,
             f"Poisson rates {', '.join(f'{r:g}' for r in w['request_rates'])} req/s"
             if w.get("request_rates") else None,
             f"mixed run: one {w['mixed_long_len']}-token prompt in every "
             f"{w.get('mixed_long_every')} requests" if w.get("mixed_long_len") else None]
    return "; ".join(p for p in parts if p) or NOT_RECORDED


def _nixl_threads(data: ReportData) -> list[tuple[str, str]]:
    """What the lab did to NIXL's progress threads in notebook 04 (set through the
    environment, so not among the flags), from its config snapshot."""
    env = data.envelopes.get("04")
    if env is None:
        return []
    delay = data.nixl_delay_us
    lowered = (env.config.get("kv_transfer") or {}).get("lower_nixl_threads")
    lowered = data.device == "cpu" if lowered is None else lowered
    text = (f"each waits in poll() up to {math.ceil(delay / 1000)} ms between rounds "
            f"(kv_transfer.nixl_progress_delay_us = {delay}; as vLLM gets it, it polls without "
            "pause)" if delay else "poll without pause, as vLLM gets them")
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
    stamps = sorted(e.timestamp for nb, e in data.envelopes.items() if nb in ARCH_NOTEBOOK.values())
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
