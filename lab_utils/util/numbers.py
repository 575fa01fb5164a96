"""Numbers as people read them, in every table the lab shows, and plot titles that say
when the numbers come from the CPU rehearsal (`titled`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def fmt_num(value: Any) -> str:
    """A number for people: thousands separated, 3 significant figures for small values."""
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if not isinstance(value, (int, float, np.number)):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return "–"
    if v.is_integer() and abs(v) >= 1:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:,.1f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"



def titled(title: str, device: str | None) -> str:
    """A plot's title; on the CPU rehearsal it says so, so that no image of its numbers is
    taken for a GPU's."""
    return f"{title} (CPU rehearsal)" if device == "cpu" else title


def label_log_axis(axis: Any) -> None:
    """Plain numbers on a matplotlib log axis: each decade, and 2 and 5 within it (its own
    labels are powers such as 10^0, or all eight minor ones, which run together)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5)
        else ""))


def join_words(items: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
