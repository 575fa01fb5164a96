"""Expected figures for a cluster of two DGX Sparks beside the ones this run measured:
memory bandwidth (01's roofline record), decode tokens/s of one stream (01's sweep), NIXL
DRAM-to-DRAM bandwidth (02's probe) and the data-plane link (00's link check). A real
(cuda) run more than FAR_OFF times away from a figure is flagged, so a misconfigured
cluster shows before its comparisons are trusted. The CPU rehearsal compares nothing and
shows only the expected figures, for the Spark profile's model (never the rehearsal's).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from lab_utils.forecast.inputs import SPARK_MODEL, dense_params
from lab_utils.kv.shapes import PUBLISHED_CONFIGS
from lab_utils.report.data import PER_STREAM, ReportData, is_number, num_or_nan
from lab_utils.report.tables import kv_table, points_table
from lab_utils.results import EnvironmentPayload
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.util.numbers import fmt_num

_SPARK_READ = dense_params(PUBLISHED_CONFIGS[SPARK_MODEL])[1]
FAR_OFF = 2.0  # a measured figure this many times above or below the expected one is flagged

# Expected figures for a two-Spark cluster: NVIDIA's published GB10 memory bandwidth, and the
# recorded GB10 runs shipped in tests/fixtures/dgx-spark-recorded/ (nixlbench, ib_write_bw;
# SOURCES.md there names each one's origin). Verify them on the cluster; the report flags a
# real run more than FAR_OFF away.
EXPECTED_TWO_SPARK: dict[str, Any] = {
    "source": ("NVIDIA's DGX Spark specifications (273 GB/s LPDDR5x) and recorded GB10 runs "
               "(tests/fixtures/dgx-spark-recorded/, sources in its SOURCES.md); verify on the "
               "cluster"),
    "memory_bandwidth_GBps": 273.0,  # GB10 unified LPDDR5x
    # the model the Spark profile serves (environment_config.json.example), from its
    # published config.json: the bytes one decode step reads in bf16, and 273 GB/s over them
    "decode_tokens_per_s_per_stream": 273e9 / _SPARK_READ,
    "decode_weight_bytes": _SPARK_READ,
    "decode_model": f"{SPARK_MODEL} in bf16, the Spark profile's model",
    "nixl_dram_GBps": (11.0, 13.0),  # NIXL DRAM to DRAM over the ConnectX-7 link
    "link_Gbps_per_rail": (92.0, 97.0),  # ib_write_bw per PCIe x4 half of the ConnectX-7
}


class Observed(NamedTuple):
    """A figure of this run: its value (None: not measured), where it comes from, and why
    it cannot be compared with the expected one (None: it can)."""

    value: float | None
    source: str
    not_comparable: str | None = None


def measured_nixl_dram_GBps(payload02: KvTransferPayload | None) -> Observed:
    """02's probe: the largest DRAM READ (what NixlConnector does); without probe rows,
    the largest prompt's measured KV transfer."""
    reads = [r for r in (payload02.probe.rows if payload02 else [])
             if r.get("seg_type") == "DRAM" and r.get("op") == "READ"
             and is_number(r.get("bytes")) and is_number(r.get("bandwidth_GBps"))]
    if reads:
        top = max(reads, key=lambda r: r["bytes"])
        source = f"02's NIXL probe, DRAM READ of {fmt_num(top['bytes'])} bytes"
        if top.get("checksum_ok") is False:
            source += " (its checksum did not match)"
        return Observed(float(top["bandwidth_GBps"]), source)
    kv = kv_table(payload02).dropna(subset=["kv_bytes", "measured_ms"])
    kv = kv[kv["measured_ms"] > 0]
    if kv.empty:
        return Observed(None, "not measured (no 02 probe DRAM READ rows or measured transfers)")
    last = kv.iloc[-1]
    return Observed(last["kv_bytes"] / last["measured_ms"] / 1e6,
                    f"02's KV transfer of {last['prompt_tokens']:g} prompt tokens "
                    "(includes latency)")


def measured_link_Gbps(payload00: EnvironmentPayload | None) -> Observed:
    """00's data-plane link check per rail: ib_write_bw over every configured rail at once
    (RDMA; their mean), or one TCP stream, which says nothing about a rail's RDMA
    bandwidth."""
    links = [c for c in (payload00.checks if payload00 else []) if c.check == "link"]
    measured = [c for c in links if is_number(c.data.get("measured_gbps"))]
    if not measured:
        if not links:
            return Observed(None, "not recorded by 00")
        c = links[0]
        return Observed(None, f"not measured (00's link check: {c.status}, {c.summary})")
    worst = min(measured, key=lambda c: c.data["measured_gbps"])
    gbps = float(worst.data["measured_gbps"])
    if worst.data.get("method") == "tcp":
        return Observed(gbps, f"00's link check, {worst.node}, one TCP stream",
                        "one TCP stream, not ib_write_bw over RDMA")
    n = int(worst.data.get("rails") or 1)  # a link check that timed one rail holds no count
    if n == 1:
        return Observed(gbps, f"00's link check, {worst.node}, ib_write_bw on one rail")
    return Observed(gbps / n, f"00's link check, {worst.node}, ib_write_bw on {n} rails at "
                              f"once ({gbps:.1f} Gb/s together), per rail")


def measured_memory_bandwidth(data: ReportData) -> Observed:
    """01's roofline bandwidth, when it was measured. On a GB10 01 records the published
    figure itself (nothing on the node measures LPDDR5x bandwidth), and comparing that
    with the expected figure would compare a constant with itself."""
    roof = data.baseline.roofline if data.baseline else None
    if roof is None or roof.memory_bandwidth_GBps is None:
        return Observed(None, "not measured (no roofline in 01's record)"
                        if roof is None else f"not measured ({roof.bandwidth_source})")
    if not roof.bandwidth_source.startswith("measured"):
        return Observed(None, f"the published figure, not measured ({roof.bandwidth_source}: "
                              f"{fmt_num(roof.memory_bandwidth_GBps)} GB/s)")
    return Observed(num_or_nan(roof.memory_bandwidth_GBps), f"01's roofline record: "
                    f"{roof.bandwidth_source}")


def measured_decode_per_stream(table: pd.DataFrame) -> Observed:
    """Decode tokens/s of one stream: 1000 / TPOT p50 at the baseline's lowest concurrency."""
    if table.empty:
        return Observed(None, "not measured")
    rows = table[(table["architecture"] == "baseline") & (table["workload"] == "standard")
                 & (table["mode"] == "concurrency") & table["valid"]].dropna(subset=[PER_STREAM])
    if rows.empty:
        return Observed(None, "no valid baseline concurrency point")
    row = rows.sort_values("value").iloc[0]
    return Observed(float(row[PER_STREAM]), f"01, 1000 / TPOT p50 at {row['load']}")


def _verdict(m: Observed, expected: float | tuple[float, float]) -> str:
    if m.value is None or not math.isfinite(m.value):
        return "not measured"
    if m.not_comparable:
        return f"not comparable ({m.not_comparable})"
    lo, hi = expected if isinstance(expected, tuple) else (expected, expected)
    ratio = 1.0 if lo <= m.value <= hi else m.value / (lo if m.value < lo else hi)
    if ratio > FAR_OFF or ratio < 1 / FAR_OFF:
        way = f"{ratio:.1f}x above" if ratio > 1 else f"{1 / ratio:.1f}x below"
        return f"WARNING: {way} the expected figure"
    return f"ok (within {FAR_OFF:g}x)"


def _expected_decode(data: ReportData) -> tuple[float, str]:
    """Decode tokens/s per stream expected on a Spark: for the model this run served when it
    ran on the GPU (its weights from 01's roofline), else (the CPU rehearsal's tiny model is
    not what a Spark serves) for the Spark profile's model, from the published figures."""
    e = EXPECTED_TWO_SPARK
    bw = e["memory_bandwidth_GBps"]
    roof = data.baseline.roofline if data.baseline else None
    weights = roof.weight_bytes if roof else None
    if data.device == "cuda" and weights is not None and weights > 0:
        return bw * 1e9 / weights, (f"{bw:g} GB/s / {weights / 1e9:.1f} GB of weights "
                                    "read per token (this model)")
    return (e["decode_tokens_per_s_per_stream"],
            f"{bw:g} GB/s / {e['decode_weight_bytes'] / 1e9:.1f} GB of weights read per token "
            f"({e['decode_model']})")


def _show(v: float | tuple[float, float]) -> str:
    return f"{fmt_num(v[0])}-{fmt_num(v[1])}" if isinstance(v, tuple) else fmt_num(v)


def expected_figures(data: ReportData, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """The expected figures for two Sparks beside this run's (real cluster only)."""
    table = points_table(data) if table is None else table
    e = EXPECTED_TWO_SPARK
    dec_exp, dec_basis = _expected_decode(data)
    rows = [
        ("memory bandwidth (GB/s)", e["memory_bandwidth_GBps"], "GB10 LPDDR5x, published",
         measured_memory_bandwidth(data)),
        ("decode tokens/s per stream", dec_exp, dec_basis, measured_decode_per_stream(table)),
        ("NIXL DRAM-to-DRAM (GB/s)", e["nixl_dram_GBps"], "nixlbench over ConnectX-7",
         measured_nixl_dram_GBps(data.kv_transfer)),
        ("link per rail (Gb/s)", e["link_Gbps_per_rail"], "ib_write_bw, one PCIe x4 half",
         measured_link_Gbps(data.environment)),
    ]
    comparable = data.device == "cuda"
    out = []
    for name, expected, basis, measured in rows:
        rec = {"figure": name, "expected (two Sparks)": _show(expected), "basis": basis}
        if comparable:
            published = measured.source.startswith("the published figure")
            rec.update({"this run": fmt_num(measured.value) if measured.value is not None
                        else "published figure" if published else "–",
                        "measured from": measured.source,
                        "verdict": "not compared (no independent measurement)" if published
                        else _verdict(measured, expected)})
        out.append(rec)  # on the CPU rehearsal nothing of this run is set beside them
    return pd.DataFrame(out)
