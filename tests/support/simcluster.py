"""A simulated three-node cluster on one machine: two "Sparks" and a controller.

Each node is a network namespace (`controller`, `spark-01`, `spark-02`) with its own sshd
and host key. A LAN (bridge `sdl-lan`, 198.18.1.0/24) joins all three; a separate
data-plane link (a veth pair named `data0` on both ends, 198.19.0.0/24, MTU 9000) joins
the two sparks only, as the ConnectX cable does. The bridge has an address on the host
(198.18.1.254), so a test running outside the namespaces can reach the LAN like an
operator's laptop would; nothing here routes to any other network.

`configs/simcluster.json` describes this cluster as a real config would: SSH and HTTP on
LAN addresses, the NIXL side channel on data-plane addresses, UCX forced onto TCP over
`data0` (the namespaces share one kernel, so UCX would otherwise pick shared memory and
never touch the link). The fixed paths it names are made true by `up`: keys, known_hosts
and the nodes' workdirs under ROOT, and ROOT/venv linked to this checkout's `.venv`.

    python tests/support/simcluster.py up       # as root
    python tests/support/simcluster.py status
    ip netns exec controller .venv/bin/python -m lab_utils run --config configs/simcluster.json
    python tests/support/simcluster.py down

`down` stops every process in the three namespaces (by PID: `ip netns pids`; they are
all ours, since we made the namespaces) and our sshds, then removes links and namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script: `python tests/support/simcluster.py up`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab_utils.on_node.proctools import comm, is_alive, proc_stat, start_ticks, stop_group

from support.sshd_server import LoopbackSSHD

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "simcluster.json"
ROOT = Path("/tmp/spark-disagg-simcluster")
STATE = ROOT / "state.json"
BRIDGE, HOST_ADDRESS = "sdl-lan", "198.18.1.254"
LAN = {"controller": "198.18.1.10", "spark-01": "198.18.1.11", "spark-02": "198.18.1.12"}
DATA = {"spark-01": "198.19.0.1", "spark-02": "198.19.0.2"}
HOST_VETH = {"controller": "sdl-ctl", "spark-01": "sdl-s01", "spark-02": "sdl-s02"}
DATA_NETDEV, LAN_NETDEV, DATA_MTU = "data0", "lan0", 9000
SSH_PORT = 22
# One CPU cgroup for everything the cluster runs. The kernel's autogroup scheduling gives
# each session a CPU group of its own, but only to processes in the root CPU cgroup, and
# sshd starts every connection in a new session: without this, each instance started over
# SSH would get a group, and on a 2-core machine a prefill holding unread KV blocks leaves
# the processes outside its group (the proxy, the client) waiting for the whole KV lease
# (docs/REHEARSAL.md, "What the rehearsal can and cannot show"). Real nodes have CPUs of their own;
# here three "nodes" share two, so they share them as one machine's processes would.
CGROUP_NAME = "spark-disagg-simcluster"
LIMITED_CGROUP_NAME = f"{CGROUP_NAME}-limited"  # beside it: `cpu_limited`


class SimClusterError(RuntimeError):
    """The simulated cluster cannot be built or torn down here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and p.returncode != 0:
        raise SimClusterError(f"`ip {' '.join(args)}` failed: {p.stderr.strip()}")
    return p


def existing_namespaces() -> list[str]:
    out = _ip("-json", "netns", "list", check=False).stdout.strip()
    names = {n["name"] for n in json.loads(out)} if out else set()
    return [n for n in LAN if n in names]


def unavailable_reason() -> str | None:
    """Why the cluster cannot be built on this machine, or None."""
    if os.geteuid() != 0:
        return "building network namespaces needs root (CI runs as root)"
    if shutil.which("ip") is None:
        return "`ip` is missing: apt-get install iproute2 (tests/ensure_sysdeps.sh does)"
    if not Path("/usr/sbin/sshd").exists():
        return "/usr/sbin/sshd is missing: apt-get install openssh-server"
    return None


def cgroup_dir() -> Path | None:
    """Where the cluster's CPU cgroup goes (cgroup v1 `cpu` hierarchy, or cgroup v2 with
    the cpu controller enabled for the root's children), or None where there is neither."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.shares").exists():
        return v1 / CGROUP_NAME
    v2 = Path("/sys/fs/cgroup")
    controls = v2 / "cgroup.subtree_control"
    if controls.exists() and "cpu" in controls.read_text().split():
        return v2 / CGROUP_NAME
    return None


def join_cgroup(pid: int) -> bool:
    """Move `pid` (and so whatever it starts from now on) into the cluster's cgroup, when
    there is one; False when there is none."""
    cg = cgroup_dir()
    if cg is None or not cg.is_dir():
        return False
    (cg / "cgroup.procs").write_text(f"{pid}\n")
    return True


@contextlib.contextmanager
def cpu_limited(pids: list[tuple[int, int]], percent: int) -> Iterator[None]:
    """Processes given as (PID, start ticks) get `percent` of one CPU between them, by a
    cgroup of their own beside the cluster's (a kernel quota, whatever else runs), and go
    back to the cluster's cgroup afterwards. Fails, saying why, where there is no CPU cgroup."""
    cg = cgroup_dir()
    if cg is None or not cg.is_dir():
        raise SimClusterError("limiting a process's CPU needs a CPU cgroup (cgroup v1 `cpu`, or "
                              "cgroup v2 with the cpu controller enabled for the root's children)")
    limited = cg.with_name(LIMITED_CGROUP_NAME)
    limited.mkdir(exist_ok=True)
    period = 100_000
    if (limited / "cpu.max").exists():  # cgroup v2
        (limited / "cpu.max").write_text(f"{period * percent // 100} {period}\n")
    else:
        (limited / "cpu.cfs_period_us").write_text(f"{period}\n")
        (limited / "cpu.cfs_quota_us").write_text(f"{period * percent // 100}\n")
    try:
        for pid, ticks in pids:
            if is_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    (limited / "cgroup.procs").write_text(f"{pid}\n")
        yield
    finally:
        for pid, ticks in pids:
            if is_alive(pid, ticks):
                with contextlib.suppress(OSError):  # it may exit meanwhile
                    join_cgroup(pid)
        _remove_cgroup(limited)


def client_key() -> Path:
    return ROOT / "ssh" / "id_ed25519"


def known_hosts() -> Path:
    return ROOT / "ssh" / "known_hosts"


def _network() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HOST_ADDRESS}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for ns, address in LAN.items():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", HOST_VETH[ns], "type", "veth", "peer", "name", LAN_NETDEV, "netns", ns)
        _ip("link", "set", HOST_VETH[ns], "master", BRIDGE, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", LAN_NETDEV)
        _ip("-n", ns, "link", "set", LAN_NETDEV, "up")
    a, b = DATA
    _ip("-n", a, "link", "add", DATA_NETDEV, "mtu", str(DATA_MTU), "type", "veth",
        "peer", "name", DATA_NETDEV, "mtu", str(DATA_MTU), "netns", b)
    for ns, address in DATA.items():
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", DATA_NETDEV)
        _ip("-n", ns, "link", "set", DATA_NETDEV, "up")


def up() -> dict:
    """Build the cluster (tearing down a previous one of ours first); returns the state."""
    reason = unavailable_reason()
    if reason:
        raise SimClusterError(reason)
    if STATE.exists():
        down()
    taken = existing_namespaces()
    if taken or _ip("link", "show", BRIDGE, check=False).returncode == 0:
        raise SimClusterError(
            f"namespaces {taken} or link {BRIDGE} exist but were not made by this script "
            f"(no {STATE}); remove them (`ip netns del NAME`, `ip link del {BRIDGE}`) and retry")
    t0 = time.monotonic()
    (ROOT / "ssh").mkdir(parents=True, exist_ok=True)
    state: dict = {"sshd": {}, "created": time.time()}
    STATE.write_text(json.dumps(state))  # from here on `down` knows the network is ours
    try:
        _network()
        cg = cgroup_dir()
        if cg is not None:
            cg.mkdir(exist_ok=True)
        lines = []
        for ns, address in LAN.items():
            sshd = LoopbackSSHD(ROOT / "sshd" / ns, address=address, port=SSH_PORT, netns=ns,
                                client_key=client_key()).start()
            join_cgroup(sshd.pid)  # before any connection: sshd forks one child per session
            state["sshd"][ns] = [sshd.pid, start_ticks(sshd.pid)]
            lines.append(sshd.known_hosts_line())
            # the server object is dropped; `down` stops it by PID and process tree
            sshd._proc = None
        known_hosts().write_text("".join(line + "\n" for line in lines))
        for ns in LAN:
            (ROOT / ns).mkdir(exist_ok=True)
        venv = ROOT / "venv"
        if venv.is_symlink() or venv.exists():
            venv.unlink()
        venv.symlink_to(Path(sys.prefix))
        (ROOT / "models").mkdir(exist_ok=True)
        state["startup_s"] = round(time.monotonic() - t0, 2)
        STATE.write_text(json.dumps(state))
    except BaseException:
        down()
        raise
    return state


def namespace_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(x) for x in out.split()]


def strays(allowed_pgids=(), namespaces=tuple(LAN)) -> list[str]:
    """"ns: pid comm" of every process in `namespaces` that is neither an sshd nor in one
    of `allowed_pgids` (nor this process): what a test expects to be gone."""
    out = []
    for ns in namespaces:
        for pid in namespace_pids(ns):
            st, name = proc_stat(pid), comm(pid)
            if pid == os.getpid() or st is None or st.pgid in allowed_pgids or name == "sshd":
                continue
            out.append(f"{ns}: {pid} {name or '(gone)'}")
    return out


def exec_argv(ns: str, *argv: str) -> list[str]:
    """`argv` run inside namespace `ns` and the cluster's cgroup (the PID stays the one
    the caller started: both steps exec in place)."""
    return [sys.executable, str(Path(__file__).resolve()), "exec", ns, "--", *argv]


def lab_argv(ns: str, *args: str) -> list[str]:
    """`python -m lab_utils ARGS` run inside namespace `ns` (and the cluster's cgroup)."""
    return exec_argv(ns, sys.executable, "-m", "lab_utils", *args)


def stop_namespace_processes(grace_s: float = 5.0) -> list[int]:
    """TERM, then after `grace_s` KILL, every process inside our namespaces (identified
    by PID and start time); returns their PIDs."""
    procs = [(p, start_ticks(p)) for ns in existing_namespaces() for p in namespace_pids(ns)
             if p != os.getpid()]
    for sig in (15, 9):
        for pid, ticks in procs:
            if is_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        t_end = time.monotonic() + (grace_s if sig == 15 else 5.0)
        while time.monotonic() < t_end and any(is_alive(*p) for p in procs):
            time.sleep(0.05)
    return [p for p, _ in procs]


def down() -> None:
    """Stop everything in the namespaces, remove links and namespaces. Idempotent."""
    state = json.loads(STATE.read_text()) if STATE.exists() else {"sshd": {}}
    stop_namespace_processes()
    for pid, ticks in state["sshd"].values():
        if is_alive(pid, ticks):
            stop_group(pid, ticks, 5)
    for ns in existing_namespaces():
        _ip("netns", "del", ns, check=False)
    cg = cgroup_dir()
    # the limited one first: left there by a test that crashed in `cpu_limited`
    for d in [cg.with_name(LIMITED_CGROUP_NAME), cg] if cg is not None else []:
        if d.is_dir():
            _remove_cgroup(d)
    _ip("link", "del", BRIDGE, check=False)
    for veth in HOST_VETH.values():
        _ip("link", "del", veth, check=False)
    STATE.unlink(missing_ok=True)


def _remove_cgroup(cg: Path, wait_s: float = 5.0) -> None:
    """rmdir the cgroup once the processes stopped above have left it (exiting processes
    take a moment); one that still holds a process is named, not emptied by force."""
    t_end = time.monotonic() + wait_s
    while True:
        try:
            cg.rmdir()
            return
        except OSError as e:
            if time.monotonic() > t_end:
                left = (cg / "cgroup.procs").read_text().split()
                raise SimClusterError(f"cannot remove {cg}: {e}; processes still in it: "
                                      f"{', '.join(left) or 'none'}") from e
            time.sleep(0.1)


def status() -> str:
    if not STATE.exists():
        return "simcluster: down"
    lines = ["simcluster: up"]
    for ns in LAN:
        pids = namespace_pids(ns) if ns in existing_namespaces() else []
        data = f", data {DATA[ns]} on {DATA_NETDEV}" if ns in DATA else ""
        lines.append(f"  {ns:<10} LAN {LAN[ns]}{data}; {len(pids)} process(es)")
    return "\n".join(lines)


def netdev_bytes(ns: str, dev: str = DATA_NETDEV) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of a namespace's interface, from `ip -s`."""
    out = json.loads(_ip("-n", ns, "-s", "-json", "link", "show", dev).stdout)[0]
    stats = out["stats64"]
    return stats["rx"]["bytes"], stats["tx"]["bytes"]


def exec_in(ns: str, argv: list[str]) -> None:
    """Join the cluster's cgroup, then exec `argv` in namespace `ns` (does not return)."""
    if ns not in LAN:
        raise SimClusterError(f"no node {ns!r}: the nodes are {', '.join(LAN)}")
    if not STATE.exists():
        raise SimClusterError("the cluster is down: run `python tests/support/simcluster.py up`")
    join_cgroup(os.getpid())
    os.execvp("ip", ["ip", "netns", "exec", ns, *argv])


USAGE = ("usage: python tests/support/simcluster.py up|down|status\n"
         "       python tests/support/simcluster.py exec NODE -- COMMAND...")


def main(argv: list[str]) -> int:
    if argv[:1] == ["exec"]:
        if len(argv) < 4 or argv[2] != "--":
            print(USAGE, file=sys.stderr)
            return 2
        try:
            exec_in(argv[1], argv[3:])
        except SimClusterError as e:
            print(f"simcluster: {e}", file=sys.stderr)
            return 1
    if len(argv) != 1 or argv[0] not in ("up", "down", "status"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if argv[0] == "up":
            st = up()
            print(f"simcluster up in {st['startup_s']} s: namespaces {', '.join(LAN)}; "
                  f"config {CONFIG.relative_to(REPO)}; run the lab from the controller with\n"
                  f"  {sys.executable} {sys.argv[0]} exec controller -- {sys.executable} -m lab_utils run "
                  f"--config {CONFIG.relative_to(REPO)}")
        elif argv[0] == "down":
            down()
            print("simcluster down: processes stopped, links and namespaces removed")
        else:
            print(status())
    except SimClusterError as e:
        print(f"simcluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
