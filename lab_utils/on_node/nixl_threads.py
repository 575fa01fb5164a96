"""NIXL's busy progress threads in a vLLM instance's process group, the lowest normal
priority for them, and the worker's main thread back on its CPUs.

The nixl Python API starts each agent with a progress thread that polls UCX with no
delay between polls (`pthrDelay = 0`, not a setting), and vLLM's NixlConnector always
enables it, so every prefill and decode instance keeps one thread running even when idle.
On a CPU rehearsal that thread takes a core from the engines. The lab gives it nice 19
with the shortest time slice the kernel takes (0.1 ms: `sched_setattr`'s `sched_runtime`
is the slice of a normal thread from Linux 6.12; older kernels ignore it): it then gets
about 1.5% of a busy core, in slices short enough that a KV move it must progress is not
held for long. `SCHED_IDLE` was tried first and is not used: a thread under it gets no
CPU at all while the engines keep both cores busy, so a KV move waited until the decode
had finished every other request (docs/REHEARSAL.md has the measurements).

The thread has no name of its own: it inherits its creator's (`VLLM::Worker` in vLLM's
CPU worker), like the worker's compute threads. So it is found by what it does, in the
process that holds a UCX context (the one with UCX's thread named `async`): a thread
other than the process's main thread that stays runnable (state R) in nearly every sample
over about a second while the instance is idle, used CPU meanwhile, and never went to
sleep of its own accord (its voluntary context switches barely moved). An idle thread
sleeps (S); a busy-polling one is always R, however loaded the machine is, so the test
does not depend on how much CPU it got. A thread that waits between polls (the lab's
progress delay, `kv_transfer.nixl_progress_delay_us`) is also R in most samples when the
cores are busy, but it sleeps about a thousand times a second, so it is not taken.

On CPU profiles the lab sets that delay (lab_utils/on_node/nixl_site), so nothing is
found here and nothing lowered: lowering is the fallback for a thread that still polls.

vLLM's NIXL worker on a CPU also moves the worker's main thread, which runs the model, to
the last core of each NUMA node, whatever VLLM_CPU_OMP_THREADS_BIND says; on one machine
that puts the prefill's and the decode's model on one core. `repin` puts it back on the
instance's bind (docs/REHEARSAL.md has the comparison).

Sent as source to SSH nodes (standard library only): `python - quiet PGID BIND` prints the
record as JSON (BIND the instance's VLLM_CPU_OMP_THREADS_BIND or "-"; with the threads
found before as further arguments, their policy now). The same functions read a fake /proc tree in tests (`root`).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import select
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

MAIN_THREAD = "main (runs the model)"  # how `repin`'s rows name the worker's main thread
UCX_ASYNC_THREAD = "async"  # UCX names its async-event thread so (ucs_pthread_create)
SAMPLES = 20
INTERVAL_S = 0.05
RUNNABLE_SHARE = 0.8  # of the samples in state R
POLICY_NAMES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH",
                5: "SCHED_IDLE", 6: "SCHED_DEADLINE"}
NICE = 19  # the lowest normal priority: a thread at it still gets a share of a busy core
SLICE_NS = 100_000  # the shortest slice Linux accepts for a normal thread (0.1 ms)
# sched_setattr / sched_getattr (not in Python's os module)
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32),
                ("flags", ctypes.c_uint64), ("nice", ctypes.c_int32),
                ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64),
                ("util_min", ctypes.c_uint32), ("util_max", ctypes.c_uint32)]


def _stat(path: Path) -> list[str] | None:
    """The fields of a stat file after "pid (comm)": [state, ppid, pgrp, ...]."""
    try:
        raw = path.read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def _comm(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def group_processes(pgid: int, root: str = "/proc") -> list[int]:
    """The live processes of a process group."""
    return sorted(int(d.name) for d in Path(root).iterdir() if d.name.isdigit()
                  and (f := _stat(d / "stat")) and int(f[2]) == pgid and f[0] not in "ZX")


def threads(pid: int, root: str = "/proc") -> dict[int, str]:
    """tid -> thread name of one process."""
    try:
        tids = [t for t in os.listdir(f"{root}/{pid}/task") if t.isdigit()]
    except OSError:
        return {}
    return {int(t): _comm(Path(f"{root}/{pid}/task/{t}/comm")) for t in tids}


def _voluntary_switches(path: Path) -> int:
    """A thread's voluntary context switches so far (it slept), 0 if not readable."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _sample(pid: int, tids: list[int], root: str) -> dict[int, tuple[str, int, int]]:
    """tid -> (state, utime + stime ticks, voluntary context switches), for the threads
    still there."""
    out = {}
    for tid in tids:
        f = _stat(Path(f"{root}/{pid}/task/{tid}/stat"))
        if f is not None:
            out[tid] = (f[0], int(f[11]) + int(f[12]),
                        _voluntary_switches(Path(f"{root}/{pid}/task/{tid}/status")))
    return out


def spinning(pgid: int, root: str = "/proc", samples: int | None = None,
             interval_s: float = INTERVAL_S) -> list[dict]:
    """The NIXL progress threads of the group that poll without pause: in a process with
    UCX's `async` thread, not its main thread, runnable in at least RUNNABLE_SHARE of
    `samples` taken `interval_s` apart, with CPU time used between the first and the last
    sample, and asleep of its own accord fewer than `samples` times meanwhile (voluntary
    context switches). The last test tells a busy thread, which never sleeps, from a
    thread that waits between polls (a progress delay) and, on a loaded machine, is found
    runnable nearly as often: woken every millisecond, it sleeps about a thousand times
    a second."""
    samples = samples or SAMPLES
    candidates: dict[int, tuple[str, dict[int, str]]] = {}
    for pid in group_processes(pgid, root):
        names = threads(pid, root)
        if UCX_ASYNC_THREAD in names.values():
            candidates[pid] = (_comm(Path(f"{root}/{pid}/comm")), names)
    runnable: dict[tuple[int, int], int] = {}
    first: dict[tuple[int, int], tuple[int, int]] = {}  # (ticks, voluntary switches)
    last: dict[tuple[int, int], tuple[int, int]] = {}
    for i in range(samples):
        for pid, (_, names) in candidates.items():
            others = [t for t in names if t != pid and names[t] != UCX_ASYNC_THREAD]
            for tid, (state, ticks, slept) in _sample(pid, others, root).items():
                runnable[(pid, tid)] = runnable.get((pid, tid), 0) + (state == "R")
                first.setdefault((pid, tid), (ticks, slept))
                last[(pid, tid)] = (ticks, slept)
        if i + 1 < samples:
            time.sleep(interval_s)
    found = []
    for (pid, tid), n in sorted(runnable.items()):
        (t0, s0), (t1, s1) = first[(pid, tid)], last[(pid, tid)]
        if n >= RUNNABLE_SHARE * samples and t1 > t0 and s1 - s0 < samples:
            pname, names = candidates[pid]
            found.append({"pid": pid, "tid": tid, "process": pname, "thread": names[tid]})
    return found


def _syscall(which: int, tid: int, attr: _SchedAttr, *extra: int) -> None:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(f"sched_setattr: no syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[which], tid, ctypes.byref(attr), *extra) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def policy_name(tid: int) -> str:
    """The thread's policy; for a normal one its nice value and slice: "SCHED_OTHER nice 19
    slice 0.1 ms" ("gone" when it no longer exists)."""
    attr = _SchedAttr()
    try:
        _syscall(1, tid, attr, ctypes.sizeof(attr), 0)
    except OSError:
        try:
            return POLICY_NAMES.get(os.sched_getscheduler(tid), "other")
        except OSError:
            return "gone"
    name = POLICY_NAMES.get(attr.policy, "other")
    if attr.policy != 0:
        return name
    return f"{name} nice {attr.nice} slice {attr.runtime / 1e6:g} ms"


def set_policy(tid: int, policy: int = 0, nice: int = 0, slice_ns: int = 0) -> None:
    """One thread's policy, nice value and (normal policy) slice; slice 0: the default."""
    _syscall(0, tid, _SchedAttr(size=ctypes.sizeof(_SchedAttr), policy=policy, nice=nice,
                                runtime=slice_ns), 0)


def lower(tid: int) -> None:
    """Nice 19 with the shortest slice for one thread (nice 19 alone where the kernel
    refuses the call)."""
    try:
        set_policy(tid, nice=NICE, slice_ns=SLICE_NS)
    except OSError:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, NICE)


def _cpus_text(cpus: Iterable[int]) -> str:
    return "CPUs " + ",".join(map(str, sorted(cpus)))


# where a thread may run; module-level so tests on a fake /proc can stand in for them
get_affinity = os.sched_getaffinity
set_affinity = os.sched_setaffinity


def repin(pgid: int, bind: str | None, root: str = "/proc") -> list[dict]:
    """Put the main thread of each process of the group that holds a UCX context (the
    worker, which runs the model) back on the CPUs of its VLLM_CPU_OMP_THREADS_BIND `bind`.
    vLLM's NIXL worker on a CPU moves that thread to the last core of each NUMA node
    whatever the bind says (to keep the KV loads apart from the model, it says); on one
    machine that puts every prefill and decode instance's model on that core. One entry
    per such process: pid, tid (= pid), the CPUs before and now. [] without a bind."""
    cpus = cpu_set(bind)
    if not cpus:
        return []
    out = []
    for pid in group_processes(pgid, root):
        if UCX_ASYNC_THREAD not in threads(pid, root).values():
            continue
        row: dict = {"pid": pid, "tid": pid, "process": _comm(Path(f"{root}/{pid}/comm")),
                     "thread": MAIN_THREAD}
        try:
            before = get_affinity(pid)
            row["before"] = _cpus_text(before)
            if set(before) != cpus:
                set_affinity(pid, cpus)
            row["policy"] = _cpus_text(get_affinity(pid))
        except OSError as e:  # gone meanwhile, or not ours
            row["error"] = str(e)
        out.append(row)
    return out


def quiet(pgid: int, known: Sequence[int] = (), root: str = "/proc",
          bind: str | None = None) -> list[dict]:
    """Give the group's NIXL progress threads nice 19 and the shortest slice; one entry per
    thread found now (pid, tid, process and thread name, policy before and after) and per
    thread of `known` (found before) still in the group, with its policy now. A thread
    already lowered still spins, so it is found again: "before" says so. With `bind`, the
    worker's main thread is also put back on its CPUs (`repin`), one entry more."""
    out = repin(pgid, bind, root)
    for t in spinning(pgid, root):
        before = policy_name(t["tid"])
        try:
            lower(t["tid"])
        except OSError as e:  # gone meanwhile, or not ours
            t["error"] = str(e)
        out.append({**t, "before": before, "policy": policy_name(t["tid"])})
    found = {t["tid"] for t in out}
    live = {tid for pid in group_processes(pgid, root) for tid in threads(pid, root)}
    for tid in known:
        if tid not in found and tid in live:
            out.append({"tid": tid, "policy": policy_name(tid)})
    return out


def busy_only(rows: Iterable[dict]) -> list[dict]:
    """The rows of `quiet` (or a record's `nixl_threads`) that name NIXL threads found busy,
    without the worker main threads `repin` put back."""
    return [r for r in rows if r.get("thread") != MAIN_THREAD]


def cpu_set(bind: str | None) -> set[int] | None:
    """The CPUs of a VLLM_CPU_OMP_THREADS_BIND value ("0", "0-3", "0,2|4-5"); None for
    "auto", "nobind" or nothing."""
    if not bind or bind in ("auto", "nobind"):
        return None
    cpus: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def spin(seconds: float, lowered: bool, cpus: Sequence[set[int] | None],
         yielding: bool = False, wait_s: float = 0.0,
         also_yielding: Sequence[set[int] | None] = ()) -> dict:
    """Busy threads like NIXL's progress threads, for `seconds`: one process per entry of
    `cpus` (its own process, so that they all run at once, as NIXL's do in separate
    instances), each pinned to those CPUs (None: not pinned) and, with `lowered`, given
    the priority the lab gives NIXL's threads. With `yielding`, each calls sched_yield in
    its loop instead, as an idle vLLM worker does for a second after each step; with
    `wait_s`, each waits that long in select() with nothing to wait for, as NIXL's thread
    with a progress delay waits in poll() (`kv_transfer.nixl_progress_delay_us`).
    `also_yielding`: more processes, pinned so, that yield at normal priority whatever
    the others do (the idle workers of other instances on the machine). Returns when all
    have ended: their start and end (wall clock) and the first ones' policy."""
    start = time.time()
    end = time.monotonic() + seconds
    children = []
    for i, pin in enumerate([*cpus, *also_yielding]):
        extra = i >= len(cpus)
        pid = os.fork()
        if pid == 0:  # the child spins and leaves without running anything else
            try:
                if pin:
                    os.sched_setaffinity(0, pin)
                if lowered and not extra:
                    lower(0)
                while time.monotonic() < end:
                    if yielding or extra:
                        os.sched_yield()
                    elif wait_s:
                        select.select([], [], [], wait_s)
            finally:
                os._exit(0)
        children.append(pid)
    time.sleep(min(0.2, seconds / 2))  # each child sets its own priority first
    policy = policy_name(children[0]) if children else "none"
    if wait_s:
        policy += f", waiting {wait_s * 1000:g} ms per poll"
    for pid in children:
        os.waitpid(pid, 0)
    return {"start": start, "end": time.time(), "processes": len(children), "policy": policy,
            "cpus": [sorted(c) if c else None for c in [*cpus, *also_yielding]]}


def main(argv: list[str] | None = None) -> int:
    """Remote entry point: `quiet PGID BIND [KNOWN_TID...]` (BIND "-" for none), or `spin SECONDS LOWERED(0|1)
    BIND...` (BIND a VLLM_CPU_OMP_THREADS_BIND value, "-" for none; `spin-yield` the same
    with yielding loops; `spin-wait WAIT_S SECONDS LOWERED BIND...` with loops that wait;
    after `+yield`, the BINDs of more loops that yield whatever the others do); prints the
    answer as JSON."""
    args = sys.argv[1:] if argv is None else argv
    cmd, rest = args[0], args[1:]
    if cmd == "quiet":
        result: object = quiet(int(rest[0]), [int(t) for t in rest[2:]],
                               bind=None if rest[1] == "-" else rest[1])
    elif cmd in ("spin", "spin-yield", "spin-wait"):
        wait_s = float(rest.pop(0)) if cmd == "spin-wait" else 0.0
        binds = [None if b == "-" else b for b in rest[2:]]
        split = binds.index("+yield") if "+yield" in binds else len(binds)
        result = spin(float(rest[0]), rest[1] == "1", [cpu_set(b) for b in binds[:split]],
                      cmd == "spin-yield", wait_s,
                      [cpu_set(b) for b in binds[split + 1:]])
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
