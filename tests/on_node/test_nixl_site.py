"""The sitecustomize that sets NIXL's progress-thread delay, against the installed nixl: an
agent made through nixl's own Python API in a process started with the lab's environment
has no thread that keeps a core busy, and one started without it has (which is what the
delay is for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from lab_utils.config import REPO_ROOT
from lab_utils.serve import launcher

pytest.importorskip("nixl._api", reason="nixl is not installed here (CI installs it)")

# makes an agent as vLLM's NixlConnector does, then reports its threads' CPU over 1.5 s
AGENT = """
import json, os, time
from nixl._api import nixl_agent, nixl_agent_config
a = nixl_agent("site-test", nixl_agent_config(backends=["UCX"]))
time.sleep(0.5)
def ticks():
    out = {}
    for t in os.listdir(f"/proc/{os.getpid()}/task"):
        f = open(f"/proc/{os.getpid()}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        out[t] = int(f[11]) + int(f[12])
    return out
t0 = ticks(); time.sleep(1.5); t1 = ticks()
print(json.dumps(max(t1[t] - t0.get(t, 0) for t in t1)))
"""


def busiest_thread_share(env: dict) -> tuple[float, str]:
    r = subprocess.run([sys.executable, "-c", AGENT], capture_output=True, text=True,
                       timeout=120, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]  # nixl logs to stdout too
    return json.loads(last) / os.sysconf("SC_CLK_TCK") / 1.5, r.stderr


def test_the_delay_stops_nixls_progress_thread_from_keeping_a_core_busy():
    site = str(REPO_ROOT / launcher.NIXL_SITE)
    share, log = busiest_thread_share({launcher.NIXL_DELAY_ENV: "1000", "PYTHONPATH": site})
    assert share < 0.2, f"a thread still used {share:.0%} of a core"
    assert "NIXL progress-thread delay 1000 us in nixl" in log
    share, log = busiest_thread_share({"PYTHONPATH": site})  # no delay asked: nixl as is
    assert share > 0.5, f"without the delay the busiest thread used {share:.0%} of a core"
    assert "NIXL progress-thread delay" not in log


def test_the_variable_names_agree():
    text = (REPO_ROOT / launcher.NIXL_SITE / "sitecustomize.py").read_text()
    assert f'ENV = "{launcher.NIXL_DELAY_ENV}"' in text


def test_a_busy_nixl_thread_is_found_and_lowered_when_no_delay_is_set():
    """The fallback: without the delay, the real nixl progress thread is the one thread
    `quiet` finds busy in the agent's process group, and it gets nice 19 (the kernel says)."""
    from lab_utils.on_node import nixl_threads

    agent = AGENT.replace("t0 = ticks(); time.sleep(1.5)", "t0 = ticks(); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, process_group=0)
    try:
        time.sleep(3)  # nixl and UCX loaded, the thread started
        rows = nixl_threads.quiet(p.pid)
        assert len(rows) == 1 and rows[0]["pid"] == p.pid, rows
        assert rows[0]["policy"].startswith("SCHED_OTHER nice 19"), rows
        assert os.getpriority(os.PRIO_PROCESS, rows[0]["tid"]) == 19
    finally:
        os.killpg(p.pid, 9)
        p.wait()
