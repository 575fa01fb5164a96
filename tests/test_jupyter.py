"""`python -m lab_utils jupyter`: JupyterLab on the notebook host's LAN address and
`jupyter.port`, its token in the environment (never on a command line), the URL printed;
the token is required and kept in the pair's token file; Ctrl-C stops it; a taken port is refused with its holder named."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from support.profiles import make_profile_data, write_profile

pytestmark = pytest.mark.slow


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyter_cfg(tmp_path):
    data = make_profile_data(str(tmp_path / "results"))
    data["jupyter"] = {"port": free_port("127.0.0.4"), "token_file": str(tmp_path / "token")}
    return write_profile(tmp_path, data)


def test_jupyter_serves_the_notebooks_with_a_token_and_stops_on_ctrl_c(jupyter_cfg):
    cmd = [sys.executable, "-m", "lab_utils", "jupyter", "--config", str(jupyter_cfg.source)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = ""
        deadline = time.monotonic() + 30
        while "open: " not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        url = re.search(r"open: (\S+)", line).group(1)
        base, token = url.split("/lab?token=")
        assert base == f"http://127.0.0.4:{jupyter_cfg.jupyter.port}"
        # the pair's token, kept in its file (owner only) for the next start and the card
        kept = jupyter_cfg.jupyter_token_path()
        assert kept.read_text().strip() == token and kept.stat().st_mode & 0o777 == 0o600
        status = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"{base}/api/contents/01_Local_Inference_Baseline.ipynb",
                                   params={"token": token, "content": 0}, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert status is not None and status.status_code == 200, status
        assert httpx.get(f"{base}/api/contents", timeout=5).status_code == 403  # no token
        pids = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:  # the token is not on any command line of the session
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert token.encode() not in f.read()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert code is not None


def test_jupyter_refuses_a_taken_port_and_names_the_holder(jupyter_cfg):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.4", jupyter_cfg.jupyter.port))
        s.listen()
        r = subprocess.run([sys.executable, "-m", "lab_utils", "jupyter", "--config",
                            str(jupyter_cfg.source)], capture_output=True, text=True,
                           timeout=60)
    assert r.returncode != 0
    assert f"port {jupyter_cfg.jupyter.port}" in r.stderr + r.stdout
    assert "jupyter.port" in r.stderr + r.stdout
