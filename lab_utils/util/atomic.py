"""Atomic file writes: readers see the old file or the new one, never a torn one.

A write goes to a temp file `.<name>.<writer pid>.<random>.tmp` next to the target, then
is renamed over it. A writer killed mid-write leaves its temp file behind; the next
atomic write into the same directory removes such leftovers once their writer is gone
(see `remove_stale_temps`).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from contextlib import suppress
from pathlib import Path

# Age after which a temp file whose writer PID is gone counts as abandoned. The age check
# guards against PIDs that mean nothing here: a writer on another host, or in another
# PID namespace, writing into a shared directory.
STALE_TEMP_AGE_S = 300.0
_TEMP_NAME = re.compile(r"^\..+\.(\d+)\.[a-z0-9_]+\.tmp$")


def atomic_write_text(path: str | os.PathLike, text: str, *, private: bool = False) -> None:
    """Write `text` (UTF-8) to `path` atomically (see `atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"), private=private)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, private: bool = False) -> None:
    """Write `data` to `path` so readers see the old file or the new one, never a part:
    temp file in the same directory, flush + fsync, os.replace, fsync of the directory.
    A new file gets the mode the umask allows, an existing one keeps its mode; a `private`
    file is always 0600 (readable by its owner only). Afterwards, stale temp files of
    killed writers in that directory are removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600 if private else path.stat().st_mode & 0o777 if path.exists() else None
    fd, tmp = _create_temp(path, 0o600 if private else 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    with suppress(OSError):  # make the rename durable, where the filesystem allows
        os.fsync(dir_fd)
    os.close(dir_fd)
    with suppress(OSError):  # housekeeping only: never fail a write that succeeded
        remove_stale_temps(path.parent)


def _create_temp(path: Path, mode: int) -> tuple[int, str]:
    """A new temp file `.<name>.<pid>.<random>.tmp` beside `path`, created with `mode`
    less the umask (as `open` does; `tempfile.mkstemp` would always make it 0600)."""
    while True:
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode), tmp
        except FileExistsError:
            continue


def _pid_alive(pid: int) -> bool:
    """False only when no process `pid` exists on this host (zombies count as alive)."""
    if pid <= 0:
        return True  # not a writer PID; never signal a process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # e.g. another user's process: it exists
        return True
    return True


def remove_stale_temps(
    directory: str | os.PathLike[str], *, min_age_s: float = STALE_TEMP_AGE_S
) -> list[Path]:
    """Remove temp files that `atomic_write_bytes` left in `directory` when its writer was
    killed: only regular files named `.<name>.<pid>.<random>.tmp` whose PID is not alive
    and that were last modified at least `min_age_s` ago. Should a live writer's temp file
    be removed anyway (a writer on another host sharing the directory, stopped longer
    than `min_age_s`), its os.replace fails and the target keeps its old content.
    Returns the removed paths."""
    removed = []
    now = time.time()
    with os.scandir(directory) as entries:
        candidates = [(e, m) for e in entries if (m := _TEMP_NAME.match(e.name))]
    for entry, match in candidates:
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < min_age_s:
            continue
        if _pid_alive(int(match.group(1))):
            continue
        with suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def read_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them: a FIFO, a device or a directory
    (which would block or never end) and a larger file raise OSError saying which."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(f"{path} is over {limit} bytes")
    return data
