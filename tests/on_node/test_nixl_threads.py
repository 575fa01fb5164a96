"""Finding NIXL's busy progress threads in an instance's process group, read from a fake
/proc tree: only a thread that keeps running while idle, in the process with UCX's
`async` thread, and not that process's main thread, is chosen."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from lab_utils.on_node import nixl_threads


def _stat(pid: int, comm: str, state: str, pgid: int, ticks: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    fields = [state, "1", str(pgid), str(pgid), "0", "-1", "0", "0", "0", "0", "0",
              str(ticks), "0"] + ["0"] * 40
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


class FakeProc:
    """/proc with processes {pid: (comm, pgid, {tid: (name, state, ticks_per_sample[,
    voluntary_switches_per_sample])})}."""

    def __init__(self, root: Path, procs: dict):
        self.root, self.procs, self.step = root, procs, 0
        self.write()

    def write(self) -> None:
        for pid, (comm, pgid, tasks) in self.procs.items():
            d = self.root / str(pid)
            (d / "task").mkdir(parents=True, exist_ok=True)
            (d / "comm").write_text(comm + "\n")
            (d / "stat").write_text(_stat(pid, comm, "S", pgid, 0))
            for tid, (name, state, rate, *sleeps) in tasks.items():
                t = d / "task" / str(tid)
                t.mkdir(exist_ok=True)
                (t / "comm").write_text(name + "\n")
                (t / "stat").write_text(_stat(tid, name, state, pgid, rate * self.step))
                # voluntary context switches: how often it slept of its own accord
                (t / "status").write_text(f"Name:\t{name}\nvoluntary_ctxt_switches:\t"
                                          f"{(sleeps or [0])[0] * self.step}\n")

    def tick(self, _seconds: float) -> None:
        self.step += 1
        self.write()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    def make(procs):
        proc = FakeProc(tmp_path, procs)
        monkeypatch.setattr(nixl_threads.time, "sleep", proc.tick)
        return proc
    return make


GROUP = 100
WORKER = {  # vLLM's CPU worker: main thread, UCX's async thread, compute threads, NIXL's
    201: ("VLLM::Worker", "R", 3),      # the main thread, busy: not NIXL's
    202: ("async", "S", 0),
    203: ("VLLM::Worker", "R", 2),      # NIXL's progress thread: always runnable, using CPU
    204: ("VLLM::Worker", "S", 0),      # a compute thread, asleep
    205: ("VLLM::Worker", "R", 0),      # runnable but got no CPU in the window
}


def test_the_busy_thread_beside_ucx_is_chosen_by_what_it_does(fake, tmp_path):
    fake({100: ("python", GROUP, {100: ("python", "S", 0)}),
          150: ("VLLM::EngineCor", GROUP, {150: ("VLLM::EngineCor", "R", 5),
                                           151: ("VLLM::EngineCor", "R", 5)}),
          201: ("VLLM::Worker", GROUP, WORKER),
          300: ("other", 999, {300: ("other", "R", 5), 301: ("async", "S", 0),
                               302: ("other", "R", 5)})})
    found = nixl_threads.spinning(GROUP, root=str(tmp_path), samples=5)
    assert found == [{"pid": 201, "tid": 203, "process": "VLLM::Worker", "thread": "VLLM::Worker"}]


def test_a_thread_runnable_in_too_few_samples_is_not_chosen(fake, tmp_path, monkeypatch):
    proc = fake({201: ("VLLM::Worker", GROUP, {201: ("VLLM::Worker", "S", 0),
                                               202: ("async", "S", 0),
                                               203: ("VLLM::Worker", "S", 2)})})
    states = iter(["R", "S", "R", "S"])  # runnable in 2 of 5 samples, using CPU throughout

    def tick(seconds):
        proc.procs[201][2][203] = ("VLLM::Worker", next(states), 2)
        proc.tick(seconds)
    monkeypatch.setattr(nixl_threads.time, "sleep", tick)
    assert nixl_threads.spinning(GROUP, root=str(tmp_path), samples=5) == []


def test_a_thread_that_waits_between_polls_is_not_chosen_on_a_loaded_machine(fake, tmp_path):
    """NIXL's thread with a progress delay, woken every millisecond on a machine whose
    cores are busy: runnable in most samples and using a little CPU, like a lowered busy
    thread, but it sleeps of its own accord about 50 times per 50 ms sample."""
    fake({201: ("VLLM::Worker", GROUP, {201: ("VLLM::Worker", "S", 0), 202: ("async", "S", 0),
                                        203: ("VLLM::Worker", "R", 1, 50),
                                        204: ("VLLM::Worker", "R", 1, 0)})})  # busy, lowered
    found = nixl_threads.spinning(GROUP, root=str(tmp_path), samples=5)
    assert [t["tid"] for t in found] == [204]


def test_no_ucx_no_thread(fake, tmp_path):
    fake({201: ("VLLM::Worker", GROUP, {201: ("VLLM::Worker", "S", 0),
                                        203: ("VLLM::Worker", "R", 2)})})
    assert nixl_threads.spinning(GROUP, root=str(tmp_path), samples=3) == []


def test_quiet_lowers_the_spinning_thread_and_reports_known_threads(fake, tmp_path, monkeypatch):
    fake({201: ("VLLM::Worker", GROUP, {201: ("VLLM::Worker", "S", 0), 202: ("async", "S", 0),
                                        203: ("VLLM::Worker", "R", 2),
                                        207: ("VLLM::Worker", "S", 0)})})
    policy = {203: "SCHED_OTHER nice 0 slice 1.4 ms", 207: "SCHED_OTHER nice 19 slice 0.1 ms"}
    monkeypatch.setattr(nixl_threads, "policy_name", lambda tid: policy[tid])
    monkeypatch.setattr(nixl_threads, "lower",
                        lambda tid: policy.__setitem__(tid, "SCHED_OTHER nice 19 slice 0.1 ms"))
    monkeypatch.setattr(nixl_threads, "SAMPLES", 3)
    rows = nixl_threads.quiet(GROUP, known=[207, 999], root=str(tmp_path))
    assert rows == [{"pid": 201, "tid": 203, "process": "VLLM::Worker", "thread": "VLLM::Worker",
                     "before": "SCHED_OTHER nice 0 slice 1.4 ms",
                     "policy": "SCHED_OTHER nice 19 slice 0.1 ms"},
                    {"tid": 207, "policy": "SCHED_OTHER nice 19 slice 0.1 ms"}]  # 999 is gone


def test_lower_gives_a_real_thread_nice_19_and_the_shortest_slice():
    """On this kernel, read back through the kernel's own files, not the code under test."""
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def spin():
        tid.append(threading.get_native_id())
        ready.set()
        while not stop.is_set():
            pass
    t = threading.Thread(target=spin)
    t.start()
    try:
        ready.wait(5)
        assert nixl_threads.policy_name(tid[0]).startswith("SCHED_OTHER nice 0 slice ")
        nixl_threads.lower(tid[0])
        assert os.getpriority(os.PRIO_PROCESS, tid[0]) == 19
        assert os.sched_getscheduler(tid[0]) == os.SCHED_OTHER
        sched = Path(f"/proc/self/task/{tid[0]}/sched").read_text()
        assert re.search(r"^se\.slice\s*:\s*100000$", sched, re.M), sched
        assert nixl_threads.policy_name(tid[0]) == "SCHED_OTHER nice 19 slice 0.1 ms"
    finally:
        stop.set()
        t.join()
    # join returns when Python is done with the thread; the kernel may still hold it briefly
    deadline = time.monotonic() + 5
    while nixl_threads.policy_name(tid[0]) != "gone" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nixl_threads.policy_name(tid[0]) == "gone"


def test_repin_puts_the_workers_main_thread_back_on_its_bind(fake, tmp_path, monkeypatch):
    # vLLM's NIXL worker moved the main thread to CPU 1; the bind says 0. Only the process
    # with UCX's thread is the worker; the API server (no UCX) is left alone.
    fake({200: ("python", GROUP, {200: ("python", "S", 0)}),
          201: ("VLLM::Worker", GROUP, {201: ("VLLM::Worker", "S", 0), 202: ("async", "S", 0)})})
    cpus = {200: {0, 1}, 201: {1}}
    monkeypatch.setattr(nixl_threads, "get_affinity", lambda pid: set(cpus[pid]))
    monkeypatch.setattr(nixl_threads, "set_affinity", lambda pid, c: cpus.__setitem__(pid, set(c)))
    rows = nixl_threads.repin(GROUP, "0", root=str(tmp_path))
    assert rows == [{"pid": 201, "tid": 201, "process": "VLLM::Worker",
                     "thread": "main (runs the model)", "before": "CPUs 1", "policy": "CPUs 0"}]
    assert cpus == {200: {0, 1}, 201: {0}}
    assert nixl_threads.repin(GROUP, None, root=str(tmp_path)) == []  # no bind: nothing to do


def test_repin_moves_a_real_thread_back():
    """On this machine: a thread moved to one CPU is put back on the bind's CPUs, read
    back through the kernel."""
    have = sorted(os.sched_getaffinity(0))
    if len(have) < 2:
        pytest.skip(f"needs two CPUs to move a thread between; this process may use {have}")
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def idle():
        tid.append(threading.get_native_id())
        os.sched_setaffinity(0, {have[-1]})
        ready.set()
        stop.wait(10)
    t = threading.Thread(target=idle)
    t.start()
    try:
        ready.wait(5)
        assert os.sched_getaffinity(tid[0]) == {have[-1]}
        nixl_threads.set_affinity(tid[0], nixl_threads.cpu_set(str(have[0])))
        assert os.sched_getaffinity(tid[0]) == {have[0]}
    finally:
        stop.set()
        t.join()
