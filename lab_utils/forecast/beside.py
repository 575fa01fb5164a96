"""The CPU term of the P/D forecast: how much slower notebook 01's instance decodes beside
threads like NIXL's progress threads, measured, not assumed.

Every prefill and decode instance runs a NIXL progress thread. As vLLM gets it from the
nixl Python API it polls without pause; with the lab's progress delay
(`kv_transfer.nixl_progress_delay_us`, the CPU rehearsal's default) it waits in poll() up
to that long between rounds. Where these threads share a machine with the decode (the
rehearsal: every instance on one machine; a cluster: the instances placed on the
decode's node), they take CPU from it, and a busy one on a 2-core machine doubles the
decode's time per token or worse. Notebook 01 has no NIXL, so it measures the same
situation with stand-ins: one process per such thread (`nixl_threads spin`), each pinned
to the CPUs vLLM binds that instance to and doing what the profile makes NIXL's thread do
(wait that long in select() each round, or, with no delay, poll without pause at the
priority the lab gives such threads), and a few decode runs of one request alone and then
beside them. Where the prefill instances share the decode's machine (the rehearsal),
one more stand-in per prefill yields in a loop pinned to its CPUs, as its idle worker
does between prompts (the replicated forecast's stand-ins for idle replicas do the same).
The ratio of the medians is the factor the forecast applies to the decode instance's
steps. The stand-ins are loops, not NIXL or vLLM: the factor is a measurement of the
situation, not of them.
"""

from __future__ import annotations

import inspect
import json
import math
import statistics
import threading
import time
from collections.abc import Callable

from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import LabConfig
from lab_utils.forecast.curves import point
from lab_utils.on_node import nixl_threads
from lab_utils.results.forecast import BesideBusy

START_S = 1.0  # the stand-ins' start (a fork each), before the first run beside them


def stand_ins(cfg: LabConfig) -> list[str]:
    """One VLLM_CPU_OMP_THREADS_BIND value ("-": not pinned) per NIXL thread that shares
    the decode's machine in the disaggregated topology."""
    return [_bind(cfg, s) for s in _beside_decode(cfg)]


def _beside_decode(cfg: LabConfig) -> list:
    """The disaggregated topology's instances on the decode's machine (all of them when
    every node is this machine), the decode included."""
    specs = cfg.instances("disaggregated")
    decode = next(s for s in specs if s.role == "decode")
    everything_here = all(n.connection == "local" for n in cfg.nodes.values())
    return [s for s in specs if everything_here or s.node == decode.node]


def _bind(cfg: LabConfig, spec) -> str:
    return (spec.cpu_bind if cfg.vllm.device == "cpu" else None) or "-"


def prefill_stand_ins(cfg: LabConfig) -> list[str]:
    """One bind per prefill instance that shares the decode's machine in the disaggregated
    topology (every one on the rehearsal): between its prompts its worker, idle, keeps
    polling for the next step (`sched_yield` for a second after each), as an idle
    replica's does, so it gets a yielding stand-in like one. [] on a cluster whose
    prefills have nodes of their own."""
    return [_bind(cfg, s) for s in _beside_decode(cfg) if s.role == "prefill"]


def replica_stand_ins(cfg: LabConfig) -> list[str]:
    """One bind per other replica that shares 01's machine in the replicated topology
    (every node is this machine): the replicas' binds less the one 01's instance has
    (else the first). [] on a cluster, where each replica has its own node."""
    if not all(n.connection == "local" for n in cfg.nodes.values()):
        return []
    binds = [_bind(cfg, s) for s in cfg.instances("replicated")]
    own = _bind(cfg, cfg.instances("baseline")[0])
    if binds:
        binds.remove(own if own in binds else binds[0])
    return binds


def measure(cfg: LabConfig, inst: ProcessRecord, run_once: Callable[[], float],
            repeats: int, on_run: Callable[[], object] = lambda: None,
            binds: list[str] | None = None, yielding: bool = False) -> BesideBusy:
    """`run_once()`: one decode run on the instance, its ms per step. `repeats` runs alone,
    then as many beside the stand-ins (`binds`, default NIXL's: `stand_ins`, busy or
    waiting as the profile's progress delay makes NIXL's threads, with a yielding one per
    prefill on the decode's machine, `prefill_stand_ins`; `yielding`: loops that yield,
    like an idle vLLM worker, at normal priority), on `inst`'s node; a run outside the
    stand-ins' life (the node's clock) is not counted."""
    # P/D's default: NIXL's threads, and the prefills' idle workers beside them
    extra = prefill_stand_ins(cfg) if binds is None and not yielding else []
    binds = stand_ins(cfg) if binds is None else binds
    # NIXL rounds the delay up to whole milliseconds (its poll() timeout)
    wait_s = 0.0 if yielding else math.ceil(cfg.nixl_progress_delay_us() / 1000) / 1000
    # a waiting thread is not busy, so the lab leaves its priority alone
    lowered = cfg.lower_nixl_threads() and not yielding and not wait_s
    t = time.monotonic()
    alone = []
    for _ in range(repeats):
        alone.append(run_once())
        on_run()
    per_run = (time.monotonic() - t) / repeats
    seconds = START_S + 3 * repeats * per_run + 2.0
    answer: dict = {}

    def spin() -> None:
        with Cluster(cfg) as cluster:
            node = cluster.node(inst.node)
            kind = (["spin-yield"] if yielding else
                    ["spin-wait", f"{wait_s:g}"] if wait_s else ["spin"])
            r = node.run([node.python, "-", *kind, f"{seconds:.1f}", "1" if lowered else "0",
                          *binds, *(["+yield", *extra] if extra else [])],
                         input=inspect.getsource(nixl_threads), timeout=seconds + 60)
        answer.update(json.loads(r.stdout) if r.ok else {"error": r.why})

    runner = threading.Thread(target=spin, name="nixl-stand-ins", daemon=True)
    runner.start()
    time.sleep(START_S)
    beside, spans = [], []
    for _ in range(repeats):
        t0 = time.time()
        beside.append(run_once())
        spans.append((t0, time.time()))
        on_run()
    runner.join()
    if "error" in answer:
        return BesideBusy(threads=len(binds) + len(extra), policy="?", binds=binds + extra,
                          alone=point(1, alone), beside=None, ratio=None,
                          why=f"the stand-ins failed: {answer['error']}")
    inside = [ms for ms, (a, b) in zip(beside, spans, strict=True)
              if answer["start"] <= a and b <= answer["end"]]
    ratio = (statistics.median(inside) / statistics.median(alone)
             if inside and statistics.median(alone) > 0 else None)
    policy = answer["policy"] + (", yielding" if yielding else "") + (
        f"; and {len(extra)} yielding, for the prefill's idle worker" if extra else "")
    return BesideBusy(threads=len(binds) + len(extra), policy=policy, binds=binds + extra,
                      alone=point(1, alone), beside=point(1, inside) if inside else None,
                      ratio=round(ratio, 3) if ratio else None,
                      why=None if inside else "no run fell inside the stand-ins' life")
