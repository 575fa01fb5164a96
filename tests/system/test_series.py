"""The whole notebook series, headless, on the CPU rehearsal: run once per session (as
`make lab` does; the `series` fixture, tests/support/series.py), then checked: every
results file valid, 00's checklist as the rehearsal must see it, the proof of transfer in
04, the report with its conclusions, nothing left running, wall time per notebook
printed."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest

from lab_utils.results import RESULTS, load_results

from support.profiles import show

pytestmark = [pytest.mark.slow, pytest.mark.series]


def test_every_notebook_ran(series):
    assert [p.name[:2] for p in series.executed] == ["00", "01", "02", "03", "04", "05"]
    times = series.times
    assert set(times) == {p.name for p in series.executed} and all(t > 0 for t in times.values())


def test_the_checklist_passed_on_the_rehearsal(series):
    """Notebook 00 ran every check for real on the rehearsal profile (models fetched, the
    ports' listeners and the link's sink started and stopped): no failure, and what only
    a CPU rehearsal on one machine shows."""
    env = load_results(series.cfg, "00").payload
    got = {(c.check, c.node): c for c in env.checks}
    assert env.blessed and not env.continued_despite_failures and env.counts.get("fail", 0) == 0
    assert got[("gpu", "spark-01")].status == "n/a" and "cpu" in got[("gpu", "spark-01")].summary
    assert got[("rdma", "spark-02")].status == "n/a"
    assert got[("python", "spark-01")].status == "pass"
    assert "Gb/s" in got[("link", "spark-02 -> spark-01")].summary
    ports = [c for c in env.checks if c.check == "ports"]
    # every instance's HTTP port (the split model's rank 0 only), the proxy, the side
    # channel, the probe, the split model's rendezvous and, each way between its ranks'
    # nodes, a port the system picked
    assert len(ports) == 12 and all(c.status == "pass" for c in ports)
    assert sum("a port the system picks" in c.summary for c in ports) == 2
    # the split model's all-reduce across the two nodes, for real, with Gloo
    reduce = got[("collective", "spark-01 / spark-02")]
    assert reduce.status == "pass" and "(gloo)" in reduce.summary and "16 MiB in" in reduce.summary


def test_results_are_valid(series):
    cfg, _ = series
    for notebook in RESULTS:
        envelope = load_results(cfg, notebook)  # validates the envelope and the profile
        assert envelope.payload, notebook
    assert load_results(cfg, "00").payload.blessed
    for notebook in ("01", "03", "04"):
        sweep = load_results(cfg, notebook).payload.sweep
        reasons = [f"{p.mode} {p.value} #{p.repeat + 1}: {p.summary.invalid_reason}"
                   for p in sweep.points if not p.summary.valid]
        assert sweep.combined and all(c.valid for c in sweep.combined), (notebook, reasons)


def test_proof_of_transfer(series):
    cfg, _ = series
    proof = load_results(cfg, "04").payload.proof
    assert proof.ok and len(proof.prompts) >= 3
    for p in proof.prompts:
        assert p.external_kv_transfer == p.prompt_tokens and p.local_compute == 0
        assert p.nixl_bytes == p.expected_bytes > 0
        assert p.tokens_equal is True


def test_the_split_model_ran_and_kept_the_output(series):
    """04's optional section: one rank per node, 01's reference output within a near tie,
    no failed request, and in the report beside the other architectures."""
    cfg, _ = series
    tp = load_results(cfg, "tp").payload
    ranks = {i.name: i.node for i in tp.instances if i.kind == "vllm"}
    assert ranks == {"tp-0": "spark-01", "tp-1": "spark-02"} and tp.ranks == 2
    assert tp.output_ok and len(tp.same_output) >= 3, [r.tokens_why for r in tp.same_output]
    assert tp.forecast is not None and tp.forecast.timed is not None
    # each rank's log says its collectives are Gloo's, over TCP (the CPU build), so the
    # forecast is graded
    assert [(r.rank, r.node, r.backend, r.net) for r in tp.collective] == [
        (0, "spark-01", "gloo", "TCP"), (1, "spark-02", "gloo", "TCP")]
    assert tp.not_graded is None
    for run in (tp.sweep, tp.mixed):
        assert run is not None and all(p.summary.failed == 0 for p in run.points)
    md = (cfg.results_dir / "report.md").read_text()
    assert "tensor-parallel" in md and "one model across the nodes" in md
    assert "rank 1 (spark-02): GLOO, TCP (Gloo, the CPU build's collectives)" in md


def test_report_with_conclusions(series):
    cfg, _ = series
    html = (cfg.results_dir / "report.html").read_text()
    md = (cfg.results_dir / "report.md").read_text()
    assert "data:image/png;base64," in html
    assert "Conclusions" in md and ("lost" in md or "won" in md or "no difference" in md)
    assert len(list((cfg.results_dir / "plots").glob("*.png"))) >= 4


def test_every_result_sentence_of_the_run_is_backed(series):
    """The audit over the whole run: every claim a notebook or the report saved holds
    against the results files, and no printed result sentence (a number beside a word that
    judges) goes without a claim, in the executed notebooks as in the report."""
    from lab_utils.report.audit import audit

    cfg, _ = series
    found = audit(cfg.results_dir)
    assert found.false == [] and found.unbacked == [], "\n".join(found.lines())
    assert found.checked >= 40


def test_forecast_made_before_the_sweeps_and_graded(request, series):
    from datetime import datetime

    from lab_utils.forecast import grade as g
    from lab_utils.report import load_report_data
    from lab_utils.report.data import graded

    cfg, _ = series
    profile = load_results(cfg, "01").payload.profile
    assert profile is not None and profile.prefill and profile.decode
    for nb, arch in (("03", "replicated"), ("04", "disaggregated"), ("tp", "tensor-parallel")):
        env = load_results(cfg, nb)
        fc = env.payload.forecast
        assert fc is not None and fc.architecture == arch and fc.rows
        measured_s = sum(p.summary.duration for p in env.payload.sweep.points)
        # made at least as long before the file was written as the sweep took to measure
        ahead = (datetime.fromisoformat(env.timestamp.replace("Z", "+00:00"))
                 - datetime.fromisoformat(fc.made_at)).total_seconds()
        assert ahead >= measured_s, (nb, ahead, measured_s)
    for nb, who in (("03", "03's instances"), ("04", "04's instances"),
                    ("tp", "the split instance")):
        # each timed its instances before it forecast, and its forecast says what it took
        fc = load_results(cfg, nb).payload.forecast
        assert fc.timed is not None and fc.timed.requests > 0 and fc.timed.ttft_ms > 0
        assert f"{who} timed before the sweep" in fc.sources["timed before the sweep"]
    assert "00's link check" in load_results(cfg, "tp").payload.forecast.sources["all-reduce"]
    by_arch = graded(load_report_data(cfg))
    # 01 grades its own
    assert set(by_arch) == {"baseline", "replicated", "disaggregated", "tensor-parallel"}
    for arch, rows in by_arch.items():
        assert g.summary(rows)["points"] > 0, arch
        show(request, "[forecast] " + " ".join(g.sentences(arch, rows)))
    md = (cfg.results_dir / "report.md").read_text()
    assert "## Predicted, then measured" in md and "### Forecast for two DGX Sparks" in md
    assert (cfg.results_dir / "plots" / "forecast.png").exists()


def test_nothing_left_running(series):
    from lab_utils.cluster import Cluster

    cfg, _ = series
    assert Cluster(cfg).running() == []
    # vLLM's ZMQ sockets and rendezvous files went with the instances' private TMPDIRs
    tmp = Path(tempfile.gettempdir())
    left = [n for n in series.tmp_added if n.startswith(("vllm_dist_", "spark-lab-"))
            or ((tmp / n).exists() and stat.S_ISSOCK((tmp / n).lstat().st_mode))]
    assert left == [], f"the series left these in {tmp}: {left}"
