"""The node contract: what every node does, checked the same way on this machine
(`LocalNode`) and on a node reached over SSH (`SSHNode`, through the loopback sshd):
run a command (exit code, both streams in full, arguments literally, environment and
stdin, a bounded timeout), copy a file, start a process detached in a process group of
its own with a log (0600) and the state file's record (0600), pass it secrets that appear
on no command line, tell whether it is alive (not when its PID was recycled), stop it by
process group (children included, TERM then KILL), give it a private temporary directory
that goes when it stops or dies, and name who holds a port. The SSH node runs on this
machine, so the tests look at its processes and files here.

What only one kind does is in test_nodes.py (local) and test_ssh.py (SSH)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab_utils.cluster import Cluster, LocalNode
from lab_utils.cluster.nodes import Node
from lab_utils.cluster.ssh import SSHNode
from lab_utils.errors import LabError, PortInUseError
from lab_utils.on_node import proctools

from support.profiles import CANARY_API_KEY, write_profile
from support.ssh_cluster import ssh_profile

SECRETS = {"HF_TOKEN": "hf_canary_node_5d21e8", "VLLM_API_KEY": CANARY_API_KEY}
DIGESTS = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in SECRETS.items()}

# A parent that starts a child in its process group, says whether the secrets arrived
# (it prints only their hashes), then both sleep; the child ignores TERM, so that the
# KILL escalation is exercised too.
FAMILY = (
    "import hashlib, os, signal, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(\"child up\", flush=True); time.sleep(600)'])\n"
    "seen = {k: hashlib.sha256(os.environ.get(k, '').encode()).hexdigest() for k in "
    f"{sorted(SECRETS)!r}}}\n"
    f"print('parent up', child.pid, 'token set:', seen == {DIGESTS!r}, flush=True)\n"
    "time.sleep(600)\n"
)


@dataclass
class Place:
    """A node of a fresh cluster, and a directory on it the test may write in."""

    cluster: Cluster
    node: Node
    dir: Path


@pytest.fixture(params=["local", "ssh"])
def place(request, tmp_path):
    """Node spark-01 of the test profile as it is (this machine), or of the same profile
    with its serving nodes reached over SSH (its workdir under tmp_path)."""
    if request.param == "local":
        cfg, kind, where = request.getfixturevalue("test_cfg"), LocalNode, tmp_path
    else:
        servers, known = request.getfixturevalue("sshds")
        cfg = write_profile(tmp_path, ssh_profile(tmp_path, servers, known))
        kind, where = SSHNode, Path(cfg.nodes["spark-01"].workdir)
    with Cluster(cfg) as cluster:
        node = cluster.node("spark-01")
        assert type(node) is kind
        assert node.run(["mkdir", "-p", str(where)]).ok
        yield Place(cluster, node, where)


def wait_for(predicate, timeout=15.0):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_run_returns_code_and_both_streams(place):
    node = place.node
    r = node.run([sys.executable, "-c",
                  "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (r.code, r.stdout.strip(), r.stderr.strip()) == (3, "out", "err")
    assert node.run(["no-such-command-xyz"]).code == 127


def test_run_drains_both_streams(place):
    big = ("import sys; sys.stdout.write('o' * 2_000_000); sys.stderr.write('e' * 2_000_000); "
           "sys.exit(4)")
    r = place.node.run([sys.executable, "-c", big], timeout=60)
    assert (r.code, len(r.stdout), len(r.stderr)) == (4, 2_000_000, 2_000_000)


def test_arguments_arrive_literally(place, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [f"; touch {marker}", "$(id)", "`id`", "a b", "it's", 'say "hi"', "'q\"",
               "line\nbreak", "*"]
    r = place.node.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))",
                        *hostile])
    assert r.ok, r.stderr
    assert json.loads(r.stdout) == hostile
    assert not marker.exists()


def test_run_passes_environment_and_stdin(place):
    r = place.node.run([sys.executable, "-c",
                        "import os, sys; print(os.environ['LAB_TEST_VALUE'], sys.stdin.read())"],
                       env={"LAB_TEST_VALUE": "a b $(id)"}, input="from stdin")
    assert r.ok, r.stderr
    assert r.stdout.strip() == "a b $(id) from stdin"


def test_run_timeout_is_bounded(place):
    t0 = time.monotonic()
    with pytest.raises(LabError, match="timed out"):
        place.node.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - t0 < 5


def test_put_file(place, tmp_path):
    src = tmp_path / "script.sh"
    src.write_text("#!/bin/sh\necho copied\n")
    src.chmod(0o750)
    dest = place.dir / "sub dir" / "script.sh"
    place.node.put_file(src, str(dest))
    assert dest.read_text() == src.read_text()
    assert dest.stat().st_mode & 0o777 == 0o750
    assert place.node.run([str(dest)]).stdout.strip() == "copied"


def test_detached_process_group_stopped_with_children(place):
    node, cluster = place.node, place.cluster
    log = place.dir / "logs" / "family.log"
    rec = node.start_detached("family", [sys.executable, "-c", FAMILY], log_path=str(log),
                              env=SECRETS)
    try:
        assert rec.pgid == rec.pid
        assert os.getpgid(rec.pid) == rec.pid != os.getpgid(0)  # a group of its own
        assert cluster.state.get("family") == rec
        assert log.stat().st_mode & 0o777 == 0o600  # it holds command lines
        assert wait_for(lambda: "child up" in node.log_tail(rec)
                        and "token set" in node.log_tail(rec))
        assert "token set: True" in node.log_tail(rec)  # the secrets arrived...
        assert len(proctools.group_members(rec.pgid)) == 2 and node.is_alive(rec)
        for pid in Path("/proc").iterdir():  # ...but are on no command line on the node
            if pid.name.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = (pid / "cmdline").read_bytes()
                    assert not any(v.encode() in cmdline for v in SECRETS.values()), pid
        for v in SECRETS.values():
            assert v not in log.read_text() and v not in cluster.state.path.read_text()

        t0 = time.monotonic()
        assert node.stop(rec, grace_s=1.0) is True
        assert time.monotonic() - t0 < 10
    finally:
        node.stop(rec, grace_s=1.0)
    assert proctools.group_members(rec.pgid) == []
    assert not node.is_alive(rec)
    assert cluster.state.get("family") is None
    assert node.stop(rec, grace_s=1.0) is False  # already gone: nothing to do


def test_state_and_logs_are_the_owners_only(place, umask):
    """They hold PIDs and command lines: 0600 whatever the umask, also when they existed."""
    node = place.node
    umask(0o022)
    old_log = place.dir / "old.log"
    old_log.write_text("earlier run\n")
    old_log.chmod(0o644)
    for name, log in (("new", place.dir / "logs" / "new.log"), ("old", old_log)):
        rec = node.start_detached(name, [sys.executable, "-c", "print('up', flush=True)"],
                                  log_path=str(log))
        assert wait_for(lambda rec=rec: "up" in node.log_tail(rec))
        assert log.stat().st_mode & 0o777 == 0o600, log
        node.forget(rec)
    assert "earlier run" in old_log.read_text()
    assert place.cluster.state.path.stat().st_mode & 0o777 == 0o600


def test_private_tmp_links_to_the_nodes_inductor_cache_and_only_the_link_goes(place, tmp_path,
                                                                             monkeypatch):
    """`torchinductor_USER` in a private TMPDIR is a link to the one in the node's own
    temporary directory (where Inductor keeps compiled kernels without a private TMPDIR),
    made if missing; removing the private TMPDIR leaves the cache and what is in it."""
    import getpass

    node = place.node
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # this machine's: the local node's TMPDIR
    node_tmpdir = node.run(["sh", "-c", 'printf %s "${TMPDIR:-/tmp}"']).stdout
    cache = Path(node_tmpdir) / f"torchinductor_{getpass.getuser()}"  # Inductor's name
    tmp = Path(node.private_tmp("decode-0"))
    link = tmp / cache.name
    assert sorted(p.name for p in tmp.iterdir()) == [cache.name]
    assert link.is_symlink() and link.resolve() == cache.resolve() and cache.is_dir()
    (link / "kernel.so").write_text("compiled")
    node.remove_private_tmp(str(tmp))
    assert not tmp.exists() and (cache / "kernel.so").read_text() == "compiled"


def test_private_tmp_is_the_process_tempdir_and_goes_when_it_stops(place, tmp_path,
                                                                   monkeypatch):
    node, cluster = place.node, place.cluster
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # this machine's: the local node's TMPDIR
    node_tmpdir = node.run(["sh", "-c", 'printf %s "${TMPDIR:-/tmp}"']).stdout
    tmp = node.private_tmp("prefill-0")  # mktemp -t: the node's TMPDIR, else /tmp
    assert Path(tmp).parent == Path(node_tmpdir)
    assert Path(tmp).name.startswith("spark-lab-prefill-0.")
    code = ("import tempfile, time; f = tempfile.NamedTemporaryFile(delete=False); "
            "print(f.name, flush=True); time.sleep(600)")
    rec = node.start_detached("tmpuser", [sys.executable, "-c", code], env={"TMPDIR": tmp},
                              log_path=str(place.dir / "t.log"), extra={"tmpdir": tmp})
    assert wait_for(lambda: node.log_tail(rec).strip())
    assert Path(node.log_tail(rec).strip()).parent == Path(tmp)  # the process wrote there
    assert node.stop(rec, grace_s=1.0) is True
    assert not Path(tmp).exists()
    # a process that died on its own: its record is dropped when next looked up, and the
    # directory with it (a killed vLLM instance left one behind before)
    tmp = node.private_tmp("decode-0")
    rec = node.start_detached("dies", [sys.executable, "-c", "pass"], env={"TMPDIR": tmp},
                              log_path=str(place.dir / "d.log"), extra={"tmpdir": tmp})
    assert wait_for(lambda: not node.is_alive(rec))
    assert Path(tmp).is_dir() and cluster.alive("dies") is None
    assert not Path(tmp).exists() and node.state.get("dies") is None
    keep = tmp_path / "not-ours"
    keep.mkdir()
    node.remove_private_tmp(str(keep))  # only what private_tmp made is ever removed
    assert keep.is_dir()


def test_recycled_pid_is_not_ours(place):
    node = place.node
    rec = node.start_detached("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                              log_path=str(place.dir / "s.log"))
    try:
        rec.start_ticks += 1  # as if the PID now belonged to another process
        assert not node.is_alive(rec)
        assert node.stop(rec, grace_s=0.5) is False  # proctools.stop_group, on the node
        assert proctools.group_members(rec.pgid)  # untouched
    finally:
        rec.start_ticks -= 1
        node.stop(rec, grace_s=1.0)
    assert proctools.group_members(rec.pgid) == []


def test_a_state_file_others_may_write_is_not_read(place):
    """The state file names processes the lab will stop: one another user owns, or may
    write, is refused (as OpenSSH refuses its own files then), saying what to do."""
    node, cluster = place.node, place.cluster
    ours = node.start_detached("ours", [sys.executable, "-c", "import time; time.sleep(600)"],
                               log_path=str(place.dir / "o.log"))
    state = cluster.state.path
    try:
        state.chmod(0o622)  # writable by others
        with pytest.raises(LabError, match="remove it"):
            cluster.state.records()
        state.chmod(0o600)
        assert [r.name for r in cluster.state.records()] == ["ours"]
    finally:
        state.chmod(0o600)
        assert node.stop(ours, grace_s=1.0) is True


def test_port_holder_is_named(place):
    node = place.node
    me = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()[:160]
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        s.listen()
        port = s.getsockname()[1]
        report = node.port_report("127.0.0.2", port)
        assert not report.free
        assert f"PID {os.getpid()}: {me}" in report.holders  # who, and what it runs
        with pytest.raises(PortInUseError) as e:
            node.ensure_port_free("127.0.0.2", port, "a test service")
        assert f"port {port}" in str(e.value) and "spark-01" in str(e.value)
    assert node.port_report("127.0.0.2", port).free

