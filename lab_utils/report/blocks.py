"""The pieces a report is made of (headings, paragraphs, lists, tables, plots, folded
parts), each rendered the same way to HTML and to Markdown by `report.render`."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from lab_utils.report.plots import Plot


@dataclass
class Block:
    """One piece of the report, rendered the same way to HTML and to Markdown."""

    kind: str  # h | p | warn | ul | table | img | fold (text: its summary; inner: its blocks)
    text: str = ""
    level: int = 2
    items: list[str] = field(default_factory=list)
    df: pd.DataFrame | None = None
    plot: Plot | None = None
    inner: list[Block] = field(default_factory=list)


def fold(summary: str, blocks: list[Block]) -> Block:
    """Blocks shown folded (HTML `<details>`), opened by the reader."""
    return Block("fold", summary, inner=list(blocks))


def H(text: str, level: int = 2) -> Block:
    return Block("h", text, level)


def P(text: str) -> Block:
    return Block("p", text)


def W(text: str) -> Block:
    return Block("warn", text)


def UL(items: list[str]) -> Block:
    return Block("ul", items=list(items))


def T(df: pd.DataFrame) -> Block:
    return Block("table", df=df)
