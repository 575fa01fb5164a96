"""Progress bars for long waits, the same in a terminal and in Jupyter.

When the notebooks run headless (`make lab`, `python -m lab_utils run`), their bars are
widgets inside the executed copy and nobody sees them. The runner then sets
`LAB_PROGRESS_LOG` in the kernel's environment to a file; every bar that finishes
appends one line to it ("concurrency 2 #1: 40/40 req in 12 s"), and the runner prints
those lines on the terminal as they come.
"""

from __future__ import annotations

import os

from tqdm.auto import tqdm

PROGRESS_LOG_ENV = "LAB_PROGRESS_LOG"


def log_progress(line: str) -> None:
    """Append a line for the headless runner to show; nothing when not run headless."""
    path = os.environ.get(PROGRESS_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line.replace("\n", " ") + "\n")


class _LoggedBar(tqdm):
    """A bar that, when closed, logs what it counted and how long it took."""

    def close(self) -> None:
        if not self.disable and not getattr(self, "_lab_logged", False):
            self._lab_logged = True
            d = self.format_dict
            total = f"/{d['total']}" if d.get("total") else ""
            line = f"{d.get('prefix') or 'progress'}: {d['n']}{total} {d.get('unit', 'it')} in {d['elapsed']:.0f} s"
            if d.get("total") and d["n"] < d["total"] and d.get("postfix"):
                line += f" ({d['postfix']})"  # unfinished: what it was waiting for
            log_progress(line)
        super().close()


def progress_bar(**kwargs) -> tqdm:
    """A tqdm bar (a widget in notebooks, text elsewhere); use as a context manager."""
    kwargs.setdefault("dynamic_ncols", True)
    cls = _LoggedBar if os.environ.get(PROGRESS_LOG_ENV) else tqdm
    return cls(**kwargs)
