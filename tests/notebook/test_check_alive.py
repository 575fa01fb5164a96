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


def test_a_dead_rank_names_itself_and_takes_the_split_model_down(test_cfg, tmp_path):
    import sys

    from lab_utils.cluster import Cluster

    log = tmp_path / "tp-1.log"
    log.write_text("Gloo connectFullMesh failed\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = record("tp-1", gone.pid, str(log))
    dead.start_ticks, dead.url = 1, None
    dead.extra = {"topology": "tensor-parallel", "role": "tp"}
    with Cluster(test_cfg) as cluster:
        rank0 = cluster.node("spark-01").start_detached(
            "tp-0", [sys.executable, "-c", "import time; time.sleep(60)"],
            log_path=str(tmp_path / "tp-0.log"), kind="vllm", url="http://127.0.0.2:1",
            extra={"topology": "tensor-parallel", "role": "tp"})
    with pytest.raises(ProcessFailedError) as e:
        check_alive(test_cfg, Served("tensor-parallel", [rank0, dead]))
    msg = str(e.value)
    assert msg.startswith("tp-1 on spark-01 stopped during the sweep")
    assert "Gloo connectFullMesh failed" in msg and "stopped tp-0 too" in msg
    with Cluster(test_cfg) as cluster:
        assert not cluster.node("spark-01").is_alive(rank0) and cluster.running() == []
