"""The report's "Estimated vs measured" table holds every calibrated figure: the start-up
and memory figures of the serving nodes, the NIXL probe's rate on the probe's initiator
and the proxy's cost per request on its node, each beside its estimate and labelled
"measured on <node>, <date>"; the forecast for two Sparks takes the measured proxy cost
on a GPU profile only. Made-up records under tmp_path, on the rehearsal profile and the
example (GPU) profile."""

from __future__ import annotations

from lab_utils.forecast.curves import point
from lab_utils.forecast.inputs import GB10
from lab_utils.kv.probe import CONSERVATIVE_GBps, GB10_PLAN_GBps
from lab_utils.report import forecast as report_forecast
from lab_utils.report.data import ReportData
from lab_utils.report.sections import _calibration_blocks
from lab_utils.report.tables import calibration_table
from lab_utils.results import calibration
from lab_utils.results.calibration import Calibration


def probe_figure(seg: str) -> str:
    return (f"NIXL probe, {seg}, one whole pass (GB/s: every size, READ and WRITE, the rate "
            "its plan divides by)")

def data_of(cfg) -> ReportData:
    return ReportData(cfg.profile, cfg.vllm.device, cfg.results_dir, {}, {}, {}, {})


def rows(seg: str, gbps: float) -> list[dict]:
    return [{"seg_type": seg, "op": op, "bytes": b, "median_us": b / (gbps * 1e3)}
            for op in ("READ", "WRITE") for b in (1 << 18, 1 << 22)]


def label(cfg, node: str) -> str:
    return f"measured on {node}, {calibration.load(cfg, node).updated_at[:10]}"


def test_the_rehearsal_table_sets_the_probe_rate_and_the_proxy_cost_beside_their_estimates(
        test_cfg):
    assert calibration_table(data_of(test_cfg)).empty
    target, initiator = test_cfg.probe_pair()
    cal = Calibration(target, test_cfg.profile, "cpu")
    cal.starts = [{"instance": "prefill-0", "role": "prefill", "s": 25.1, "first": True,
                   "at": "2026-11-26T11:16:00Z"}]
    calibration.save(test_cfg, cal)
    calibration.record_probe(test_cfg, initiator, target, rows("DRAM", 4.2))
    calibration.record_proxy(test_cfg, test_cfg.proxy.node,
                             point(128, [-0.8, 0.98, 2.8]), backend=target)
    df = calibration_table(data_of(test_cfg))
    by = {(r["node"], r["figure"]): r for r in df.to_dict("records")}
    probe = by[(initiator, probe_figure("DRAM"))]
    assert (probe["estimate"], probe["measured"], probe["source"]) == (
        CONSERVATIVE_GBps, 4.2, label(test_cfg, initiator))
    proxy = by[(test_cfg.proxy.node, "proxy, per request (ms)")]
    assert (proxy["estimate"], proxy["measured"], proxy["source"]) == (
        GB10["hop_ms"][0], 0.98, label(test_cfg, test_cfg.proxy.node))
    first = by[(target, "first start (s)")]
    assert (first["measured"], first["source"]) == (25.1, "measured on spark-01, 2026-11-26")
    # each node shows what it measures: no memory rows for the proxy's node, no probe
    # row where no probe ran, no CUDA row on the CPU build
    assert {f for n, f in by if n == test_cfg.proxy.node} == {"proxy, per request (ms)"}
    assert not any(f.startswith("NIXL probe") for n, f in by if n == target)
    assert not any(f.startswith("activations") for _, f in by)
    # the report's section shows that table
    blocks = _calibration_blocks(data_of(test_cfg))
    assert [b.kind for b in blocks] == ["h", "p", "table"]
    assert "NIXL probe's plan" in blocks[1].text
    assert blocks[2].df.equals(df)


def test_a_gpu_table_has_both_memory_types_and_the_spark_forecast_takes_the_proxy_cost(
        spark_cfg, monkeypatch):
    target, initiator = spark_cfg.probe_pair()
    calibration.record_probe(spark_cfg, initiator, target, rows("DRAM", 11.5) + rows("VRAM", 0.4))
    df = calibration_table(data_of(spark_cfg)).set_index("figure")
    assert df.loc[probe_figure("DRAM"), "estimate"] == GB10_PLAN_GBps["DRAM"]
    assert df.loc[probe_figure("VRAM"), "estimate"] == GB10_PLAN_GBps["VRAM"]
    assert df.loc[probe_figure("VRAM"), "measured"] == 0.4
    # the Spark forecast: the published proxy figure, then the measured one
    monkeypatch.setattr(report_forecast, "spark_workload",
                        lambda data: (spark_cfg.model.name, spark_cfg.workload))
    data = data_of(spark_cfg)
    assert report_forecast.spark_forecast(data)[2]["hop_ms"] == (
        f"{GB10['hop_ms'][0]:g} ({GB10['hop_ms'][1]})")
    calibration.record_proxy(spark_cfg, spark_cfg.proxy.node, point(1024, [0.4, 0.6, 0.7]),
                             backend=target)
    sources = report_forecast.spark_forecast(data)[2]
    assert sources["hop_ms"] == f"0.6 ({label(spark_cfg, spark_cfg.proxy.node)})"


def test_the_rehearsals_proxy_cost_stays_out_of_the_spark_forecast(test_cfg, monkeypatch):
    calibration.record_proxy(test_cfg, test_cfg.proxy.node, point(128, [0.9, 1.0, 1.1]),
                             backend="spark-01")
    data = data_of(test_cfg)
    assert report_forecast.spark_hop(data) is None  # the rehearsal machine's proxy is no Spark's
    monkeypatch.setattr(report_forecast, "spark_workload",
                        lambda data: (test_cfg.model.name, test_cfg.workload))
    assert "measured on" not in report_forecast.spark_forecast(data)[2]["hop_ms"]
