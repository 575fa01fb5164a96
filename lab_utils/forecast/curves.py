"""The measured curves a forecast is made from, as notebook 01 records them.

Every curve is a handful of measured points, each with its median and its range over
repeats (`CurvePoint`). `Curve` reads a value between the points by linear interpolation and
beyond them along the end segment, never below zero: it invents no shape the
measurements do not show. `bound` picks the low, median or high edge of every point, so a
forecast can be run at the edges of the measurement's spread.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from dataclasses import dataclass

from lab_utils.results.forecast import CurvePoint, Edge


def point(x: float, values: list[float]) -> CurvePoint:
    """The point of these repeated measurements of y at x."""
    if not values:
        raise ValueError(f"no measurement at {x}")
    return CurvePoint(x=x, median=statistics.median(values), lo=min(values), hi=max(values),
                      n=len(values))


@dataclass(frozen=True)
class Curve:
    """y(x) through measured points (sorted by x)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def of(cls, points: list[CurvePoint], edge: Edge = "median") -> Curve:
        if not points:
            raise ValueError("a curve needs at least one measured point")
        pts = sorted(points, key=lambda p: p.x)
        return cls(tuple(p.x for p in pts), tuple(p.at(edge) for p in pts))

    @classmethod
    def flat(cls, y: float) -> Curve:
        return cls((0.0,), (y,))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return max(ys[0], 0.0)
        i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y0
        return max(y, 0.0)

    def scaled(self, factor: float) -> Curve:
        return Curve(self.xs, tuple(y * factor for y in self.ys))
