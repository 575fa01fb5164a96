"""Calibration: a start of the lab's instances records what vLLM measured (parsed from
the real logs), the memory of their processes, seconds to healthy and the node's OS
share, per node of the profile; the plan then uses those figures instead of its
estimates and says "measured on <node>, <date>". Here on the recorded GB10 start-up
(a fake node answers with the recorded log and /proc/meminfo), and on the rehearsal's
real instances (slow)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from lab_utils.cluster import Cluster
from lab_utils.cluster.nodes import Node
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import REPO_ROOT, parse_config
from lab_utils.kv.memory import CUDA_OVERHEAD, GiB
from lab_utils.results import calibration
from lab_utils.serve import calibrate, make_plan

RECORDED = REPO_ROOT / "tests/fixtures/dgx-spark-recorded"
GB10_LOG = (RECORDED / "vllm-0.13.0-offline-startup.gb10.txt").read_text()
MEMINFO = (RECORDED / "proc-meminfo.head-20.gb10.txt").read_text()
EXAMPLE = REPO_ROOT / "environment_config.json.example"


def spark_cfg(tmp_path, utilization=0.3):
    data = json.loads(EXAMPLE.read_text())
    data["results_root"] = str(tmp_path / "results")
    data["vllm"]["baseline"]["gpu_memory_utilization"] = utilization
    return parse_config(data, str(EXAMPLE))


class FakeSpark:
    """A node that answers as the recorded GB10 did: /proc/meminfo, the start-up log and
    a process group holding 3 GiB (PSS, kB)."""

    python = "/usr/bin/python3"

    def run(self, argv, timeout=60.0, env=None, input=None):
        out = MEMINFO if argv == ["cat", "/proc/meminfo"] else str(3 * 1024 * 1024)
        return SimpleNamespace(ok=True, stdout=out)

    def log_tail(self, rec, lines=40):
        return GB10_LOG

    meminfo = Node.meminfo  # the transport's own reader, over `run`
    name = "spark-01"


def fake_cluster(cfg):
    spark = FakeSpark()
    return SimpleNamespace(cfg=cfg, node=lambda name: spark, running=lambda: [])


def baseline_record():
    return ProcessRecord(name="baseline-0", node="spark-01", pid=9, pgid=9, start_ticks=1,
                         log_path="x.log", argv=[], kind="vllm", url="http://x:8100",
                         extra={"role": "baseline", "topology": "baseline"})


def test_a_start_on_the_recorded_gb10_writes_the_calibration_record(tmp_path):
    cfg = spark_cfg(tmp_path)
    cluster = fake_cluster(cfg)
    before = calibrate.before_start(cluster, ["spark-01"])
    written = calibrate.record(cluster, [baseline_record()], {"baseline-0": 131.0}, before)
    assert written == [str(cfg.results_dir / "calibration" / "spark-01.json")]
    cal = calibration.load(cfg, "spark-01")
    assert (cal.node, cal.profile, cal.device) == ("spark-01", cfg.profile, "cuda")
    inst = cal.instances["baseline"]
    assert inst["figures"]["kv_bytes"] == int(17.96 * GiB)  # "Available KV cache memory"
    assert inst["figures"]["weights_bytes"] == int(14.9889 * GiB)
    assert inst["utilization"] == 0.3 and inst["start_s"] == 131.0
    assert inst["pss_bytes"] == inst["process_bytes"] == 3 * GiB
    total, available = 125511968 * 1024, 112483768 * 1024
    assert cal.mem_total_bytes == total and cal.os_reserve_bytes == total - available
    # the torch.compile cache was hit: a later start, not a first one
    assert cal.starts == [{"instance": "baseline-0", "role": "baseline", "at": inst["at"],
                           "s": 131.0, "first": False}]
    m = cal.measured()
    # vLLM's pool (0.3 x CUDA's total, 121.69 GiB on a GB10) less weights and KV cache
    pool = math.ceil(0.3 * calibration.GB10_CUDA_TOTAL)
    assert m["cuda_overhead"][0] == pool - int(14.9889 * GiB) - int(17.96 * GiB)
    assert 3.5 * GiB < m["cuda_overhead"][0] < 3.6 * GiB  # the 3 GiB estimate was low
    assert m["later_start_s"][0] == 131.0 and "first_start_s" not in m
    assert m["os_reserve"][1] == f"measured on spark-01, {cal.updated_at[:10]}"


def test_the_dry_run_uses_what_was_measured_and_says_so(tmp_path):
    cfg = spark_cfg(tmp_path)
    plan = make_plan(Cluster(cfg), "baseline", read_nodes=False)
    items = {i.what: i for i in plan.instances[0].memory.items}
    assert items["activations, CUDA graphs, CUDA context"].bytes == CUDA_OVERHEAD
    assert "estimate" in plan.text() and "measured on" not in plan.text()
    cluster = fake_cluster(cfg)
    calibrate.record(cluster, [baseline_record()], {"baseline-0": 131.0},
                     calibrate.before_start(cluster, ["spark-01"]))
    cal = calibration.load(cfg, "spark-01")
    plan = make_plan(Cluster(cfg), "baseline", read_nodes=False)
    items = {i.what: i for i in plan.instances[0].memory.items}
    label = f"measured on spark-01, {cal.updated_at[:10]}"
    assert items["activations, CUDA graphs, CUDA context"].bytes == cal.measured()["cuda_overhead"][0]
    assert items["activations, CUDA graphs, CUDA context"].note == label
    assert items["API server and engine processes"].bytes == 3 * GiB
    assert items["API server and engine processes"].note == label
    text = plan.text()
    assert f"OS and other processes {cal.os_reserve_bytes / GiB:.1f} GiB ({label})" in text
    assert f"vLLM logged a 17.96 GiB KV cache ({label})" in text
    # the plan's KV cache is now what vLLM made of the same pool (up to the weights'
    # figure: the files here, vLLM's own count in the log)
    kv = plan.instances[0].memory.kv_bytes
    assert kv == pytest.approx(17.96 * GiB, rel=0.05)


def test_a_pd_start_on_a_gb10_leaves_every_shipped_topology_fitting(tmp_path):
    """A prefill/decode start reconstructed from GB10 figures: vLLM logs a 35.6 GiB KV
    cache, and each instance's process group holds 39 GiB (PSS): the NIXL host copy of that
    cache (kv_buffer_device "cpu", allocated and pinned at start-up) plus 3.4 GiB of
    processes. The record keeps 3.4 GiB per role, not the copy a second time: every
    topology the example ships still fits its plan afterwards (counting the copy twice,
    the P/D plan read 136.2 of 119.7 GiB)."""
    from lab_utils.config import TOPOLOGIES
    from lab_utils.serve.launcher import server_command

    cfg = spark_cfg(tmp_path)
    pss = (int(35.6 * GiB) + int(3.4 * GiB)) // 1024 * 1024  # read in kB
    log = GB10_LOG.replace("Available KV cache memory: 17.96 GiB",
                           "Available KV cache memory: 35.6 GiB")

    class PdSpark(FakeSpark):
        def run(self, argv, timeout=60.0, env=None, input=None):
            out = MEMINFO if argv == ["cat", "/proc/meminfo"] else str(pss // 1024)
            return SimpleNamespace(ok=True, stdout=out)

        def log_tail(self, rec, lines=40):
            return log

    spark = PdSpark()
    cluster = SimpleNamespace(cfg=cfg, node=lambda name: spark, running=lambda: [])
    started = [ProcessRecord(name=s.name, node=s.node, pid=9, pgid=9, start_ticks=1,
                             log_path="x.log", argv=server_command(Cluster(cfg), s),
                             kind="vllm", extra={"role": s.role, "topology": "disaggregated"})
               for s in cfg.instances("disaggregated")]
    assert {r.extra["role"] for r in started} == {"prefill", "decode"}
    calibrate.record(cluster, started, {r.name: 140.0 for r in started}, {})
    for node in ("spark-01", "spark-02"):
        cal = calibration.load(cfg, node)
        (inst,) = cal.instances.values()
        assert inst["pss_bytes"] == pss and inst["host_kv_bytes"] == int(35.6 * GiB)
        assert inst["process_bytes"] == pss - int(35.6 * GiB)
    for topology in TOPOLOGIES:
        if not cfg.instances(topology):
            continue
        plan = make_plan(Cluster(cfg), topology, read_nodes=False)
        assert plan.fits, plan.text()


def test_an_unreadable_or_foreign_record_leaves_the_estimates(tmp_path):
    cfg = spark_cfg(tmp_path)
    p = calibration.path(cfg, "spark-01")
    p.parent.mkdir(parents=True)
    p.write_text("{not json")
    assert calibration.load(cfg, "spark-01") is None
    p.write_text(json.dumps({"node": "spark-01", "profile": "another", "device": "cuda"}))
    assert calibration.load(cfg, "spark-01") is None
    assert "measured on" not in make_plan(Cluster(cfg), "baseline", read_nodes=False).text()


@pytest.mark.slow
def test_the_rehearsal_start_calibrates_and_the_next_dry_run_says_so(rehearsal):
    """The session's rehearsal instances (baseline, prefill, decode) were started by
    `serve`: their nodes' records hold what the real vLLM logs said."""
    rehearsal.up()
    cfg = rehearsal.cfg
    nodes = sorted({s.node for t in rehearsal.TOPOLOGIES for s in cfg.instances(t)})
    for node in nodes:
        cal = calibration.load(cfg, node)
        assert cal is not None, node
        assert cal.device == "cpu" and cal.mem_total_bytes > 0
        for role, inst in cal.instances.items():
            spec = next(s for t in rehearsal.TOPOLOGIES for s in cfg.instances(t)
                        if s.role == role)
            # "Explicitly set (1.0/...) GiB for KV cache": the configured VLLM_CPU_KVCACHE_SPACE
            assert inst["figures"]["kv_bytes"] == spec.settings.cpu_kvcache_space_gib * GiB
            assert inst["figures"]["kv_tokens"] > 0 and inst["figures"]["init_engine_s"] > 0
            assert inst["start_s"] > 0 and inst["pss_bytes"] > 0
        assert cal.starts and all(s["s"] > 0 for s in cal.starts)
    text = make_plan(Cluster(cfg), "disaggregated", read_nodes=False).text()
    cal = calibration.load(cfg, nodes[0])
    label = f"measured on {nodes[0]}, {cal.updated_at[:10]}"
    assert label in text
    assert "API server and engine processes" in text and "(estimate)" not in text.split(
        "Per node")[1]  # the OS reserve is measured too
    from lab_utils.report.data import ReportData
    from lab_utils.report.tables import calibration_table

    df = calibration_table(ReportData(cfg.profile, "cpu", cfg.results_dir, {}, {}, {}, {}))
    assert set(df["node"]) == set(nodes)
    mine = df[df["node"] == nodes[0]].set_index("figure")
    assert mine.loc["first start (s)", "source"] == label
    assert mine.loc["API server and engine processes (GiB)", "measured"] > 0


def test_the_report_sets_the_estimates_beside_the_measurements(tmp_path):
    from lab_utils.report.data import ReportData
    from lab_utils.report.tables import calibration_table

    cfg = spark_cfg(tmp_path)
    data = ReportData(cfg.profile, "cuda", cfg.results_dir, {}, {}, {}, {})
    assert calibration_table(data).empty
    cluster = fake_cluster(cfg)
    calibrate.record(cluster, [baseline_record()], {"baseline-0": 131.0},
                     calibrate.before_start(cluster, ["spark-01"]))
    df = calibration_table(data).set_index("figure")
    label = f"measured on spark-01, {calibration.load(cfg, 'spark-01').updated_at[:10]}"
    row = df.loc["activations, CUDA graphs, CUDA context (GiB)"]
    assert (row["estimate"], row["measured"], row["source"]) == (3.0, 3.56, label)
    assert df.loc["API server and engine processes (GiB)", "measured"] == 3.0
    assert df.loc["later start (s)", "measured"] == 131.0
    assert df.loc["later start (s)", "estimate"] == 300.0  # the agenda's allowance
    first = df.loc["first start (s)"]
    assert pd.isna(first["measured"]) and first["source"] == "not measured yet"
