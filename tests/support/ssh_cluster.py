"""A lab profile whose serving nodes are reached over SSH through the loopback sshds
(`support.sshd_server`), and the check that no SSH connection is left open."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import paramiko

from support.profiles import PORT_SHIFT, make_profile_data


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
