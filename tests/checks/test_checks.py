"""The bring-up checklist: golden statuses and fixes on the recorded two-Spark profile
(nodes replaying recorded GB10 outputs), and the real checks on the CPU rehearsal with a
port taken (with none taken, notebook 00 in the series runs them: test_series.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab_utils.checks import nixl, rdma, run_checks
from lab_utils.checks.frame import ChecklistReport
from lab_utils.config import parse_config
from lab_utils.results.checklist import CheckResult

from support.replay import PROFILE, REC, SCENARIOS, profile_data, replay_nodes


def scenario_cfg(tmp_path, scenario: str = "recorded"):
    data = profile_data(scenario)
    data["results_root"] = str(tmp_path / "results")
    return parse_config(data, str(PROFILE))


@pytest.fixture
def spark_cfg(tmp_path):
    return scenario_cfg(tmp_path)


def _by_key(report: ChecklistReport) -> dict[tuple[str, str], CheckResult]:
    return {(r.check, r.node): r for r in report.results}


# What the recordings show for the pair as recorded; every scenario below changes some.
RECORDED_STATUS = {
    ("ssh", "spark-01"): "pass", ("code", "spark-01"): "pass", ("python", "spark-01"): "pass",
    ("versions_match", "cluster"): "pass", ("gpu", "spark-01"): "pass",
    ("gpu_processes", "spark-01"): "pass", ("cuda_build", "spark-01"): "pass",
    ("rdma", "spark-01"): "pass", ("rails", "spark-01"): "pass",
    # roceP2p1s0f1's active_mtu is 1024 in the mtu9000 recording (only f0/f1 were raised):
    # informational, NVIDIA's two-Spark guides run at 1024
    ("mtu", "spark-01"): "pass", ("link_speed", "spark-01"): "pass",
    # no NIXL transfer was recorded on a GB10: the replay cannot answer the smoke test
    ("nixl", "spark-01"): "warn", ("os_packages", "spark-01"): "pass",
    ("link", "spark-02 -> spark-01"): "pass", ("model", "cluster"): "pass",
    ("memory", "spark-01"): "pass", ("clock", "spark-01"): "pass",
    ("hf_token", "cluster"): "pass", ("logs", "spark-02"): "n/a",
    # no recording answers `ulimit -l`: the check says it could not read the limit
    ("memlock", "spark-01"): "warn",
}

# scenario -> {(check, node): (status, text the fix must contain)}
GOLDEN = {
    "mtu1500": {("mtu", "spark-01"): ("pass", None)},
    "switch_100g": {("link_speed", "spark-02"): ("warn", "Speed 200000Mb/s")},
    "cable_in_port0": {("rdma", "spark-01"): ("fail", "rocep1s0f0:1,roceP2p1s0f0:1"),
                       ("rails", "spark-02"): ("warn", "sudo ip link set <netdev> up")},
    "leftover_gpu_processes": {("gpu_processes", "spark-01"): ("warn", "kill <PID>")},
    "torch_cu129": {("cuda_build", "spark-02"): ("fail", "pip install vllm==0.32.0 nixl==1.5.1")},
    # PyPI's vllm 0.32.0 has no +cu tag; torch.version.cuda and libcudart.so.13 say CUDA 13
    "pypi_vllm_032": {("cuda_build", "spark-01"): ("pass", None)},
    "nixl_err_backend": {("logs", "spark-02"): ("fail", "UCX_LOG_LEVEL=debug")},
    "host_key_changed": {("ssh", "spark-02"): ("fail", "ssh-keygen -R '192.168.1.12'"),
                         ("python", "spark-02"): ("n/a", None)},
    # a stock DGX OS: no perftest, no ibstat; a warning with the install line, not a fail
    "no_perftest": {("link", "spark-02 -> spark-01"):
                    ("warn", "sudo apt install perftest infiniband-diags"),
                    ("link_speed", "spark-01"): ("pass", None)},
    # a stock Ubuntu: no compiler or Python headers for Triton (fail), no ibv_devinfo: the
    # mtu check says it could not read the MTU, not that the MTU is low
    "stock_os_packages": {("os_packages", "spark-01"): ("fail", "build-essential python3-dev"),
                          ("mtu", "spark-01"): ("warn", "sudo apt install ibverbs-utils")},
    # Ubuntu's 8 MiB default: far below the KV cache's host copy NIXL registers
    "memlock_default": {("memlock", "spark-01"): ("fail", "LimitMEMLOCK=infinity")},
    # NCCL and Gloo would bind to an interface that does not hold the data address
    "data_ifname_wrong": {("data_ifname", "spark-02"):
                          ("fail", "give one half of data_netdev (enp1s0f1np1, enP2p1s0f1np1) "
                                   "the address 192.168.100.11")},
    "data_ifname_right": {("data_ifname", "spark-02"): ("pass", None)},
    # 200G on port 0, Rate 200 per half, 92.6 Gb/s on one half: healthy
    "healthy_200g": {("rdma", "spark-01"): ("pass", None), ("rails", "spark-01"): ("pass", None),
                     ("link_speed", "spark-01"): ("pass", None),
                     ("link", "spark-02 -> spark-01"): ("pass", None)},
}


def test_every_scenario_has_a_golden():
    assert set(GOLDEN) | {"recorded"} == set(SCENARIOS)


def test_recorded_pair(spark_cfg):
    report = run_checks(spark_cfg, replay_nodes(spark_cfg), show_progress=False)
    got = _by_key(report)
    for key, status in RECORDED_STATUS.items():
        assert got[key].status == status, (key, got[key])
    assert not report.failed
    # GB10's nvidia-smi says "Not Supported" for memory: read from /proc/meminfo instead
    assert "Not Supported" in got[("gpu", "spark-01")].summary
    assert "107 of 120 GiB" in got[("gpu", "spark-01")].summary
    # the GPU's name is data notebook 00 records (the roofline's memory bandwidth)
    from lab_utils.checks.gpu import gpu_name

    assert got[("gpu", "spark-01")].data["name"] == "NVIDIA GB10"
    assert gpu_name(report.results) == "NVIDIA GB10"
    # ib_write_bw on both halves at once: 11031.78 MiB/s = 92.5 Gb/s and (reconstructed,
    # tests/support/replay.py) 97.28 Gb/s, against two PCIe x4 halves (~100 Gb/s each)
    link = got[("link", "spark-02 -> spark-01")]
    assert link.summary == "95% of 2 PCIe x4 halves' ~200 Gb/s"
    assert "rocep1s0f1 reports 200 Gb/s (ethtool)" in link.evidence
    # every configured half has an IPv4 address in the recorded `ip addr show`
    assert "enP2p1s0f1np1 192.168.200.17/24" in got[("rails", "spark-01")].evidence
    ports = [r for r in report.results if r.check == "ports"]
    assert {r.status for r in ports} == {"pass"}
    assert any("192.168.100.10:5600" in r.summary and r.node == "spark-02 -> spark-01"
               for r in ports)  # side channel from decode to prefill on the data plane
    assert any("192.168.1.12:8400" in r.summary and r.node == "controller -> spark-02"
               for r in ports)  # HTTP from the proxy on the LAN


def tp_cfg(tmp_path):
    """The recorded pair with the tensor-parallel topology across both nodes."""
    data = profile_data()
    data["results_root"] = str(tmp_path / "results")
    data["topology"]["tensor_parallel"] = {"nodes": ["spark-01", "spark-02"]}
    data["vllm"]["tp"] = {"port": 8500}
    for node in ("spark-01", "spark-02"):
        data["nodes"][node]["data_ifname"] = "enp1s0f1np1"
    return parse_config(data, str(PROFILE))


def test_tensor_parallel_ranks_are_tried_each_way_on_a_port_the_system_picks(tmp_path):
    report = run_checks(tp_cfg(tmp_path), replay_nodes(tp_cfg(tmp_path)), show_progress=False)
    ports = [r for r in report.results if r.check == "ports"]
    assert {r.status for r in ports} == {"pass"}
    picked = [r for r in ports if "a port the system picks" in r.summary]
    assert sorted(r.node for r in picked) == ["spark-01 -> spark-02", "spark-02 -> spark-01"]
    # the port the replayed listener reported, not the 0 it was asked for
    assert all(":45678 (" in r.summary for r in picked)
    assert any(":29500 (tensor-parallel rendezvous" in r.summary for r in ports)


def test_a_firewall_open_only_for_the_configured_ports_fails_with_its_rule(tmp_path):
    cfg = tp_cfg(tmp_path)
    nodes = replay_nodes(cfg)
    for node in nodes.values():  # every port the system picks is refused
        answer = node._facts

        def refusing(args, answer=answer):
            got = answer(args)
            if args[0] == "connect":
                got.update({t: {"ok": False, "ms": None, "error": "TimeoutError: timed out"}
                            for t in got if t.endswith(":45678")})
            return got
        node._facts = refusing
    report = run_checks(cfg, nodes, show_progress=False)
    bad = [r for r in report.results if r.check == "ports" and r.status == "fail"]
    assert {r.node for r in bad} == {"spark-01 -> spark-02", "spark-02 -> spark-01"}
    one = next(r for r in bad if r.node == "spark-02 -> spark-01")
    assert "192.168.100.10:45678" in one.summary and "not reachable from spark-02" in one.summary
    assert ("`sudo ufw allow from 192.168.100.11 to 192.168.100.10 proto tcp` on spark-01"
            in one.fix)
    assert report.failed


@pytest.mark.parametrize("scenario", sorted(GOLDEN))
def test_recorded_scenarios(tmp_path, scenario):
    cfg = scenario_cfg(tmp_path, scenario)
    report = run_checks(cfg, replay_nodes(cfg, scenario), show_progress=False)
    got = _by_key(report)
    for key, (status, fix) in GOLDEN[scenario].items():
        assert got[key].status == status, (key, got[key])
        if fix:
            assert fix in got[key].fix, (key, got[key].fix)
    assert report.failed == any(s == "fail" for s, _ in GOLDEN[scenario].values())


def test_healthy_200g_pair_is_judged_per_half(tmp_path):
    cfg = scenario_cfg(tmp_path, "healthy_200g")
    nodes = replay_nodes(cfg, "healthy_200g")
    got = _by_key(run_checks(cfg, nodes, show_progress=False))
    link = got[("link", "spark-02 -> spark-01")]
    # both halves at once, each to the peer's matching half: 92.57 + 97.28 Gb/s against
    # the two halves' ~200 (against the devices' 2 x 200 it would read 47%)
    assert link.summary == "95% of 2 PCIe x4 halves' ~200 Gb/s"
    assert "both rails at once: rocep1s0f0 92.6 Gb/s, roceP2p1s0f0 97.3 Gb/s" in link.evidence
    assert "rocep1s0f0 reports 200 Gb/s (ibstat)" in link.evidence
    assert link.data["ceiling_gbps"] == 200 and link.data["reported_gbps"] == 400
    assert link.data["measured_gbps"] == pytest.approx(189.85, abs=0.01)
    # the servers on spark-01's halves, each on its own port; both clients from spark-02
    ran = nodes["spark-01"].commands
    assert "ib_write_bw -d rocep1s0f0 -p 5800 -D 5 -F --report_gbits" in ran
    assert "ib_write_bw -d roceP2p1s0f0 -p 5801 -D 5 -F --report_gbits" in ran
    assert all(not n.alive for n in nodes.values())
    speed = got[("link_speed", "spark-01")]
    assert speed.summary == ("enp1s0f0np0 200 Gb/s (ibstat Rate; ethtool printed no Speed), "
                             "enP2p1s0f0np0 200 Gb/s (ibstat Rate; ethtool printed no Speed)")


def test_no_perftest_says_what_to_install_and_measures_nothing(tmp_path):
    cfg = scenario_cfg(tmp_path, "no_perftest")
    nodes = replay_nodes(cfg, "no_perftest")
    report = run_checks(cfg, nodes, show_progress=False)
    link = _by_key(report)[("link", "spark-02 -> spark-01")]
    assert link.summary == ("not measured: ib_write_bw (perftest) is not installed on "
                            "spark-02, spark-01")
    assert "notebook 02's NIXL probe" in link.fix and link.data["measured_gbps"] is None
    assert not report.failed  # notebooks 02-04 still run
    assert not any(c.startswith("ib_write_bw") for n in nodes.values() for c in n.commands)
    assert not any(n.alive for n in nodes.values())


def test_changed_host_key_says_what_was_seen_and_the_fix_once(spark_cfg):
    got = _by_key(run_checks(spark_cfg, replay_nodes(spark_cfg, "host_key_changed"),
                             show_progress=False))[("ssh", "spark-02")]
    assert got.evidence == ("node spark-02 (lab@192.168.1.12:22): the host key CHANGED since "
                            "it was recorded in ~/.ssh/known_hosts.")
    assert got.fix.startswith("If the node was reinstalled, remove the old key with "
                              "`ssh-keygen -R '192.168.1.12' -f ~/.ssh/known_hosts`")


def test_token_file_fixes_quote_the_path(tmp_path):
    from lab_utils.checks import software
    from lab_utils.checks.frame import Context
    from lab_utils.cluster import Cluster
    from lab_utils.config import read_secret_file
    from lab_utils.errors import LabError

    token = tmp_path / "my tokens" / "hf token"
    token.parent.mkdir()
    token.write_text("hf_x\n")
    token.chmod(0o644)
    data = profile_data()
    data["model"].update(source="hub", name="org/model", path=None)
    data["hf_token_file"] = str(token)
    cfg = parse_config(data)
    quoted = f"chmod 600 '{token}'"
    assert quoted in software.check_hf_token(Context(Cluster(cfg)))[0].fix
    with pytest.raises(LabError) as e:
        read_secret_file(cfg, cfg.hf_token_file, "HF token")
    assert quoted in str(e.value)
    token.unlink()  # a missing file is not named: it may be the token itself, pasted there
    missing = software.check_hf_token(Context(Cluster(cfg)))[0]
    assert "does not exist" in missing.summary and str(token) not in missing.summary + missing.fix


def test_replayed_commands_are_the_recorded_ones(spark_cfg):
    from lab_utils.cluster import Cluster

    nodes = replay_nodes(spark_cfg)
    with Cluster(spark_cfg, nodes) as cluster:  # a cluster of replaying nodes, passed down
        run_checks(cluster, show_progress=False)
    ran = set(nodes["spark-01"].commands)
    for cmd in ("nvidia-smi", "ibdev2netdev", "ibv_devinfo", "ethtool enp1s0f1np1"):
        assert cmd in ran
    assert ("ib_write_bw -d rocep1s0f1 -p 5800 -D 5 -F --report_gbits 192.168.100.10"
            in nodes["spark-02"].commands)
    # nothing the check started is left running on any node
    assert all(not n.alive for n in nodes.values())


def test_model_snapshots_differ(spark_cfg):
    nodes = replay_nodes(spark_cfg, snapshots={"spark-01": "aaaa", "spark-02": "bbbb"})
    got = _by_key(run_checks(spark_cfg, nodes, show_progress=False))
    assert got[("model", "cluster")].status == "fail"
    assert "model.revision" in got[("model", "cluster")].fix


def _rails(*pairs: tuple[float | None, float | None]) -> list[dict]:
    return [{"device": f"dev{i}", "gbps": g, "reported_gbps": r} for i, (g, r) in enumerate(pairs)]


def test_link_verdict_judges_one_rail_by_its_pcie_half():
    # healthy halves: 92.57 and 97.28 Gb/s recorded (playbook), behind a port at 200
    for gbps in (92.57, 97.28):
        assert rdma.link_verdict("a -> b", _rails((gbps, 200)), "seen").status == "pass"
    assert rdma.link_verdict("a -> b", _rails((92.5, 100)), "seen").status == "pass"
    # the degraded state reported on healthy-looking 200G links: 8-25 Gb/s
    for gbps in (8.0, 13.23, 25.0):
        slow = rdma.link_verdict("a -> b", _rails((gbps, 200)), "seen")
        assert slow.status == "warn" and "reboot" in slow.fix
    assert rdma.link_verdict("a -> b", _rails((10.0, 200)), "seen").summary == (
        "moves 10% of one PCIe x4 half's ~100 Gb/s")
    # no rate known: still the half's ceiling; a device slower than a half: its rate
    assert rdma.link_verdict("a -> b", _rails((20.0, None)), "seen").status == "warn"
    assert rdma.link_verdict("a -> b", _rails((22.0, 25)), "seen").summary == (
        "88% of the reported 25 Gb/s")


def test_link_verdict_judges_both_rails_together():
    """NVIDIA's guide: both halves at once, 92.57 + 97.28 Gb/s (recorded); against the two
    halves' ~200 Gb/s. One degraded half pulls the pair under 80%; a half with no result
    fails, naming it."""
    both = rdma.link_verdict("a -> b", _rails((92.57, 200), (97.28, 200)), "seen")
    assert both.status == "pass" and both.summary == "95% of 2 PCIe x4 halves' ~200 Gb/s"
    assert both.data["measured_gbps"] == pytest.approx(189.85) and both.data["rails"] == 2
    one_slow = rdma.link_verdict("a -> b", _rails((92.57, 200), (13.23, 200)), "seen")
    assert one_slow.status == "warn" and one_slow.summary == "moves 53% of 2 PCIe x4 halves' ~200 Gb/s"
    lost = rdma.link_verdict("a -> b", _rails((92.57, 200), (None, 200)), "seen")
    assert lost.status == "fail" and "dev1" in lost.summary


def test_rails_warn_on_a_half_without_ipv4():
    from lab_utils.checks import parsers

    rows = parsers.ibdev2netdev((REC / "ibdev2netdev.gb10.one-cable-port1.txt").read_text())
    addrs = parsers.ip_addr((REC / "ip-addr-show.gb10.txt").read_text())
    chosen = [r for r in rows if r["state"] == "Up"]
    assert rdma.rails_verdict("spark-01", chosen, rows, addrs).status == "pass"
    # constructed: no recording shows a half without IPv4, so the recorded one loses its own
    addrs["enP2p1s0f1np1"]["ipv4"] = []
    got = rdma.rails_verdict("spark-01", chosen, rows, addrs)
    assert got.status == "warn" and got.summary.startswith("no IPv4 address on enP2p1s0f1np1")
    assert "enP2p1s0f1np1: {addresses:" in got.fix and "netplan apply" in got.fix


def test_cuda_build_fix_clears_the_nodes_venv():
    from lab_utils.checks.gpu import install_line

    assert install_line("/home/lab/spark-disagg-lab/.venv/bin/python") == (
        "python3 -m venv --clear /home/lab/spark-disagg-lab/.venv && "
        "/home/lab/spark-disagg-lab/.venv/bin/pip install vllm==0.32.0 nixl==1.5.1")


def test_elf_needed_reads_what_readelf_lists():
    """On this machine's vllm (the CPU build): its extensions link libtorch, no libcudart."""
    import glob
    import os

    import vllm

    from lab_utils.on_node import facts

    so = glob.glob(os.path.join(os.path.dirname(vllm.__file__), "_C.abi3.so"))
    if not so:
        pytest.skip("no vllm/_C.abi3.so here")
    needed = facts.elf_needed(so[0])
    assert "libtorch.so" in needed and "libc.so.6" in needed
    assert not any(lib.startswith("libcudart") for lib in needed)
    assert facts.python_facts()["vllm_cudart"] is None
    assert facts.elf_needed(__file__) == []  # not an ELF file


def test_a_warning_needs_a_fix():
    with pytest.raises(ValueError, match="needs a fix"):
        CheckResult("x", "n", "warn", "no fix given")


def test_text_and_json_render(spark_cfg):
    report = run_checks(spark_cfg, replay_nodes(spark_cfg, "mtu1500"), show_progress=False)
    text = report.text()
    assert "WARN  memlock         spark-01" in text and "fix:  let lab lock memory" in text
    assert "PASS  mtu" in text and "about 6% less per rail" in text  # informational
    data = json.loads(json.dumps(report.to_dict()))
    assert data["counts"]["warn"] >= 2 and data["failed"] is False


@pytest.mark.slow
def test_rehearsal_port_taken(test_cfg):
    port = test_cfg.vllm.decode.port
    holder = subprocess.Popen(  # another process holds the decode instance's port
        [sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
         # SO_REUSEADDR: an earlier engine's TIME_WAIT connections must not block the bind
         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
         f"s.bind(('127.0.0.3', {port})); s.listen(); print('ready', flush=True); "
         "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        report = run_checks(test_cfg, show_progress=False)
    finally:
        holder.kill()
        holder.wait()
    bad = [r for r in report.results if r.check == "ports" and r.status == "fail"]
    assert len(bad) == 1 and f"127.0.0.3:{port}" in bad[0].summary
    assert "spark-02" in bad[0].summary and f"PID {holder.pid}" in bad[0].evidence
    assert report.failed
    # the other ports' listeners and the link check's sink were stopped and forgotten (the
    # whole checklist passing on the rehearsal: notebook 00 in tests/system/test_series.py)
    from lab_utils.cluster import Cluster

    assert Cluster(test_cfg).running() == []


def test_memory_check_uses_the_plan_with_the_nixl_host_mirror(spark_cfg):
    """At 0.6 with kv_buffer_device "cpu", the host copy of the KV cache does not fit on a
    recorded Spark: a fail naming a utilization that fits (0.45 does)."""
    for role in ("baseline", "replica", "prefill", "decode"):
        getattr(spark_cfg.vllm, role).gpu_memory_utilization = 0.6
    got = _by_key(run_checks(spark_cfg, replay_nodes(spark_cfg), show_progress=False))
    mem = got[("memory", "spark-01")]
    assert mem.status == "fail" and "do not fit" in mem.summary
    assert "gpu_memory_utilization 0.52" in mem.fix and "kv-cache-memory-bytes" in mem.fix


def test_memlock_fails_below_what_nixl_registers():
    """The verdict on `ulimit -l` answers (constructed strings: the shell prints a number of
    KiB or "unlimited") against what NIXL registers; n/a where NIXL does not use RDMA."""
    assert nixl.memlock_verdict("spark-01", "unlimited\n").status == "pass"
    low = nixl.memlock_verdict("spark-01", "8192\n", 36 * 2**30, "a host copy", "lab")
    assert low.status == "fail" and "8192 KiB" in low.summary
    assert "limits.d" in low.fix and "lab soft memlock" in low.fix and "LimitMEMLOCK" in low.fix
    assert nixl.memlock_verdict("spark-01", "8192\n", None, "no config.json").status == "fail"
    enough = nixl.memlock_verdict("spark-01", f"{64 * 2**20}\n", 36 * 2**30, "a host copy")
    assert enough.status == "pass"
    assert nixl.memlock_verdict("spark-01", None).status == "warn"


def test_memlock_needs_the_kv_host_copy_on_the_recorded_pair(tmp_path):
    """On the recorded two-Spark profile (Qwen3-8B, kv_buffer_device "cpu"), what NIXL
    registers is the instance's host copy of the KV cache, as `serve`'s plan sizes it."""
    cfg = scenario_cfg(tmp_path, "memlock_default")
    report = run_checks(cfg, replay_nodes(cfg, "memlock_default"), show_progress=False)
    got = _by_key(report)[("memlock", "spark-01")]
    assert got.status == "fail" and "host copy of the KV cache" in got.evidence, got
    assert "ulimit -l: 8192" in got.evidence


def test_nixl_smoke_verdicts():
    """The smoke test's verdicts on its answer line and UCX_PROTO_INFO's tables (the
    rehearsal's real tcp/lo output shape; an RDMA table as UCX prints it, hand-written:
    no GB10 recording of one exists)."""
    env = {"UCX_TLS": "^sm,cma", "UCX_PROTO_INFO": "y", "UCX_NET_DEVICES": "rocep1s0f1:1"}
    ok = 'NIXL_SMOKE {"ok": true, "stage": "done", "error": null, "bytes": 1048576, "seconds": 0.01}'

    def table(config: str) -> str:
        return "\n".join(f"[1.0] [spark:1:0]   {line}" for line in (
            "+--------+-------------+------------+", "| a intra-node cfg#1 |",
            "| remote memory read by ucp_get*(multi) into host memory from host |",
            "+--------+-------------+------------+", "| Range  | Description | Config |",
            "+--------+-------------+------------+", f"| 0..inf | zero-copy | {config} |",
            "+--------+-------------+------------+")) + "\n"

    rdma_ok = nixl.nixl_verdict("spark-01", 0, table("rc_mlx5/rocep1s0f1:1") + ok, env, rdma=True)
    assert rdma_ok.status == "pass" and "rc_mlx5/rocep1s0f1:1" in rdma_ok.evidence
    tcp = nixl.nixl_verdict("spark-01", 0, table("tcp/enp1s0f1np1") + ok, env, rdma=True)
    assert tcp.status == "warn" and "not over RDMA" in tcp.summary
    assert nixl.nixl_verdict("local", 0, table("tcp/lo") + ok, env, rdma=False).status == "pass"
    # UCX's C stdio can hand the pipe a block that ends mid-line just before the answer
    glued = table("tcp/lo")[:-20] + ok + "\n" + table("tcp/lo")
    assert nixl.nixl_verdict("local", 0, glued, env, rdma=False).status == "pass"
    bad = ('NIXL_SMOKE {"ok": false, "stage": "agent", "error": "nixlBackendError: '
           'NIXL_ERR_BACKEND", "bytes": 1048576, "seconds": null}')
    failed = nixl.nixl_verdict("spark-01", 0, bad, env, rdma=True)
    assert failed.status == "fail" and "NIXL_ERR_BACKEND" in failed.summary
    assert "ulimit -l" in failed.fix and "UCX_TLS" in failed.fix
    assert nixl.nixl_verdict("spark-01", 139, "Segmentation fault", env, rdma=True).status == "fail"


def test_nixl_smoke_runs_for_real_on_the_local_node(test_cfg):
    """The smoke test on the rehearsal's local node: the venv's nixl with its own UCX
    moves 1 MiB between two agents (over TCP here: shared memory is left out)."""
    from lab_utils.checks.frame import Context
    from lab_utils.cluster import Cluster

    with Cluster(test_cfg) as cluster:
        got = nixl.check_nixl(Context(cluster))
    assert got and all(r.status == "pass" for r in got), got
    assert all("moved 1024 KiB" in r.summary and "UCX chose tcp/" in r.evidence for r in got)


def test_token_check_refuses_what_serve_refuses(tmp_path, monkeypatch):
    """The checklist and `serve` apply one rule to the token file: a file others can read
    fails (it no longer merely warns), with the chmod fix quoted."""
    from types import SimpleNamespace

    from lab_utils.checks import software
    from lab_utils.config import DEFAULT_PROFILE, parse_config

    token = tmp_path / "my token"
    token.write_text("hf_x_canary\n")
    token.chmod(0o644)
    data = json.loads(DEFAULT_PROFILE.read_text())
    data["model"].update(source="hub", name="org/model", path=None)
    data["hf_token_file"] = str(token)
    ctx = SimpleNamespace(cfg=parse_config(data))
    [r] = software.check_hf_token(ctx)
    assert r.status == "fail" and r.fix == f"chmod 600 '{token}'"
    token.chmod(0o600)
    [r] = software.check_hf_token(ctx)
    assert r.status == "pass" and "hf_x_canary" not in r.summary


def test_checklist_view_puts_fails_first_and_collapses_n_a():
    from lab_utils.checks import views

    report = ChecklistReport([
        CheckResult("ssh", "spark-01", "pass", "reached"),
        CheckResult("gpu", "controller", "n/a", "no GPU role"),
        CheckResult("mtu", "spark-01", "warn", "MTU 1500", fix="set MTU 9000"),
        CheckResult("rdma", "controller", "n/a", "not a serving node"),
        CheckResult("cuda_build", "spark-02", "fail", "cu129 torch", fix="install cu130"),
        CheckResult("ports", "spark-02", "pass", "free")])
    frame = views.checklist_frame(report)
    assert list(frame["status"]) == ["fail", "warn", "pass", "pass", "n/a"]
    assert frame["check"].iloc[-1] == "2 n/a"
    assert "gpu (controller), rdma (controller)" in frame["summary"].iloc[-1]
    assert len(views.checklist_frame(report, show_na=True)) == 6
    assert views.tally(report) == ("6 results: 1 fail, 1 warn, 2 pass, 2 n/a "
                                   "(NOT blessed: fix the failures first)")


def test_a_node_with_no_instance_says_so_not_zero_gib(spark_cfg):
    got = _by_key(run_checks(spark_cfg, replay_nodes(spark_cfg), show_progress=False))
    ctl = got[("memory", "controller")]
    assert ctl.status == "pass" and "no vLLM instance is planned on this node" in ctl.summary
    assert "0.0 GiB" not in ctl.summary
    assert "plan needs" in got[("memory", "spark-01")].summary


def test_data_ifname_is_checked_against_the_recorded_interfaces():
    """On the recorded `ip addr show` and ibdev2netdev (cable in port 1): the interface NCCL
    and Gloo get must exist, be up, hold data_address and be a half of data_netdev."""
    from types import SimpleNamespace

    from lab_utils.checks import parsers
    from lab_utils.checks.rdma import ifname_verdict

    addrs = parsers.ip_addr((REC / "ip-addr-show.gb10.txt").read_text())
    rows = parsers.ibdev2netdev((REC / "ibdev2netdev.gb10.one-cable-port1.txt").read_text())
    chosen = [r for r in rows if r["ibdev"] in ("rocep1s0f1", "roceP2p1s0f1")]

    def verdict(ifname: str, address: str):
        return ifname_verdict("spark-02", SimpleNamespace(data_ifname=ifname, data_address=address),
                              chosen, addrs)

    assert verdict("enp1s0f1np1", "192.168.200.13").status == "pass"
    gone = verdict("enp9s0", "192.168.200.13")
    assert gone.status == "fail" and "does not exist" in gone.summary
    assert 'data_ifname to "enp1s0f1np1"' in gone.fix  # the half that holds the address
    other = verdict("enp1s0f0np0", "192.168.100.11")  # holds it, but on the port not cabled
    assert other.status == "fail" and "not a netdev of data_netdev" in other.summary
    assert verdict("enp1s0f1np1", "192.168.100.11").summary == "enp1s0f1np1 does not hold 192.168.100.11"
    assert verdict("enp1s0f1np1", "192.168.200.13").status == "pass"
    assert ifname_verdict("spark-02", SimpleNamespace(data_ifname="x", data_address="y"),
                          chosen, None).status == "warn"


def _allreduce(tmp_path, kind: str):
    cfg = tp_cfg(tmp_path)
    nodes = replay_nodes(cfg)
    for node in nodes.values():
        node.allreduce = kind
    got = _by_key(run_checks(cfg, nodes, show_progress=False))
    return got[("collective", "spark-01 / spark-02")], nodes


def test_the_all_reduce_runs_as_the_ranks_will_and_says_nccls_network(tmp_path):
    check, nodes = _allreduce(tmp_path, "rdma")
    assert check.status == "pass", check
    assert "all-reduce across the nodes (nccl): 8 KiB in 0.05 ms; 16 MiB in 1.90 ms" in check.summary
    assert "spark-02: nccl over IB (rocep1s0f1:1, roceP2p1s0f1:1)" in check.evidence
    # each rank with its environment: the data-plane interface, the HCAs, NCCL's INFO lines,
    # and rank 0's rendezvous from the config
    (argv, env), = [(a, e) for a, e in nodes["spark-02"].envs.items()
                    if a.split()[-7:-5] == ["allreduce", "1"]]
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"
    assert env["NCCL_SOCKET_IFNAME"] == "=enp1s0f1np1" and env["NCCL_DEBUG"] == "INFO"
    assert "allreduce 1 2 192.168.100.10:29500 nccl" in argv
    assert "check-allreduce" not in " ".join(r.name for r in nodes["spark-01"].state.records())


def test_an_all_reduce_over_sockets_warns_and_a_queue_pair_timeout_fails_with_its_fix(tmp_path):
    check, _ = _allreduce(tmp_path, "sockets")
    assert check.status == "warn" and "did not use RDMA" in check.summary
    assert "nccl over Socket (enp1s0f1np1:192.168.100.11)" in check.evidence
    check, _ = _allreduce(tmp_path / "qp", "qp_timeout")
    assert check.status == "fail" and "did not complete" in check.summary
    assert check.evidence.startswith("nccl_queue_pair_timeout:")
    assert "collective check" in check.fix


def test_nccls_own_device_order_is_compared_across_the_nodes(tmp_path):
    check, _ = _allreduce(tmp_path, "swapped")
    assert check.status == "fail" and "different order" in check.summary
    assert "spark-02: roceP2p1s0f1:1, rocep1s0f1:1" in check.evidence
    assert "one half" in check.fix


def test_the_ranks_answer_is_found_after_anothers_unfinished_line():
    from lab_utils.checks.collective import _answer

    glued = ('spark-01:1:1 [0] NCCL INFO NET/IB : Using [0]roc{"rank": 0, "backend": "nccl", '
             '"sizes": []}')
    assert _answer(glued) == {"rank": 0, "backend": "nccl", "sizes": []}


def test_the_all_reduce_is_not_tried_without_a_split_model(spark_cfg):
    got = _by_key(run_checks(spark_cfg, replay_nodes(spark_cfg), show_progress=False))
    assert got[("collective", "cluster")].status == "n/a"
