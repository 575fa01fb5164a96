"""The cluster object: each node built once, unknown names refused with the known ones,
nodes by role, the processes of the profile (alive, stop in order, running), closing,
and nodes handed in by a test."""

from __future__ import annotations

import sys
import time

import pytest

from lab_utils.cluster import Cluster, LocalNode, Node, as_cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.errors import LabError


def _sleeper(node: Node, name: str, tmp_path, **kw) -> ProcessRecord:
    return node.start_detached(name, [sys.executable, "-c", "import time; time.sleep(60)"],
                               log_path=str(tmp_path / f"{name}.log"), **kw)


def test_a_node_is_built_once_per_name(test_cfg):
    with Cluster(test_cfg) as cluster:
        first = cluster.node("spark-01")
        assert isinstance(first, LocalNode)
        assert cluster.node("spark-01") is first
        assert cluster.node("spark-02") is not first
        assert first.state is cluster.state  # one state file for all of them
        assert [n.name for n in cluster.nodes()] == list(test_cfg.nodes)
        assert cluster.nodes()[0] is first


def test_unknown_node_name_lists_the_known_ones(test_cfg):
    cluster = Cluster(test_cfg)
    with pytest.raises(LabError) as e:
        cluster.node("spark-99")
    msg = str(e.value)
    assert "spark-99" in msg and all(n in msg for n in test_cfg.nodes)


def test_nodes_by_role(test_cfg):
    cluster = Cluster(test_cfg)
    serving = [n for n, c in test_cfg.nodes.items() if "serving" in c.roles]
    assert [n.name for n in cluster.nodes("serving")] == serving
    assert cluster.serving() == cluster.nodes("serving")


class _Fake(LocalNode):
    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_nodes_handed_in_replace_the_profile_s(test_cfg):
    state = Cluster(test_cfg).state
    fake = _Fake("spark-01", test_cfg.nodes["spark-01"], state)
    with Cluster(test_cfg, {"spark-01": fake}) as cluster:
        assert cluster.node("spark-01") is fake
        assert cluster.names() == ["spark-01"]
        with pytest.raises(LabError, match="its nodes: spark-01$"):
            cluster.node("spark-02")  # no real node behind a test's back
    assert fake.closed == 1


def test_as_cluster_closes_only_what_it_built(test_cfg):
    fake = _Fake("spark-01", test_cfg.nodes["spark-01"], Cluster(test_cfg).state)
    given = Cluster(test_cfg, {"spark-01": fake})
    with as_cluster(given) as c:
        assert c is given
    assert fake.closed == 0  # its owner closes it
    with as_cluster(test_cfg) as c:
        assert isinstance(c, Cluster) and c.cfg is test_cfg


def test_alive_stop_and_running(test_cfg, tmp_path):
    with Cluster(test_cfg) as cluster:
        node = cluster.node("spark-01")
        a = _sleeper(node, "a", tmp_path, extra={"topology": "baseline"})
        b = _sleeper(node, "b", tmp_path)
        dead = node.start_detached("dead", [sys.executable, "-c", "pass"],
                                   log_path=str(tmp_path / "dead.log"))
        stranger = ProcessRecord(name="elsewhere", node="not-in-profile", pid=1, pgid=1,
                                 start_ticks=0, log_path="", argv=["x"])
        cluster.state.add(stranger)
        try:
            t_end = time.monotonic() + 10
            while node.is_alive(dead) and time.monotonic() < t_end:
                time.sleep(0.05)
            assert cluster.alive(a) == a and cluster.alive("b") == b
            assert cluster.alive("dead") is None and cluster.state.get("dead") is None  # forgotten
            assert cluster.alive("never-started") is None
            assert cluster.alive(stranger) is None  # not this profile's node: left alone
            assert cluster.state.get("elsewhere") == stranger
            assert [r.name for r in cluster.running("baseline")] == ["a"]
            assert {r.name for r in cluster.running()} == {"a", "b", "elsewhere"}
            assert cluster.stop([b, stranger, a], grace_s=1) == ["b", "a"]  # in order
            assert not node.is_alive(a) and not node.is_alive(b)
            assert cluster.stop([a], grace_s=1) == []
        finally:
            node.stop(a, 1)
            node.stop(b, 1)
            cluster.state.remove("elsewhere")
        assert cluster.running() == []


def test_a_dead_leader_s_orphans_are_stopped_when_it_is_noticed(test_cfg, tmp_path, caplog):
    """A vLLM API server killed with -9 leaves its engine core and workers (same process
    group) running; noticing the dead leader stops them, and says so."""
    from lab_utils.on_node import proctools

    orphan = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])"
    with Cluster(test_cfg) as cluster:
        node = cluster.node("spark-01")
        rec = node.start_detached("leader", [sys.executable, "-c", orphan],
                                  log_path=str(tmp_path / "leader.log"))
        t_end = time.monotonic() + 10
        while (node.is_alive(rec) or len(proctools.group_members(rec.pgid)) != 1) \
                and time.monotonic() < t_end:
            time.sleep(0.05)
        assert not node.is_alive(rec) and len(proctools.group_members(rec.pgid)) == 1
        with caplog.at_level("WARNING", logger="lab_utils.cluster"):
            assert cluster.alive("leader") is None
        assert proctools.group_members(rec.pgid) == []
        assert cluster.state.get("leader") is None
        assert "leader on node spark-01 had died" in caplog.text
