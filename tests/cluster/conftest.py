"""The loopback sshds the SSH node tests connect to (one per simulated serving node,
started once per session), and this machine's system-wide known_hosts kept out of them."""

from __future__ import annotations

import pytest

from lab_utils.cluster import ssh

from support.ssh_cluster import open_transports
from support.sshd_server import LoopbackSSHD


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
