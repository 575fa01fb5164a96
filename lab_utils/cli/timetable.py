"""`timetable`: the day's timetable rebuilt from a dress run's results directory."""

from __future__ import annotations

from pathlib import Path

from lab_utils.notebook import optional_seconds, read_timings, start_lines, timetable


def run(args) -> int:
    results = Path(args.results_dir).expanduser()
    books = read_timings(results / "timings.json")["notebooks"]
    saved: dict[str, float] = {}
    for nb, _, s in optional_seconds(books):
        saved[nb] = saved.get(nb, 0.0) + (s or 0.0)
    lines = timetable(results, saved)
    print("\n".join(lines + start_lines(results)))
    return 0 if lines[0].startswith("|") else 1
