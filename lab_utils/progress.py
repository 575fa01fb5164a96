"""Progress bars for long waits, the same in a terminal and in Jupyter."""

from __future__ import annotations

from tqdm.auto import tqdm


def progress_bar(**kwargs) -> tqdm:
    """A tqdm bar (a widget in notebooks, text elsewhere); use as a context manager."""
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(**kwargs)
