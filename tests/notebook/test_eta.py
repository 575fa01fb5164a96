"""What the calibration record measured replaces the ETA's estimates: `python -m lab_utils
eta` adds each notebook's start-up, the measured first or later starts of its instances
("measured on <node>, <date>") once there are any, the agenda's allowance before; on a
GPU profile before notebook 01, the proxy's measured cost per request replaces the
published figure; and 01's profile records that cost. On the rehearsal profile (CPU
figures) with made-up results under tmp_path, and on the example profile for the GPU."""

from __future__ import annotations

from types import SimpleNamespace

from lab_utils.cli import main
from lab_utils.forecast.curves import point
from lab_utils.forecast.inputs import GB10
from lab_utils.forecast.timing import minutes, notebook_seconds, switches_seconds
from lab_utils.notebook import eta_inputs, eta_lines, forecasting, steps
from lab_utils.results import calibration
from lab_utils.results.calibration import STARTUP_ALLOWANCE_S

from support.eta_records import starts, write_01_02

ALLOWANCE = "the agenda's allowance per topology, not measured yet"


def total_line(lines: list[str]) -> str:
    """The forecast's total (whole-notebook ETAs follow it)."""
    return next(ln for ln in lines if ln.startswith("  total: "))


def test_eta_adds_the_agendas_allowance_until_a_start_was_measured(test_cfg):
    write_01_02(test_cfg)
    inputs, cores, _ = eta_inputs(test_cfg)
    measuring = notebook_seconds(inputs, test_cfg, cores)
    lines = eta_lines(test_cfg)
    for nb in ("01", "03", "04"):
        assert (f"  {nb}: {minutes(measuring[nb])} measuring + "
                f"{minutes(STARTUP_ALLOWANCE_S)} start-up ({ALLOWANCE})") in lines
    # 01's optional switches restart its instance three times, outside the total
    switches = switches_seconds(inputs, test_cfg, cores)
    assert switches > 0 and (f"  01's optional two switches: {minutes(switches)} measuring + "
                             f"{minutes(3 * STARTUP_ALLOWANCE_S)} start-up (3 starts; not in "
                             "the total)") in lines
    total = sum(measuring.values()) + 3 * STARTUP_ALLOWANCE_S
    assert total_line(lines).startswith(f"  total: {minutes(total)} (")


def test_eta_uses_the_measured_first_and_later_starts(test_cfg, tmp_path, capsys):
    write_01_02(test_cfg)
    # as a rehearsal left them: every role started once on its node, prefill twice
    starts(test_cfg, "spark-01", ("baseline", 22.6, True, "2026-11-26"),
           ("replica", 22.8, True, "2026-11-26"), ("prefill", 25.1, True, "2026-11-26"),
           ("prefill", 24.0, False, "2026-11-27"))
    starts(test_cfg, "spark-02", ("replica", 23.5, True, "2026-11-26"),
           ("decode", 26.0, True, "2026-11-26"))
    s01 = "measured on spark-01, 2026-11-27, later start"
    s02 = "measured on spark-02, 2026-11-26, first start"
    assert forecasting.startup_seconds(test_cfg, "baseline") == (24.0, s01)
    # the rehearsal starts a topology's instances together: its slowest one counts, and
    # a node's first start is the slowest first start measured there (decode's, 26 s)
    assert forecasting.startup_seconds(test_cfg, "replicated") == (26.0, f"{s01}; {s02}")
    assert forecasting.startup_seconds(test_cfg, "disaggregated") == (26.0, f"{s01}; {s02}")
    inputs, cores, _ = eta_inputs(test_cfg)
    measuring = notebook_seconds(inputs, test_cfg, cores)
    assert main(["eta", "--config", str(tmp_path / "profile.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"  01: {minutes(measuring['01'])} measuring + 24 s start-up ({s01})" in out
    assert f"  04: {minutes(measuring['04'])} measuring + 26 s start-up ({s01}; {s02})" in out
    assert ALLOWANCE not in "\n".join(out)
    assert total_line(out).startswith(f"  total: {minutes(sum(measuring.values()) + 24 + 26 + 26)} (")


def test_a_role_never_started_on_a_node_keeps_the_allowance(test_cfg):
    starts(test_cfg, "spark-01", ("baseline", 22.6, True, "2026-11-26"))
    # spark-02 has no record: the replicated topology's second instance was never measured
    assert forecasting.startup_seconds(test_cfg, "replicated") == (STARTUP_ALLOWANCE_S,
                                                                   ALLOWANCE)
    # a role not started on a node that measured a first start: that first start
    assert forecasting.startup_seconds(test_cfg, "disaggregated")[0] == STARTUP_ALLOWANCE_S
    starts(test_cfg, "spark-02", ("replica", 30.0, True, "2026-11-26"))
    assert forecasting.startup_seconds(test_cfg, "disaggregated") == (
        30.0, "measured on spark-01, 2026-11-26, first start; "
              "measured on spark-02, 2026-11-26, first start")


def test_before_01_a_gpu_eta_takes_the_proxys_measured_cost(spark_cfg):
    inputs, _, source = eta_inputs(spark_cfg)
    assert inputs.hop_ms == GB10["hop_ms"][0] and source == "published GB10 figures"
    node = spark_cfg.proxy.node
    calibration.record_proxy(spark_cfg, node, point(1024, [0.5, 0.7, 0.9]), backend="spark-01")
    label = f"measured on {node}, {calibration.load(spark_cfg, node).updated_at[:10]}"
    inputs, _, source = eta_inputs(spark_cfg)
    assert inputs.hop_ms == 0.7
    assert inputs.sources["hop_ms"] == f"0.7 ({label})"
    assert source == f"published GB10 figures, the proxy's 0.7 ms per request {label}"
    assert eta_lines(spark_cfg)[0].startswith(f"predicted time per notebook, measuring "
                                              f"forecast from {source}, workload")


def test_the_engine_profile_records_the_proxy_cost(test_cfg, monkeypatch):
    hop = point(128, [0.6, 0.9, 1.4])
    monkeypatch.setattr(steps, "measure_profile", lambda *a: SimpleNamespace(hop=hop))
    monkeypatch.setattr(steps, "tokenizer_of", lambda served, cfg: (None, None))
    inst = SimpleNamespace(node="spark-01", kind="vllm")
    proxy = SimpleNamespace(kind="proxy", node=test_cfg.proxy.node, pgid=7)
    served = SimpleNamespace(records=[inst, proxy], instance_records=lambda: [inst],
                             proxy_url="http://127.0.0.4:8000")
    assert steps.profile_engine(test_cfg, served).hop == hop
    cal = calibration.load(test_cfg, test_cfg.proxy.node)
    assert cal.proxy["ms"] == 0.9 and cal.proxy["backend"] == "spark-01"
    assert calibration.proxy_ms(test_cfg) == (0.9, f"measured on {test_cfg.proxy.node}, "
                                                   f"{cal.updated_at[:10]}")


def test_after_01_without_02_eta_predicts_01_and_03_and_says_why_not_04(test_cfg):
    write_01_02(test_cfg)
    (test_cfg.results_dir / "kv_transfer_metrics.json").unlink()
    lines = eta_lines(test_cfg)
    upto_total = lines[1:lines.index(total_line(lines)) + 1]
    assert [ln.split(":")[0] for ln in upto_total] == [
        "  01", "  03", "  01's optional two switches", "  04", "  total"]
    assert lines[4] == "  04: not predicted: its forecast needs notebook 02's KV transfer probe"
