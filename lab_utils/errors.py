"""Errors the lab raises for the user to act on.

Every `LabError` carries a message that says what is wrong and how to fix it. The CLI
prints it without a traceback; in Jupyter, IPython's `_render_traceback_` hook shows only
the message, so a notebook user sees the fix rather than a stack of frames.
"""

from __future__ import annotations


class LabError(Exception):
    """A problem the user can fix; the message names the fix."""

    def _render_traceback_(self) -> list[str]:  # IPython hook
        return [f"{type(self).__name__}: {self}"]


class ConfigError(LabError):
    """The config file is missing, unreadable or invalid."""


class ResultsMissingError(LabError):
    """A notebook needs the results of an earlier one that has not been run."""


class ProcessFailedError(LabError):
    """A process the lab started died or never became ready."""


class PortInUseError(LabError):
    """A port the config assigns is already taken."""


class MetricMissingError(LabError):
    """A Prometheus metric the lab relies on is absent from this vLLM version."""
