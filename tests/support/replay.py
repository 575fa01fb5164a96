"""Nodes that replay command outputs recorded on DGX Spark (GB10) machines.

`ReplayNode` answers the commands the checklist runs from the verbatim recordings in
`fixtures/dgx-spark-recorded/` (see SOURCES.md there), so `check` runs end to end on a
two-Spark profile without the hardware. A scenario picks which recording answers which
command: `SCENARIOS["recorded"]` is the pair as the recordings show it, the others swap
in the recorded failure cases. Answers to the lab's own probes (`nodefacts`) are built
from recordings where one exists (package versions) and are otherwise plain values
(a clock, free disk, a listener that accepts, `command -v` finding every tool, Python.h
where Ubuntu's python3.12-dev puts it, a missing tool's exit 127), stated as such below.
No recording of `ulimit -l` or of a NIXL transfer on a GB10 exists: those answer as an
unrecorded command does (exit 127), unless a scenario gives a plain value. A scenario may also change the profile's node
settings (`profile_data`).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path

from lab_utils.cluster import Node, RunResult, provision
from lab_utils.cluster.nodes import PortReport
from lab_utils.errors import LabError

from support import parsers_extra

REC = Path(__file__).resolve().parents[1] / "fixtures" / "dgx-spark-recorded"
PROFILE = Path(__file__).resolve().parents[1] / "fixtures" / "two-spark-recorded.json"


def rec(name: str) -> str:
    return (REC / name).read_text()


PYTHON_H = "/usr/include/python3.12/Python.h"  # python3.12-dev's path: a plain value


def python_facts(kind: str) -> dict:
    """The `nodefacts python` answer, from recorded `pip show vllm` and torch outputs.
    nixl's version appears in no recording: "not-recorded" stands for "installed"; nor does
    what vLLM's extensions link (vllm_cudart), which stays None (not read).

    "pypi_032" is PyPI's aarch64 vllm 0.32.0 with the torch 2.13.0 it pins, recorded on no
    Spark: the values were read from those wheels (their METADATA Version, torch/version.py's
    cuda = '13.0', `readelf -d` of vllm/_C_stable_libtorch.abi3.so: libcudart.so.13; issue
    18's findings, section 2)."""
    vllm = parsers_extra.pip_show_version(rec("pip-show-vllm.grep-Version.gb10-pair.notebook-formatted.txt"))
    if kind == "pypi_032":
        return {"python": "3.12.3", "executable": "/home/lab/spark-disagg-lab/.venv/bin/python",
                "vllm": "0.32.0", "torch": "2.13.0", "torch_cuda": "13.0",
                "vllm_cudart": "libcudart.so.13", "nixl": "1.5.1", "huggingface_hub": "not-recorded",
                "python_h": PYTHON_H}
    if kind == "cu129":
        env = parsers_extra.collect_env(rec("vllm-collect_env.gb10.torch-cu129.excerpt.txt"))
        torch, cuda = env["torch_version"], env["cuda_used_to_build"]
    else:
        text = rec("torch-cuda-config.gb10.notebook-script.txt")
        torch = re.search(r"PyTorch version: (\S+)", text)[1]
        cuda = re.search(r"CUDA version: (\S+)", text)[1]
    return {"python": "3.12.3", "executable": "/home/lab/spark-disagg-lab/.venv/bin/python",
            "vllm": vllm, "torch": torch, "torch_cuda": cuda, "vllm_cudart": None,
            "nixl": "not-recorded",
            "huggingface_hub": "not-recorded", "python_h": PYTHON_H}


# Which recording answers which command, for the pair as recorded.
RECORDED = {
    "nvidia-smi": "nvidia-smi.gb10.txt",
    "nvidia-smi --query-gpu=name,driver_version --format=csv":
        "nvidia-smi-query-gpu.name-driver_version.csv.gb10.txt",
    "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader": "",
    "ibdev2netdev": "ibdev2netdev.gb10.one-cable-port1.txt",
    "ibv_devinfo": "ibv_devinfo.gb10.mtu9000-on-enp1s0f0-f1.txt",
    "ip link show enp1s0f1np1": "ip-link-show.enp1s0f1np1.gb10.mtu9000.txt",
    "ip link show enP2p1s0f1np1": "ip-link-show.gb10.mtu1500.txt",
    "ethtool enp1s0f1np1": "ethtool.grep-Speed.enp1s0f1np1.gb10.via-switch.200G.txt",
    "ethtool enP2p1s0f1np1": "ethtool.grep-Speed.enP2p1s0f1np1.gb10.via-switch.200G.txt",
    "ibstat": "ibstat.gb10.txt",
    # the check runs `-D 5 -F --report_gbits`; this recording ran perftest's default
    # iterations and printed MB/s (the parser reads both forms)
    "ib_write_bw -d rocep1s0f1 -p 5800 -D 5 -F --report_gbits 192.168.100.10":
        "ib_write_bw.gb10-pair.client.mtu1024.link2.txt",
    # reconstructed: this pair's second half (roceP2p1s0f1) was never timed; its client
    # is answered with the playbook's second-half client (roceP2p1s0f0, run beside the
    # first), so the check sees two halves at once
    "ib_write_bw -d roceP2p1s0f1 -p 5801 -D 5 -F --report_gbits 192.168.100.10":
        "ib_write_bw.gb10-pair.report_gbits.rail2-roceP2p1s0f0.txt",
    "cat /proc/meminfo": "proc-meminfo.head-20.gb10.txt",
    "ip addr show": "ip-addr-show.gb10.txt",
}

# Recorded failure cases, as changes to RECORDED (and to the lab-probe answers).
SCENARIOS: dict[str, dict] = {
    "recorded": {},
    "mtu1500": {"ibv_devinfo": "ibv_devinfo.gb10.mtu1500.txt",
                "ip link show enp1s0f1np1": "ip-link-show.gb10.mtu1500.txt"},
    "switch_100g": {"ethtool enp1s0f1np1": "ethtool.grep-Speed.enp1s0f1np1.gb10.via-switch.before-fix.txt",
                    "ethtool enP2p1s0f1np1":
                        "ethtool.grep-Speed.enP2p1s0f1np1.gb10.via-switch.before-fix.txt"},
    "cable_in_port0": {"ibdev2netdev": "ibdev2netdev.gb10.one-cable-port0.spark-5c2d.txt"},
    "leftover_gpu_processes": {
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader":
            "nvidia-smi-query-compute-apps.gb10.abridged.txt"},
    "torch_cu129": {"python": "cu129"},
    "pypi_vllm_032": {"python": "pypi_032"},
    "nixl_err_backend": {"logs": "nixl-err-backend.gb10.vllm-0.15.1.excerpt.txt"},
    "host_key_changed": {"ssh_error": "spark-02"},
    # A stock DGX OS: perftest and infiniband-diags not installed (no recording of the
    # shell's "not found" exists; the replay answers as a shell does, exit 127).
    "no_perftest": {"missing": ["ib_write_bw", "ibstat"]},
    # A stock Ubuntu without build-essential, python3.12-dev and ibverbs-utils (plain
    # values: `command -v` finds neither gcc nor ibv_devinfo, no Python.h)
    "stock_os_packages": {"missing": ["gcc", "ibv_devinfo"], "python_h": False},
    # Ubuntu's default locked-memory limit, 8 MiB (a plain value: no GB10 recording)
    "memlock_default": {"sh -c ulimit -l": "=8192\n"},
    # data_ifname against the recorded `ip addr show` (192.168.100.11 is on enp1s0f0np0,
    # enp1s0f1np1 holds 192.168.200.13): the name of the cabled half but not the address's
    # interface, then the one that holds the address the node is given
    "data_ifname_wrong": {"nodes": {"spark-02": {"data_ifname": "enp1s0f1np1"}}},
    "data_ifname_right": {"nodes": {"spark-02": {"data_ifname": "enp1s0f1np1",
                                                 "data_address": "192.168.200.13"}}},
    # A healthy pair at 200G with the cable in port 0: both halves of it configured, each
    # reporting Rate 200 (ibstat of a Dell Pro Max GB10, source J), ib_write_bw on both
    # halves at once 92.57 and 97.28 Gb/s (the playbook's two clients, run together, on
    # the same pair as the port-0 ibdev2netdev; recorded with --run_infinitely).
    # No ethtool of a port-0 netdev is recorded: link_speed reads ibstat's Rate instead.
    "healthy_200g": {
        "nodes": {n: {"data_netdev": "rocep1s0f0:1,roceP2p1s0f0:1"}
                  for n in ("spark-01", "spark-02")},
        "ibdev2netdev": "ibdev2netdev.gb10.one-cable-port0.spark-5c2d.txt",
        "ibstat": "ibstat.gb10.dell-pro-max.port0-rate200.excerpt.txt",
        "ip link show enp1s0f0np0": "ip-link-show.enp1s0f0np0.gb10.mtu9000.txt",
        "ip link show enP2p1s0f0np0": "ip-link-show.gb10.mtu1500.txt",
        "ib_write_bw -d rocep1s0f0 -p 5800 -D 5 -F --report_gbits 192.168.100.10":
            "ib_write_bw.gb10-pair.report_gbits.rail1-rocep1s0f0.txt",
        "ib_write_bw -d roceP2p1s0f0 -p 5801 -D 5 -F --report_gbits 192.168.100.10":
            "ib_write_bw.gb10-pair.report_gbits.rail2-roceP2p1s0f0.txt",
    },
}


def profile_data(scenario: str = "recorded") -> dict:
    """The recorded two-Spark profile as JSON data, with the scenario's node settings."""
    data = json.loads(PROFILE.read_text())
    for node, fields in SCENARIOS[scenario].get("nodes", {}).items():
        data["nodes"][node].update(fields)
    return data


# Reconstructed, not recorded (no GB10 NCCL log is at hand): the all-reduce check's rank
# logs, NCCL's INFO lines in the format of its source (src/transport/net_ib/init.cc's
# "NET/IB : Using [i]dev:port/link ...; OOB if:addr<0>", its init's "Using network"), with
# the recorded pair's devices and addresses; the times are illustrative, not measured.
def allreduce_log(kind: str, rank: int, node_cfg) -> str:
    ip, ifname = node_cfg.data_address, node_cfg.data_ifname or "enp1s0f1np1"
    host = f"spark-0{rank + 1}:{4100 + rank}:{4100 + rank} [0] NCCL INFO "
    if kind == "swapped":  # the second node lists the port's halves the other way round
        first, second = (("rocep1s0f1", "roceP2p1s0f1") if rank == 0 else
                         ("roceP2p1s0f1", "rocep1s0f1"))
        return (host + f"NET/IB : Using [0]{first}:1/RoCE [1]{second}:1/RoCE [RO]; OOB "
                f"{ifname}:{ip}<0>\n" + host + "Using network IB\n")  # then it hangs
    if kind == "qp_timeout":
        return (host + f"NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB "
                f"{ifname}:{ip}<0>\n" + host + "Using network IB\n"
                + host.replace("INFO", "WARN").replace(" [0] ", " [0] misc/ibvwrap.cc:262 ")
                + "Call to ibv_modify_qp failed with 110 Connection timed out, on dev "
                "roceP2p1s0f1:1, curr state INIT, next state RTR\n"
                "torch.distributed.DistBackendError: NCCL error: remote process exited or "
                "there was a network error\n")
    if kind == "sockets":
        lines = (host + "NET/IB : No device found.\n" + host
                 + f"NET/Socket : Using [0]{ifname}:{ip}<0>\n" + host + "Using network Socket\n")
    else:
        lines = (host + "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB "
                 f"{ifname}:{ip}<0>\n" + host + "Using network IB\n")
    sizes = [{"bytes": 8192, "ms": 0.05, "sum_ok": True},
             {"bytes": 16 * 2**20, "ms": 1.9, "sum_ok": True}]
    return lines + json.dumps({"rank": rank, "backend": "nccl", "sizes": sizes}) + "\n"


class ReplayNode(Node):
    """A node whose commands are answered from recordings (nothing is executed)."""

    _pids = itertools.count(40000)

    def __init__(self, name, node_cfg, state, scenario: str = "recorded", snapshot: str = "a1b2c3"):
        super().__init__(name, node_cfg, state)
        self.changes = SCENARIOS[scenario]
        self.answers = {**RECORDED, **{k: v for k, v in self.changes.items() if " " in k or
                                       k in RECORDED}}
        self.snapshot = snapshot
        self.commands: list[str] = []
        self.alive: set[int] = set()
        self.finished: dict[int, str] = {}  # pid -> its output, of a recorded process that ended
        self.allreduce = "rdma"  # which reconstructed all-reduce log answers (allreduce_log)
        self.envs: dict[str, dict] = {}  # the environment each detached process got, by argv

    def run(self, argv, *, timeout=60.0, env=None, input=None) -> RunResult:
        self.commands.append(" ".join(argv))
        if self.changes.get("ssh_error") == self.name:
            raise LabError(f"node {self.name} (lab@{self.cfg.ssh.host}:22): the host key CHANGED "
                           "since it was recorded in ~/.ssh/known_hosts. If the node was "
                           f"reinstalled, remove the old key with `ssh-keygen -R "
                           f"'{self.cfg.ssh.host}' -f ~/.ssh/known_hosts` and connect once.")
        if argv[:2] == [self.python, "-"] and input and "NIXL_SMOKE" in input:
            return RunResult(127, "", "no recording answers the NIXL smoke test")
        if argv[:2] == [self.python, "-"]:
            return RunResult(0, json.dumps(self._facts(argv[2:])) + "\n", "")
        if argv[:2] == [self.python, "-c"] and "snapshot_download" in argv[2]:
            return RunResult(0, json.dumps(self.snapshot) + "\n", "")
        key = " ".join(argv)
        missing = self.changes.get("missing", [])
        if argv[:2] == ["sh", "-c"] and argv[2].startswith("command -v "):  # the lab's probe
            tools = argv[2].removeprefix("command -v ").split(";")[0].split()
            return RunResult(0, "".join(f"/usr/bin/{t}\n" for t in tools if t not in missing), "")
        if argv[0] in missing:
            return RunResult(127, "", f"sh: 1: exec: {argv[0]}: not found\n")
        if argv[0] == "true" or argv[:2] == ["rm", "-f"]:
            return RunResult(0, "", "")
        if argv[0] == "cat" and argv[1].endswith("/lab_utils/.deployed"):
            return RunResult(0, provision.code_digest() + "\n", "")
        if key in self.answers:
            name = self.answers[key]
            if name.startswith("="):  # a plain value, not a recording
                return RunResult(0, name[1:], "")
            return RunResult(0, rec(name) if name else "", "")
        return RunResult(127, "", f"sh: 1: {argv[0]}: not found (no recording answers `{key}`)")

    def _facts(self, args: list[str]):
        cmd = args[0]
        if cmd == "python":
            facts = python_facts(self.changes.get("python", "cu130"))
            return {**facts, "python_h": facts["python_h"] if self.changes.get("python_h", True)
                    else None}
        if cmd == "clock":
            return {"time": time.time()}
        if cmd == "disk":  # no df recording: a plain value well above the thresholds
            return {p: {"free": 500 * 1024**3, "total": 3700 * 1024**3, "checked": p} for p in args[1:]}
        if cmd == "logs":
            log = self.changes.get("logs") if self.name == "spark-02" else None
            return {f"{args[1]}/decode-0.log": rec(log)} if log else {}
        if cmd == "connect":  # the listener is answered below; every port accepts
            return {t: {"ok": True, "ms": 0.2, "error": None} for t in args[2:]}
        raise AssertionError(f"unexpected nodefacts command {args}")

    def put_file(self, local, remote) -> None:
        raise AssertionError("the checklist copies no files")

    def _spawn(self, argv, env, log_path, cwd):
        pid = next(self._pids)
        self.commands.append(" ".join(argv))
        answer = self.answers.get(" ".join(argv))
        self.envs[" ".join(argv)] = env
        if "allreduce" in argv:  # the check's rank, answered by a reconstruction: done
            i = argv.index("allreduce")
            self.finished[pid] = allreduce_log(self.allreduce, int(argv[i + 1]), self.cfg)
        elif answer:  # a recorded command that ends by itself (an ib_write_bw client): done
            self.finished[pid] = rec(answer)
        else:
            self.alive.add(pid)
        return pid, 1

    def is_alive(self, rec) -> bool:
        return rec.pid in self.alive

    def log_tail(self, rec, lines=40) -> str:
        if "listen" in rec.argv:  # port 0: the system picks one
            ports = {t: t[:-2] + ":45678" if t.endswith(":0") else t
                     for t in rec.argv if t.count(":") == 1 and t[0].isdigit()}
            return json.dumps({"ready": True, "bound": len(rec.argv) - 5, "failed": [],
                               "ports": ports}) + "\n"
        return "\n".join(self.finished.get(rec.pid, "").splitlines()[-lines:])

    def _stop_group(self, rec, grace_s) -> bool:
        self.alive.discard(rec.pid)
        return True

    def port_report(self, address, port) -> PortReport:
        return PortReport(free=True, holders=[])


def replay_nodes(cfg, scenario: str = "recorded", snapshots: dict | None = None) -> dict:
    """Replaying nodes for every node of `cfg`, sharing the profile's state file; hand
    them to `run_checks` or `Cluster(cfg, nodes)`."""
    from lab_utils.cluster import Cluster

    state = Cluster(cfg).state
    return {n: ReplayNode(n, c, state, scenario, (snapshots or {}).get(n, "a1b2c3"))
            for n, c in cfg.nodes.items()}
