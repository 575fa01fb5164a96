"""Sets NIXL's progress-thread delay in the processes of a prefill or decode instance.

The lab puts this directory first on the instance's PYTHONPATH, with
LAB_NIXL_PROGRESS_DELAY_US, when `kv_transfer.nixl_progress_delay_us` is above 0 (the CPU
rehearsal's default). Python imports `sitecustomize` at start-up in every process of the
instance, vLLM's workers included; this one adds an import hook and nothing else. When
nixl's compiled bindings (`nixl_cu13._bindings`, `nixl_cu12._bindings`, ...) are imported,
it replaces their `nixlAgentConfig` with a subclass that keeps the delay above 0: the nixl
Python API builds every agent's config with `pthrDelay = 0`, a progress thread that polls
UCX without pause, and offers no setting for it. With a delay, NIXL's UCX backend waits in
poll() for UCX's events for at most that long (rounded up to whole milliseconds), so the
thread takes no CPU while nothing moves. Each process that loads the bindings writes one
line to stderr (the instance's log) saying so. A failure here is reported the same way and
leaves nixl as it was. Any other `sitecustomize` later on sys.path still runs.

Standard library only: it runs before anything else in the process.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

ENV = "LAB_NIXL_PROGRESS_DELAY_US"
HERE = os.path.dirname(os.path.abspath(__file__))


def delay_us() -> int:
    """The delay asked for (0: none, or not a number)."""
    try:
        return max(0, int(os.environ.get(ENV, "0")))
    except ValueError:
        return 0


def patch(bindings, delay: int) -> None:
    """Make every `nixlAgentConfig` built from `bindings` carry `delay` where it would
    carry 0."""
    base = bindings.nixlAgentConfig
    if getattr(base, "_lab_delay_us", None) is not None:
        return

    class AgentConfig(base):  # type: ignore[misc, valid-type]  # a base class found at run time
        _lab_delay_us = delay

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if getattr(self, "pthrDelay", None) == 0:
                self.pthrDelay = delay

        def __setattr__(self, name, value):
            if name == "pthrDelay" and value == 0:
                value = delay
            super().__setattr__(name, value)

    AgentConfig.__name__ = AgentConfig.__qualname__ = base.__name__
    bindings.nixlAgentConfig = AgentConfig


def _say(text: str) -> None:
    sys.stderr.write(f"lab: {text} (pid {os.getpid()})\n")
    sys.stderr.flush()


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, delay: int):
        self.inner, self.delay = inner, delay

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        try:
            patch(module, self.delay)
            _say(f"NIXL progress-thread delay {self.delay} us in {module.__name__} "
                 "(kv_transfer.nixl_progress_delay_us)")
        except Exception as e:  # nixl's bindings changed: leave them as they are
            _say(f"could not set NIXL's progress-thread delay in {module.__name__}: {e!r}; "
                 "its progress thread polls without pause")


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, delay: int):
        self.delay = delay

    def find_spec(self, name, path=None, target=None):
        if not (name.startswith("nixl") and name.endswith("._bindings")):
            return None
        sys.meta_path.remove(self)  # let the other finders find it
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, self.delay)
        return spec


def _next_sitecustomize() -> None:
    """Run the `sitecustomize` this one hides, if any (the first later on sys.path)."""
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == HERE:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_lab_hidden_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if delay_us() > 0 and not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder(delay_us()))
_next_sitecustomize()
