"""`make test`: lint, fast unit tests, then the slow tests with real engines, timing each.

The slow phase starts real vLLM instances and NIXL transfers; it runs in CI for real.
LAB_STRICT=1 turns any skipped test into a failure, so nothing is silently left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

PHASES = [
    ("lint (ruff)", [str(BIN / "ruff"), "check", "."]),
    ("types (mypy)", [str(BIN / "mypy")]),
    ("fast tests", [sys.executable, "-m", "pytest", "-q", "-m", "not slow"]),
    ("slow tests (real vLLM + NIXL)", [sys.executable, "-m", "pytest", "-q", "-m", "slow",
                                       "--durations=10"]),
]


def main() -> int:
    env = {**os.environ, "LAB_STRICT": "1", "PYTHONUNBUFFERED": "1"}
    timings = []
    failed = []
    t_all = time.monotonic()
    for name, cmd in PHASES:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        code = subprocess.call(cmd, cwd=ROOT, env=env)
        timings.append((name, time.monotonic() - t0, code))
        if code:
            failed.append(name)
    print("\n=== phase times ===")
    for name, secs, code in timings:
        print(f"  {name:<32} {secs:7.1f} s  {'ok' if code == 0 else f'FAILED (exit {code})'}")
    print(f"  {'total':<32} {time.monotonic() - t_all:7.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
