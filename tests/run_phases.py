"""`make test`: lint, fast unit tests, then the slow tests with real engines, timing each.

The slow phase starts real vLLM instances and NIXL transfers; it runs in CI for real.
LAB_STRICT=1 turns any skipped test into a failure, so nothing is silently left out.

Every test's duration (setup + call + teardown) is appended to `DURATIONS_LOG` as it
ends (tests/support/durations.py). At the end: each phase's time, each slow test's
duration beside its reference (tests/durations.json), the ten slowest tests of the run,
and the slow phase against its budget (`SLOW_BUDGET_S`): over it, a loud warning naming
the tests that grew. The budget never fails the run: how fast the suite is, is not a
test verdict.

    python tests/run_phases.py                      # what `make test` runs
    python tests/run_phases.py --save-durations     # the last run's durations become
                                                    # the reference (tests/durations.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests"))

from support.durations import DURATIONS_ENV, PHASE_ENV, read_log  # noqa: E402

PHASES = [
    ("lint (ruff)", [str(BIN / "ruff"), "check", "."]),
    # mypy runs beside the fast tests (BESIDE_NEXT): its output is printed when it ends
    ("types (mypy)", [str(BIN / "mypy")]),
    # the unit tests on every core (pytest-xdist; 150 s instead of 245 s on 2 cores); the
    # slow ones one at a time, as their engines measure and share the machine's cores
    ("fast tests", [sys.executable, "-m", "pytest", "-q", "-m", "not slow",
                    "-n", str(min(4, os.cpu_count() or 1))]),
    ("slow tests (real vLLM + NIXL)", [sys.executable, "-m", "pytest", "-q", "-m", "slow",
                                       "--durations=10"]),
]

BESIDE_NEXT = {"types (mypy)"}  # phases that run beside the phase after them
DURATIONS_LOG = ROOT / "results" / "test-durations.jsonl"  # this run's, git-ignored
REFERENCE = ROOT / "tests" / "durations.json"  # committed: a measured run's
# The slow phase's budget on the 2-core rehearsal machine CI runs on (docs/DEVELOPING.md,
# "Tests", says how it was chosen); LAB_SLOW_BUDGET_S sets another for another machine.
SLOW_BUDGET_S = float(os.environ.get("LAB_SLOW_BUDGET_S", 25 * 60))
# A test "grew" when it took this much longer than its reference, in seconds and in
# proportion both (small tests jitter by seconds, long ones by a few percent).
GREW_S, GREW_FRACTION = 20.0, 0.25


def is_slow(cmd: list[str]) -> bool:
    """Whether a phase runs the slow tests (`-m slow`)."""
    return any(a == "-m" and b == "slow" for a, b in zip(cmd, cmd[1:], strict=False))


def load_reference(path: Path = REFERENCE) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {"tests": {}}


def _mmss(secs: float) -> str:
    return f"{int(secs // 60)}:{int(secs % 60):02d}"


def grown(measured: dict[str, float], reference: dict[str, float]) -> list[tuple[str, float, float | None]]:
    """(test, seconds now, reference seconds or None for a new test) of the tests that
    grew past `GREW_S` and `GREW_FRACTION` (or are new and take over `GREW_S`), the
    largest growth first."""
    out = []
    for test, secs in measured.items():
        ref = reference.get(test)
        if ref is None:
            if secs > GREW_S:
                out.append((test, secs, None))
        elif secs - ref > GREW_S and secs > ref * (1 + GREW_FRACTION):
            out.append((test, secs, ref))
    return sorted(out, key=lambda t: -(t[1] - (t[2] or 0.0)))


def slow_summary(rows: list[dict], phase: str, phase_s: float, reference: dict) -> list[str]:
    """Each slow test's duration beside its reference, then the budget's verdict."""
    ref = reference.get("tests", {})
    tests = [r for r in rows if r.get("phase") == phase and "test" in r]
    lines = [f"\n=== slow tests, each (setup + call + teardown; reference: {REFERENCE.name}, "
             f"measured {reference.get('measured', 'never')}) ==="]
    for r in tests:
        was = ref.get(r["test"])
        delta = f"{r['seconds'] - was:+7.1f}" if was is not None else "    new"
        lines.append(f"  {r['seconds']:7.1f} s  {delta}  {r['test']}"
                     + ("" if r["outcome"] == "passed" else f"  [{r['outcome']}]"))
    measured = {r["test"]: r["seconds"] for r in tests}
    lines.append(f"  {sum(measured.values()):7.1f} s  in {len(tests)} tests; the phase "
                 f"{phase_s:.1f} s ({_mmss(phase_s)}) of its budget {_mmss(SLOW_BUDGET_S)}")
    if phase_s <= SLOW_BUDGET_S:
        return lines
    bar = "!" * 88
    lines += ["", bar,
              f"!! WARNING: the slow tests took {_mmss(phase_s)} (min:s), over their budget of "
              f"{_mmss(SLOW_BUDGET_S)}",
              "!! (CI allows 90 min for all of `make test`; the budget keeps it inside half of "
              "that on a slow day)"]
    grew = grown(measured, ref)
    if grew:
        lines.append(f"!! grew against {REFERENCE.relative_to(ROOT)} (over +{GREW_S:.0f} s "
                     f"and +{GREW_FRACTION:.0%}):")
        for test, secs, was in grew:
            lines.append(f"!!   {secs:7.1f} s  " + (f"(was {was:.1f} s, {secs - was:+.1f} s)"
                                                   if was is not None else "(new)") + f"  {test}")
    else:
        total_ref = reference.get("slow_phase_s") or sum(ref.values()) or 0
        lines.append("!! no single test grew past the threshold: the machine was slower across "
                     f"the board (reference phase {total_ref:.0f} s)")
    lines += ["!! speed up what grew, or if the growth is wanted, raise the budget "
              "(docs/DEVELOPING.md, \"Tests\")", bar]
    return lines


def slowest(rows: list[dict], n: int = 10) -> list[str]:
    tests = sorted((r for r in rows if "test" in r), key=lambda r: -r["seconds"])[:n]
    return [f"\n=== the {len(tests)} slowest tests of the run ==="] + [
        f"  {r['seconds']:7.1f} s  {r['test']}  ({r['phase']})" for r in tests]


def save_durations(log: Path, note: str) -> int:
    """Write the slow tests' durations of the run logged in `log` to REFERENCE."""
    rows = read_log(log)
    slow = [name for name, cmd in PHASES if is_slow(cmd)]
    tests = [r for r in rows if "test" in r and r.get("phase") in slow]
    if not tests:
        print(f"no slow test in {log}: run `make test` (or tests/run_phases.py) first")
        return 1
    failed = [r["test"] for r in tests if r["outcome"] != "passed"]
    if failed:
        print(f"not saved: {len(failed)} slow test(s) did not pass in that run: {failed[:5]}")
        return 1
    phase = [r for r in rows if r.get("phase") in slow and "phase_seconds" in r]
    data = {
        "_about": "Reference durations of the slow tests (seconds, setup + call + teardown), "
                  "from one measured run; tests/run_phases.py names the tests that grew "
                  "against them when the slow phase is over its budget. Refresh: "
                  "python tests/run_phases.py --save-durations (after a `make test`).",
        "measured": date.today().isoformat(),
        "machine": note or f"{os.cpu_count()} cores",
        "slow_phase_s": round(phase[-1]["phase_seconds"] if phase
                              else sum(r["seconds"] for r in tests), 1),
        "tests": {r["test"]: r["seconds"] for r in tests},
    }
    REFERENCE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"written: {REFERENCE} ({len(tests)} tests, slow phase {data['slow_phase_s']:.0f} s)")
    return 0


def main() -> int:
    env = {**os.environ, "LAB_STRICT": "1", "PYTHONUNBUFFERED": "1",
           DURATIONS_ENV: str(DURATIONS_LOG)}
    DURATIONS_LOG.parent.mkdir(parents=True, exist_ok=True)
    DURATIONS_LOG.write_text("")
    timings = []
    failed = []
    t_all = time.monotonic()
    def ended(name: str, secs: float, code: int) -> None:
        timings.append((name, secs, code))
        with open(DURATIONS_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"phase": name, "phase_seconds": round(secs, 1), "exit": code}) + "\n")
        if code:
            failed.append(name)

    beside = None  # (name, process, its output file, start) of a phase running beside
    for name, cmd in PHASES:
        t0 = time.monotonic()
        if name in BESIDE_NEXT:
            out = tempfile.TemporaryFile()  # noqa: SIM115  (closed once the next phase ends)
            proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, PHASE_ENV: name}, stdout=out,
                                    stderr=subprocess.STDOUT)
            done_at: list[float] = []  # when it ended, for its own time
            threading.Thread(target=lambda p=proc, d=done_at: (p.wait(), d.append(time.monotonic())),
                             daemon=True).start()
            print(f"\n=== {name} (beside the next phase; its output when it ends) ===", flush=True)
            beside = (name, proc, out, t0, done_at)
            continue
        print(f"\n=== {name} ===", flush=True)
        code = subprocess.call(cmd, cwd=ROOT, env={**env, PHASE_ENV: name})
        ended(name, time.monotonic() - t0, code)
        if beside is not None:
            b_name, proc, out, b_t0, done_at = beside
            code = proc.wait()
            while not done_at:  # the thread notes the time right after its own wait
                time.sleep(0.01)
            out.seek(0)
            print(f"\n=== {b_name}: its output ===\n" + out.read().decode(errors="replace"),
                  flush=True)
            out.close()
            ended(b_name, done_at[0] - b_t0, code)
            beside = None
    rows = read_log(DURATIONS_LOG)
    reference = load_reference()
    for name, secs, _ in timings:
        if is_slow(dict(PHASES)[name]):
            print("\n".join(slow_summary(rows, name, secs, reference)))
    print("\n".join(slowest(rows)))
    print("\n=== phase times ===")
    for name, secs, code in timings:
        print(f"  {name:<32} {secs:7.1f} s  {'ok' if code == 0 else f'FAILED (exit {code})'}")
    print(f"  {'total':<32} {time.monotonic() - t_all:7.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save-durations", nargs="?", const=str(DURATIONS_LOG), metavar="LOG",
                        help=f"write {REFERENCE.relative_to(ROOT)} from a run's log (default: "
                             "the last run's) instead of running the tests")
    parser.add_argument("--note", default="", help="with --save-durations: the machine, in words")
    args = parser.parse_args()
    sys.exit(save_durations(Path(args.save_durations), args.note) if args.save_durations
             else main())
