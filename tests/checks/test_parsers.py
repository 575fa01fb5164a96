"""Tests for lab_utils.checks.parsers (and tests/support/parsers_extra.py) on the recorded
DGX Spark (GB10) outputs.

Every golden value below was read off a recording in tests/fixtures/dgx-spark-recorded/
(sources in its SOURCES.md); the few hand-written snippets are marked as such and only
cover branches the recordings never reach (a discrete GPU's memory column, a header line).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab_utils.checks import parsers
from lab_utils.on_node import facts

from support import parsers_extra as extra

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "dgx-spark-recorded"
CX7 = ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1")
CX7_NETDEVS = ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- nvidia-smi

# file -> (driver, persistence mode, processes as (pid, type, name, MiB), or None if absent)
SMI_TABLES = {
    "nvidia-smi.gb10.txt": ("580.95.05", "On", []),
    "nvidia-smi.gb10.in-k8s-pod.txt": ("580.95.05", "On", []),
    "nvidia-smi.gb10.k8s-pod.abridged.driver-580.173.02.txt": ("580.173.02", "On", None),
    "nvidia-smi.gb10.spark-7d19.txt": (
        "580.95.05",
        "On",
        [
            (4174, "G", "/usr/lib/xorg/Xorg", 84),
            (4399, "G", "/usr/bin/gnome-shell", 125),
            (4761, "G", ".../7182/usr/lib/firefox/firefox", 273),
        ],
    ),
    "nvidia-smi.gb10.with-gui-processes.driver-580.82.09.txt": (
        "580.82.09",
        "Off",
        [
            (3405, "G", "/usr/lib/xorg/Xorg", 242),
            (3562, "G", "/usr/bin/gnome-shell", 53),
            (214921, "C", ".../envs/rapids-25.10/bin/python", 196),
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(SMI_TABLES))
def test_nvidia_smi_summary_recordings(name: str) -> None:
    driver, persistence, processes = SMI_TABLES[name]
    summary = parsers.nvidia_smi_summary(recorded(name))
    assert summary["driver_version"] == driver
    assert summary["cuda_version"] == "13.0"
    assert summary["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA GB10",
            "persistence_mode": persistence,
            "bus_id": "0000000F:01:00.0",
            "memory_used_mib": None,  # GB10 prints "Not Supported"
            "memory_total_mib": None,
        }
    ]
    if processes is None:
        assert summary["processes"] is None
    else:
        got = [(p["pid"], p["type"], p["name"], p["memory_mib"]) for p in summary["processes"]]
        assert got == processes
        assert all(p["gpu"] == 0 for p in summary["processes"])


def test_nvidia_smi_summary_reads_memory_of_a_discrete_gpu() -> None:
    # hand-written in the same layout: GB10 never prints numbers in this column
    row = (
        "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |"
        "                    0 |\n"
        "| N/A   31C    P0             70W /  700W  |    1234MiB /  81559MiB |"
        "      0%      Default |\n"
    )
    (gpu,) = parsers.nvidia_smi_summary(row)["gpus"]
    assert (gpu["name"], gpu["memory_used_mib"], gpu["memory_total_mib"]) == (
        "NVIDIA H100 80GB HBM3",
        1234,
        81559,
    )


# The header line only, NOT a GB10 recording: copied from a B200's `nvidia-smi` on driver
# 610.43.02 in https://github.com/sgl-project/sglang/issues/27487 (as the issues index
# returned it). Drivers 610+ print "KMD Version" / "CUDA UMD Version" where DGX Spark's 580
# prints "Driver Version" / "CUDA Version"; no full GB10 output on a 610 driver was found.
SMI_R610_HEADER = (
    "| NVIDIA-SMI 610.43.02              KMD Version: 610.43.02     CUDA UMD Version: 13.3"
    "     |\n"
)


def test_nvidia_smi_summary_reads_the_r610_header() -> None:
    summary = parsers.nvidia_smi_summary(SMI_R610_HEADER)
    assert (summary["driver_version"], summary["cuda_version"]) == ("610.43.02", "13.3")


def test_nvidia_smi_summary_of_unrelated_text() -> None:
    summary = parsers.nvidia_smi_summary("bash: nvidia-smi: command not found\n")
    assert summary == {
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "processes": None,
    }


def test_nvidia_smi_csv_memory_is_na_on_gb10() -> None:
    text = recorded("nvidia-smi-query-gpu.name-memory.total-free-used-temp-power.csv.gb10.txt")
    (row,) = parsers.nvidia_smi_csv(text)
    assert row == {
        "name": "NVIDIA GB10",
        "memory.total": None,
        "memory.free": None,
        "memory.used": None,
        "temperature.gpu": "39",
        "power.draw": "3.74 W",
    }


def test_nvidia_smi_csv_driver_version() -> None:
    text = recorded("nvidia-smi-query-gpu.name-driver_version.csv.gb10.txt")
    assert parsers.nvidia_smi_csv(text) == [{"name": "NVIDIA GB10", "driver_version": "580.173.02"}]
    # the field list given: the header line is recognised and skipped
    assert parsers.nvidia_smi_csv(text, "name,driver_version") == parsers.nvidia_smi_csv(text)


def test_nvidia_smi_csv_noheader_needs_fields() -> None:
    text = recorded("nvidia-smi-query-gpu.compute_cap.csv-noheader.gb10.txt")
    assert parsers.nvidia_smi_csv(text, ["compute_cap"]) == [{"compute_cap": "12.1"}]
    assert parsers.nvidia_smi_csv(text) == []  # the only line was taken as the header


def test_nvidia_smi_compute_apps_without_header() -> None:
    text = recorded("nvidia-smi-query-compute-apps.gb10.abridged.txt")
    assert parsers.nvidia_smi_compute_apps(text) == [
        {"pid": 1527324, "process_name": "VLLM::EngineCore", "used_memory_mib": 10468},
        {"pid": 1527352, "process_name": "VLLM::EngineCore", "used_memory_mib": 10468},
    ]


def test_nvidia_smi_compute_apps_with_header_and_na() -> None:
    # the recorded rows behind nvidia-smi's usual header, plus an N/A row (hand-written)
    text = (
        "pid, process_name, used_gpu_memory [MiB]\n"
        + recorded("nvidia-smi-query-compute-apps.gb10.abridged.txt")
        + "42, python3, [N/A]\n"
    )
    apps = parsers.nvidia_smi_compute_apps(text)
    assert [a["pid"] for a in apps] == [1527324, 1527352, 42]
    assert apps[-1]["used_memory_mib"] is None


# --------------------------------------------------------------------------- CUDA builds
# (pip show and collect_env are read by tests/support/parsers_extra.py, for ReplayNode)


def test_pip_show_version_in_notebook_formatted_and_raw_output() -> None:
    text = recorded("pip-show-vllm.grep-Version.gb10-pair.notebook-formatted.txt")
    assert extra.pip_show_version(text) == "0.13.0+cu130"
    assert extra.pip_show_version("Name: vllm\nVersion: 0.13.0+cu130\nSummary: x\n") == (
        "0.13.0+cu130"
    )
    assert extra.pip_show_version("WARNING: Package(s) not found: vllm\n") is None


def test_collect_env_shows_a_cu129_torch_on_gb10() -> None:
    env = extra.collect_env(recorded("vllm-collect_env.gb10.torch-cu129.excerpt.txt"))
    assert env["torch_version"] == "2.9.1+cu129"
    assert env["cuda_used_to_build"] == "12.9"
    assert env["cuda_available"] == "True"
    assert env["os"] == "Ubuntu 24.04.3 LTS (aarch64)"
    assert env["python_version"].startswith("3.12.3 ")
    assert env["clang_version"] is None  # "Could not collect"
    assert env["rocm_used_to_build_pytorch"] is None  # "N/A"
    assert parsers.cuda_major_of_build(env["torch_version"]) == 12


def _torch_version_from_notebook_script() -> str:
    text = recorded("torch-cuda-config.gb10.notebook-script.txt")
    return re.search(r"^PyTorch version: (\S+)", text, re.MULTILINE).group(1)


@pytest.mark.parametrize(
    ("version", "major"),
    [
        (
            extra.pip_show_version(
                recorded("pip-show-vllm.grep-Version.gb10-pair.notebook-formatted.txt")
            ),
            13,
        ),
        (_torch_version_from_notebook_script(), 13),  # "2.9.0+cu130"
        ("2.9.1+cu129", 12),
        ("2.1.0+cu118", 11),
        ("2.9.0+cpu", None),
        ("0.13.0", None),
        ("2.9.0a0+50eac811a6.nv25.09", None),
        (None, None),
    ],
)
def test_cuda_major_of_build(version: str | None, major: int | None) -> None:
    assert parsers.cuda_major_of_build(version) == major


# --------------------------------------------------------------------------- RDMA devices

UP, DOWN = "Up", "Down"
IBDEV2NETDEV = {
    "ibdev2netdev.gb10.one-cable-port0.spark-5c2d.txt": (UP, DOWN, UP, DOWN),
    "ibdev2netdev.gb10.one-cable-port0.spark-bd26.txt": (UP, DOWN, UP, DOWN),
    "ibdev2netdev.gb10.one-cable-port1.txt": (DOWN, UP, DOWN, UP),
    "ibdev2netdev.gb10.three-spark-ring.all-up.txt": (UP, UP, UP, UP),
}


@pytest.mark.parametrize("name", sorted(IBDEV2NETDEV))
def test_ibdev2netdev_mapping_by_name(name: str) -> None:
    links = parsers.ibdev2netdev(recorded(name))
    by_ibdev = {link["ibdev"]: (link["netdev"], link["state"]) for link in links}
    expected = dict(zip(CX7, zip(CX7_NETDEVS, IBDEV2NETDEV[name], strict=True), strict=True))
    assert by_ibdev == expected
    assert {link["port"] for link in links} == {1}


def test_ibdev2netdev_order_differs_between_recordings() -> None:
    # the port1 recording lists roceP2* first: checks must look devices up by name
    first = parsers.ibdev2netdev(recorded("ibdev2netdev.gb10.one-cable-port1.txt"))[0]
    assert first["ibdev"] == "roceP2p1s0f0"


@pytest.mark.parametrize(
    ("name", "active_mtu"),
    [
        ("ibv_devinfo.gb10.mtu1500.txt", dict.fromkeys(CX7, 1024)),
        (
            "ibv_devinfo.gb10.mtu9000-on-enp1s0f0-f1.txt",
            {"rocep1s0f0": 4096, "rocep1s0f1": 4096, "roceP2p1s0f0": 1024, "roceP2p1s0f1": 1024},
        ),
    ],
)
def test_ibv_devinfo_active_mtu(name: str, active_mtu: dict[str, int]) -> None:
    devices = parsers.ibv_devinfo(recorded(name))
    assert list(devices) == list(CX7)
    assert {hca: dev["ports"][1]["active_mtu"] for hca, dev in devices.items()} == active_mtu
    for dev in devices.values():
        assert dev["fw_ver"] == "28.45.4028"
        assert dev["transport"] == "InfiniBand"
        port = dev["ports"][1]
        assert (port["state"], port["max_mtu"], port["link_layer"]) == (
            "PORT_ACTIVE",
            4096,
            "Ethernet",
        )


def test_ibstat_rate_100_on_every_ca() -> None:
    cas = parsers.ibstat(recorded("ibstat.gb10.txt"))
    assert sorted(cas) == sorted(CX7)
    for ca in cas.values():
        assert (ca["ca_type"], ca["firmware_version"]) == ("MT4129", "28.45.4028")
        port = ca["ports"][1]
        assert port["state"] == "Active"
        assert port["physical_state"] == "LinkUp"
        assert port["rate"] == 100
        assert port["link_layer"] == "Ethernet"


def test_ibstat_each_half_reports_the_ports_200() -> None:
    # a Dell Pro Max with GB10 cabled in port 0 at 200G: each PCIe half reports Rate 200,
    # though one half moves ~100 Gb/s at most (the link check compares with that)
    cas = parsers.ibstat(recorded("ibstat.gb10.dell-pro-max.port0-rate200.excerpt.txt"))
    assert {n: (c["ports"][1]["state"], c["ports"][1]["rate"]) for n, c in cas.items()} == {
        "roceP2p1s0f0": ("Active", 200),
        "roceP2p1s0f1": ("Down", 40),
        "rocep1s0f0": ("Active", 200),
    }


# --------------------------------------------------------------------------- IP links


def test_ip_link_show_all() -> None:
    links = parsers.ip_link(recorded("ip-link-show.gb10.mtu1500.txt"))
    assert list(links)[:3] == ["lo", "enP7s7", "enp1s0f0np0"]
    for ifname in CX7_NETDEVS:
        assert links[ifname]["mtu"] == 1500
        assert links[ifname]["state"] == "UP"
        assert {"UP", "LOWER_UP"} <= links[ifname]["flags"]
    assert links["enp1s0f0np0"]["mac"] == "30:c5:99:3e:6a:13"
    assert links["enP7s7"]["state"] == "DOWN"
    assert "NO-CARRIER" in links["enP7s7"]["flags"]
    assert links["lo"]["mtu"] == 65536
    assert links["tailscale0"]["mac"] is None
    assert links["tailscale0"]["link_type"] == "none"
    assert links["wlP9s9"]["state"] == "UP"  # "state UP mode DORMANT"


@pytest.mark.parametrize(
    ("name", "ifname", "index", "mac"),
    [
        ("ip-link-show.enp1s0f0np0.gb10.mtu9000.txt", "enp1s0f0np0", 3, "30:c5:99:3e:6a:13"),
        ("ip-link-show.enp1s0f1np1.gb10.mtu9000.txt", "enp1s0f1np1", 4, "30:c5:99:3e:6a:14"),
    ],
)
def test_ip_link_show_one_interface(name: str, ifname: str, index: int, mac: str) -> None:
    assert parsers.ip_link(recorded(name)) == {
        ifname: {
            "index": index,
            "mtu": 9000,
            "state": "UP",
            "flags": {"BROADCAST", "MULTICAST", "UP", "LOWER_UP"},
            "mac": mac,
            "link_type": "ether",
        }
    }


def test_ip_addr_show_ipv4_of_every_connectx7_netdev() -> None:
    addrs = parsers.ip_addr(recorded("ip-addr-show.gb10.txt"))
    assert {n: addrs[n]["ipv4"] for n in CX7_NETDEVS} == {
        "enp1s0f0np0": ["192.168.100.11/24"],
        "enp1s0f1np1": ["192.168.200.13/24"],
        "enP2p1s0f0np0": ["192.168.100.15/24"],
        "enP2p1s0f1np1": ["192.168.200.17/24"],
    }
    assert addrs["enP7s7"]["ipv4"] == [] and addrs["enP7s7"]["state"] == "DOWN"
    assert addrs["tailscale0"]["ipv4"] == ["100.116.56.45/32"]
    assert addrs["tailscale0"]["mac"] is None  # link/none
    assert len(addrs["wlP9s9"]["ipv6"]) == 4
    assert addrs["enp1s0f0np0"]["mtu"] == 1500


def test_ibdev2netdev_netdevs_exist_in_ip_link() -> None:
    links = parsers.ip_link(recorded("ip-link-show.gb10.mtu1500.txt"))
    mapping = parsers.ibdev2netdev(recorded("ibdev2netdev.gb10.three-spark-ring.all-up.txt"))
    assert {m["netdev"] for m in mapping} <= set(links)


@pytest.mark.parametrize(
    ("name", "mbps"),
    [
        ("ethtool.grep-Speed.enp1s0f1np1.gb10.via-switch.before-fix.txt", 100000),
        ("ethtool.grep-Speed.enP2p1s0f1np1.gb10.via-switch.before-fix.txt", 100000),
        ("ethtool.grep-Speed.enp1s0f1np1.gb10.via-switch.200G.txt", 200000),
        ("ethtool.grep-Speed.enP2p1s0f1np1.gb10.via-switch.200G.txt", 200000),
    ],
)
def test_ethtool_speed(name: str, mbps: int) -> None:
    assert parsers.ethtool_speed_mbps(recorded(name)) == mbps


def test_ethtool_speed_unknown() -> None:
    assert parsers.ethtool_speed_mbps("\tSpeed: Unknown!\n") is None
    assert parsers.ethtool_speed_mbps("") is None


# --------------------------------------------------------------------------- memory

GIB, MIB, KIB = 1024**3, 1024**2, 1024


def test_proc_meminfo() -> None:
    info = parsers.proc_meminfo(recorded("proc-meminfo.head-20.gb10.txt"))
    assert len(info) == 20
    assert info["MemTotal"] == 125511968 * KIB
    assert info["MemAvailable"] == 112483768 * KIB
    assert info["Active(anon)"] == 6795344 * KIB
    assert info["SwapTotal"] == 0


def test_one_meminfo_parser_for_every_user() -> None:
    """The checklist's parser is the node-side one the serving plan and the results use."""
    text = recorded("proc-meminfo.head-20.gb10.txt")
    assert facts.proc_meminfo(text) == parsers.proc_meminfo(text)
    assert facts.mem_total_bytes(text) == 125511968 * KIB
    assert facts.mem_total_bytes("") is None
    assert facts.mem_total_bytes("MemFree:        69472388 kB\n") is None


# --------------------------------------------------------------------------- nixlbench (tests/support)

# file -> (seg type, device_list, rows, peak GB/s)
NIXLBENCH = {
    "nixlbench.gb10-pair.single-rail.DRAM.txt": ("DRAM", "rocep1s0f0", 11, 11.56331),
    "nixlbench.gb10-pair.dual-rail.DRAM.txt": ("DRAM", "all", 11, 13.17373),
    "nixlbench.gb10-pair.single-rail.VRAM.txt": ("VRAM", "rocep1s0f0", 10, 0.605174),
    "nixlbench.gb10-pair.dual-rail.VRAM.txt": ("VRAM", "all", 10, 0.580719),
}


@pytest.mark.parametrize("name", sorted(NIXLBENCH))
def test_nixlbench_recordings(name: str) -> None:
    seg_type, device_list, n_rows, peak = NIXLBENCH[name]
    result = extra.nixlbench(recorded(name))
    assert result["config"]["initiator_seg_type"] == seg_type
    assert result["config"]["target_seg_type"] == seg_type
    assert result["config"]["device_list"] == device_list
    assert result["config"]["backend"] == "UCX"
    assert result["config"]["etcd_endpoint"] == "http://192.168.100.11:2379"
    assert len(result["rows"]) == n_rows
    assert result["peak_bw_GBps"] == pytest.approx(peak)
    first = result["rows"][0]
    assert (first["block_size"], first["batch_size"]) == (65536, 1)
    assert set(first) == {
        "block_size", "batch_size", "bw_GBps", "avg_lat_us", "avg_prep_us", "p99_prep_us",
        "avg_post_us", "p99_post_us", "avg_tx_us", "p99_tx_us",
    }  # fmt: skip


def test_nixlbench_row_values() -> None:
    rows = extra.nixlbench(recorded("nixlbench.gb10-pair.single-rail.DRAM.txt"))["rows"]
    assert rows[-1] == {
        "block_size": 67108864,
        "batch_size": 1,
        "bw_GBps": 11.563310,
        "avg_lat_us": 5803.6,
        "avg_prep_us": 17.0,
        "p99_prep_us": 17.0,
        "avg_post_us": 0.5,
        "p99_post_us": 14.0,
        "avg_tx_us": 5802.7,
        "p99_tx_us": 5804.0,
    }
    # GB is 1e9 bytes: 64 MiB in 5803.6 us
    last = rows[-1]
    assert last["bw_GBps"] == pytest.approx(last["block_size"] / last["avg_lat_us"] / 1e3, rel=1e-3)


def test_nixlbench_vram_time_goes_to_posting() -> None:
    # from VRAM most of each transfer is spent before the wire (Avg Post), not on it (Avg Tx)
    rows = extra.nixlbench(recorded("nixlbench.gb10-pair.single-rail.VRAM.txt"))["rows"]
    assert all(r["avg_post_us"] > r["avg_tx_us"] for r in rows)


# --------------------------------------------------------------------------- link tests

# file suffix after "ib_write_bw.gb10-pair." -> device, mtu, unit, printed average, Gb/s
IB_WRITE_BW = [
    ("client.mtu1024.link1.txt", "rocep1s0f0", 1024, "MB/sec", 11031.60, 92.54),
    ("client.mtu1024.link2.txt", "rocep1s0f1", 1024, "MB/sec", 11031.78, 92.54),
    ("client.mtu4096.txt", "rocep1s0f0", 4096, "MB/sec", 11678.83, 97.97),
    ("report_gbits.rail1-rocep1s0f0.txt", "rocep1s0f0", 1024, "Gb/sec", 92.568, 92.568),
    ("report_gbits.rail2-roceP2p1s0f0.txt", "roceP2p1s0f0", 1024, "Gb/sec", 97.2817, 97.2817),
]


@pytest.mark.parametrize(("suffix", "device", "mtu", "unit", "printed", "gbps"), IB_WRITE_BW)
def test_ib_write_bw_recordings(
    suffix: str, device: str, mtu: int, unit: str, printed: float, gbps: float
) -> None:
    result = parsers.ib_write_bw(recorded(f"ib_write_bw.gb10-pair.{suffix}"))
    assert (result["device"], result["mtu"], result["unit"]) == (device, mtu, unit)
    assert result["link_type"] == "Ethernet"
    assert result["bw_avg_Gbps"] == pytest.approx(gbps, abs=0.01)
    if unit == "MB/sec":
        assert result["bw_avg_MBps"] == printed
    else:
        assert result["bw_avg_MBps"] * 1024**2 * 8 / 1e9 == pytest.approx(printed)
        assert len(result["rows"]) >= 5  # --run_infinitely prints one row per second


def test_ib_write_bw_mb_is_mebibyte() -> None:
    # MsgRate x message size reproduces the printed MB/sec only with MB = 2**20 bytes
    (row,) = parsers.ib_write_bw(recorded("ib_write_bw.gb10-pair.client.mtu1024.link1.txt"))["rows"]
    assert row["msg_rate_Mpps"] * 1e6 * row["bytes"] / 1024**2 == pytest.approx(
        row["bw_avg"], rel=1e-4
    )


EMPTY_RESULTS = [
    (parsers.nvidia_smi_csv, []),
    (parsers.nvidia_smi_compute_apps, []),
    (extra.pip_show_version, None),
    (extra.collect_env, {}),
    (parsers.ibdev2netdev, []),
    (parsers.ibv_devinfo, {}),
    (parsers.ibstat, {}),
    (parsers.ip_link, {}),
    (parsers.ip_addr, {}),
    (parsers.ethtool_speed_mbps, None),
    (parsers.proc_meminfo, {}),
]


@pytest.mark.parametrize(
    ("parse", "empty"), EMPTY_RESULTS, ids=lambda v: getattr(v, "__name__", "")
)
def test_parsers_survive_empty_and_foreign_text(parse, empty) -> None:
    assert parse("") == empty
    parse(recorded("nixl-err-backend.gb10.vllm-0.15.1.excerpt.txt"))  # must not raise


def test_link_test_parsers_on_empty_text() -> None:
    assert extra.nixlbench("") == {"config": {}, "rows": [], "peak_bw_GBps": None}
    assert parsers.ib_write_bw("")["bw_avg_Gbps"] is None
