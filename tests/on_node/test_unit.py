"""`on_node.unit`, which leads a vLLM instance's process group: when its child (the API
server) ends, for whatever reason, the rest of the group is stopped within the grace
period and the leader exits with the child's status; a TERM to the group (the lab's
stop) ends everything the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lab_utils.on_node.proctools import group_members

# the child starts a helper in the group (as the API server starts its engine core); a
# helper that ignores TERM stands for an engine that will not stop when asked
HELPER = ("import signal, sys, time\n"
          "if sys.argv[1] == 'stubborn':\n"
          "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          "print('helper ready', flush=True)\n"
          "time.sleep(300)\n")
CHILD = ("import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1]])\n"
         "print('ready', flush=True)\n"
         "time.sleep(float(sys.argv[2]))\n"
         "sys.exit(3)\n")


def start(tmp_path, *, stubborn: bool = False, lives_s: float = 300, grace_s: float = 1.0):
    log = tmp_path / "unit.log"
    with open(log, "w") as out:  # the processes keep their own copy of the file
        p = subprocess.Popen([sys.executable, "-m", "lab_utils.on_node.unit", str(grace_s), "--",
                              sys.executable, "-c", CHILD, "stubborn" if stubborn else "meek",
                              str(lives_s), HELPER], stdout=out, stderr=subprocess.STDOUT,
                             process_group=0)
    t_end = time.monotonic() + 30
    while (tmp_path / "unit.log").read_text().count("ready") < 2 and time.monotonic() < t_end:
        time.sleep(0.05)
    t_end = time.monotonic() + 10
    while len(group_members(p.pid)) < 3 and time.monotonic() < t_end:
        time.sleep(0.05)
    assert len(group_members(p.pid)) == 3, group_members(p.pid)  # leader, child, helper
    return p, log


def child_of(leader: int) -> int:
    (child,) = [int(c) for c in Path(f"/proc/{leader}/task/{leader}/children").read_text().split()]
    return child


def test_a_killed_child_takes_the_rest_of_its_group_with_it(tmp_path):
    p, log = start(tmp_path)
    os.kill(child_of(p.pid), signal.SIGKILL)
    assert p.wait(timeout=10) == 128 + signal.SIGKILL
    assert group_members(p.pid) == []
    said = log.read_text()
    assert "was killed by signal 9; stopped the 1 other process(es) of its group" in said, said


def test_a_helper_that_ignores_term_is_killed_after_the_grace(tmp_path):
    p, _ = start(tmp_path, stubborn=True, grace_s=1.0)
    t0 = time.monotonic()
    os.kill(child_of(p.pid), signal.SIGKILL)
    assert p.wait(timeout=15) == 128 + signal.SIGKILL
    assert 1.0 <= time.monotonic() - t0 < 8 and group_members(p.pid) == []


def test_the_child_s_exit_code_is_the_unit_s(tmp_path):
    p, log = start(tmp_path, lives_s=0.5)
    assert p.wait(timeout=15) == 3 and group_members(p.pid) == []
    assert "exited with code 3; stopped the 1 other process(es)" in log.read_text()


def test_term_to_the_group_stops_everything(tmp_path):
    p, _ = start(tmp_path)
    os.killpg(p.pid, signal.SIGTERM)  # what the lab's stop sends first
    assert p.wait(timeout=10) == 128 + signal.SIGTERM
    assert group_members(p.pid) == []


def test_refuses_to_run_outside_a_group_of_its_own():
    r = subprocess.run([sys.executable, "-m", "lab_utils.on_node.unit", "1", "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "must lead its process group" in r.stderr
