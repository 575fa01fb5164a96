"""The loopback OpenSSH server used by the SSH node tests: paramiko connects to it with
strict host key checking (RejectPolicy) and the generated client key and runs a command;
an unknown host key is refused; a rotated host key is reported as a bad host key; stop()
leaves no sshd process, no member of its process group, no process it started (even
one orphaned in the background), and frees the port.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import paramiko
import pytest

from lab_utils.on_node.proctools import gone, group_members

from support.sshd_server import LoopbackSSHD


def connect(sshd: LoopbackSSHD, known_hosts: Path) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            sshd.host,
            port=sshd.port,
            username=sshd.user,
            key_filename=str(sshd.client_key),
            allow_agent=False,
            look_for_keys=False,
            timeout=10,
            banner_timeout=10,
            auth_timeout=10,
        )
    except BaseException:
        client.close()
        raise
    return client


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, _ = client.exec_command(command, timeout=10)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) != 0


@pytest.fixture
def sshd(tmp_path):
    with LoopbackSSHD(tmp_path / "sshd") as server:
        yield server


def test_connect_with_known_host_and_client_key(sshd, tmp_path):
    assert sshd.host == "127.0.0.1"
    line = sshd.known_hosts_line()
    assert line == f"[127.0.0.1]:{sshd.port} {sshd.host_public_key_line()}"
    assert line.split()[1] == "ssh-ed25519"
    kh = sshd.write_known_hosts(tmp_path / "known_hosts")
    with connect(sshd, kh) as client:
        assert run(client, "echo hello") == (0, "hello\n")
        assert run(client, "id -un")[1].strip() == sshd.user


def test_unknown_host_key_is_refused(sshd, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(sshd, empty)
    assert sshd.running  # a refused client does not hurt the server


def test_rotated_host_key_is_a_bad_host_key(sshd, tmp_path):
    old_kh = sshd.write_known_hosts(tmp_path / "old_known_hosts")
    old_key, port, old_pid = sshd.host_public_key_line(), sshd.port, sshd.pid
    new_key = sshd.rotate_host_key()
    assert new_key != old_key
    assert sshd.port == port and sshd.running and sshd.pid != old_pid
    with pytest.raises(paramiko.BadHostKeyException):
        connect(sshd, old_kh)
    with connect(sshd, sshd.write_known_hosts(tmp_path / "new_known_hosts")) as client:
        assert run(client, "echo hello") == (0, "hello\n")


def test_ssh_config_block(sshd, tmp_path):
    cfg_file = tmp_path / "ssh_config"
    cfg_file.write_text(sshd.ssh_config_block("spark-test") + "\nHost *\n    Port 22\n")
    cfg = paramiko.SSHConfig.from_path(str(cfg_file)).lookup("spark-test")
    assert cfg["hostname"] == sshd.host
    assert int(cfg["port"]) == sshd.port
    assert cfg["user"] == sshd.user
    assert cfg["identityfile"] == [str(sshd.client_key)]
    with connect(sshd, Path(cfg["userknownhostsfile"])) as client:
        assert run(client, "echo hello") == (0, "hello\n")


def test_stop_leaves_nothing_behind(tmp_path):
    sshd = LoopbackSSHD(tmp_path / "sshd").start()
    pid = pgid = sshd.pid
    kh = sshd.write_known_hosts()
    client = connect(sshd, kh)
    try:
        # A process that outlives its command (re-parented to sshd, the subreaper) and
        # a command still running when the server stops.
        status, out = run(client, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
        orphan = int(out)
        _, busy_out, _ = client.exec_command("echo $$; exec sleep 301")
        busy = int(busy_out.readline())
        assert not gone(orphan) and not gone(busy)

        sshd.stop()
    finally:
        client.close()

    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped by us
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not (gone(orphan) and gone(busy)):
        time.sleep(0.05)
    assert gone(orphan) and gone(busy)
    assert group_members(pgid) == []
    assert port_is_free(sshd.host, sshd.port)
    assert not sshd.running
    sshd.stop()  # idempotent


def test_only_loopback_addresses():
    with pytest.raises(ValueError, match="loopback"):
        LoopbackSSHD(Path("/nonexistent"), address="10.0.0.1")


def test_startup_failure_reports_the_log(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = LoopbackSSHD(tmp_path / "sshd", port=port)
        with pytest.raises(RuntimeError, match="exited|did not accept"):
            server.start()
        assert not server.running
