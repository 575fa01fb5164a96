"""The workshop's agenda, its checkpoints, and the day's timetable rebuilt from a dress run.

`AGENDA` is the one list of the day's parts (docs/FACILITATOR.md's table is checked
against it, the pair's card prints its checkpoints). A part's minutes hold the notebook's
headless run (its starts and measurements) plus the time to read and talk about it.
`timetable` sets a dress run's measured times beside each slot: what is left for reading,
and the slot to give the part where too little is left.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from lab_utils.results import calibration

DAY_MIN = 180
READING_MIN = 10  # the least a serving notebook's slot leaves beside its run, to read and talk


@dataclass(frozen=True)
class Part:
    name: str
    minutes: int
    notebook: str | None  # the notebook the part runs, if any
    what: str


AGENDA = (
    Part("welcome", 15, None, "the architecture on the whiteboard; each pair opens JupyterLab"),
    Part("notebook 00", 20, "00", "the bring-up checklist; fix what fails (triage table below)"),
    Part("notebook 01", 25, "01", "one instance: one request, the sweep, the roofline, the "
         "profile; the optional two switches only for a pair ahead of time"),
    Part("notebook 02", 15, "02", "KV size arithmetic and the NIXL probe"),
    Part("break", 10, None, ""),
    Part("notebook 03", 25, "03", "replicas: the forecast, the sweep, the mixed workload"),
    Part("notebook 04", 30, "04", "prefill/decode: the proof, the forecast, the sweep, the mixed "
         "workload; the optional router and split-model sections only for a pair ahead of time"),
    Part("notebook 05", 15, "05", "the report: verdict, forecast graded, what-if"),
    Part("wrap-up", 10, None, "what each pair found; where their numbers differ and why"),
)


def clock(minutes: float) -> str:
    """Minutes from the start as the agenda writes them: 95 -> "1:35"."""
    m = int(round(minutes))
    return f"{m // 60}:{m % 60:02d}"


def starts(parts: tuple[Part, ...] = AGENDA) -> list[tuple[int, Part]]:
    """Each part with the minute it starts at."""
    ends = itertools.accumulate(p.minutes for p in parts)
    return [(end - p.minutes, p) for end, p in zip(ends, parts, strict=True)]


def checkpoints() -> list[tuple[str, str]]:
    """(clock, what every pair has by then): a notebook's end, and the swap at the break."""
    out = []
    for at, p in starts():
        end = clock(at + p.minutes)
        if p.notebook == "00":
            out.append((end, "notebook 00's verdict"))
        elif p.notebook == "05":
            out.append((end, "the report"))
        elif p.notebook:
            out.append((end, f"{p.notebook}'s results written"))
        elif p.name == "break":
            out.append((clock(at), "partners swap: the other one drives"))
    return out


def agenda_table() -> list[str]:
    """The agenda as docs/FACILITATOR.md shows it."""
    rows = ["| start | minutes | part | what happens |", "|---|---|---|---|"]
    rows += [f"| {clock(at)} | {p.minutes} | {p.name} | {p.what} |" for at, p in starts()]
    return rows


def timetable(results_dir: Path, optional_s: dict[str, float] | None = None) -> list[str]:
    """The day's timetable from a dress run's results directory (its executed/times.json):
    each part's slot, the notebook's measured run, what that leaves to read, and where it
    leaves less than READING_MIN the slot to give it. `optional_s`: per notebook, what its
    optional parts took in that run (a pair behind time saves it with --skip-optional)."""
    times_file = results_dir / "executed" / "times.json"
    try:
        times = {name[:2]: float(s) for name, s in json.loads(times_file.read_text()).items()}
    except (OSError, ValueError) as e:
        return [f"no dress run in {results_dir}: {times_file} unreadable ({e}); run the series "
                "once (`python -m lab_utils run`) and point this at its results directory"]
    rows = ["| start | slot (min) | part | run (min) | left to read (min) | rebuilt slot (min) |",
            "|---|---|---|---|---|---|"]
    at = 0
    for p in AGENDA:
        run = times.get(p.notebook) if p.notebook else None
        slot = p.minutes
        if run is None:
            cells = ["–", "–", str(slot)] if p.notebook is None else ["not run", "–", str(slot)]
        else:
            left = slot - run / 60
            slot = max(slot, math.ceil(run / 60 + READING_MIN)) if left < READING_MIN else slot
            saves = (optional_s or {}).get(p.notebook or "")
            cells = [f"{run / 60:.1f}" + (f" ({saves / 60:.1f} optional)" if saves else ""),
                     f"{left:.1f}", str(slot) + (" (was " + str(p.minutes) + ")"
                                                 if slot != p.minutes else "")]
        rows.append(f"| {clock(at)} | {p.minutes} | {p.name} | " + " | ".join(cells) + " |")
        at += slot
    rows.append(f"Total with the rebuilt slots: {at} min of {DAY_MIN}"
                + ("" if at <= DAY_MIN else f": {at - DAY_MIN} min over; cut an optional part"))
    return rows


def start_lines(results_dir: Path) -> list[str]:
    """The dress run's measured start-ups per node, beside the allowance the agenda had."""
    cals = calibration.load_all(results_dir, results_dir.name)
    said = [f"  {c.node}: first start {c.first_start_s:.0f} s"
            + (f", later starts {c.later_start_s:.0f} s (median)" if c.later_start_s else "")
            for c in cals if c.first_start_s is not None]
    allowance = f"{calibration.STARTUP_ALLOWANCE_S / 60:.0f} min per topology"
    if not said:
        return [f"start-ups: none measured in {results_dir}; the ETAs use the agenda's "
                f"allowance ({allowance})"]
    return [f"start-ups measured (the ETAs use these instead of the agenda's {allowance}; "
            "keep calibration/ in results/<profile>/ on every pair):"] + said
