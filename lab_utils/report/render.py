"""Rendering the report: `build_report(cfg)` reads the results of notebooks 00-04 from the
profile's results directory and writes `report.html` (self-contained: plots embedded as
data URIs), `report.md` (plots linked) and `plots/*.png`, atomically. Only notebook 01 is
required; what is missing is named with the notebook to run.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lab_utils.config import LabConfig
from lab_utils.report.conclusions import conclusions
from lab_utils.report.data import load_report_data
from lab_utils.report.export import write_exports
from lab_utils.report.plots import render_plots, write_plots
from lab_utils.report.sections import Block, report_blocks
from lab_utils.report.summary import report_claims
from lab_utils.report.tables import points_table
from lab_utils.results.claims import Comparison, save_claims
from lab_utils.results.guesses import guesses_frame
from lab_utils.util.atomic import atomic_write_text


@dataclass
class ReportPaths:
    html: Path
    md: Path
    plots: list[Path]
    conclusions: list[str]
    findings: list[Comparison] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # notebooks whose results are absent
    # export/runs.csv and each run in `vllm bench serve --save-result`'s layout
    exports: list[Path] = field(default_factory=list)


CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
.warn { background: #fff4e5; border-left: 4px solid #e67e00; padding: 0.5em 1em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #555; }
details { margin: 0.5em 0 1em; } summary { cursor: pointer; color: #444; }
"""


def _html_block(b: Block) -> str:
    if b.kind == "fold":
        inner = "\n".join(_html_block(x) for x in b.inner)
        return f"<details><summary>{html.escape(b.text)}</summary>\n{inner}\n</details>"
    if b.kind == "h":
        return f"<h{b.level}>{html.escape(b.text)}</h{b.level}>"
    if b.kind in ("p", "warn"):
        cls = ' class="warn"' if b.kind == "warn" else ""
        return f"<p{cls}>{html.escape(b.text)}</p>"
    if b.kind == "ul":
        return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in b.items) + "</ul>"
    if b.kind == "table":
        assert b.df is not None
        return b.df.to_html(index=False, escape=True, na_rep="–", border=0)
    assert b.plot is not None
    src = "data:image/png;base64," + base64.b64encode(b.plot.png).decode("ascii")
    return (f'<figure><img src="{src}" alt="{html.escape(b.plot.title)}">'
            f"<figcaption>{html.escape(b.plot.caption)}</figcaption></figure>")


def render_html(blocks: list[Block], title: str) -> str:
    body = "\n".join(_html_block(b) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n"
            f"<body>\n{body}\n</body>\n</html>\n")


def _md_cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(_md_cell(c) for c in df.columns) + " |",
             "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |"
              for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _md_block(b: Block) -> str:
    if b.kind == "fold":  # GitHub and most viewers fold <details> in Markdown too
        inner = "\n\n".join(_md_block(x) for x in b.inner)
        return f"<details><summary>{b.text}</summary>\n\n{inner}\n\n</details>"
    if b.kind == "h":
        return "#" * b.level + " " + b.text
    if b.kind == "p":
        return b.text
    if b.kind == "warn":
        return f"> **Warning:** {b.text}"
    if b.kind == "ul":
        return "\n".join(f"- {i}" for i in b.items)
    if b.kind == "table":
        assert b.df is not None
        return md_table(b.df) if not b.df.empty else "(empty)"
    assert b.plot is not None
    return f"![{b.plot.title}](plots/{b.plot.name}.png)\n\n*{b.plot.caption}*"


def render_markdown(blocks: list[Block]) -> str:
    return "\n\n".join(_md_block(b) for b in blocks) + "\n"


def build_report(cfg: LabConfig) -> ReportPaths:
    """Read the results of 00-04, write report.html, report.md and plots/*.png in
    cfg.results_dir. Raises ResultsMissingError (naming notebook 01) without a baseline."""
    data = load_report_data(cfg)
    table = points_table(data)
    concl = conclusions(data, table)
    plots = render_plots(data, table)
    out = cfg.results_dir
    plot_paths = write_plots(out / "plots", plots)
    exports = write_exports(data, out / "export")
    blocks = report_blocks(data, table, concl, plots, guesses=guesses_frame(cfg, quiet=True))
    atomic_write_text(out / "report.md", render_markdown(blocks))
    atomic_write_text(out / "report.html",
                      render_html(blocks, f"Benchmark report: {cfg.profile}"))
    save_claims(out, "report", report_claims(data, concl))
    return ReportPaths(html=out / "report.html", md=out / "report.md", plots=plot_paths,
                       conclusions=concl.sentences, findings=concl.findings,
                       missing=sorted(data.missing), exports=exports)
