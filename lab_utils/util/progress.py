"""Progress bars for long waits, the same in a terminal and in Jupyter.

In a notebook the bar is one line of text, redrawn in place (an IPython display that is
updated), not a widget: a saved notebook keeps the bar's final line ("profile: 100%
48/48 [00:03]"), where a widget would be saved as its first state ("0% 0/14").

When the notebooks run headless (`make lab`, `python -m lab_utils run`), their bars are
widgets inside the executed copy and nobody sees them. The runner then sets
`LAB_PROGRESS_LOG` in the kernel's environment to a file; every bar that finishes
appends one line to it ("concurrency 2 #1: 40/40 req in 12 s"), and the runner prints
those lines on the terminal as they come.

Outside a notebook, a bar whose output is not a terminal (a log file, a pipe) writes one
whole line per step, not a redraw per second: a log then reads "3/4 instance" once, not
a line (or a carriage return) for every refresh of the elapsed time.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from tqdm import tqdm as text_tqdm
from tqdm.auto import tqdm

PROGRESS_LOG_ENV = "LAB_PROGRESS_LOG"


def log_progress(line: str) -> None:
    """Append a line for the headless runner to show; nothing when not run headless."""
    path = os.environ.get(PROGRESS_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line.replace("\n", " ") + "\n")


if TYPE_CHECKING:  # _Logged is mixed into tqdm bars: type-check it as one
    _LoggedBase = text_tqdm
else:
    _LoggedBase = object


class _Logged(_LoggedBase):
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


class _DisplayBar(text_tqdm):
    """A text bar drawn into one IPython display, updated in place."""

    def __init__(self, *args, **kwargs):
        from IPython.display import display

        self._handle: Any = None  # IPython's display handle, once shown
        kwargs.setdefault("ncols", 100)
        kwargs.setdefault("ascii", False)
        super().__init__(*args, **kwargs)
        if not self.disable:
            self._handle = display({"text/plain": self.__str__()}, raw=True, display_id=True)

    def display(self, msg=None, pos=None):  # tqdm calls this to redraw
        if getattr(self, "_handle", None) is not None:
            self._handle.update({"text/plain": msg or self.__str__()}, raw=True)
        return True

    def close(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and self.total and self.n >= self.total and self.postfix:
            # done: what it waited for is over, and a status cut at the bar's width (the
            # line the notebook keeps) would be read as the result
            self.postfix = ""
            handle.update({"text/plain": self.__str__()}, raw=True)
        self._handle = None  # tqdm clears a bar it does not leave: keep the final line
        super().close()
        if handle is not None:
            handle.update({"text/plain": self.__str__()}, raw=True)


class _LineBar(text_tqdm):
    """A text bar for a file that is not a terminal: one line each time the count moves
    (and the first), none for a refresh of the same count."""

    def __init__(self, *args, **kwargs):
        self._last_n: float | None = None
        self._out = kwargs.get("file") or sys.stderr
        kwargs["file"] = _Discard()  # tqdm's own writes (redraws, the closing newline)
        kwargs.setdefault("mininterval", 0)  # every step gets its line
        kwargs.setdefault("miniters", 1)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):  # tqdm calls this to redraw
        if self.n == getattr(self, "_last_n", None):
            return True
        self._last_n = self.n
        self._out.write(self.__str__() + "\n")
        self._out.flush()
        return True


class _LoggedBar(_Logged, tqdm):
    pass


class _LoggedLineBar(_Logged, _LineBar):
    pass


class _LoggedDisplayBar(_Logged, _DisplayBar):
    pass


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def progress_bar(**kwargs) -> text_tqdm:
    """A progress bar: one line of text redrawn in place in a notebook, tqdm's text bar
    elsewhere; use as a context manager."""
    logged = bool(os.environ.get(PROGRESS_LOG_ENV))
    if _in_kernel():
        kwargs.setdefault("file", _Discard())
        return (_LoggedDisplayBar if logged else _DisplayBar)(**kwargs)
    out = kwargs.get("file") or sys.stderr
    if not _is_terminal(out):
        return (_LoggedLineBar if logged else _LineBar)(**kwargs)
    kwargs.setdefault("dynamic_ncols", True)
    return (_LoggedBar if logged else tqdm)(**kwargs)


def _is_terminal(f) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _Discard:
    """Where a display bar's own text output goes: nowhere (it draws into its display)."""

    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass
