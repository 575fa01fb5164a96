"""What only the local node does: its detached processes stay in the caller's session
(see `LocalNode._spawn`: Linux's autogroup scheduling). What every node does is the node
contract (test_node_contract.py)."""

from __future__ import annotations

import os
import sys

import pytest

from lab_utils.cluster import Cluster, LocalNode
from lab_utils.on_node import proctools


@pytest.fixture
def cluster(test_cfg):
    with Cluster(test_cfg) as c:
        yield c


@pytest.fixture
def node(cluster) -> LocalNode:
    n = cluster.node("spark-01")
    assert isinstance(n, LocalNode)
    return n


def test_detached_process_stays_in_the_callers_session(node, tmp_path):
    rec = node.start_detached("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                              log_path=str(tmp_path / "s.log"))
    try:
        # its own group, the caller's session (and so the caller's autogroup: see _spawn)
        assert os.getpgid(rec.pid) == rec.pid != os.getpgid(0)
        assert os.getsid(rec.pid) == os.getsid(0)
    finally:
        assert node.stop(rec, grace_s=1.0) is True
    assert proctools.group_members(rec.pgid) == []
