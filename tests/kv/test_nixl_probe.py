"""The NIXL transfer probe (driver `lab_utils.kv.probe`, agent
`lab_utils.on_node.nixl_agent`): a real two-agent run on the rehearsal profile (target on
127.0.0.2, initiator on 127.0.0.3, both through the node layer), its clean-up, the errors
a user can meet (port taken, transport that cannot start), checksum verification, and
the statistics and fraction-of-limit arithmetic."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

from lab_utils.cluster import Cluster
from lab_utils.errors import LabError, PortInUseError
from lab_utils.kv.probe import (
    apply_limits,
    default_sizes,
    expected_rates,
    fraction_of_limit,
    run_probe,
)
from lab_utils.on_node import proctools
from lab_utils.on_node.nixl_agent import (
    KiB,
    MiB,
    block_crcs,
    blocks_checksum,
    combine_crcs,
    memcpy_bandwidth,
    summarize,
)
from lab_utils.results import calibration
from lab_utils.results.kv_transfer import ROW_KEYS, ProbeResult


@pytest.fixture
def cfg(test_cfg):
    """The test profile with a probe port free right now: other suites' checks also
    listen on the profile's probe port, and may run beside this one on a shared host."""
    with socket.create_server(("127.0.0.2", 0)) as s:
        test_cfg.kv_transfer.probe_port = s.getsockname()[1]
    return test_cfg


def _assert_clean(cfg) -> None:
    assert Cluster(cfg).running() == []
    target = cfg.probe_pair()[0]
    assert proctools.port_is_free(cfg.nodes[target].data_address, cfg.kv_transfer.probe_port)


# ----- real agents -------------------------------------------------------------------


@pytest.mark.slow
def test_probe_end_to_end_on_loopback(cfg):
    sizes = [64 * KiB, 100_000, 1 * MiB]  # 100 000 B is moved as two 64 KiB blocks
    r = run_probe(cfg, sizes, seg_types=("DRAM", "VRAM"), iterations=5, warmup=1,
                  show_progress=False)
    assert (r.target, r.initiator) == ("spark-01", "spark-02")
    assert (r.target_address, r.initiator_address) == ("127.0.0.2", "127.0.0.3")
    assert r.port == cfg.kv_transfer.probe_port and r.same_machine
    moved = [64 * KiB, 128 * KiB, 1 * MiB]
    assert sorted((row["bytes"], row["op"]) for row in r.rows) == sorted(
        (b, op) for b in moved for op in ("READ", "WRITE"))
    for row in r.rows:
        assert tuple(row) == ROW_KEYS
        assert row["seg_type"] == "DRAM" and row["iterations"] == 5
        assert row["checksum_ok"] is True
        assert row["bandwidth_GBps"] > 0
        assert row["bandwidth_Gbps"] == pytest.approx(8 * row["bandwidth_GBps"])
        assert 0 < row["p50_us"] <= row["p90_us"] <= row["p99_us"]
        assert row["limit_kind"] == "memcpy"
        assert row["limit_GBps"] == pytest.approx(r.memcpy_GBps[row["bytes"]])
        assert row["fraction_of_limit"] == pytest.approx(
            row["bandwidth_GBps"] / row["limit_GBps"])
    assert r.ok
    assert any("VRAM not applicable" in n and "no GPU" in n for n in r.notes)
    assert any("100000 -> 131072" in n for n in r.notes)
    assert r.env == {"target": {}, "initiator": {}}  # the rehearsal sets no UCX variables
    json.dumps(r.to_dict())
    assert list(r.to_frame(full=True).columns) == list(ROW_KEYS) and len(r.to_frame()) == 6
    shown = r.to_frame()  # what notebook 02 shows: units in the headers, a handful of columns
    assert list(shown.columns) == ["memory", "op", "size (MiB)", "descriptors", "median (ms)",
                                   "p99 (ms)", "GB/s", "limit (GB/s)", "limit is", "% of limit",
                                   "checksum ok"]
    assert set(shown["limit is"]) == {"a memory copy of that size on this machine (both agents "
                                      "here)"}
    assert (shown["median (ms)"] * 1e3 - r.to_frame(full=True)["median_us"]).abs().max() < 1
    # nothing left behind: no record, no process, the port free again
    _assert_clean(cfg)
    assert r.pids["target"] != r.pids["initiator"]
    assert all(proctools.gone(pid) for pid in r.pids.values())
    log = Path(cfg.log_dir_on("spark-01")) / "nixl-probe-target.log"
    assert "ready" in log.read_text()
    # its rate is recorded on the initiator's calibration record, for the next plan
    cal = calibration.load(cfg, "spark-02")
    assert cal.probe["DRAM"]["target"] == "spark-01" and cal.probe["DRAM"]["sizes"] == 3
    assert cal.probe["DRAM"]["GBps"] == pytest.approx(calibration.probe_rates(r.rows)["DRAM"]["GBps"])
    assert f"rates recorded for the next probe's plan: {calibration.path(cfg, 'spark-02')}" in r.notes
    assert expected_rates(cfg)[1].startswith("DRAM measured on spark-02, ")


@pytest.mark.slow
def test_transport_that_cannot_start_fails_with_the_log(cfg):
    """Shared-memory transports alone cannot start NIXL's UCX backend: the error names
    the target, carries its log tail and the known-failure fix, and nothing is left."""
    with pytest.raises(LabError) as e:
        run_probe(cfg, [64 * KiB], ucx_tls="shm", show_progress=False, timeout_s=60)
    msg = str(e.value)
    assert "NIXL probe target on node spark-01" in msg
    assert "NIXL_ERR_BACKEND" in msg and "UCX_TLS" in msg
    _assert_clean(cfg)


def test_port_in_use_names_port_and_node(cfg):
    port = cfg.kv_transfer.probe_port
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.2", port))
        s.listen()
        with pytest.raises(PortInUseError) as e:
            run_probe(cfg, [64 * KiB], show_progress=False)
    assert f"port {port}" in str(e.value) and "spark-01" in str(e.value)
    assert "NIXL probe" in str(e.value)
    assert Cluster(cfg).running() == []


def test_ucx_variables_come_from_config_and_overrides(cfg):
    from lab_utils.kv.probe import _ucx_env

    cfg.nodes["spark-01"].data_netdev = "rocep1s0f0:1,roceP2p1s0f0:1"
    cfg.kv_transfer.ucx_tls = "rc,cuda_copy"
    assert _ucx_env(cfg, "spark-01", None, None) == {
        "UCX_TLS": "rc,cuda_copy", "UCX_NET_DEVICES": "rocep1s0f0:1,roceP2p1s0f0:1"}
    assert _ucx_env(cfg, "spark-02", "tcp", {"spark-02": "lo"}) == {
        "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}


def test_invalid_arguments_are_refused_before_anything_starts(cfg):
    for kwargs in ({"seg_types": ("HBM",)}, {"ops": ("COPY",)}, {"iterations": 0}):
        with pytest.raises(ValueError):
            run_probe(cfg, [64 * KiB], show_progress=False, **kwargs)
    with pytest.raises(ValueError):
        run_probe(cfg, [0], show_progress=False)
    assert Cluster(cfg).running() == []


def test_target_ignores_connections_that_are_not_its_initiator():
    """A reachability check or scanner hitting the port must not take the initiator's
    place: the target closes it and keeps listening for the run's own initiator."""
    from lab_utils.on_node.nixl_agent import _accept_initiator, _send

    with socket.create_server(("127.0.0.2", 0)) as srv:
        addr = srv.getsockname()
        strangers = [socket.create_connection(addr) for _ in range(3)]
        strangers[0].sendall(b"GET / HTTP/1.0\r\n\r\n")  # garbage framing
        _send(strangers[1], {"run_id": "another-run"})
        strangers[2].close()  # connects and leaves
        mine = socket.create_connection(addr)
        _send(mine, {"run_id": "r1"})
        conn = _accept_initiator(srv, "r1", timeout=10)
        conn.sendall(b"x")
        assert mine.recv(1) == b"x"
        for s in (conn, mine, *strangers):
            s.close()


# ----- checksums -----------------------------------------------------------------------


def test_checksum_detects_corruption_order_and_missing_data():
    blocks = np.frombuffer(np.random.default_rng(1).bytes(8 * 1024), np.uint8).reshape(8, 1024)
    expected = combine_crcs(block_crcs(blocks, range(8))[i] for i in [5, 1, 3])
    assert blocks_checksum(blocks, [5, 1, 3]) == expected
    corrupted = blocks.copy()
    corrupted[1, 700] ^= 1
    assert blocks_checksum(corrupted, [5, 1, 3]) != expected
    assert blocks_checksum(blocks, [1, 5, 3]) != expected  # block order matters
    untouched = blocks.copy()
    untouched[[5, 1, 3]] = 0  # a destination the transfer never wrote (zeroed beforehand)
    assert blocks_checksum(untouched, [5, 1, 3]) != expected


def test_a_mismatch_fails_the_result():
    row = {k: None for k in ROW_KEYS} | {"checksum_ok": False}
    r = ProbeResult(rows=[row], target="a", initiator="b", target_address="1.1.1.1",
                    initiator_address="1.1.1.2", port=1, same_machine=False, env={})
    assert not r.ok


# ----- arithmetic -----------------------------------------------------------------------


def test_summarize_percentiles_and_bandwidth():
    s = summarize([0.003, 0.001, 0.002], 1_000_000)
    assert s["iterations"] == 3
    assert s["median_us"] == s["p50_us"] == pytest.approx(2000)
    assert s["p90_us"] == pytest.approx(2800)  # linear interpolation
    assert s["p99_us"] == pytest.approx(2980)
    assert s["bandwidth_GBps"] == pytest.approx(0.5)  # 1 MB in 2 ms, decimal GB
    assert s["bandwidth_Gbps"] == pytest.approx(4.0)
    for bad in ([], [0.001, 0.0]):
        with pytest.raises(ValueError):
            summarize(bad, 1)


def test_fraction_and_limits():
    assert fraction_of_limit(5.0, 20.0) == 0.25
    assert fraction_of_limit(5.0, None) is None
    rows = [{"bytes": 1024, "bandwidth_GBps": 2.0}]
    assert apply_limits(rows, True, {1024: 8.0}, 200.0) == []
    assert rows[0] | {} == {"bytes": 1024, "bandwidth_GBps": 2.0, "limit_GBps": 8.0,
                            "limit_kind": "memcpy", "fraction_of_limit": 0.25}
    apply_limits(rows, False, {1024: 8.0}, 200.0)  # 200 Gb/s = 25 GB/s
    assert (rows[0]["limit_kind"], rows[0]["limit_GBps"]) == ("link", 25.0)
    assert rows[0]["fraction_of_limit"] == pytest.approx(0.08)
    notes = apply_limits(rows, False, {}, None)
    assert rows[0]["fraction_of_limit"] is None and rows[0]["limit_kind"] is None
    assert "link_rate_gbps" in notes[0]


def test_default_sizes():
    sizes = default_sizes()
    assert sizes[0] == 64 * KiB and sizes[-1] == 64 * MiB and len(sizes) == 11
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))
    capped = default_sizes(max_total_bytes=8 * MiB)
    assert capped[-1] == 4 * MiB and sum(capped) <= 8 * MiB


def test_memcpy_bandwidth_is_positive_per_size():
    out = memcpy_bandwidth([4 * KiB, 64 * KiB], iterations=3)
    assert set(out) == {4 * KiB, 64 * KiB} and all(v > 0 for v in out.values())


# ----- the agent module ------------------------------------------------------------------


def test_agent_module_needs_nothing_of_lab_utils_outside_on_node():
    """The agent runs on the nodes from the deployed copy: its imports are the standard
    library, numpy, nixl and torch, and on_node itself."""
    import ast

    import lab_utils.on_node.nixl_agent as agent

    tree = ast.parse(Path(agent.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    outside = {n for n in names if n.startswith("lab_utils")
               and not n.startswith("lab_utils.on_node")}
    assert outside == set()


def test_agent_command_line_refuses_an_initiator_without_target():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "lab_utils.on_node.nixl_agent", "--role",
                        "initiator", "--address", "127.0.0.3", "--port", "1", "--run-id", "r",
                        "--blocks", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--target-address and --sizes" in p.stderr
