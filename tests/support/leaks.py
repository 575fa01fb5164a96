"""Where a secret must never appear: process command lines and files the lab writes."""

from __future__ import annotations

import os
from pathlib import Path

from lab_utils.util.background import Background


def cmdline_hits(secret: str) -> list[str]:
    """`PID: command line` of every process (one kernel: every simulated node) whose
    argv contains `secret`."""
    hits = []
    needle = secret.encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in raw:
            argv = raw.replace(b"\0", b" ").decode(errors="replace")
            hits.append(f"{d}: {argv[:200]}")
    return hits


def file_hits(secret: str, *roots: Path, skip: tuple[str, ...] = ()) -> tuple[list[str], int]:
    """(files under `roots` containing `secret`, number of files read). Files named in
    `skip` (e.g. the token file itself) are not read."""
    needle, hits, scanned = secret.encode(), [], 0
    for root in roots:
        for p in Path(root).rglob("*"):
            if not p.is_file() or p.is_symlink() or p.name in skip:
                continue
            try:
                data = p.read_bytes()
            except OSError:
                continue
            scanned += 1
            if needle in data:
                hits.append(str(p))
    return hits, scanned


class CmdlineWatch(Background):
    """Samples every process's command line for any of `secrets` in a thread while a
    `with` block runs."""

    def __init__(self, *secrets: str, interval_s: float = 0.5):
        super().__init__("cmdline-watch")
        self.secrets, self.interval_s = secrets, interval_s
        self.hits: set[str] = set()
        self.samples = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            for secret in self.secrets:
                self.hits.update(cmdline_hits(secret))
            self.samples += 1
            self._stop.wait(self.interval_s)

