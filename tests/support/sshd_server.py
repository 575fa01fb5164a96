"""A private OpenSSH server on a loopback address for tests of the SSH node layer.

`LoopbackSSHD` creates, in a test's temporary directory, its own ed25519 host key, an
ed25519 client key pair for the current user, an ``authorized_keys`` file and an
``sshd_config`` that accepts only that key for only that user; it then runs
``/usr/sbin/sshd -D -e`` on a free loopback port in a new session, logging to
``sshd.log``. It never touches the system sshd or its configuration. It can hand out the
known_hosts entry and an ssh_config ``Host`` block, rotate its host key (to simulate a
changed server), and stop: TERM then KILL of our sshd and of every process it forked,
found by walking its process tree (sshd puts each connection in a session of its own,
so the process group alone does not reach them) and by its process group.
"""

from __future__ import annotations

import contextlib
import getpass
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab_utils.on_node.proctools import all_pids, group_members, proc_stat

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
READY_MARKER = "Server listening on"

# Run as `python -I -S -c EXEC_AS_SUBREAPER /usr/sbin/sshd ...`: mark the process a child
# subreaper (prctl PR_SET_CHILD_SUBREAPER = 36; kept across execve), then become sshd with
# the same PID. Processes orphaned below sshd (e.g. something a remote command left
# running in the background) are then re-parented to our sshd instead of PID 1, so stop()
# still finds them in sshd's process tree, and sshd reaps them.
EXEC_AS_SUBREAPER = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

_sshd_version: tuple[int, int] | None = None


class SSHDError(RuntimeError):
    """sshd could not be configured or started; the message carries its output."""


def sshd_version() -> tuple[int, int]:
    """(major, minor) of the installed OpenSSH server, e.g. (9, 2); (0, 0) if unknown."""
    global _sshd_version
    if _sshd_version is None:
        out = subprocess.run([SSHD, "-V"], capture_output=True, text=True, check=False)
        m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
        _sshd_version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return _sshd_version


def _free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)  # ssh-keygen would otherwise ask whether to overwrite
    subprocess.run(
        [SSH_KEYGEN, "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path), "-q"],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )



def _quote(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value


class LoopbackSSHD:
    """A private sshd on `address`:`port` (loopback only), its keys and files in `workdir`.

    Keys and config are made by the constructor; `start()` (or entering the context
    manager) runs sshd, `stop()` (or leaving it) ends it and everything it forked.
    """

    def __init__(self, workdir: Path, address: str = "127.0.0.1", port: int | None = None,
                 netns: str | None = None, client_key: Path | None = None,
                 home: Path | None = None):
        """With `netns`, sshd runs inside that network namespace (made by the caller) and
        may listen on any of its addresses; `port` is then required. `client_key` shares
        one client key pair between servers (a user with one key for the whole cluster);
        by default each server makes its own. `home` is the sessions' $HOME (sshd's
        SetEnv) instead of the user's real one."""
        if netns is None and not ipaddress.ip_address(address).is_loopback:
            raise ValueError(f"LoopbackSSHD listens on loopback addresses only, not {address}")
        if netns is not None and port is None:
            raise ValueError("an sshd in a network namespace needs an explicit port")
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._address = address
        self._netns = netns
        self._home = home
        self._port = port if port is not None else _free_port(address)
        self._user = getpass.getuser()
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self._client_key = Path(client_key) if client_key else self.workdir / "client_ed25519"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.config_path = self.workdir / "sshd_config"
        self.pid_file = self.workdir / "sshd.pid"
        self.log_path = self.workdir / "sshd.log"
        self.known_hosts_path = self.workdir / "known_hosts"
        self._proc: subprocess.Popen | None = None
        self._log = None
        self.startup_s: float | None = None  # wall time of the last start()

        _keygen(self.host_key, f"loopback-sshd-host@{address}")
        if client_key is None or not self._client_key.exists():
            _keygen(self._client_key, f"{self._user}@loopback-sshd-client")
        pub = self._client_key.with_name(self._client_key.name + ".pub").read_text()
        self.authorized_keys.write_text(pub)
        self.authorized_keys.chmod(0o600)
        self.config_path.write_text(self._config_text())

    # ---- facts ---------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._address

    @property
    def port(self) -> int:
        return self._port

    @property
    def user(self) -> str:
        return self._user

    @property
    def client_key(self) -> Path:
        """Path of the client's private key (no passphrase)."""
        return self._client_key

    @property
    def pid(self) -> int | None:
        """PID of the running sshd listener (also its process group and session id)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def host_public_key_line(self) -> str:
        """The host key as `ssh-ed25519 AAAA...` (no comment)."""
        fields = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        return f"{fields[0]} {fields[1]}"

    def known_hosts_line(self) -> str:
        """The known_hosts entry, e.g. `[127.0.0.1]:2222 ssh-ed25519 AAAA...`."""
        name = self._address if self._port == 22 else f"[{self._address}]:{self._port}"
        return f"{name} {self.host_public_key_line()}"

    def write_known_hosts(self, path: Path | None = None) -> Path:
        """Write (overwrite) a known_hosts file holding our current host key; default
        `workdir/known_hosts`. Returns the path."""
        path = Path(path) if path is not None else self.known_hosts_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.known_hosts_line() + "\n")
        return path

    def ssh_config_block(self, alias: str, known_hosts: Path | list[Path] | None = None) -> str:
        """A `Host alias` block for an ssh_config file pointing at this server. Without
        `known_hosts`, `workdir/known_hosts` is (re)written with the current host key;
        a list names several files (all are read)."""
        if known_hosts is None:
            known_hosts = self.write_known_hosts()
        files = known_hosts if isinstance(known_hosts, list) else [known_hosts]
        kh = " ".join(_quote(str(f)) for f in files)
        return (
            f"Host {alias}\n"
            f"    HostName {self._address}\n"
            f"    Port {self._port}\n"
            f"    User {self._user}\n"
            f"    IdentityFile {_quote(str(self._client_key))}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {kh}\n"
            f"    StrictHostKeyChecking yes\n"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no sshd log)"

    # ---- lifecycle -----------------------------------------------------------------

    def _config_text(self) -> str:
        lines = [
            "# Private test sshd written by tests/support/sshd_server.py; the system config is not read.",
            f"Port {self._port}",
            f"ListenAddress {self._address}",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            f"AllowUsers {self._user}",
            "Subsystem sftp internal-sftp",
            "LogLevel VERBOSE",
            "UseDNS no",
            "PrintMotd no",
            "# No AcceptEnv line: the client may not pass any environment variable.",
        ]
        if self._home is not None:
            lines.append(f"SetEnv {_quote(f'HOME={self._home}')}")
        if sshd_version() >= (9, 8):
            # Refused host keys and probe connections must not get 127.0.0.1 penalised.
            lines.append("PerSourcePenalties no")
        return "\n".join(lines) + "\n"

    def start(self) -> LoopbackSSHD:
        """Validate the config, run sshd and wait until it accepts on its port."""
        if self.running:
            return self
        t0 = time.monotonic()
        if os.geteuid() == 0:
            # Privilege separation directory: sshd run as root refuses to start without it.
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        check = subprocess.run(
            [SSHD, "-t", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if check.returncode != 0:
            raise SSHDError(
                f"sshd -t rejected {self.config_path} (rc={check.returncode}):\n"
                f"{check.stdout}{check.stderr}"
            )
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        log_start = self.log_path.stat().st_size
        # `ip netns exec` enters the namespace and execs in place: the PID stays ours
        netns = ["ip", "netns", "exec", self._netns] if self._netns else []
        self._proc = subprocess.Popen(
            netns + [sys.executable, "-I", "-S", "-c", EXEC_AS_SUBREAPER]
            + [SSHD, "-D", "-e", "-f", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,
            close_fds=True,
        )
        try:
            self._wait_ready(log_start)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, log_start: int) -> None:
        """Ready = this run logged `Server listening on` and the port accepts a connection
        (so a port held by someone else, which makes sshd exit, is never taken for ours)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        family = socket.AF_INET6 if ":" in self._address else socket.AF_INET
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise SSHDError(f"sshd exited with rc={rc} during startup:\n{self.log_tail()}")
            with open(self.log_path, "rb") as f:
                f.seek(log_start)
                listening = READY_MARKER.encode() in f.read()
            if listening:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(1.0)
                    try:
                        s.connect((self._address, self._port))
                        return
                    except OSError:
                        pass
            time.sleep(0.02)
        raise SSHDError(
            f"sshd did not accept on {self._address}:{self._port} within "
            f"{START_TIMEOUT_S:.0f}s:\n{self.log_tail()}"
        )

    def _freeze_tree(self, root: int) -> list[tuple[int, int]]:
        """SIGSTOP `root` and all its descendants, top-down, so that nothing forks while
        we collect them; returns (pid, starttime) of the stopped descendants."""
        frozen: list[tuple[int, int]] = []
        queue = [root]
        seen = {root}
        while queue:
            parent = queue.pop(0)
            with contextlib.suppress(ProcessLookupError):
                os.kill(parent, signal.SIGSTOP)
            # The process table is read after stopping the parent, so every child it
            # forked is included and it cannot fork another.
            for pid in all_pids():
                st = proc_stat(pid)
                if pid not in seen and st and st.ppid == parent:
                    seen.add(pid)
                    queue.append(pid)
                    frozen.append((pid, st.start_ticks))
        return frozen

    @staticmethod
    def _alive(pid: int, starttime: int) -> bool:
        """The process that had this PID and start time still exists (zombies count)."""
        st = proc_stat(pid)
        return st is not None and st.start_ticks == starttime

    def _kill_descendants(self, root: int, deadline: float) -> None:
        """Freeze `root` (stopped, it forks nothing new) and all its descendants; TERM the
        descendants and let `root` run again so that it reaps them; KILL any left at
        `deadline`. Repeat (bounded) while new ones show up; `root` ends up stopped."""
        for _ in range(10):
            victims = self._freeze_tree(root)
            if not victims:
                return
            for sig in (signal.SIGTERM, signal.SIGCONT):
                for pid, start in victims:
                    if self._alive(pid, start):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, sig)
            with contextlib.suppress(ProcessLookupError):
                os.kill(root, signal.SIGCONT)
            while time.monotonic() < deadline and any(self._alive(*v) for v in victims):
                time.sleep(0.02)
            for pid, start in victims:
                if self._alive(pid, start):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            reaped_by = time.monotonic() + 1.0
            while time.monotonic() < reaped_by and any(self._alive(*v) for v in victims):
                time.sleep(0.02)

    def stop(self) -> None:
        """End our sshd and everything it started: first every descendant (TERM, then
        KILL after STOP_TIMEOUT_S) while sshd, stopped except to reap, is still there
        to collect them; then sshd itself (TERM, wait up to STOP_TIMEOUT_S, KILL); last
        a KILL to its process group in case anything there is left. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            pgid = proc.pid  # start_new_session: sshd leads its own session and group
            if proc.poll() is None:
                self._kill_descendants(proc.pid, time.monotonic() + STOP_TIMEOUT_S)
                # sshd is stopped now; TERM stays pending until CONT, so it cannot
                # accept another connection before acting on it.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                    os.kill(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                proc.wait()
            if group_members(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()
        if self._log is not None:
            self._log.close()
            self._log = None

    def rotate_host_key(self) -> str:
        """Stop sshd, generate a new host key and start again on the same port (a server
        whose host key changed). Returns the new `ssh-ed25519 AAAA...` line."""
        was_running = self.running
        self.stop()
        _keygen(self.host_key, f"loopback-sshd-host@{self._address}")
        if was_running:
            self.start()
        return self.host_public_key_line()

    def __enter__(self) -> LoopbackSSHD:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"LoopbackSSHD({self._user}@{self._address}:{self._port}, {state})"
