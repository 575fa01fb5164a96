"""The local node: run, copy, detached start recorded in the state file, is-alive, log
tail, stop by process group (children included), and who holds a port."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from lab_utils.cluster import Cluster, LocalNode
from lab_utils.errors import PortInUseError
from lab_utils.on_node import proctools

# A parent that starts a child in the same process group, then both sleep; TERM is
# ignored by the child so that the KILL escalation is exercised too.
FAMILY = (
    "import os, signal, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"child up\", flush=True); time.sleep(600)'])\n"
    "print('parent up', child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def cluster(test_cfg):
    with Cluster(test_cfg) as c:
        yield c


@pytest.fixture
def node(cluster) -> LocalNode:
    n = cluster.node("spark-01")
    assert isinstance(n, LocalNode)
    return n


def wait_for(predicate, timeout=10.0):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_run_returns_code_and_both_streams(node):
    r = node.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (r.code, r.stdout.strip(), r.stderr.strip()) == (3, "out", "err")
    assert node.run(["no-such-command-xyz"]).code == 127


def test_run_passes_arguments_literally(node, tmp_path):
    hostile = ["; touch " + str(tmp_path / "x"), "$(id)", "a b", "'q\"", "line\nbreak"]
    r = node.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *hostile])
    import json

    assert json.loads(r.stdout) == hostile
    assert not (tmp_path / "x").exists()


def test_put_file(node, tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("payload")
    node.put_file(src, str(tmp_path / "sub" / "b.txt"))
    assert (tmp_path / "sub" / "b.txt").read_text() == "payload"


def test_detached_process_group_stopped_with_children(node, cluster, tmp_path):
    log = str(tmp_path / "family.log")
    rec = node.start_detached("family", [sys.executable, "-c", FAMILY], log_path=log,
                              env={"LAB_TEST_SECRET": "s3cret"})
    assert rec.pgid == rec.pid
    # its own group, the caller's session (and so the caller's autogroup: see _spawn)
    assert os.getpgid(rec.pid) == rec.pid != os.getpgid(0)
    assert os.getsid(rec.pid) == os.getsid(0)
    assert cluster.state.get("family") == rec
    assert wait_for(lambda: "child up" in node.log_tail(rec))
    members = proctools.group_members(rec.pgid)
    assert len(members) == 2 and node.is_alive(rec)
    assert b"s3cret" not in Path(f"/proc/{rec.pid}/cmdline").read_bytes()

    t0 = time.monotonic()
    assert node.stop(rec, grace_s=1.0) is True
    assert time.monotonic() - t0 < 10
    assert proctools.group_members(rec.pgid) == []
    assert not node.is_alive(rec)
    assert cluster.state.get("family") is None
    assert node.stop(rec, grace_s=1.0) is False  # already gone: nothing to do


def test_state_and_logs_are_the_owners_only(node, cluster, tmp_path, umask):
    """They hold PIDs and command lines: 0600 whatever the umask, also when they existed."""
    umask(0o022)
    old_log = tmp_path / "old.log"
    old_log.write_text("earlier run\n")
    old_log.chmod(0o644)
    for name, log in (("new", tmp_path / "logs" / "new.log"), ("old", old_log)):
        rec = node.start_detached(name, [sys.executable, "-c", "print('up', flush=True)"],
                                  log_path=str(log))
        assert wait_for(lambda rec=rec: "up" in node.log_tail(rec))
        assert log.stat().st_mode & 0o777 == 0o600, log
        node.forget(rec)
    assert "earlier run" in old_log.read_text()
    assert cluster.state.path.stat().st_mode & 0o777 == 0o600


def test_private_tmp_is_the_process_tempdir_and_goes_when_it_stops(node, cluster, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # mktemp -t: the node's TMPDIR, else /tmp
    tmp = node.private_tmp("prefill-0")
    assert Path(tmp).parent == tmp_path and Path(tmp).name.startswith("spark-lab-prefill-0.")
    code = ("import tempfile, time; f = tempfile.NamedTemporaryFile(delete=False); "
            "print(f.name, flush=True); time.sleep(600)")
    rec = node.start_detached("tmpuser", [sys.executable, "-c", code], env={"TMPDIR": tmp},
                              log_path=str(tmp_path / "t.log"), extra={"tmpdir": tmp})
    assert wait_for(lambda: node.log_tail(rec).strip())
    assert Path(node.log_tail(rec).strip()).parent == Path(tmp)  # the process wrote there
    assert node.stop(rec, grace_s=1.0) is True
    assert not Path(tmp).exists()
    # a process that died on its own: its record is dropped when next looked up, and the
    # directory with it (a killed vLLM instance left one behind before)
    tmp = node.private_tmp("decode-0")
    rec = node.start_detached("dies", [sys.executable, "-c", "pass"], env={"TMPDIR": tmp},
                              log_path=str(tmp_path / "d.log"), extra={"tmpdir": tmp})
    assert wait_for(lambda: not node.is_alive(rec))
    assert Path(tmp).is_dir() and cluster.alive("dies") is None
    assert not Path(tmp).exists() and node.state.get("dies") is None
    keep = tmp_path / "not-ours"
    keep.mkdir()
    node.remove_private_tmp(str(keep))  # only what private_tmp made is ever removed
    assert keep.is_dir()


def test_recycled_pid_is_not_ours(node, tmp_path):
    rec = node.start_detached("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                              log_path=str(tmp_path / "s.log"))
    try:
        rec.start_ticks += 1  # as if the PID now belonged to another process
        assert not node.is_alive(rec)
        assert proctools.stop_group(rec.pgid, rec.start_ticks, 0.5) is False
        assert proctools.group_members(rec.pgid)  # untouched
    finally:
        rec.start_ticks -= 1
        node.stop(rec, grace_s=1.0)
    assert proctools.group_members(rec.pgid) == []


def test_port_holder_is_named(node):
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        s.listen()
        port = s.getsockname()[1]
        report = node.port_report("127.0.0.2", port)
        assert not report["free"]
        assert any(h.startswith(f"PID {__import__('os').getpid()}:") for h in report["holders"])
        with pytest.raises(PortInUseError) as e:
            node.ensure_port_free("127.0.0.2", port, "a test service")
        assert f"port {port}" in str(e.value) and "spark-01" in str(e.value)
    assert node.port_report("127.0.0.2", port)["free"]
