"""Predict first: before 01, 03 and 04 forecast and measure, the attendee writes down their
own numbers (`guess`); notebook 05 and the report show them beside the lab's forecast and
the measurement (`guesses_frame`).

The guesses are kept in `results/<profile>/guesses.json`, one entry per notebook, written
again each time the cell runs; a value left at None is no guess. They are the attendee's,
not a measurement: nothing else in the lab reads them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.results.points import BY_KEY, MetricKey
from lab_utils.results.store import load_optional
from lab_utils.util.atomic import atomic_write_text
from lab_utils.util.numbers import fmt_num

# notebook -> guess name -> (metric key, workload, load: "lowest" or "highest" concurrency)
ASKED: dict[str, dict[str, tuple[MetricKey, str, str]]] = {
    "01": {"throughput_top": ("output_throughput", "standard", "highest"),
           "tpot_c1": ("median_tpot_ms", "standard", "lowest")},
    "03": {"throughput_top": ("output_throughput", "standard", "highest"),
           "itl_p99_mixed": ("p99_itl_ms", "mixed", "highest")},
    "04": {"ttft_c1": ("median_ttft_ms", "standard", "lowest"),
           "itl_p99_mixed": ("p99_itl_ms", "mixed", "highest")},
}
FILE = "guesses.json"
# what each notebook's guesses can lean on: the earlier notebooks' measurements of the same
EARLIER = {"01": (), "03": ("01",), "04": ("01", "03")}
WHO = {"01": "01's single instance", "03": "03's replicas"}


def read_guesses(cfg: LabConfig) -> dict[str, Any]:
    path = cfg.results_dir / FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LabError(f"{path} is not JSON ({e}): delete it and enter the guesses again") from e


def _level(cfg: LabConfig, which: str) -> int:
    """The workload's highest or lowest concurrency, where a guess is asked."""
    levels = cfg.workload.concurrency or [1]
    return max(levels) if which == "highest" else min(levels)


def _load(cfg: LabConfig, what: tuple[MetricKey, str, str]) -> str:
    _, workload, which = what
    run = "the mixed workload" if workload == "mixed" else "the sweep"
    return f"{run} at concurrency {_level(cfg, which)}"


def guess(cfg: LabConfig, notebook: str, **values: float | None) -> None:
    """Store the attendee's guesses for `notebook` (names in `ASKED[notebook]`) and say what
    was stored (`read_guesses` returns them)."""
    asked = ASKED.get(notebook)
    if asked is None:
        raise LabError(f"notebook {notebook} asks for no guess (only {', '.join(ASKED)})")
    unknown = set(values) - set(asked)
    if unknown:
        raise LabError(f"notebook {notebook} asks for {', '.join(asked)}, not {', '.join(sorted(unknown))}")
    given = {k: float(v) for k, v in values.items() if v is not None}
    for k, v in given.items():
        if not v > 0:
            raise LabError(f"{k} = {v}: a guess is a positive number (or None for no guess)")
    every = read_guesses(cfg)
    every[notebook] = {"at": datetime.now(UTC).isoformat(timespec="seconds"), **given}
    atomic_write_text(cfg.results_dir / FILE, json.dumps(every, indent=1) + "\n")
    for line in so_far(cfg, notebook):
        print(line)
    if not given:
        print("no guess entered: fine; notebook 05 shows the forecast and the measurement alone")
    for k, v in given.items():
        key = asked[k][0]
        print(f"your guess: {BY_KEY[key].heading} {fmt_num(v)}, {_load(cfg, asked[k])}")


def so_far(cfg: LabConfig, notebook: str) -> list[str]:
    """What the earlier notebooks measured of each figure `notebook` asks a guess of, at the
    same workload and load: the numbers the prose points back to, printed where the guess is
    written."""
    lines = []
    for what in ASKED[notebook].values():
        seen = [(nb, m) for nb in EARLIER[notebook]
                if (m := _forecast_and_measured(cfg, nb, what)[1]) is not None]
        if seen:
            lines.append(f"measured so far, {BY_KEY[what[0]].heading} at {_load(cfg, what)}: "
                         + "; ".join(f"{WHO[nb]} {fmt_num(m)}" for nb, m in seen))
    return lines


def _forecast_and_measured(cfg: LabConfig, notebook: str, what: tuple[MetricKey, str, str]
                           ) -> tuple[float | None, float | None]:
    env = load_optional(cfg, notebook)
    if env is None:
        return None, None
    key, workload, which = what
    p = env.payload
    run = p.sweep if workload == "standard" else getattr(p, "mixed", None)
    level = float(_level(cfg, which))
    point = next((c for c in (run.combined if run else [])
                  if c.mode == "concurrency" and float(c.value) == level), None)
    fc = getattr(p, "forecast", None)
    row = next((r for r in (fc.rows if fc else [])
                if r.workload == workload and r.value == level), None)
    return (row.median(key) if row else None), (point.median(key) if point is not None else None)


def guesses_frame(cfg: LabConfig, quiet: bool = False) -> pd.DataFrame | None:
    """05 and the report: each guess beside the lab's forecast and the measurement (None: no
    guess was entered in this series, said in one line unless `quiet`)."""
    every = read_guesses(cfg)
    rows = []
    for nb, asked in ASKED.items():
        for name, what in asked.items():
            mine = (every.get(nb) or {}).get(name)
            if mine is None:
                continue
            forecast, measured = _forecast_and_measured(cfg, nb, what)
            rows.append({"notebook": nb, "what": f"{BY_KEY[what[0]].heading}, {_load(cfg, what)}",
                         "you": fmt_num(mine), "the lab's forecast": fmt_num(forecast),
                         "measured": fmt_num(measured),
                         "closer": _closer(mine, forecast, measured)})
    if not rows:
        if not quiet:
            print("no guesses were entered in this series (01, 03 and 04 ask before they "
                  "forecast)")
        return None
    return pd.DataFrame(rows)


def _closer(mine: float, forecast: float | None, measured: float | None) -> str:
    if measured is None:
        return "not measured"
    if forecast is None:
        return "–"
    a, b = abs(mine - measured), abs(forecast - measured)
    return "you" if a < b else "the forecast" if b < a else "tie"
