"""A thread that runs beside a `with` block: started on entry, stopped and joined on exit."""

from __future__ import annotations

import threading


class Background:
    """Subclasses define `_run`, which returns once `self._stop` is set."""

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
