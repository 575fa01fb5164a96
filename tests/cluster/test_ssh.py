"""What only the SSH node does, against real sshd on loopback: host-key policy,
~/.ssh/config, one connection per node reused until its cluster closes (and reopened when
it drops), the workdir rule, deploy and the model copy. What every node does (run, copy,
quoting, timeouts, detached start and stop, secrets, ports) is the node contract
(test_node_contract.py). Deploy and serve of the disaggregated topology over SSH, with
the proof of transfer, is the simulated cluster's (tests/system/test_simcluster.py). No
connection outlives the tests."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from lab_utils.cluster import Cluster, provision, ssh, tiny_model
from lab_utils.cluster.ssh import SSHNode
from lab_utils.errors import LabError

from support.profiles import write_profile
from support.ssh_cluster import open_transports, ssh_profile
from support.sshd_server import LoopbackSSHD

CANARY = "hf_canary_ssh_7f3a9c"


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
    assert (copied / "config" / "schema.py").read_bytes() == (here / "config" / "schema.py").read_bytes()
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


def test_a_port_that_is_not_ssh_gives_one_line_and_no_paramiko_traceback(sshds, tmp_path, capfd):
    """A node that accepts TCP but is no SSH server: paramiko's own log (two tracebacks)
    reaches no terminal; the lab's error is one line, and its suggested ssh command
    carries the configured port and user."""
    import socket
    import threading

    from lab_utils.checks.software import _ssh_fix, ssh_command

    servers, known = sshds
    data = ssh_profile(tmp_path, servers, known)
    host = data["nodes"]["spark-01"]["ssh"]["host"]
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(4)

    def answer_http():
        for _ in range(4):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=answer_http, daemon=True).start()
    data["nodes"]["spark-01"]["ssh"].update(port=listener.getsockname()[1], user="labuser",
                                            connect_timeout_s=3)
    cfg = write_profile(tmp_path, data)
    script = ("import sys\nfrom lab_utils.cluster import Cluster\nfrom lab_utils.config import load_config\n"
              "from lab_utils.errors import LabError\n"
              "with Cluster(load_config(sys.argv[1])) as c:\n"
              "    try:\n        c.node('spark-01').run(['true'])\n"
              "    except LabError as e:\n        print('LABERROR', e)\n")
    try:  # a process of its own: pytest's log capture would hide what a terminal shows
        p = subprocess.run([sys.executable, "-c", script, str(cfg.source)], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    finally:
        listener.close()
    assert "Traceback" not in p.stderr + p.stdout and "paramiko" not in p.stderr, p.stderr
    error = p.stdout.split("LABERROR ", 1)[1].strip()
    assert error and "\n" not in error
    ssh_cfg = cfg.nodes["spark-01"].ssh
    assert "SSH failed" in error and "protocol banner" in error
    _, fix = _ssh_fix(error, f"labuser@{host}", ssh_command(ssh_cfg))
    assert f"ssh -p {ssh_cfg.port}" in fix and "labuser@" in fix
