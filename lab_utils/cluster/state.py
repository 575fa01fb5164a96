"""The state file: every process the lab started, so it can be found and stopped later.

One JSON file per profile (`results/<profile>/state.json`) lists each process with its
node, PID, process group, start time (to tell a recycled PID from ours), log path and
what it serves; it is readable by its owner only (0600), as are the logs. Updates take
an exclusive lock and replace the file atomically, so two commands running at once never
lose each other's records.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab_utils.errors import LabError
from lab_utils.util.atomic import atomic_write_text


@dataclass
class ProcessRecord:
    """A process the lab started on a node."""

    name: str
    node: str
    pid: int
    pgid: int
    start_ticks: int
    log_path: str
    argv: list[str]
    kind: str = "process"
    port: int | None = None
    url: str | None = None
    started_at: float = 0.0
    extra: dict = field(default_factory=dict)


class StateFile:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def _read(self) -> list[ProcessRecord]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            # as OpenSSH treats its own files: one another user wrote, or could have,
            # names processes the lab would stop
            raise LabError(f"{self.path} is owned by uid {st.st_uid} with mode "
                           f"{stat.S_IMODE(st.st_mode):o}; the lab trusts only its own state "
                           "file, writable by its owner alone: check that no lab process "
                           "runs, then remove it")
        data = json.loads(self.path.read_text())
        return [ProcessRecord(**r) for r in data.get("processes", [])]

    def records(self) -> list[ProcessRecord]:
        with self._locked():
            return self._read()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, records: list[ProcessRecord]) -> None:
        atomic_write_text(self.path, json.dumps({"processes": [asdict(r) for r in records]},
                                                indent=2), private=True)

    def add(self, record: ProcessRecord) -> None:
        with self._locked():
            records = [r for r in self._read() if r.name != record.name]
            self._write(records + [record])

    def remove(self, name: str) -> None:
        with self._locked():
            self._write([r for r in self._read() if r.name != name])

    def get(self, name: str) -> ProcessRecord | None:
        return next((r for r in self.records() if r.name == name), None)
