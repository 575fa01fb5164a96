"""A sweep whose requests failed because an instance died says so in one message: the
instance, its node, its log's path and last lines, and what to re-run."""

from __future__ import annotations

import os
import subprocess

import pytest

from lab_utils.cluster.state import ProcessRecord
from lab_utils.errors import ProcessFailedError
from lab_utils.notebook import check_alive
from lab_utils.on_node import proctools
from lab_utils.serve import Served


def record(name: str, pid: int, log: str) -> ProcessRecord:
    return ProcessRecord(name=name, node="spark-01", pid=pid, pgid=pid,
                         start_ticks=proctools.start_ticks(pid) or 1, log_path=log,
                         argv=["x"], kind="vllm", url="http://127.0.0.2:1")


def test_a_dead_instance_is_named_with_its_log_tail(test_cfg, tmp_path):
    log = tmp_path / "prefill-0.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "RuntimeError: engine died\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    me = record("proxy", os.getpid(), str(tmp_path / "proxy.log"))
    dead = record("prefill-0", gone.pid, str(log))
    dead.start_ticks = 1  # whatever now holds the pid, it is not this process
    check_alive(test_cfg, Served("disaggregated", [me]))  # all alive: nothing raised
    with pytest.raises(ProcessFailedError) as e:
        check_alive(test_cfg, Served("disaggregated", [me, dead]))
    msg = str(e.value)
    assert msg.startswith("prefill-0 on spark-01 stopped during the sweep")
    assert str(log) in msg and "RuntimeError: engine died" in msg and "line 20" not in msg
    assert "Re-run the cell that starts the topology" in msg
