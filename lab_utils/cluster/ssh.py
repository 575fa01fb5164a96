"""Nodes reached over SSH (paramiko), with the same interface as the local node.

Each node keeps one connection to its host, opened on first use and reused for every
command (keep-alive, connect timeout) until `close()`; its cluster closes it. Host keys
are checked against every known_hosts file OpenSSH reads (each entry of
UserKnownHostsFile, then GlobalKnownHostsFile or /etc/ssh/ssh_known_hosts); an unknown key
is accepted only when the config opts in (`accept_new_host_key`, like OpenSSH's
accept-new), and then recorded in the user's file; a changed key is always refused, with
the command that fixes it. The user's `~/.ssh/config` supplies host name, user, port,
identity and known_hosts files. Before anything is written on a node, its workdir is
checked to be a directory of the lab's own (`lab_utils.on_node.dirs`). Commands are passed as argument lists, each
argument quoted; environment variables (secrets included) travel on the channel's stdin
and are exported by a small shell wrapper, so they never appear on a command line.
Process facts (alive, stop by group, port holders) are decided on the node by
`lab_utils.on_node.proctools`, whose source is sent over stdin, so they work before any deploy.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import threading
import time
from pathlib import Path

import paramiko

from lab_utils.cluster.nodes import Node, RunResult
from lab_utils.cluster.state import ProcessRecord, StateFile
from lab_utils.config import NodeConfig, loopback_problems
from lab_utils.errors import LabError
from lab_utils.on_node import dirs, proctools

# paramiko logs its own failures (with tracebacks) on the "paramiko" logger; with no
# handler Python prints them to stderr, before the lab's one-line error. The lab reports
# every SSH failure itself, so paramiko's log reaches no terminal.
_PARAMIKO_LOG = logging.getLogger("paramiko")
_PARAMIKO_LOG.addHandler(logging.NullHandler())
_PARAMIKO_LOG.propagate = False

# Reads NAME=VALUE lines from stdin up to an empty line, exports them, runs the command.
_ENV_THEN_EXEC = 'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done; exec "$@"'
# Same, then starts the command detached in its own session (so its PID is its process
# group), output appended to a log file readable by the user only (it holds command
# lines), and prints the PID.
_ENV_THEN_DETACH = (
    'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done; '
    'cd "${1:-$HOME}" || exit 97; log="$2"; shift 2; mkdir -p "$(dirname "$log")"; '
    '(umask 077 && : >>"$log") && chmod 600 "$log" || exit 96; '
    'setsid "$@" >>"$log" 2>&1 </dev/null & echo "$!"'
)
# Read after the user's files when ~/.ssh/config names no GlobalKnownHostsFile (OpenSSH's
# default); a module constant, so tests point it elsewhere.
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Accept and remember a host key never seen before (changed keys still fail)."""

    def __init__(self, known_hosts: Path):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _files(value: str | None) -> list[str]:
    """The files of a multi-valued ssh_config option (quoted like OpenSSH); none for
    "none". paramiko drops the quotes around a value that is one quoted path, so a value
    naming an existing file is that one file."""
    if value and Path(value).expanduser().is_file():
        return [value]
    files = shlex.split(value or "")
    return [] if [f.lower() for f in files] == ["none"] else files


def _env_lines(env: dict[str, str]) -> str:
    for k, v in env.items():
        if "\n" in v or "\n" in k or "=" in k or not k:
            raise LabError(f"environment variable {k!r}: names without '=' and values "
                           "without newlines only")
    return "".join(f"{k}={v}\n" for k, v in env.items()) + "\n"


class SSHNode(Node):
    """A node reached over SSH; see the module docstring."""

    def __init__(self, name: str, node_cfg: NodeConfig, state: StateFile):
        super().__init__(name, node_cfg, state)
        if node_cfg.ssh is None or not node_cfg.python:
            raise LabError(f"node {name}: an SSH node needs `ssh` and `python` in the config")
        self.ssh = node_cfg.ssh
        self._conn: paramiko.SSHClient | None = None  # this node's one connection
        self._conn_lock = threading.Lock()  # commands may run from several threads
        self._workdir_checked = False

    # ----- connection -----------------------------------------------------------------
    def _resolved(self) -> dict:
        """Host, port, user, key files and known_hosts after ~/.ssh/config."""
        found: dict = {}
        user_cfg = Path("~/.ssh/config").expanduser()
        if user_cfg.exists():
            found = paramiko.SSHConfig.from_path(str(user_cfg)).lookup(self.ssh.host)
        keys = [self.ssh.key_file] if self.ssh.key_file else found.get("identityfile", [])
        user_files = ([self.ssh.known_hosts] if self.ssh.known_hosts
                      else _files(found.get("userknownhostsfile")) or ["~/.ssh/known_hosts"])
        global_files = _files(found.get("globalknownhostsfile")) or list(GLOBAL_KNOWN_HOSTS)
        return {
            "hostname": found.get("hostname", self.ssh.host),
            "port": self.ssh.port if self.ssh.port != 22 else int(found.get("port", 22)),
            "username": self.ssh.user or found.get("user") or os.environ.get("USER", "root"),
            "key_filename": [str(Path(k).expanduser()) for k in keys] or None,
            "known_hosts": Path(user_files[0]).expanduser(),  # where new keys are recorded
            "known_hosts_read": [Path(f).expanduser() for f in user_files + global_files],
        }

    def _client(self) -> paramiko.SSHClient:
        """The node's connection: opened on first use, reopened if it dropped."""
        with self._conn_lock:
            transport = self._conn.get_transport() if self._conn else None
            if transport is None or not transport.is_active():
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self._conn = self._connect()
            assert self._conn is not None
            return self._conn

    def close(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connect(self) -> paramiko.SSHClient:
        r = self._resolved()
        self._check_not_loopback(r["hostname"])
        client = paramiko.SSHClient()
        read = [f for f in r["known_hosts_read"] if f.is_file() and os.access(f, os.R_OK)]
        for f in read:  # in OpenSSH's order: a host's first recorded key of a type counts
            client.get_host_keys().load(str(f))
        client.set_missing_host_key_policy(
            _AcceptNewPolicy(r["known_hosts"]) if self.ssh.accept_new_host_key
            else paramiko.RejectPolicy())
        where = f"{r['username']}@{r['hostname']}:{r['port']}"
        entry = r["hostname"] if r["port"] == 22 else f"[{r['hostname']}]:{r['port']}"
        try:
            try:
                client.connect(r["hostname"], port=r["port"], username=r["username"],
                               key_filename=r["key_filename"], timeout=self.ssh.connect_timeout_s,
                               banner_timeout=self.ssh.connect_timeout_s,
                               auth_timeout=self.ssh.connect_timeout_s,
                               look_for_keys=r["key_filename"] is None, allow_agent=True)
            except BaseException:
                client.close()  # no half-open transport left behind
                raise
        except paramiko.BadHostKeyException:
            holding = ([f for f in read if paramiko.HostKeys(str(f)).lookup(entry)]
                       or [r["known_hosts"]])
            fixes = " and ".join(f"`ssh-keygen -R {shlex.quote(entry)} -f {shlex.quote(str(f))}`"
                                 for f in holding)
            raise LabError(
                f"node {self.name} ({where}): the host key CHANGED since it was recorded in "
                f"{', '.join(map(str, holding))}. If the node was reinstalled, remove the old "
                f"key with {fixes} and connect once with `ssh` to check and record the new "
                "one; otherwise treat it as an attack."
            ) from None
        except paramiko.SSHException as e:
            if "not found in known_hosts" in str(e):
                login = shlex.quote(f"{r['username']}@{r['hostname']}")
                raise LabError(
                    f"node {self.name} ({where}): host key unknown (not in "
                    f"{', '.join(map(str, r['known_hosts_read']))}). Run "
                    f"`ssh -p {r['port']} {login}` once and check the fingerprint, or set "
                    "ssh.accept_new_host_key: true in the config."
                ) from None
            raise LabError(f"node {self.name} ({where}): SSH failed: {e}") from None
        except (TimeoutError, OSError) as e:
            raise LabError(f"node {self.name} ({where}): cannot connect: {e}") from None
        transport = client.get_transport()
        assert transport is not None  # set by a successful connect()
        transport.set_keepalive(15)
        return client

    def _check_not_loopback(self, hostname: str) -> None:
        """The config's loopback rule, for a host name the config could not judge."""
        try:
            address = str(socket.getaddrinfo(hostname, None)[0][4][0])
        except OSError:
            return  # connecting names the problem
        problems = loopback_problems(self.name, self.cfg, address)
        if problems:
            raise LabError(f"{problems[0]} ({self.ssh.host} resolves to {address})")

    # ----- Node interface -------------------------------------------------------------
    def _exec(self, command: str, stdin_text: str, timeout: float) -> RunResult:
        transport = self._client().get_transport()
        assert transport is not None  # _client() reconnects a connection without one
        chan = transport.open_session(timeout=self.ssh.connect_timeout_s)
        try:
            chan.settimeout(0.2)
            chan.exec_command(command)
            chan.sendall(stdin_text.encode())
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                drained = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    drained = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    drained = True
                # sshd may send the exit status before the last of the output: done only
                # once the channel's end of data has arrived too, and nothing is left
                if (chan.exit_status_ready() and (chan.eof_received or chan.closed)
                        and not chan.recv_ready() and not chan.recv_stderr_ready()):
                    break
                if time.monotonic() > deadline:
                    raise LabError(f"command on node {self.name} timed out after {timeout:.0f} s: "
                                   f"{command[:200]}")
                if not drained:
                    time.sleep(0.01)
            return RunResult(chan.recv_exit_status(), out.decode(errors="replace"),
                             err.decode(errors="replace"))
        finally:
            chan.close()

    def run(self, argv, *, timeout=60.0, env=None, input=None) -> RunResult:
        command = "sh -c " + shlex.quote(_ENV_THEN_EXEC) + " sh " + shlex.join(argv)
        return self._exec(command, _env_lines(env or {}) + (input or ""), timeout)

    def check_workdir(self) -> None:
        """Refuse a workdir that is not a directory of the lab's own (see
        `lab_utils.on_node.dirs`), before anything is written on the node."""
        if self._workdir_checked:
            return
        assert self.cfg.workdir, "the config requires a workdir on SSH nodes"
        found = json.loads(self.run_sent(dirs, "workdir", self.cfg.workdir))
        if found["problem"]:
            raise LabError(
                f"nodes.{self.name}.workdir: {self.cfg.workdir!r} is refused: "
                f"{found['problem']}, and the lab writes its code (lab_utils/) and logs "
                "(logs/) into the workdir. Set it to a directory of the lab's own, e.g. "
                f"{json.dumps(found['home'].rstrip('/') + '/spark-disagg-lab')}.")
        self._workdir_checked = True

    def put_file(self, local, remote) -> None:
        self.check_workdir()
        r = self.run(["mkdir", "-p", str(Path(remote).parent)])
        if not r.ok:
            raise LabError(f"node {self.name}: cannot create {Path(remote).parent}: {r.stderr.strip()}")
        with self._client().open_sftp() as sftp:
            sftp.put(str(local), str(remote))
            sftp.chmod(str(remote), os.stat(local).st_mode & 0o777)

    def _spawn(self, argv, env, log_path, cwd):
        self.check_workdir()
        command = ("sh -c " + shlex.quote(_ENV_THEN_DETACH) + " sh "
                   + shlex.join([cwd or self.cfg.workdir or "", log_path, *argv]))
        r = self._exec(command, _env_lines(env), 30)
        if not r.ok or not r.stdout.strip().isdigit():
            raise LabError(f"node {self.name}: could not start {argv[0]}: {r.stderr.strip()}")
        pid = int(r.stdout.strip())
        return pid, int(self.run_sent(proctools, "ticks", str(pid)))

    def is_alive(self, rec: ProcessRecord) -> bool:
        return self.run_sent(proctools, "alive", str(rec.pid), str(rec.start_ticks)) == "true"

    def log_tail(self, rec: ProcessRecord, lines: int = 40) -> str:
        r = self.run(["tail", "-n", str(lines), rec.log_path])
        return r.stdout if r.ok else f"(no log at {rec.log_path} on {self.name})"

    def _stop_group(self, rec: ProcessRecord, grace_s: float) -> bool:
        stopped = self.run_sent(proctools, "stop", str(rec.pgid), str(rec.start_ticks), str(grace_s))
        return stopped == "true"
