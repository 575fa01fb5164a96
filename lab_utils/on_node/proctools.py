"""Process and port facts read from /proc, on whichever node this module runs.

Used directly by the local node and, once the lab is deployed, run on a remote node as
`python -m lab_utils.on_node.proctools ...` so both kinds of node decide the same way. A process
is identified by PID *and* its start time, so a recycled PID is never mistaken for ours;
a process group is stopped TERM first, then KILL after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import NamedTuple


class ProcStat(NamedTuple):
    state: str  # "R", "S", ... "Z" zombie, "X" dead
    ppid: int
    pgid: int
    start_ticks: int


def proc_stat(pid: int) -> ProcStat | None:
    """A process's state, parent, group and start time, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def children(pid: int) -> list[int]:
    return [c for c in all_pids() if (st := proc_stat(c)) and st.ppid == pid]


def comm(pid: int) -> str:
    """The process's short name ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, not yet reaped)."""
    st = proc_stat(pid)
    return st is None or st.state in ("Z", "X")


def start_ticks(pid: int) -> int:
    st = proc_stat(pid)
    return st.start_ticks if st else -1


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_alive(pid: int, ticks: int) -> bool:
    """True when `pid` runs and is the process recorded with `ticks` (not a zombie)."""
    _reap(pid)
    st = proc_stat(pid)
    return st is not None and st.start_ticks == ticks and st.state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    return [pid for pid in all_pids()
            if (st := proc_stat(pid)) and st.pgid == pgid and st.state not in ("Z", "X")]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU time of one thread so far (0 when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds used so far by the live processes of a process group (one that ends
    while it is read counts as 0)."""
    total = 0.0
    for pid in group_members(pgid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += cpu_seconds(pid)
    return total


def _group_is_ours(pgid: int, ticks: int) -> bool:
    """The group still holds our processes. A PID equal to a live group's id cannot be
    handed out again, so if the leader is gone, the remaining members are our orphans;
    if a process with that PID exists, it must be the one we recorded."""
    leader = proc_stat(pgid)
    if leader is not None and leader.state not in ("Z", "X"):
        return leader.start_ticks == ticks
    return bool(group_members(pgid))


def stop_group(pgid: int, ticks: int, grace_s: float = 10.0) -> bool:
    """TERM the group, wait up to `grace_s`, then KILL. Returns True if anything ran."""
    if not _group_is_ours(pgid, ticks):
        _reap(pgid)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pgid)
        if not group_members(pgid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        _reap(pgid)
        if not group_members(pgid):
            break
        time.sleep(0.1)
    return True


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                    inodes.add(cols[9])
    return inodes


def port_holders(port: int) -> list[str]:
    """'PID N: cmdline' of every process listening on TCP `port` (any address)."""
    inodes = _listening_inodes(port)
    found: list[str] = []
    if not inodes:
        return found
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fds = list((d / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:  # an fd may close while we look (other threads): skip it, not the process
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found.append(f"PID {d.name}: {_cmdline(int(d.name))}")
                break
    return found


def port_is_free(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def port_report(address: str, port: int) -> dict:
    """{"free": bool, "holders": [...]} for the port on this node."""
    free = port_is_free(address, port)
    return {"free": free, "holders": [] if free else port_holders(port)}


def main(argv: list[str] | None = None) -> int:
    """Remote entry point: `ticks PID`, `alive PID TICKS`, `stop PGID TICKS GRACE`,
    `port ADDR PORT`; prints the answer as JSON."""
    args = sys.argv[1:] if argv is None else argv
    cmd, rest = args[0], args[1:]
    if cmd == "ticks":
        result: object = start_ticks(int(rest[0]))
    elif cmd == "alive":
        result = is_alive(int(rest[0]), int(rest[1]))
    elif cmd == "stop":
        result = stop_group(int(rest[0]), int(rest[1]), float(rest[2]))
    elif cmd == "port":
        result = port_report(rest[0], int(rest[1]))
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
