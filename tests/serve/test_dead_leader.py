"""A real vLLM instance whose API server dies with SIGKILL: its engine core (and the
process group's other members) would run on, orphaned. The instance is one unit: the
group's leader (`on_node.unit`) stops the rest within the grace period, without anybody
running `status`, and the instance's log says so; `status` then reports it dead.

One dedicated baseline instance (the shared rehearsal instances are stopped first: two
cores), so no other test loses an instance to the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab_utils.cluster import Cluster
from lab_utils.on_node import proctools

from support.profiles import make_profile_data, write_profile

pytestmark = [pytest.mark.slow, pytest.mark.stops_rehearsal]

OWN_PORTS = 4000  # apart from the other tests' profiles (+1000, +2000, +3000)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def test_a_killed_api_server_takes_its_engine_with_it(engine_cfg, tmp_path):
    from lab_utils.serve.launcher import start_instance, wait_ready
    from lab_utils.serve.topology import cleanup

    cleanup(engine_cfg)  # two cores: not beside the shared instances
    data = make_profile_data(str(tmp_path / "results"))
    for role in ("baseline", "replica", "prefill", "decode"):  # ports of its own
        data["vllm"][role]["port"] += OWN_PORTS
        if data["vllm"][role].get("side_channel_port"):
            data["vllm"][role]["side_channel_port"] += OWN_PORTS
    data["proxy"]["port"] += OWN_PORTS
    data["kv_transfer"]["probe_port"] += OWN_PORTS
    cfg = write_profile(tmp_path, data)
    (spec,) = cfg.instances("baseline")
    with Cluster(cfg) as cluster:
        try:
            wait_ready(cluster, [start_instance(cluster, spec)[0]], show_progress=False)
            (rec,) = Cluster(cfg).running()  # the lab's own record: PID, group, start time
            members = proctools.group_members(rec.pgid)
            # the API server (the unit's only child); its engine core (and helpers: a
            # multiprocessing resource tracker), started by it in its process group
            (api,) = proctools.children(rec.pid)
            engine = [p for p in members if p not in (rec.pid, api)]
            assert "openai.api_server" in _cmdline(api), _cmdline(api)
            assert rec.pid in members and engine, {p: _cmdline(p) for p in members}
            assert rec.argv[:3] == _cmdline(api).split()[:3]  # the record keeps vLLM's argv

            os.kill(api, signal.SIGKILL)
            t0 = time.monotonic()
            bound = cfg.vllm.stop_grace_s + 10
            while proctools.group_members(rec.pgid) and time.monotonic() - t0 < bound:
                time.sleep(0.1)
            took = time.monotonic() - t0
            left = proctools.group_members(rec.pgid)
            assert left == [], {q: _cmdline(q) for q in left}
            said = Path(rec.log_path).read_text(errors="replace")
            assert f"main process (pid {api}) was killed by signal 9; stopped the " in said
            print(f"\n[dead leader] the instance's {len(engine)} other process(es) were stopped "
                  f"{took:.1f} s after its API server was killed")

            p = subprocess.run([sys.executable, "-m", "lab_utils", "status", "--config",
                                str(cfg.source)], capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stdout + p.stderr
            line = next(ln for ln in p.stdout.splitlines() if ln.startswith(rec.name))
            assert f"pid {rec.pid}" in line
            assert line.rstrip().endswith("dead"), line
            assert Cluster(cfg).running() == []  # forgotten, with its private TMPDIR
        finally:
            cleanup(cluster)
