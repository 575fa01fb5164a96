"""The report's plots, drawn with matplotlib's Agg canvas (pyplot is never touched, so a
notebook keeps its own backend): throughput, TTFT and ITL against load per architecture,
KV transfer time against prompt length, decode tokens/s per stream against the
memory-bandwidth roofline, and ITL p99 under the mixed long/short workload. Error bars
span the repeats; an invalid point is a gap in its line and a cross on the x axis, never a
value. `write_plots` writes them as plots/*.png and removes the ones not drawn this time.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lab_utils.report.data import ARCHITECTURES, PER_STREAM, ReportData, graded
from lab_utils.report.tables import kv_table, workload_rows
from lab_utils.results.claims import Claim, claim
from lab_utils.results.forecast import GradeRow
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.points import BY_KEY, MetricKey
from lab_utils.util.atomic import atomic_write_bytes
from lab_utils.util.numbers import fmt_num, label_log_axis, titled

# one colour and one marker per architecture, the same in every plot
COLORS = {"baseline": "tab:blue", "replicated": "tab:orange", "disaggregated": "tab:green",
          "tensor-parallel": "tab:purple"}
MARKERS = {"baseline": "o", "replicated": "s", "disaggregated": "^", "tensor-parallel": "D"}
PLOT_NAMES = ("throughput", "ttft", "itl", "kv_transfer", "roofline", "mixed_itl", "forecast")


@dataclass(frozen=True)
class Plot:
    name: str
    title: str
    caption: str
    png: bytes


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _figure(nrows: int, ncols: int, title: str, device: str | None) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(7.6 * ncols, 3.6 * nrows + 0.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    fig.suptitle(titled(title, device))
    return fig, axes


def _legend(ax) -> None:
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _setup_x(ax, mode: str, values: list[float]) -> None:
    values = sorted(set(values))
    if values and values[0] > 0 and values[-1] / values[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)" if mode == "concurrency"
                  else "request rate (req/s)")
    ax.grid(True, alpha=0.3)


def plot_values(rows: pd.DataFrame, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y and the y error bars of one series; invalid points are NaN (a gap, no value)."""
    rows = rows.sort_values("value")
    valid = rows["valid"].to_numpy(bool)
    x = rows["value"].to_numpy(float)
    y = np.where(valid, rows[key].to_numpy(float), np.nan)
    spread = valid & (rows["repeats"].to_numpy() > 1)
    lo = np.where(spread, rows[f"{key}_min"].to_numpy(float), y)
    hi = np.where(spread, rows[f"{key}_max"].to_numpy(float), y)
    err = np.nan_to_num(np.vstack([y - lo, hi - y]), nan=0.0).clip(min=0)
    return x, y, err


def _draw_arch(ax, rows: pd.DataFrame, arch: str, series: list[tuple[str, str, str]]) -> None:
    """One architecture's series as lines in its colour and marker (`series`: metric key,
    line style, label suffix)."""
    for key, line, suffix in series:
        x, y, err = plot_values(rows, key)
        ax.errorbar(x, y, yerr=err, fmt=line + MARKERS[arch], color=COLORS[arch], capsize=3,
                    label=f"{arch}{suffix}")
    bad = rows.loc[~rows["valid"], "value"].to_numpy(float)
    if len(bad):
        ax.scatter(bad, np.full(len(bad), 0.03), transform=ax.get_xaxis_transform(),
                   marker="x", s=90, linewidths=2.5, color=COLORS[arch], zorder=5,
                   clip_on=False, label=f"{arch}: invalid, no value")


def _bars(ax, part: pd.DataFrame, archs: list[str], series: list[tuple[str, str, str]]) -> None:
    """One load point: a bar per architecture (and per series, the second hatched), in
    its colour, min-max over repeats as error bars; an invalid point has no bar, a cross."""
    width = 0.8 / len(series)
    for i, arch in enumerate(archs):
        rows = part[part["architecture"] == arch]
        for j, (key, line, suffix) in enumerate(series):
            _, y, err = plot_values(rows, key)
            x = i - 0.4 + width * (j + 0.5)
            if np.isnan(y[0]):
                ax.scatter([x], [0], marker="x", s=90, color=COLORS[arch], zorder=5,
                           label=f"{arch}: invalid, no value")
                continue
            ax.bar([x], y, width, yerr=err, capsize=3, color=COLORS[arch],
                   hatch="//" if line == "--" else None, edgecolor="black", linewidth=0.5,
                   label=f"{arch}{suffix}")
    ax.set_xticks(range(len(archs)), archs, rotation=15, ha="right")
    ax.grid(True, axis="y", alpha=0.3)


def _metric_plot(table: pd.DataFrame, name: str, title: str, panels: list[tuple[str, list]],
                 device: str | None = None) -> Plot | None:
    """Each panel a metric against load, every architecture measured; a mode measured at
    one load only is drawn as bars, one per architecture, not as lines of one point."""
    if table.empty:
        return None
    modes = [m for m in ("concurrency", "rate") if (table["mode"] == m).any()]
    fig, axes = _figure(len(panels), len(modes), title, device)
    for c, mode in enumerate(modes):
        part = table[table["mode"] == mode]
        archs = [a for a in ARCHITECTURES if (part["architecture"] == a).any()]
        loads = sorted(set(part["value"]))
        for r, (ylabel, series) in enumerate(panels):
            ax = axes[r][c]
            if len(loads) == 1:
                _bars(ax, part, archs, series)
                ax.set_xlabel(f"at {mode} {loads[0]:g} (one load point)")
            else:
                for arch in archs:
                    _draw_arch(ax, part[part["architecture"] == arch], arch, series)
                _setup_x(ax, mode, loads)
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            _legend(ax)
    return Plot(name, title, _invalid_caption(table), _png(fig))


def _invalid_caption(table: pd.DataFrame) -> str:
    bad = table[~table["valid"]]
    text = ("Error bars: min-max over repeats (none with one repeat). Invalid points are never "
            "drawn as values: the line has a gap there and a cross on the x axis marks the load.")
    if bad.empty:
        return text + " No point here is invalid."
    names = [f"{r['architecture']} at {r['load']}" for _, r in bad.iterrows()]
    return text + " Invalid here: " + ", ".join(names) + "."


def _roofline_plot(data: ReportData, table: pd.DataFrame) -> Plot | None:
    rows = table[(table["workload"] == "standard") & (table["mode"] == "concurrency")]
    if rows.empty:
        return None
    fig, axes = _figure(1, 1, "Decode tokens/s per stream vs concurrency", data.device)
    ax = axes[0][0]
    for arch in ARCHITECTURES:
        part = rows[rows["architecture"] == arch]
        if not part.empty:
            _draw_arch(ax, part, arch, [(PER_STREAM, "-", "")])
    roof = roofline_limit(data)
    if roof is not None:
        ax.axhline(roof, color="black", linestyle=":",
                   label=f"memory-bandwidth roofline ({fmt_num(roof)} tok/s)")
    else:
        ax.text(0.5, 0.95, "roofline unknown for this hardware", transform=ax.transAxes,
                ha="center", va="top", fontsize="small")
    _setup_x(ax, "concurrency", list(rows["value"]))
    ax.set_ylabel("tokens/s per stream (1000 / TPOT p50)")
    top = rows[PER_STREAM].max()
    if roof is not None and top > 0 and roof > 5 * top:  # far above: a log axis shows both
        ax.set_yscale("log")
        label_log_axis(ax.yaxis)
    else:
        ax.set_ylim(bottom=0)
    _legend(ax)
    return Plot("roofline", "Decode tokens/s per stream vs the memory-bandwidth roofline",
                roofline_text(data) + " " + _invalid_caption(rows), _png(fig))


def roofline_limit(data: ReportData) -> float | None:
    roof = data.baseline.roofline if data.baseline else None
    v = roof.max_tokens_per_s_per_stream if roof else None
    return float(v) if v is not None and v > 0 else None


def roofline_text(data: ReportData) -> str:
    roof = roofline_limit(data)
    if roof is None:
        return ("The memory-bandwidth roofline is unknown for this hardware (notebook 01 "
                "recorded no memory bandwidth or weight size), so the curve is shown alone.")
    r = data.baseline.roofline if data.baseline else None
    bw, weights = (getattr(r, "memory_bandwidth_GBps", None), getattr(r, "weight_bytes", None))
    inputs = (f" ({fmt_num(bw)} GB/s, {getattr(r, 'bandwidth_source', '') or 'as 01 recorded'}"
              f", / {weights / 1e6:,.1f} MB of weights)" if bw and weights else "")
    one = data.sweeps["baseline"].point_at(1) if "baseline" in data.sweeps else None
    tpot = one.median("median_tpot_ms") if one is not None and one.valid else None
    pace = (f" 01's single instance at concurrency 1 decoded {fmt_num(1000 / tpot)} tokens/s per "
            f"stream (1000 / its TPOT p50), {1000 / tpot / roof:.0%} of the line"
            + ("; this run does not measure what else set that pace."
               if 1000 / tpot < 0.5 * roof else ".") if tpot else "")
    return (f"Roofline (dotted line): at most {fmt_num(roof)} tokens/s per stream, memory "
            f"bandwidth / bytes read per decode step{inputs} (every weight once per step). The model "
            "behind the line expects batching to share that read among streams, per-stream "
            f"speed falling slowly while the total grows; the points are what this run did.{pace}")


def roofline_claim(data: ReportData) -> Claim | None:
    """The roofline caption as a claim: the figures it quotes, as 01 recorded them."""
    r = data.baseline.roofline if data.baseline else None
    if roofline_limit(data) is None or r is None:
        return None
    return claim("report", roofline_text(data), figures={
        "roofline": r.max_tokens_per_s_per_stream, "memory_bandwidth_GBps": r.memory_bandwidth_GBps,
        "weight_bytes": r.weight_bytes})


def _kv_plot(payload02: KvTransferPayload | None, device: str | None) -> Plot | None:
    kv = kv_table(payload02)
    if kv.empty:
        return None
    fig, axes = _figure(1, 1, "KV transfer time vs prompt length", device)
    ax = axes[0][0]
    ax.plot(kv["prompt_tokens"], kv["predicted_ms"], "-o", label="predicted")
    meas = kv.dropna(subset=["measured_ms"])
    ax.plot(meas["prompt_tokens"], meas["measured_ms"], "s", markersize=8, label="measured")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("transfer time (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    unmeasured = len(kv) - len(meas)
    best = max((r["bandwidth_GBps"] for r in (payload02.probe.rows if payload02 else [])
                if r.get("op") == "READ" and r.get("bandwidth_GBps")), default=None)
    caption = ("Predicted: bytes moved (whole blocks) / the highest READ bandwidth notebook 02's "
               f"probe reached{f' ({fmt_num(best)} GB/s)' if best else ''} (a decode reads the "
               "prefill's KV). Measured: 02's probe reading that many bytes; notebook 04 times "
               "the KV transfers of real requests.")
    if unmeasured:
        caption += f" {unmeasured} prompt length(s) have no measurement and show no square."
    return Plot("kv_transfer", "KV transfer: predicted vs measured", caption, _png(fig))


def render_plots(data: ReportData, table: pd.DataFrame) -> list[Plot]:
    """Every plot the data allows, as PNG bytes (nothing written)."""
    if table.empty:
        return []
    std, mixed = workload_rows(table, "standard"), workload_rows(table, "mixed")
    dev = data.device
    plots = [
        _metric_plot(std, "throughput", "Throughput vs load",
                     [(BY_KEY["output_throughput"].heading, [("output_throughput", "-", "")]),
                      (BY_KEY["request_throughput"].heading, [("request_throughput", "-", "")])],
                     dev),
        _metric_plot(std, "ttft", "TTFT p50 (solid) and p99 (dashed) vs load",
                     [("TTFT (ms)", [("median_ttft_ms", "-", " p50"),
                                     ("p99_ttft_ms", "--", " p99")])], dev),
        _metric_plot(std, "itl", "ITL p50 (solid) and p99 (dashed) vs load",
                     [("ITL (ms)", [("median_itl_ms", "-", " p50"),
                                    ("p99_itl_ms", "--", " p99")])], dev),
        _kv_plot(data.kv_transfer, dev),
        _roofline_plot(data, table),
        _metric_plot(mixed, "mixed_itl", "Mixed long/short workload: ITL p99",
                     [(BY_KEY["p99_itl_ms"].heading, [("p99_itl_ms", "-", "")])], dev),
        grade_plot(graded(data), dev),
    ]
    return [p for p in plots if p is not None]


def grade_plot(by_arch: dict[str, list[GradeRow]], device: str | None = None) -> Plot | None:
    """Predicted against measured TTFT p50/p99 and ITL p50/p99, a panel each, every
    architecture in its colour and marker (log-log, the diagonal is a perfect forecast;
    hollow markers were not graded)."""
    if not any(by_arch.values()):
        return None
    fig, axes = _figure(2, 2, "Forecast vs measurement", device)
    keys: tuple[MetricKey, ...] = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
    for ax, k in zip(axes.flat, keys, strict=True):
        title = BY_KEY[k].heading
        vals = []
        for arch, rows in by_arch.items():
            pts = [(r.measured, r.predicted, r.graded) for r in rows
                   if r.metric == k and r.predicted and r.measured]
            for graded_only in (True, False):
                sel = [(m, p) for m, p, g in pts if g == graded_only]
                if sel:
                    ax.scatter([m for m, _ in sel], [p for _, p in sel],
                               marker=MARKERS[arch], edgecolors=COLORS[arch],
                               facecolors=COLORS[arch] if graded_only else "none",
                               label=arch + ("" if graded_only else " (not graded)"))
            vals += [v for m, p, _ in pts for v in (m, p)]
        if vals:
            lo, hi = min(vals) * 0.7, max(vals) * 1.4
            ax.plot([lo, hi], [lo, hi], "--", color="grey", label="predicted = measured")
            ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
            for axis in (ax.xaxis, ax.yaxis):
                label_log_axis(axis)
        ax.set(xlabel=f"measured {title}", ylabel=f"predicted {title}", title=title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return Plot("forecast", "Forecast vs measurement",
                "Each marker is one load point: on the diagonal the forecast was exact; hollow "
                "markers were flagged (stall, late reads, invalid) and are not graded.",
                _png(fig))


def write_plots(plots_dir: Path, plots: list[Plot]) -> list[Path]:
    """Write plots/*.png; a known plot not drawn this time is removed, not left stale."""
    for p in plots:
        atomic_write_bytes(plots_dir / f"{p.name}.png", p.png)
    for name in set(PLOT_NAMES) - {p.name for p in plots}:
        (plots_dir / f"{name}.png").unlink(missing_ok=True)
    return [plots_dir / f"{p.name}.png" for p in plots]

