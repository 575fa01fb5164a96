"""Tests of lab_utils.report on synthetic results written through lab_utils.results: the
conclusions say what the numbers say (disaggregation losing throughput while winning ITL
p99, differences inside the spread reported as none, invalid points excluded and named),
the report builds with notebooks 02-04 missing, the expected Spark figures are compared
only on a real (cuda) profile and are read from the payloads notebooks 00 and 02 write
(00's link check, ib_write_bw or one TCP stream; 02's largest DRAM READ in the NIXL
probe), and report.html renders in headless Chromium with every plot loaded.
"""

from __future__ import annotations

import html
import json
import os
import platform
import re
import shutil
import subprocess
import time

import pandas as pd
import pytest

from lab_utils import report
from lab_utils.checks.rdma import link_verdict
from lab_utils.errors import ResultsMissingError
from lab_utils.kv.probe import apply_limits, summarize
from lab_utils.measure.benchmark import HEADLINE, combine
from lab_utils.results import RESULTS, hardware, write_envelope, write_results
from lab_utils.results.checklist import CheckResult
from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult, RepeatSummary

from support.payloads import (
    baseline_dict,
    disaggregated_dict,
    environment_dict,
    kv_dict,
    model,
    proof_row_dict,
    replicated_dict,
    roofline_dict,
)
from support.profiles import make_profile_data, write_profile

LOADS = (1, 2, 4)
FAILED = "12 of 24 requests failed (50%, allowed 0%); first errors: ['HTTP 503']"


def metrics(out_tps: float, ttft: float, itl: float, itl_p99: float) -> dict[str, float]:
    """A point's headline metrics, consistent enough for the report."""
    return {"request_throughput": out_tps / 32, "output_throughput": out_tps,
            "total_token_throughput": out_tps * 5, "request_goodput": out_tps / 32,
            "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 2, "median_tpot_ms": itl,
            "p99_tpot_ms": itl * 1.5, "median_itl_ms": itl, "p99_itl_ms": itl_p99,
            "median_e2el_ms": ttft + 31 * itl, "p99_e2el_ms": 2 * (ttft + 31 * itl)}


def sweep(arch: str, per_load: dict[float, dict[str, float]], *, repeats: int = 1,
          jitter: float = 0.0, invalid: tuple[float, ...] = (), mixed: bool = False,
          rates: dict[float, dict[str, float]] | None = None,
          held_up: dict[float, float] | None = None,
          read_together: dict[float, float] | None = None) -> dict:
    """A BenchmarkResult dump made the way `benchmark.sweep` makes one: per-repeat
    summaries (values scaled by 1 - jitter .. 1 + jitter), combined with `combine`."""
    points, combined = [], []
    plan = [("concurrency", k, v) for k, v in per_load.items()]
    plan += [("rate", k, v) for k, v in (rates or {}).items()]
    for mode, load, values in plan:
        summaries = []
        for rep in range(repeats):
            f = 1 + (jitter * (2 * rep / (repeats - 1) - 1) if repeats > 1 else 0.0)
            bad = load in invalid
            s = {k: values[k] * f for k in HEADLINE}
            s.update(valid=not bad, invalid_reason=FAILED if bad else None, mode=mode,
                     value=float(load), repeat=rep, mixed=mixed,
                     held_up_s=(held_up or {}).get(load, 0.0) if rep == 0 else 0.0,
                     itl_read_together_fraction=(read_together or {}).get(load, 0.0) if rep == 0 else 0.0)
            summaries.append(RepeatSummary(**s))
            points.append(BenchmarkPoint(mode=mode, value=load, repeat=rep, summary=s,
                                         requests=[]))
        combined.append(combine(summaries, mode, float(load), mixed))
    workload = {"input_len": 128, "output_len": 32, "num_prompts": 24, "repeats": repeats,
                "concurrency": list(per_load), "mixed": mixed}
    return BenchmarkResult(target=f"http://127.0.0.4:9000/{arch}", model="tiny-llama",
                           workload=workload, points=points, combined=combined).model_dump()


def write(cfg, notebook: str, payload: dict) -> None:
    """Write a payload in the files' format through the notebook's model."""
    write_results(cfg, notebook, model(notebook, payload), software={}, hardware={})


def write_baseline(cfg, *, roofline: dict | None = None, **kw) -> None:
    data = {c: metrics(100 * c, 50, 10, 30) for c in LOADS}
    write(cfg, "01", baseline_dict(sweep("baseline", data, **kw),
                                   roofline=roofline or roofline_dict()))


def probe_row(seg: str, op: str, nbytes: int, gbytes_per_s: float) -> dict:
    """A NIXL probe row as `nixl_probe` makes one: 5 transfers at `gbytes_per_s`."""
    times = [nbytes / (gbytes_per_s * 1e9)] * 5
    row = {"seg_type": seg, "op": op, "bytes": nbytes, **summarize(times, nbytes),
           "checksum_ok": True}
    apply_limits([row], same_machine=False, memcpy_GBps={}, link_rate_gbps=200.0)
    return row


def write_kv(cfg) -> None:
    """Notebook 02's payload; the probe's largest DRAM READ moves 1.6 GB/s."""
    rows = [{"prompt_tokens": n, "kv_bytes": n * 16384, "predicted_ms": n * 0.01,
             "measured_ms": None if n == 2048 else n * 0.012} for n in (128, 512, 2048)]
    probe = [probe_row("DRAM", "READ", 1 << 20, 0.9), probe_row("DRAM", "WRITE", 1 << 20, 0.8),
             probe_row("DRAM", "READ", 64 << 20, 1.6), probe_row("DRAM", "WRITE", 64 << 20, 2.5),
             probe_row("VRAM", "READ", 64 << 20, 9.0)]
    for r in rows:
        r["blocks"] = r["prompt_tokens"] // 16
    write(cfg, "02", kv_dict(pvm=rows, probe_rows=probe))


def write_environment(cfg, *results: CheckResult) -> None:
    """Notebook 00's payload, as `environment.record_environment` writes it."""
    write(cfg, "00", environment_dict(*results))


def write_replicated(cfg, data: dict, *, mixed: dict | None = None, **kw) -> None:
    write(cfg, "03", replicated_dict(
        sweep("replicated", data, **kw),
        sweep("replicated", mixed, mixed=True, held_up=kw.get("held_up")) if mixed else None))


def write_disaggregated(cfg, data: dict, *, mixed: dict | None = None, ok: bool = True,
                        **kw) -> None:
    payload = disaggregated_dict(sweep("disaggregated", data, **kw),
                                 sweep("disaggregated", mixed, mixed=True) if mixed else None)
    payload["proof"] = {"ok": ok, "prompts": [proof_row_dict(ok)]}
    write(cfg, "04", payload)


def write_loses_throughput_wins_itl(cfg) -> None:
    """Disaggregation: 30% less output throughput than replicated at every load, 40% lower
    ITL p99, and a much lower ITL p99 under the mixed long/short workload."""
    write_baseline(cfg)
    write_kv(cfg)
    rep = {c: metrics(200 * c, 40, 10, 50) for c in LOADS}
    dis = {c: metrics(140 * c, 60, 9, 30) for c in LOADS}
    write_replicated(cfg, rep, mixed={c: metrics(150 * c, 80, 12, 400) for c in LOADS})
    write_disaggregated(cfg, dis, mixed={c: metrics(120 * c, 90, 10, 40) for c in LOADS})


def finding(findings, metric: str, load: float, subject="disaggregated",
            reference="replicated", workload="standard"):
    (f,) = [f for f in findings if f.metric == metric and f.value == load
            and f.subject.name == subject and f.reference.name == reference
            and f.workload == workload]
    return f


# ----- conclusions -----------------------------------------------------------------------


def test_disaggregation_loses_throughput_wins_itl_p99(test_cfg):
    write_loses_throughput_wins_itl(test_cfg)
    paths = report.build_report(test_cfg)
    text = "\n".join(paths.conclusions)
    assert ("Disaggregation lost on output throughput to replicated serving (two replicas on this "
            "same machine, routed round-robin) "
            "at concurrency 1, 2 and 4 (replicated up to 1.4x higher).") in text
    assert ("Disaggregation won on ITL p99 against replicated serving (two replicas on this same "
            "machine, routed round-robin) at "
            "concurrency 1, 2 and 4 (up to 1.7x lower).") in paths.conclusions
    assert ("Output throughput (higher is better), disaggregated vs replicated: replicated "
            "better at concurrency 1, 2 and 4 (1.4x higher).") in paths.conclusions
    assert sum("does not raise throughput" in s for s in paths.conclusions) == 1
    assert "Mixed long/short workload, disaggregation won on ITL p99" in text
    f = finding(paths.findings, "output_throughput", 4)
    assert (f.winner, f.better, round(f.gap_pct, 1)) == ("replicated", "reference", 42.9)
    assert "beyond the 10% margin; one repeat, spread unknown" in f.basis
    f = finding(paths.findings, "p99_itl_ms", 2)
    assert (f.winner, round(f.gap_pct, 1)) == ("disaggregated", 66.7)
    assert "unknown spread" in text and paths.missing == ["00", "tp"]
    names = sorted(p.name for p in paths.plots)  # no forecast recorded: no forecast plot
    assert names == sorted(f"{n}.png" for n in report.PLOT_NAMES if n != "forecast")
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths.plots)
    print("\n".join(paths.conclusions[:8]))


def test_invalid_point_shown_and_excluded(test_cfg):
    write_baseline(test_cfg)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS})
    write_disaggregated(test_cfg, {c: metrics(140 * c, 60, 9, 30) for c in LOADS}, invalid=(4,))
    paths = report.build_report(test_cfg)
    data = report.load_report_data(test_cfg)
    shown = report.display_table(report.headline_table(data))
    row = shown[(shown["architecture"] == "disaggregated") & (shown["load"] == "concurrency 4")]
    assert row["valid"].item() == "INVALID" and row["output throughput (tok/s)"].item() == "INVALID"
    assert FAILED in row["note"].item()
    assert not any(f.value == 4 and "disaggregated" in (f.subject.name, f.reference.name)
                   for f in paths.findings)
    assert any(f.value == 4 and f.subject.name == "replicated" for f in paths.findings)
    (excluded,) = [s for s in paths.conclusions if s.startswith("Excluded")]
    assert "disaggregated at concurrency 4" in excluded and "12 of 24 requests failed" in excluded
    assert not any("concurrency 4" in s for s in paths.conclusions
                   if "isaggregat" in s and not s.startswith("Excluded"))
    page = paths.html.read_text()
    assert "INVALID" in page and html.escape(FAILED) in page
    x, y, _ = report.plot_values(report.headline_table(data).query(
        "architecture == 'disaggregated'"), "output_throughput")
    assert list(x) == [1, 2, 4] and y[2] != y[2]  # NaN: a gap, never a value


def test_differences_inside_spread_are_no_difference(test_cfg):
    write_baseline(test_cfg, repeats=3, jitter=0.1)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS},
                     repeats=3, jitter=0.1)
    # 15% less throughput, beyond the 10% margin, but every repeat range (+-10%) overlaps:
    # no difference
    write_disaggregated(test_cfg, {c: metrics(170 * c, 40, 10, 50) for c in LOADS},
                        repeats=3, jitter=0.1)
    concl = report.conclusions(report.load_report_data(test_cfg))
    f = finding(concl.findings, "output_throughput", 2)
    assert f.winner is None and round(f.gap_pct, 1) == 17.6
    assert "beyond the 10% margin, but the min-max ranges over 3 and 3 repeats overlap" in f.basis
    assert ("Output throughput (higher is better), disaggregated vs replicated: no difference "
            "at concurrency 1, 2 and 4.") in concl.sentences
    assert any("won on no metric" in s for s in concl.sentences)
    assert any("measured 3 times" in s for s in concl.sentences)
    # Replicated vs baseline at concurrency 4: 800 vs 400 tok/s, ranges far apart.
    f = finding(concl.findings, "output_throughput", 4, "replicated", "baseline")
    assert f.winner == "replicated" and "do not overlap" in f.basis


def test_one_repeat_is_judged_by_the_margin_alone(test_cfg):
    write_baseline(test_cfg)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS})
    # 7.5% less throughput, 7% longer ITL: over the old 5% noise floor, within the margin
    write_disaggregated(test_cfg, {c: metrics(186 * c, 40, 10.7, 50) for c in LOADS})
    concl = report.conclusions(report.load_report_data(test_cfg))
    for key in ("output_throughput", "median_itl_ms"):
        f = finding(concl.findings, key, 1)
        assert f.winner is None and "within the 10% margin" in f.basis
    assert any("Points measured once (baseline, replicated, disaggregated) have an unknown "
               "spread: one is held against the other side's range (more than 10% beyond it), "
               "and between two such points the 10% margin alone decides" in s
               for s in concl.sentences)


def test_missing_notebooks_are_named(test_cfg):
    write_baseline(test_cfg)
    paths = report.build_report(test_cfg)
    assert paths.missing == ["00", "02", "03", "04", "tp"]
    for page in (paths.html.read_text(), paths.md.read_text()):
        for nb in ("02_KV_Cache_Transfer", "03_Replicated_Serving", "04_Disaggregated_Serving"):
            assert f"run notebooks/{nb}.ipynb" in page
    assert any("No disaggregated results" in s for s in paths.conclusions)
    assert {p.name for p in paths.plots} == {"throughput.png", "ttft.png", "itl.png",
                                             "roofline.png"}
    assert "roofline is unknown for this hardware" in paths.md.read_text()


def test_stale_plots_removed_and_md_links_plots(test_cfg):
    write_loses_throughput_wins_itl(test_cfg)
    report.build_report(test_cfg)
    for nb in ("02", "03", "04"):
        (test_cfg.results_dir / RESULTS[nb].file_name).unlink()
    paths = report.build_report(test_cfg)
    on_disk = sorted(p.name for p in (test_cfg.results_dir / "plots").glob("*.png"))
    assert on_disk == sorted(p.name for p in paths.plots)
    md = paths.md.read_text()
    assert all(f"](plots/{p.name})" in md for p in paths.plots)


def test_rate_points_are_labelled_and_compared(test_cfg):
    rates = {r: metrics(80 * r, 45, 11, 35) for r in (2.0, 4.0)}
    write_baseline(test_cfg, rates=rates)
    faster = {r: metrics(150 * r, 45, 11, 35) for r in (2.0, 4.0)}
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS}, rates=faster)
    paths = report.build_report(test_cfg)
    table = report.headline_table(report.load_report_data(test_cfg))
    assert list(table["load"])[-4:] == ["rate 2 req/s", "rate 2 req/s", "rate 4 req/s",
                                        "rate 4 req/s"]
    assert ("Output throughput (higher is better), replicated vs baseline: replicated better "
            "at concurrency 1, 2 and 4 and at rate 2 and 4 req/s (1.9-2.0x higher).") \
        in paths.conclusions


def test_failed_proof_is_a_warning(test_cfg):
    write_baseline(test_cfg)
    write_disaggregated(test_cfg, {c: metrics(140 * c, 60, 9, 30) for c in LOADS}, ok=False)
    paths = report.build_report(test_cfg)
    assert paths.conclusions[0].startswith("Notebook 04's proof that the KV cache really moved "
                                           "did not pass")
    assert paths.conclusions[1].startswith("CPU rehearsal: each prefill or decode instance")
    assert "No replicated results" in paths.conclusions[2]
    assert "Disaggregation won on ITL p50 against the single instance" in \
        "\n".join(paths.conclusions)
    assert "> **Warning:** Proof that the KV cache moved: FAILED" in paths.md.read_text()


def test_front_doors_table_when_04_recorded_it(test_cfg):
    write_baseline(test_cfg)
    write_loses_throughput_wins_itl(test_cfg)
    assert "vllm-router" not in report.build_report(test_cfg).md.read_text()
    one = {1: metrics(140, 60, 9, 30)}
    payload = disaggregated_dict(sweep("disaggregated", {c: metrics(140 * c, 60, 9, 30) for c in LOADS}))
    payload["front_doors"] = {"point": "concurrency 1", "router_version": "0.1.17",
                              "lab": sweep("disaggregated", one),
                              "vllm_router": sweep("disaggregated", {1: metrics(154, 45, 9, 30)})}
    write(test_cfg, "04", payload)
    md = report.build_report(test_cfg).md.read_text()
    assert "one sweep point (concurrency 1) through the lab's proxy, then through vllm-router 0.1.17" in md
    row = next(line for line in md.splitlines() if line.startswith("| TTFT p50 (ms)"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["TTFT p50 (ms)", "60.0", "45.0", "1.3x lower",
                                                               "vllm-router 0.1.17", "60.0"]


def test_empty_sweep_still_builds(test_cfg):
    empty = BenchmarkResult(target="t", model="tiny-llama", workload={}, points=[], combined=[])
    write(test_cfg, "01", baseline_dict(empty.model_dump()))
    paths = report.build_report(test_cfg)
    assert paths.plots == [] and paths.html.exists()
    assert any(s.startswith("Run-to-run spread: a difference counts only when it is larger "
                            "than 10%") and "Points measured once" in s for s in paths.conclusions)


def test_baseline_missing_raises(test_cfg):
    with pytest.raises(ResultsMissingError, match="01_Local_Inference_Baseline"):
        report.build_report(test_cfg)


def test_broken_optional_sweep_reported_as_missing(test_cfg):
    write_baseline(test_cfg)
    write_envelope(test_cfg, test_cfg.results_dir / "replicated_metrics.json",
                   "replicated_metrics", "03",
                   {**replicated_dict(), "sweep": {"points": "nonsense"}})
    paths = report.build_report(test_cfg)
    assert "03" in paths.missing
    text = paths.md.read_text()
    assert "not notebook 03's results as this lab reads them (payload.sweep" in text


# ----- expected figures ------------------------------------------------------------------


def cuda_cfg(tmp_path):
    data = make_profile_data(str(tmp_path / "results"))
    data["vllm"]["device"] = "cuda"
    for node in data["nodes"].values():  # one machine: no separate data-plane link
        node["data_over_lan"] = True
    return write_profile(tmp_path, data)


def link_row(cfg) -> dict:
    df = report.expected_figures(report.load_report_data(cfg)).set_index("figure")
    return df.loc["link per rail (Gb/s)"].to_dict()


def test_expected_figures_not_comparable_on_cpu(test_cfg):
    write_baseline(test_cfg)
    data = report.load_report_data(test_cfg)
    df = report.expected_figures(data)
    assert "this run" not in df.columns  # left out, not shown as "not comparable"
    decode = df.set_index("figure").loc["decode tokens/s per stream"]
    # the Spark profile's model, never the rehearsal's tiny one (01's roofline weights):
    # Qwen3-8B's published config.json, 15.1 GB read per step, 273 GB/s over it
    from lab_utils.forecast.inputs import dense_params
    from lab_utils.kv.shapes import PUBLISHED_CONFIGS

    read = dense_params(PUBLISHED_CONFIGS["Qwen/Qwen3-8B"])[1]
    assert round(read / 1e9, 1) == 15.1
    assert decode["expected (two Sparks)"] == f"{273e9 / read:.2f}" == "18.04"
    assert "15.1 GB of weights" in decode["basis"]
    assert "Qwen/Qwen3-8B" in decode["basis"] and "this model" not in decode["basis"]
    assert "not comparable" not in report.build_report(test_cfg).md.read_text()


def test_expected_figures_warn_when_far_off_on_cuda(tmp_path):
    cfg = cuda_cfg(tmp_path)
    roof = {"memory_bandwidth_GBps": 273.0, "weight_bytes": 16_000_000_000,
            "bandwidth_source": "GB10 LPDDR5x, published figure",
            "max_tokens_per_s_per_stream": 17.06}
    write_baseline(cfg, roofline=roof)  # TPOT 10 ms at concurrency 1: 100 tok/s per stream
    write_kv(cfg)  # 512 tokens x 16 KiB in 6.1 ms: 1.4 GB/s; the probe's 64 MiB READ: 1.6 GB/s
    df = report.expected_figures(report.load_report_data(cfg)).set_index("figure")
    # 01 recorded the published 273 GB/s itself: nothing independent to compare
    bw = df.loc["memory bandwidth (GB/s)"]
    assert (bw["this run"], bw["verdict"]) == ("published figure",
                                               "not compared (no independent measurement)")
    assert bw["measured from"].startswith("the published figure, not measured")
    assert df.loc["decode tokens/s per stream", "verdict"] == \
        "WARNING: 5.9x above the expected figure"
    nixl = df.loc["NIXL DRAM-to-DRAM (GB/s)"]
    assert nixl["verdict"] == "WARNING: 6.9x below the expected figure"
    assert (nixl["this run"], nixl["measured from"]) == \
        ("1.60", "02's NIXL probe, DRAM READ of 67,108,864 bytes")
    assert df.loc["link per rail (Gb/s)", "verdict"] == "not measured"
    assert df.loc["link per rail (Gb/s)", "measured from"] == "not recorded by 00"
    md = report.build_report(cfg).md.read_text()
    assert "> **Warning:** decode tokens/s per stream" in md
    assert "at most 17.06 tokens/s" in md
    assert "KV cache per token of tiny-llama: 16,384 bytes (16.0 KiB), moved in blocks of 16" in md


def test_expected_memory_bandwidth_compared_when_measured(tmp_path):
    cfg = cuda_cfg(tmp_path)
    write_baseline(cfg, roofline={"memory_bandwidth_GBps": 250.0, "weight_bytes": 16 * 10**9,
                                  "bandwidth_source": "measured on spark-01: streaming read",
                                  "max_tokens_per_s_per_stream": 15.6})
    row = report.expected_figures(report.load_report_data(cfg)).set_index("figure").loc[
        "memory bandwidth (GB/s)"]
    assert row["verdict"] == "ok (within 2x)" and row["this run"] == "250"
    assert row["measured from"] == "01's roofline record: measured on spark-01: streaming read"


def test_expected_link_from_rdma_check(tmp_path):
    cfg = cuda_cfg(tmp_path)
    write_baseline(cfg)
    # ib_write_bw on one rail at 40 of the 100 Gb/s it reports: a warn in 00
    write_environment(cfg, link_verdict("spark-b -> spark-a", [{"gbps": 40.0, "reported_gbps": 100.0}],
                                        "ib_write_bw on rocep1s0f1: 40.0 Gb/s"))
    row = link_row(cfg)
    assert (row["this run"], row["verdict"]) == ("40", "WARNING: 2.3x below the expected figure")
    assert row["measured from"] == "00's link check, spark-b -> spark-a, ib_write_bw on one rail"
    md = report.build_report(cfg).md.read_text()
    assert "Blessed: no check failed (1 pass, 1 warn, 0 fail, 0 n/a)." in md
    assert "| link | spark-b -> spark-a | warn | moves 40% of one PCIe x4 half's ~100 Gb/s |" in md
    write_environment(cfg, link_verdict("spark-b -> spark-a", [{"gbps": 94.5, "reported_gbps": 100.0}], "ib_write_bw"))
    assert link_row(cfg)["verdict"] == "ok (within 2x)"


def test_expected_link_over_tcp_not_compared(tmp_path):
    cfg = cuda_cfg(tmp_path)
    write_baseline(cfg)
    tcp = CheckResult("link", "spark-b -> spark-a", "pass", "9.4 Gb/s over the data plane",
                      data={"measured_gbps": 9.4, "reported_gbps": None, "method": "tcp"})
    write_environment(cfg, tcp)
    row = link_row(cfg)
    assert (row["this run"], row["verdict"]) == \
        ("9.40", "not comparable (one TCP stream, not ib_write_bw over RDMA)")
    write_environment(cfg, CheckResult("link", "cluster", "n/a", "prefill and decode share "
                                       "one node: no link between them"))
    row = link_row(cfg)
    assert (row["this run"], row["verdict"]) == ("–", "not measured")
    assert "prefill and decode share one node" in row["measured from"]


# ----- rendering in a real browser -------------------------------------------------------

CHECK_SCRIPT = """
<img id="broken-control" alt="control" src="data:image/png;base64,AAAA">
<script>
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).map(i => i.alt);
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  const out = document.createElement("pre");
  out.id = "img-check";
  out.textContent = JSON.stringify({ok: ok, broken: broken});
  document.body.appendChild(out);
});
</script>
"""


def chromium_or_skip() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        msg = ("chromium not found: install it with `bash tests/ensure_sysdeps.sh` as root "
               "(Debian package chromium)")
        if os.environ.get("LAB_STRICT"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def run_chromium(exe: str, profile_dir, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile_dir}",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_report_html_renders_in_chromium(series, tmp_path):
    """The report the notebook series wrote (notebook 05, tests/support/series.py), opened
    in headless Chromium: every plot is inlined and loads."""
    exe = chromium_or_skip()
    html_path = series.cfg.results_dir / "report.html"
    page = html_path.read_text()
    inlined = page.count('src="data:image/png;base64,')
    assert 'src="plots/' not in page and inlined >= 4, inlined
    # A copy with a checker (and one deliberately broken image, to prove the check can fail).
    check = tmp_path / "check.html"
    check.write_text(page.replace("</body>", CHECK_SCRIPT + "</body>"))
    t0 = time.monotonic()
    dom = run_chromium(exe, tmp_path / "chromium", "--virtual-time-budget=10000",
                       "--dump-dom", check.as_uri())
    found = re.search(r'<pre id="img-check">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"no image check in the DOM (exit {dom.returncode}): {dom.stderr[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    assert result["broken"] == ["control"]
    assert len(result["ok"]) == inlined
    shot = tmp_path / "report.png"
    run_chromium(exe, tmp_path / "chromium", f"--screenshot={shot}", "--window-size=1280,2400",
                 html_path.as_uri())
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000
    print(f"\nchromium: DOM check and screenshot in {time.monotonic() - t0:.1f} s; {shot}")


def test_runs_the_machine_stalled_in_are_named(test_cfg):
    write_baseline(test_cfg)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS})
    assert not any("stood still" in s for s in report.build_report(test_cfg).conclusions)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS},
                     held_up={2: 6.5}, mixed={2: metrics(100, 400, 10, 50)})
    (said,) = [s for s in report.build_report(test_cfg).conclusions if "stood still" in s]
    runs = 2 * len(LOADS) + 1
    assert said.startswith(f"The machine running the benchmark stood still during 2 of {runs} "
                           "measured runs, 13.0 s in all (replicated concurrency 2 #1: 6.5 s; "
                           "replicated (mixed workload) concurrency 2 #1: 6.5 s)")
    data = report.load_report_data(test_cfg)
    for workload in ("standard", "mixed"):
        shown = report.display_table(report.headline_table(data, workload))
        noted = shown[shown["note"] != ""]
        assert list(zip(noted["architecture"], noted["load"], noted["note"], strict=True)) == [
            ("replicated", "concurrency 2", "repeat 1: the machine stood still 6.5 s")]


def test_runs_whose_tokens_were_read_together_are_named(test_cfg):
    write_baseline(test_cfg, read_together={1: 0.05})  # under the 10% that earns a note
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS})
    assert not any("same read" in s for s in report.build_report(test_cfg).conclusions)
    write_replicated(test_cfg, {c: metrics(200 * c, 40, 10, 50) for c in LOADS},
                     held_up={4: 3.0}, read_together={2: 0.1, 4: 0.45})
    (said,) = [s for s in report.build_report(test_cfg).conclusions if "same read" in s]
    assert said.startswith(f"In 2 of {2 * len(LOADS)} measured runs, at least 10% of the tokens "
                           "after the first reached the load generator in the same read as the "
                           "token before (replicated concurrency 2 #1: 10%; replicated "
                           "concurrency 4 #1: 45%).")
    built = report.build_report(test_cfg)
    (left,) = [s for s in built.conclusions if s.startswith("Not compared on")]
    assert left == ("Not compared on ITL p50, ITL p99 and TPOT p50 where the load generator got "
                    "many tokens in one read on either side (the headline table's notes name the "
                    "runs): replicated vs baseline at concurrency 2 and 4.")
    per_token = {"median_itl_ms", "p99_itl_ms", "median_tpot_ms"}
    compared = {(f.value, f.metric) for f in report.conclusions(report.load_report_data(test_cfg)).findings}
    assert {m for v, m in compared if v == 1} >= per_token  # 5% at concurrency 1: compared
    assert not {m for v, m in compared if v in (2, 4)} & per_token
    assert {m for v, m in compared if v in (2, 4)} >= {"median_ttft_ms", "output_throughput"}
    shown = report.display_table(report.headline_table(report.load_report_data(test_cfg), "standard"))
    noted = shown[shown["note"] != ""]
    assert list(zip(noted["architecture"], noted["load"], noted["note"], strict=True)) == [
        ("replicated", "concurrency 2", "repeat 1: 10% of tokens read together"),
        ("replicated", "concurrency 4",
         "repeat 1: the machine stood still 3.0 s, 45% of tokens read together")]


def test_the_report_opens_with_a_one_screen_verdict(test_cfg):
    write_loses_throughput_wins_itl(test_cfg)
    paths = report.build_report(test_cfg)
    data = report.load_report_data(test_cfg)
    verdict, archs = report.verdict_table(report.conclusions(data, report.points_table(data)))
    assert archs == "baseline, replicated and disaggregated"
    standard = verdict[verdict["workload"] == "standard"]
    row = standard[standard["metric"].str.startswith("output throughput")]
    # request throughput ranks and measures the same (fixed output length): one row
    assert row["metric"].item() == ("output throughput (higher is better; request throughput "
                                    "ranks the same)")
    assert not standard["metric"].str.startswith("request throughput").any()
    # all three, best first, the margin where they differ
    assert row["concurrency 4"].item() == "replicated > disaggregated (1.4x) > baseline (1.4x)"
    row = standard[standard["metric"] == "ITL p99 (lower is better)"]
    assert row["concurrency 2"].item() == "disaggregated = baseline > replicated (1.7x)"
    assert len(verdict) <= 2 * len(report.METRICS)  # one screen: a row per workload and metric
    md = paths.md.read_text()
    order = [md.index(h) for h in ("## Verdict", "## Plots", "## Headline table", "## Conclusions")]
    assert order == sorted(order)
    folded = md[md.index("## Conclusions"):md.index("## Comparison at every load point")]
    assert "<details><summary>" in folded and "</details>" in folded
    assert "<details><summary>" in paths.html.read_text()


def test_the_first_screen_has_the_verdict_sentence_the_banner_and_the_system(test_cfg):
    write_loses_throughput_wins_itl(test_cfg)
    data = {c: metrics(100 * c, 50, 10, 30) for c in LOADS}
    payload = baseline_dict(sweep("baseline", data), roofline=roofline_dict())
    payload["instances"] = [{"name": "baseline-0", "node": "spark-01", "url": "http://h:1",
                             "kind": "vllm", "role": "baseline",
                             "argv": ["/py", "-m", "vllm.entrypoints.openai.api_server",
                                      "--model", "/m", "--port", "1", "--dtype", "bfloat16",
                                      "--block-size", "32", "--enforce-eager"]}]
    write_results(test_cfg, "01", model("01", payload))  # this machine's software and hardware
    md = report.build_report(test_cfg).md.read_text()
    first = md[:md.index("Written ")]  # before the rest of the introduction
    lines = first.splitlines()
    assert lines[0] == "# Benchmark report: profile test-local-cpu"
    # computed: the largest win as a ratio, what it cost, where, on which hardware
    print(lines[2])
    assert lines[2].startswith(
        "Verdict: Best of disaggregated serving, round-robin replicated serving and the single "
        "instance, each against every other measured at the same load by the lab's rule. "
        "Standard workload (concurrency 1, 2 and 4): output throughput: round-robin replicated "
        "serving at concurrency 1, 2 and 4 (up to 1.4x higher than the next); TTFT p50: "
        "round-robin replicated serving at concurrency 1, 2 and 4 (up to 1.2x lower than the next); ITL p99: no single "
        "best at concurrency 1, 2 and 4 (beaten by none, by the lab's rule: disaggregated "
        "serving 30.00 ms / 30.00 ms / 30.00 ms and the single instance 30.00 ms / 30.00 ms / "
        "30.00 ms). Mixed workload (concurrency 1, 2 and 4): ")
    assert "ITL p99: disaggregated serving at concurrency 1, 2 and 4 (up to 10x lower" in lines[2]
    assert lines[4].startswith("Every node of this profile is the same machine")
    assert "> **Warning:** CPU REHEARSAL, NOT A DGX SPARK" in first
    box = dict(re.findall(r"^\| ([^|]+?) \| (.+?) \|$", first, re.M))
    software = hardware.software_versions()
    assert f"vLLM {software['vllm']}, NIXL {software['nixl']}" in box["software"]
    assert f"UCX {software['ucx']}" in box["software"]
    hw = box["hardware (where the notebooks ran)"]
    assert f"{os.cpu_count()} cores" in hw and "GB memory" in hw
    assert platform.release() in box["OS and kernel"]
    if software["lab_commit"]:
        assert f"commit {software['lab_commit'][:12]}" in box["the lab"]
    assert box["model"] == "tiny-llama, dtype bfloat16, revision not pinned (as fetched)"
    assert box["vLLM flags: baseline (baseline, notebook 01)"] == (
        "--dtype bfloat16 --block-size 32 --enforce-eager")
    assert "128-token prompts; 32 output tokens (ignore_eos: each request" in box["workload"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d( to .*)?", box["date (UTC)"])
    # set through the environment, not a flag: what the lab did to NIXL's threads in 04
    assert box["NIXL progress threads (prefill, decode)"].startswith(
        "each waits in poll() up to 1 ms between rounds, set by the lab for these runs "
        "(kv_transfer.nixl_progress_delay_us = 1000; as vLLM starts NIXL, without it, the "
        "thread polls without pause); any found busy lowered")


def test_the_verdict_sentence_when_nothing_differs_and_on_a_gpu(tmp_path):
    cfg = cuda_cfg(tmp_path)
    same = {c: metrics(100 * c, 50, 10, 30) for c in LOADS}
    write(cfg, "01", baseline_dict(sweep("baseline", same), roofline=roofline_dict()))
    write_replicated(cfg, {c: metrics(104 * c, 52, 10, 31) for c in LOADS})
    md = report.build_report(cfg).md.read_text()
    assert ("Verdict: Best of round-robin replicated serving and the single instance, each "
            "against every other measured at the same load by the lab's rule. Standard workload "
            "(concurrency 1, 2 and 4): output throughput: no single best at concurrency 1, 2 and "
            "4 (beaten by none, by the lab's rule: round-robin replicated serving 104.0 tok/s / "
            "208.0 tok/s / 416.0 tok/s and the single instance 100.0 tok/s / 200.0 tok/s / "
            "400.0 tok/s); TTFT p50: no single best at concurrency 1, 2 and 4 (beaten by none, "
            "by the lab's rule: round-robin replicated serving 52.00 ms / 52.00 ms / 52.00 ms and "
            "the single instance 50.00 ms / 50.00 ms / 50.00 ms); ITL p99: no single best at "
            "concurrency 1, 2 and 4 (beaten by none, by the lab's rule: round-robin replicated "
            "serving 31.00 ms / 31.00 ms / 31.00 ms and the single instance 30.00 ms / 30.00 ms "
            "/ 30.00 ms).") in md
    assert "CPU REHEARSAL" not in md


# What `vllm bench serve --save-result` (vLLM 0.32, without --save-detailed) writes for a
# run at a concurrency with --percentile-metrics ttft,tpot,itl,e2el, from
# vllm/benchmarks/serve.py's `benchmark` and `main`: the lab's export must carry each.
# tests/report/test_export_engine.py checks the export against a file vllm bench serve
# wrote on a real instance (keys, types, units); this is the quick check without one.
VLLM_SAVE_RESULT_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "latencies",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for s in ("mean", "median", "std", "p99")),
}


def test_every_run_is_exported_as_vllm_bench_serve_json_and_as_csv(test_cfg):
    write_loses_throughput_wins_itl(test_cfg)
    paths = report.build_report(test_cfg)
    names = sorted(p.name for p in paths.exports)
    # vLLM's pattern, {label}-{rate}qps-concurrency{n}-{model}-{date}.json, the repeat before
    # the date
    (rep4,) = [n for n in names if re.fullmatch(
        r"replicated-standard-infqps-concurrency4-tiny-llama-repeat1-\d{8}-\d{6}\.json", n)]
    assert "runs.csv" in names
    runs = (2 * 3 + 2 * 3) + 3  # standard and mixed of 03 and 04, standard of 01
    assert len(names) == runs + 1
    got = json.loads((paths.exports[0].parent / rep4).read_text())
    assert set(got) >= VLLM_SAVE_RESULT_KEYS, VLLM_SAVE_RESULT_KEYS - set(got)
    # the same meaning: the run's numbers, in vLLM's units
    assert got["max_concurrency"] == 4 and got["request_rate"] == "inf"
    assert got["output_throughput"] == 800.0 and got["median_ttft_ms"] == 40.0
    assert got["model_id"] == "tiny-llama" and re.fullmatch(r"\d{8}-\d{6}", got["date"])
    assert got["label"] == "replicated-standard" and "lab_goodput_slo_ms" not in got  # no SLO
    csv = pd.read_csv(paths.exports[0])
    assert len(csv) == runs and {"label", "model", "date", "architecture", "workload", "repeat",
                                 "mean_e2el_ms", "prefix_cache_hit_pct",
                                 "completed", "failed", "duration"} <= set(csv.columns)
    assert sorted(set(csv["repeat"])) == [1]  # numbered from 1, as in the file names
    assert (csv["date"].str.fullmatch(r"\d{8}-\d{6}")).all()
    row = csv[(csv["architecture"] == "disaggregated") & (csv["workload"] == "standard")
              & (csv["value"] == 2)]
    assert row["output_throughput"].item() == 280.0
    # and in the report, per point: the fields vllm bench serve prints
    fields = report.fields_table(report.load_report_data(test_cfg))
    assert {"completed", "failed", "duration", "total_token_throughput", "mean_ttft_ms",
            "median_e2el_ms", "p99_tpot_ms"} <= set(fields.columns)
    assert len(fields) == 3 * 3 + 2 * 3  # the points: 01, 03 and 04; mixed of 03 and 04
    md = paths.md.read_text()
    assert "Every field vllm bench serve reports, per point (15 points)" in md


def test_the_exported_backend_names_the_endpoint_the_run_used():
    from lab_utils.report.export import vllm_result
    from lab_utils.results.sweep import BenchmarkPoint, BenchmarkResult

    point = BenchmarkPoint(mode="concurrency", value=1, repeat=0, summary={}, requests=[])
    for chat, backend in ((False, "openai"), (True, "openai-chat")):  # vLLM's --backend names
        result = BenchmarkResult(target="http://127.0.0.1:8000", model="tiny-llama",
                                 workload={"chat": chat, "num_prompts": 4}, points=[point],
                                 combined=[])
        got = vllm_result(result, point, label="x")
        assert got["backend"] == got["endpoint_type"] == backend


def test_each_p99_shows_its_n_and_says_max_under_100(test_cfg):
    from lab_utils.report.tables import display_table, headline_table

    write_baseline(test_cfg)
    data = report.load_report_data(test_cfg)
    for p in data.sweeps["baseline"].points:  # 24 requests, 31 gaps each
        p.summary.completed = 24
        p.requests = [{"error": None, "itl_ms": [1.0] * 31}] * 24
    shown = display_table(headline_table(data)).iloc[0]
    assert shown["TTFT p99 (ms)"] == "100.00 (n=24, ~max)"
    assert shown["ITL p99 (ms)"] == "30.00 (n=744)"
    assert shown["TTFT p50 (ms)"] == "50.00"
