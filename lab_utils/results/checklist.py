"""A check's result as the environment checklist (`lab_utils.checks`) produces it and
notebook 00 records it (`payloads.EnvironmentPayload`): pass, warn, fail or n/a, on which
node, what was seen and, for warn and fail, the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATUSES = ("pass", "warn", "fail", "n/a")


@dataclass
class CheckResult:
    check: str
    node: str  # a node name, or "cluster" for checks across nodes
    status: str  # one of STATUSES
    summary: str
    evidence: str = ""
    fix: str | None = None
    data: dict = field(default_factory=dict)  # the measured values, for later notebooks

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        if self.status in ("warn", "fail") and not self.fix:
            raise ValueError(f"{self.check} on {self.node}: a {self.status} needs a fix")
