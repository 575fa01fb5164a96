"""Nodes: the one interface the lab uses to act on a machine of the cluster.

A node runs commands (exit code, stdout, stderr, timeout), copies files, starts detached
processes in their own process group with a log file (0600: it holds command lines;
recorded in the profile's state file), tells whether one is alive, shows its log tail, stops it by process group, and
says who holds a port. `LocalNode` implements it for this machine; the SSH node
implements the same methods over paramiko. `Cluster` picks the implementation from
the config and builds each node once.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from lab_utils.cluster.state import ProcessRecord, StateFile
from lab_utils.config import NodeConfig
from lab_utils.errors import LabError, PortInUseError
from lab_utils.on_node import proctools
from lab_utils.on_node.facts import proc_meminfo

UNIT_MODULE = "lab_utils.on_node.unit"  # leads an instance's process group (start_detached)
PRIVATE_TMP_PREFIX = "spark-lab-"  # Node.private_tmp's directories, and only those, are removed
# mktemp -d, then the link to Inductor's cache (named as Inductor names it: the user as
# Python's getpass.getuser() finds it), made first if missing; the directory, or nothing.
_PRIVATE_TMP_SH = (
    'd=$(mktemp -d -t "$1") || exit 1\n'
    'c="${TMPDIR:-/tmp}/torchinductor_${LOGNAME:-${USER:-${LNAME:-${USERNAME:-$(id -un)}}}}"\n'
    'if mkdir -p "$c" && ln -s "$c" "$d/"; then printf %s "$d"; else rm -rf "$d"; exit 1; fi\n')

@dataclass
class RunResult:
    code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def why(self) -> str:
        """The last line of stderr (for a Python traceback, the exception), at most 300
        characters; the exit code when the command printed nothing."""
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        return lines[-1][-300:] if lines else f"exit code {self.code}"


@dataclass(frozen=True)
class PortReport:
    """A port on a node: free, or the processes that hold it ("PID n: command")."""
    free: bool
    holders: list[str]

    def who(self) -> str:
        return "; ".join(self.holders) or "a process this user cannot see"


class Node(ABC):
    """What every node offers. Paths are paths on that node."""

    def __init__(self, name: str, node_cfg: NodeConfig, state: StateFile):
        self.name = name
        self.cfg = node_cfg
        self.state = state
        # The interpreter for lab code and vLLM there; locally, the one running the lab.
        self.python = node_cfg.python or sys.executable

    @abstractmethod
    def run(self, argv: list[str], *, timeout: float = 60.0, env: dict[str, str] | None = None,
            input: str | None = None) -> RunResult: ...

    @abstractmethod
    def put_file(self, local: str | os.PathLike, remote: str) -> None: ...

    @abstractmethod
    def _spawn(self, argv: list[str], env: dict[str, str], log_path: str,
               cwd: str | None) -> tuple[int, int]:
        """Start detached; return (pid, start_ticks). The PID leads its own group."""

    @abstractmethod
    def is_alive(self, rec: ProcessRecord) -> bool: ...

    @abstractmethod
    def log_tail(self, rec: ProcessRecord, lines: int = 40) -> str: ...

    @abstractmethod
    def _stop_group(self, rec: ProcessRecord, grace_s: float) -> bool: ...

    def run_sent(self, module, *args: str, timeout: float = 60.0) -> str:
        """Run an `on_node` module's entry point on the node, its source sent over stdin
        (nothing needs to be deployed); its answer (stdout)."""
        r = self.run([self.python, "-", *args], input=inspect.getsource(module), timeout=timeout)
        if not r.ok:
            raise LabError(f"node {self.name}: {module.__name__.rsplit('.', 1)[-1]} {args[0]} "
                           f"failed: {r.stderr.strip()[-500:] or r.why}")
        return r.stdout.strip()

    def meminfo(self) -> dict[str, int]:
        """/proc/meminfo in bytes (`on_node.facts.proc_meminfo`); LabError when unreadable."""
        r = self.run(["cat", "/proc/meminfo"], timeout=15)
        if not r.ok:
            raise LabError(f"node {self.name}: cannot read /proc/meminfo: {r.why}")
        return proc_meminfo(r.stdout)

    def port_report(self, address: str, port: int) -> PortReport:
        """Whether `address:port` is free here, and what holds it if not
        (`on_node.proctools.port_report`)."""
        return PortReport(**json.loads(self.run_sent(proctools, "port", address, str(port))))

    def close(self) -> None:
        """Release what the node holds open (an SSH connection); the next use reopens it."""
        return  # a local node holds nothing open

    def start_detached(self, name: str, argv: list[str], *, log_path: str,
                       env: dict[str, str] | None = None, cwd: str | None = None,
                       kind: str = "process", port: int | None = None, url: str | None = None,
                       extra: dict | None = None, unit_grace_s: float | None = None) -> ProcessRecord:
        """Start `argv` in its own process group, output to `log_path`, and record it.
        `env` adds to the node's environment; it never appears on the command line. With
        `unit_grace_s`, the group is led by `on_node.unit`, which runs `argv` as its child
        and stops the rest of the group when that child ends (lab_utils must be importable
        there: `env`'s PYTHONPATH); the record keeps `argv`, its PID is the leader's."""
        spawned = argv if unit_grace_s is None else [
            self.python, "-m", UNIT_MODULE, f"{unit_grace_s:g}", "--", *argv]
        pid, ticks = self._spawn(spawned, env or {}, log_path, cwd)
        rec = ProcessRecord(name=name, node=self.name, pid=pid, pgid=pid, start_ticks=ticks,
                            log_path=log_path, argv=list(argv), kind=kind, port=port, url=url,
                            started_at=time.time(), extra=extra or {})
        self.state.add(rec)
        return rec

    def stop(self, rec: ProcessRecord, grace_s: float = 10.0) -> bool:
        """Stop the record's process group (TERM, then KILL), remove its private temporary
        directory if it has one, and forget it."""
        ran = self._stop_group(rec, grace_s)
        self.forget(rec)
        return ran

    def forget(self, rec: ProcessRecord) -> None:
        """Drop the record of a process that is stopped or dead, with its private
        temporary directory if it has one."""
        self.state.remove(rec.name)
        self.remove_private_tmp(rec.extra.get("tmpdir"))

    def private_tmp(self, name: str) -> str:
        """A new temporary directory on this node for one process (its TMPDIR): what the
        process leaves there (vLLM's ZMQ sockets, its rendezvous files) goes when it stops.
        A short path under the node's /tmp, so socket paths stay within the 107-byte limit.

        One entry is not the process's own: `torchinductor_USER`, where PyTorch Inductor
        keeps the kernels it compiles and the C++ headers it precompiles, is a link to the
        node's (the one Inductor uses without a private TMPDIR). vLLM compiles a kernel the
        first time an instance computes logprobs, and the instance runs no step meanwhile; a
        cache that went with each instance made every fresh one compile again (on the
        2-core rehearsal box 40-150 s: docs/SIMCLUSTER.md). `rm -rf` removes the link only."""
        r = self.run(["sh", "-c", _PRIVATE_TMP_SH, "sh", f"{PRIVATE_TMP_PREFIX}{name}.XXXXXX"])
        if not r.ok:
            raise LabError(f"node {self.name}: cannot create a temporary directory: {r.why}")
        return r.stdout.strip()

    def remove_private_tmp(self, path: str | None) -> None:
        if not path or not Path(path).name.startswith(PRIVATE_TMP_PREFIX):
            return  # only what private_tmp made
        with contextlib.suppress(LabError):  # unreachable now: it is small, under its /tmp
            self.run(["rm", "-rf", "--", path], timeout=60)

    def ensure_port_free(self, address: str, port: int, what: str) -> None:
        report = self.port_report(address, port)
        if not report.free:
            raise PortInUseError(
                f"port {port} on node {self.name} ({address}) is already in use, needed for "
                f"{what}. Held by: {report.who()}. Stop that process (if it is the lab's: "
                f"`python -m lab_utils cleanup`) or change the port in the config."
            )


class LocalNode(Node):
    """This machine."""

    def run(self, argv, *, timeout=60.0, env=None, input=None) -> RunResult:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, **(env or {})}, input=input,
                               stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{argv[0]} on node {self.name} timed out after {timeout:.0f} s") from e
        except FileNotFoundError as e:
            return RunResult(127, "", str(e))
        return RunResult(p.returncode, p.stdout, p.stderr)

    def put_file(self, local, remote) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        if Path(local).resolve() != Path(remote).resolve():
            shutil.copy2(local, remote)

    def _spawn(self, argv, env, log_path, cwd):
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # it holds command lines: its owner's only, also when it existed
        # A process group of its own (what `stop` signals), in the caller's session. Not
        # a session of its own: Linux's autogroup scheduling puts each session in a
        # separate CPU group, and on the 2-core rehearsal, while a prefill held KV blocks
        # for a decode, processes in other sessions (the lab's client and proxy
        # included) got no CPU for the whole KV lease, while processes in the
        # instances' session ran (docs/REHEARSAL.md, "What the rehearsal can and cannot
        # show").
        with open(fd, "ab") as log:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, process_group=0,  # Python 3.11+ (requires-python)
                                 env={**os.environ, **env}, cwd=cwd)
        # The Popen object is dropped; proctools reaps the child when it exits.
        p.returncode = 0
        return p.pid, proctools.start_ticks(p.pid)

    def is_alive(self, rec) -> bool:
        return proctools.is_alive(rec.pid, rec.start_ticks)

    def log_tail(self, rec, lines=40) -> str:
        try:
            with open(rec.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return f"(no log at {rec.log_path})"

    def _stop_group(self, rec, grace_s) -> bool:
        return proctools.stop_group(rec.pgid, rec.start_ticks, grace_s)

    def port_report(self, address, port) -> PortReport:
        return PortReport(**proctools.port_report(address, port))  # no interpreter to start


