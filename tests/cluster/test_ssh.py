"""The SSH node against real sshd on loopback: run, copy, detached start and stop, quoting,
host-key policy, ~/.ssh/config, secrets, one connection per node reused until its cluster
closes, deploy and the model copy. No connection outlives the tests. (Deploy and serve of
the disaggregated topology over SSH, with the proof of transfer, is the simulated
cluster's: tests/system/test_simcluster.py.)"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest

from lab_utils.cluster import Cluster, provision, ssh, tiny_model
from lab_utils.cluster.ssh import SSHNode
from lab_utils.errors import LabError
from lab_utils.on_node import proctools

from support.profiles import CANARY_API_KEY, PORT_SHIFT, make_profile_data, write_profile
from support.sshd_server import LoopbackSSHD

CANARY = "hf_canary_ssh_7f3a9c"


@pytest.fixture(scope="session")
def sshds(tmp_path_factory):
    """One sshd per simulated serving node, on that node's loopback address."""
    root = tmp_path_factory.mktemp("sshd")
    servers = {name: LoopbackSSHD(root / name, address=addr).start()
               for name, addr in (("spark-01", "127.0.0.2"), ("spark-02", "127.0.0.3"))}
    known = root / "known_hosts"
    known.write_text("".join(s.known_hosts_line() + "\n" for s in servers.values()))
    yield servers, known
    assert open_transports() == [], "an SSH connection was left open"
    for s in servers.values():
        s.stop()


@pytest.fixture(autouse=True)
def no_system_known_hosts(monkeypatch, tmp_path):
    """This machine's /etc/ssh/ssh_known_hosts plays no part; a test names its own."""
    monkeypatch.setattr(ssh, "GLOBAL_KNOWN_HOSTS", (str(tmp_path / "no-global-known-hosts"),))


def open_transports(wait_s: float = 5.0) -> list:
    """paramiko's transport threads still running (a closed one ends within moments)."""
    t_end = time.monotonic() + wait_s
    while True:
        alive = [t for t in threading.enumerate() if isinstance(t, paramiko.Transport)]
        if not alive or time.monotonic() > t_end:
            return alive
        time.sleep(0.05)


def ssh_profile(root: Path, servers: dict, known: Path, **ssh_overrides) -> dict:
    data = make_profile_data(str(root / "results"))
    data["profile"] = "test-ssh"
    data["model"]["node_path"] = str(root / "node-models" / "tiny-llama")
    for name, server in servers.items():
        node = data["nodes"][name]
        node.update(connection="ssh", python=sys.executable, workdir=str(root / name))
        node["ssh"] = {"host": server.host, "port": server.port, "user": server.user,
                       "key_file": str(server.client_key), "known_hosts": str(known),
                       **ssh_overrides}
    for role in ("baseline", "replica", "prefill", "decode"):  # off the engine tests' ports
        s = data["vllm"][role]
        s["port"] += PORT_SHIFT
        if s.get("side_channel_port"):
            s["side_channel_port"] += PORT_SHIFT
    return data


@pytest.fixture(scope="session")
def ssh_cfg(sshds, tmp_path_factory):
    servers, known = sshds
    root = tmp_path_factory.mktemp("ssh-profile")
    return write_profile(root, ssh_profile(root, servers, known))


@pytest.fixture
def cluster(ssh_cfg):
    with Cluster(ssh_cfg) as c:
        yield c


@pytest.fixture
def node(cluster) -> SSHNode:
    n = cluster.node("spark-01")
    assert isinstance(n, SSHNode)
    return n


@pytest.fixture
def connects(monkeypatch) -> list[str]:
    """The host of every SSH connection opened during the test."""
    opened: list[str] = []
    connect = paramiko.SSHClient.connect

    def counting(self, hostname, *args, **kwargs):
        opened.append(hostname)
        return connect(self, hostname, *args, **kwargs)

    monkeypatch.setattr(paramiko.SSHClient, "connect", counting)
    return opened


def test_one_connection_per_node_reused_until_the_cluster_closes(ssh_cfg, sshds, tmp_path,
                                                                  connects):
    servers, _ = sshds
    with Cluster(ssh_cfg) as cluster:
        one, two = cluster.node("spark-01"), cluster.node("spark-02")
        assert connects == []  # nothing is opened before a node is used
        for _ in range(3):
            assert one.run(["echo", "hi"]).stdout.strip() == "hi"
        src = tmp_path / "f.txt"
        src.write_text("x")
        one.put_file(src, f"{one.cfg.workdir}/f.txt")
        rec = one.start_detached("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                                 log_path=f"{one.cfg.workdir}/sleeper.log")
        assert cluster.alive(rec) == rec and cluster.stop([rec], grace_s=1) == ["sleeper"]
        assert connects == [servers["spark-01"].host]  # every command on one connection
        conn = one._conn
        assert two.run(["true"]).ok and cluster.node("spark-02").run(["true"]).ok
        assert connects == [servers["spark-01"].host, servers["spark-02"].host]
        assert one._conn is conn and len(open_transports(0)) == 2
    assert one._conn is None and two._conn is None
    assert not conn.get_transport()  # closed
    assert open_transports() == []
    assert one.run(["true"]).ok  # used again: a new connection, closed again by close()
    assert len(connects) == 3
    cluster.close()
    assert open_transports() == []


def test_a_dropped_connection_is_reopened(node, connects):
    assert node.run(["true"]).ok
    node._conn.get_transport().close()  # as if the network dropped it
    assert node.run(["echo", "again"]).stdout.strip() == "again"
    assert len(connects) == 2


def test_run_drains_both_streams(node):
    big = "import sys; sys.stdout.write('o' * 2_000_000); sys.stderr.write('e' * 2_000_000); sys.exit(4)"
    r = node.run([sys.executable, "-c", big], timeout=60)
    assert (r.code, len(r.stdout), len(r.stderr)) == (4, 2_000_000, 2_000_000)


def test_hostile_arguments_arrive_literally(node, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [f"; touch {marker}", "$(id)", "`id`", "a b", "it's", 'say "hi"', "line\nbreak", "*"]
    r = node.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *hostile])
    assert r.ok, r.stderr
    assert json.loads(r.stdout) == hostile
    assert not marker.exists()


def test_run_timeout_is_bounded(node):
    t0 = time.monotonic()
    with pytest.raises(LabError, match="timed out"):
        node.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - t0 < 5


def test_copy_file(node, tmp_path):
    src = tmp_path / "script.sh"
    src.write_text("#!/bin/sh\necho copied\n")
    src.chmod(0o750)
    dest = f"{node.cfg.workdir}/sub dir/script.sh"
    node.put_file(src, dest)
    assert Path(dest).read_text() == src.read_text()
    assert Path(dest).stat().st_mode & 0o777 == 0o750
    assert node.run([dest]).stdout.strip() == "copied"


def test_detached_start_and_stop_leave_nothing(node):
    secrets = {"HF_TOKEN": CANARY, "VLLM_API_KEY": CANARY_API_KEY}
    digest = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in secrets.items()}
    code = ("import hashlib, os, subprocess, sys, time\n"  # the program knows only the hashes
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "seen = {k: hashlib.sha256(os.environ.get(k, '').encode()).hexdigest() for k in "
            f"{sorted(secrets)!r}}}\n"
            f"print('token set:', seen == {digest!r}, flush=True)\n"
            "time.sleep(600)\n")
    log = f"{node.cfg.workdir}/logs/family.log"
    rec = node.start_detached("family", [sys.executable, "-c", code], log_path=log,
                              env=secrets)
    try:
        assert rec.pgid == rec.pid and node.state.get("family") == rec
        assert Path(log).stat().st_mode & 0o777 == 0o600  # it holds command lines
        t_end = time.monotonic() + 15
        while "token set" not in node.log_tail(rec) and time.monotonic() < t_end:
            time.sleep(0.1)
        assert "token set: True" in node.log_tail(rec)  # the secret arrived...
        assert node.is_alive(rec) and len(proctools.group_members(rec.pgid)) == 2
        for pid in Path("/proc").iterdir():  # ...but is on no command line on the node
            if pid.name.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = (pid / "cmdline").read_bytes()
                    assert not any(v.encode() in cmdline for v in secrets.values()), pid
        for v in secrets.values():
            assert v not in Path(log).read_text() and v not in node.state.path.read_text()
    finally:
        assert node.stop(rec, grace_s=2) is True
    assert proctools.group_members(rec.pgid) == []
    assert not node.is_alive(rec)


def test_port_holder_reported_over_ssh(node, sshds):
    servers, _ = sshds
    report = node.port_report("127.0.0.2", servers["spark-01"].port)
    assert not report["free"] and any("sshd" in h for h in report["holders"])


def test_unknown_host_key_refused_unless_opted_in(sshds, tmp_path):
    servers, _ = sshds
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cfg = write_profile(tmp_path, ssh_profile(tmp_path, servers, empty))
    with pytest.raises(LabError, match="host key unknown") as e, Cluster(cfg) as cluster:
        cluster.node("spark-01").run(["true"])
    assert "accept_new_host_key" in str(e.value)

    cfg = write_profile(tmp_path, ssh_profile(tmp_path, servers, empty, accept_new_host_key=True))
    with Cluster(cfg) as cluster:
        assert cluster.node("spark-01").run(["echo", "ok"]).stdout.strip() == "ok"
    assert servers["spark-01"].host_public_key_line().split()[1] in empty.read_text()


def test_changed_host_key_refused_with_fix(sshds, tmp_path):
    servers, _ = sshds
    other = LoopbackSSHD(tmp_path / "other", address="127.0.0.2")  # keys only, never started
    s = servers["spark-01"]
    wrong = tmp_path / "known hosts"  # the fix quotes it
    entry = f"[{s.host}]:{s.port}"
    wrong.write_text(f"{entry} {other.host_public_key_line()}\n")
    for accept_new in (False, True):  # opting in to new keys never accepts a changed one
        cfg = write_profile(tmp_path, ssh_profile(tmp_path, servers, wrong,
                                                  accept_new_host_key=accept_new))
        with pytest.raises(LabError, match="CHANGED") as e, Cluster(cfg) as cluster:
            cluster.node("spark-01").run(["true"])
        fix = f"`ssh-keygen -R {shlex.quote(entry)} -f {shlex.quote(str(wrong))}`"
        assert fix in str(e.value)


def test_host_key_known_system_wide_is_accepted(sshds, tmp_path, monkeypatch):
    servers, known = sshds
    s = servers["spark-01"]
    user_file = tmp_path / "known_hosts"
    user_file.write_text("")
    cfg = write_profile(tmp_path, ssh_profile(tmp_path, servers, user_file))
    monkeypatch.setattr(ssh, "GLOBAL_KNOWN_HOSTS", (str(known),))  # /etc/ssh/ssh_known_hosts
    with Cluster(cfg) as cluster:
        assert cluster.node("spark-01").run(["echo", "global"]).stdout.strip() == "global"
    # or the GlobalKnownHostsFile that ~/.ssh/config names
    monkeypatch.setattr(ssh, "GLOBAL_KNOWN_HOSTS", (str(tmp_path / "absent"),))
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Host {s.host}\n    GlobalKnownHostsFile {known}\n")
    monkeypatch.setenv("HOME", str(home))
    with Cluster(cfg) as cluster:
        assert cluster.node("spark-01").run(["echo", "config"]).stdout.strip() == "config"
    assert user_file.read_text() == ""  # nothing needed recording


def test_every_user_known_hosts_file_is_read(sshds, tmp_path, monkeypatch):
    servers, known = sshds
    s = servers["spark-02"]
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("")
    second.write_text("")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(s.ssh_config_block("spark-two", [first, known])
                                          + s.ssh_config_block("spark-new", [first, second]))
    monkeypatch.setenv("HOME", str(home))
    data = ssh_profile(tmp_path, servers, known)
    data["nodes"]["spark-02"]["ssh"] = {"host": "spark-two"}  # its key is in the second file
    with Cluster(write_profile(tmp_path, data)) as cluster:
        assert cluster.node("spark-02").run(["echo", "second"]).stdout.strip() == "second"
    data["nodes"]["spark-02"]["ssh"] = {"host": "spark-new", "accept_new_host_key": True}
    with Cluster(write_profile(tmp_path, data)) as cluster:
        assert cluster.node("spark-02").run(["echo", "new"]).stdout.strip() == "new"
    assert s.host_public_key_line() in first.read_text()  # a new key goes to the user's file
    assert second.read_text() == ""


def test_user_ssh_config_is_honoured(sshds, tmp_path, monkeypatch):
    servers, known = sshds
    s = servers["spark-02"]
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(s.ssh_config_block("spark-two", known_hosts=known))
    monkeypatch.setenv("HOME", str(home))
    data = ssh_profile(tmp_path, servers, known)
    data["nodes"]["spark-02"]["ssh"] = {"host": "spark-two"}  # everything else from ~/.ssh/config
    cfg = write_profile(tmp_path, data)
    with Cluster(cfg) as cluster:
        assert cluster.node("spark-02").run(["echo", "via alias"]).stdout.strip() == "via alias"


def fake_model(root: Path, weights: bytes) -> Path:
    """A directory shaped like a model: config.json, weights, the tiny model's marker."""
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(weights)
    (root / tiny_model.MARKER).write_text("{}")
    return root


def test_model_copy_replaces_only_the_labs_own_directory(sshds, tmp_path, monkeypatch):
    servers, known = sshds
    local = fake_model(tmp_path / "generated", b"lab weights")
    monkeypatch.setattr(tiny_model, "generate", lambda *a, **k: local)  # built on this host
    theirs = tmp_path / "node" / "their-model"
    theirs.mkdir(parents=True)
    (theirs / "config.json").write_text('{"theirs": true}')
    (theirs / "model.safetensors").write_bytes(b"their weights")
    data = ssh_profile(tmp_path, servers, known)
    data["model"]["node_path"] = str(theirs)
    with Cluster(write_profile(tmp_path, data)) as cluster, pytest.raises(LabError) as e:
        provision.ensure_model_on(cluster, "spark-01")
    assert str(theirs) in str(e.value) and "model.node_path" in str(e.value)
    assert "remove that directory yourself" in str(e.value)
    assert (theirs / "model.safetensors").read_bytes() == b"their weights"
    assert sorted(p.name for p in theirs.parent.iterdir()) == ["their-model"]

    ours = tmp_path / "node" / "tiny"
    data["model"]["node_path"] = str(ours)
    cfg = write_profile(tmp_path, data)
    with Cluster(cfg) as cluster:
        want = provision.ensure_model_on(cluster, "spark-01")
        assert want == tiny_model.fingerprint(ours)
        (ours / "stale.bin").write_text("left by an older copy")  # still the lab's: marked
        assert provision.ensure_model_on(cluster, "spark-01") == want
        assert not (ours / "stale.bin").exists()
        staging = Path(f"{ours}.partial")  # someone's, where the copy would be staged
        staging.mkdir()
        (staging / "notes.txt").write_text("mine")
        (ours / "stale.bin").write_text("again")
        with pytest.raises(LabError, match=str(staging)):
            provision.ensure_model_on(cluster, "spark-01")
    assert (staging / "notes.txt").read_text() == "mine" and (ours / "stale.bin").exists()


def test_workdir_that_is_the_home_directory_is_refused(tmp_path):
    home = tmp_path / "home"
    (home / "spark-disagg-lab" / ".venv").mkdir(parents=True)  # docs/CLUSTER.md's layout
    (home / ".bashrc").write_text("# the user's\n")
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    with LoopbackSSHD(tmp_path / "sshd", address="127.0.0.4", home=home) as server:
        known = server.write_known_hosts(tmp_path / "known_hosts")
        data = ssh_profile(tmp_path, {"spark-01": server}, known)
        for workdir in (str(home), f"{home}/"):
            data["nodes"]["spark-01"]["workdir"] = workdir
            cfg = write_profile(tmp_path, data)
            with pytest.raises(LabError) as e:
                provision.deploy(cfg, ["spark-01"])
            msg = str(e.value)
            assert f"nodes.spark-01.workdir: {workdir!r}" in msg and "home directory" in msg
            assert f'"{home}/spark-disagg-lab"' in msg  # the fix
            with Cluster(cfg) as cluster, pytest.raises(LabError, match="workdir"):
                cluster.node("spark-01").start_detached(
                    "x", ["true"], log_path=f"{workdir}/logs/x.log")
            assert cluster.state.records() == []
        assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before

        project = home / "project"  # a lab_utils/ the lab did not deploy is not replaced
        (project / "lab_utils").mkdir(parents=True)
        (project / "lab_utils" / "mine.py").write_text("x = 1\n")
        data["nodes"]["spark-01"]["workdir"] = str(project)
        with pytest.raises(LabError, match="no .deployed"):
            provision.deploy(write_profile(tmp_path, data), ["spark-01"])
        assert os.listdir(project / "lab_utils") == ["mine.py"]

        data["nodes"]["spark-01"]["workdir"] = str(home / "spark-disagg-lab")  # docs/CLUSTER.md's
        assert "deployed" in provision.deploy(write_profile(tmp_path, data), ["spark-01"])[0]
        assert sorted(os.listdir(home / "spark-disagg-lab")) == [".venv", "lab_utils"]
    assert open_transports() == []


def test_deploy_copies_when_stale_and_names_missing_packages(sshds, tmp_path):
    from lab_utils.cluster.provision import code_digest, deploy

    servers, known = sshds
    cfg = write_profile(tmp_path, ssh_profile(tmp_path, servers, known))
    first = deploy(cfg, ["spark-01"])
    assert first[0].startswith("spark-01: deployed lab_utils")
    copied = Path(cfg.nodes["spark-01"].workdir) / "lab_utils"
    here = Path(__file__).parents[2] / "lab_utils"
    assert (copied / "config" / "model.py").read_bytes() == (here / "config" / "model.py").read_bytes()
    assert deploy(cfg, ["spark-01"])[0].startswith("spark-01: up to date")
    (copied / ".deployed").write_text("stale")
    (copied / "gone.py").write_text("a module the package no longer has")  # an older copy's
    assert "deployed" in deploy(cfg, ["spark-01"])[0]
    assert (copied / ".deployed").read_text() == code_digest()
    assert not (copied / "gone.py").exists() and not Path(f"{copied}.partial").exists()

    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    data = ssh_profile(tmp_path, servers, known)
    data["nodes"]["spark-02"]["python"] = str(bare / "bin" / "python")
    cfg = write_profile(tmp_path, data)
    with pytest.raises(LabError) as e:
        deploy(cfg, ["spark-02"])
    msg = str(e.value)
    assert "spark-02 (serving)" in msg and "vllm" in msg and "nixl" in msg
    assert str(bare / "bin" / "python") in msg and "install" in msg
