"""The environment checklist's frame: results, the context checks share, and the runner.

A check is a function `check(ctx) -> list[CheckResult]`; `lab_utils.checks.software` holds them
in the order the checklist runs. Every result says pass, warn, fail or n/a, on which
node, what was seen (evidence) and, for warn and fail, the fix: a command to run or a
setting to change. A check that crashes becomes a fail naming the error, and the others
still run. Nodes are reached through the cluster (one connection per node for the whole
checklist), so a test can hand in nodes that replay recorded command outputs instead of
real machines.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from lab_utils.cluster import Cluster, Node, RunResult, as_cluster
from lab_utils.config import LabConfig
from lab_utils.errors import LabError
from lab_utils.on_node import facts as nodefacts
from lab_utils.results.checklist import STATUSES, CheckResult
from lab_utils.util.progress import progress_bar

_FACTS_SOURCE = inspect.getsource(nodefacts)


@dataclass
class Context:
    """What checks share: the cluster (config and nodes), and cached command results."""

    cluster: Cluster
    unreachable: dict[str, str] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)

    @property
    def cfg(self) -> LabConfig:
        return self.cluster.cfg

    def node(self, name: str) -> Node:
        return self.cluster.node(name)

    def serving(self) -> list[str]:
        return [n.name for n in self.cluster.serving()]

    def split(self, check: str, names: list[str],
              why_not: Callable[[str], str | None] | None = None) -> tuple[list[str], list[CheckResult]]:
        """The nodes `check` runs on, and an n/a result for each of the others: a node SSH
        did not reach, or one for which `why_not` gives a reason."""
        run_on, skipped = [], []
        for n in names:
            reason = (f"not checked: {self.unreachable[n]}" if n in self.unreachable
                      else why_not(n) if why_not else None)
            if reason:
                skipped.append(CheckResult(check, n, "n/a", reason))
            else:
                run_on.append(n)
        return run_on, skipped

    def run(self, name: str, argv: list[str], timeout: float = 60.0) -> RunResult:
        """Run a command on a node once per checklist (results are cached)."""
        key = (name, tuple(argv))
        if key not in self._cache:
            self._cache[key] = self.node(name).run(argv, timeout=timeout)
        return self._cache[key]

    def facts(self, name: str, *args: str, timeout: float = 60.0):
        """Run a `nodefacts` command with the node's Python; its JSON answer."""
        node = self.node(name)
        key = (name, "facts", args)
        if key not in self._cache:
            r = node.run([node.python, "-", *args], input=_FACTS_SOURCE, timeout=timeout)
            if not r.ok:
                raise LabError(f"node {name}: `{node.python}` could not report {args[0]}: "
                               f"{(r.stderr or r.stdout).strip()[-300:]}")
            self._cache[key] = json.loads(r.stdout.strip().splitlines()[-1])
        return self._cache[key]

    def facts_argv(self, name: str, *args: str) -> list[str]:
        """A command line running `nodefacts` detached (no stdin there)."""
        return [self.node(name).python, "-c", _FACTS_SOURCE, *args]


Check = Callable[[Context], Iterable[CheckResult]]


@dataclass
class ChecklistReport:
    results: list[CheckResult]

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    @property
    def failed(self) -> bool:
        return self.counts["fail"] > 0

    def to_dict(self) -> dict:
        return {"counts": self.counts, "failed": self.failed,
                "results": [asdict(r) for r in self.results]}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in asdict(r).items() if k != "data"}
                             for r in self.results],
                            columns=["check", "node", "status", "summary", "evidence", "fix"])

    def text(self) -> str:
        width = max((len(r.check) for r in self.results), default=5)
        lines = []
        for r in self.results:
            lines.append(f"{r.status.upper():4}  {r.check:<{width}}  {r.node:<10}  {r.summary}")
            if r.status in ("warn", "fail"):
                if r.evidence:
                    lines.append(f"{'':6}{'':<{width}}  seen: {r.evidence}")
                lines.append(f"{'':6}{'':<{width}}  fix:  {r.fix}")
        c = self.counts
        lines.append(f"\n{c['pass']} pass, {c['warn']} warn, {c['fail']} fail, {c['n/a']} n/a")
        return "\n".join(lines)


def _crashed(check: Check, error: Exception) -> CheckResult:
    name = check.__name__.removeprefix("check_")
    return CheckResult(name, "cluster", "fail", f"the check itself failed: {error}",
                       evidence=type(error).__name__,
                       fix="read the error; if it names a node or a command, fix that and re-run")


def run_checklist(cluster: Cluster | LabConfig, checks: Sequence[Check],
                  nodes: Mapping[str, Node] | None = None,
                  show_progress: bool = True) -> ChecklistReport:
    """Run `checks` on a cluster, or on one built from a config for the checklist (and
    closed after it); `nodes` replaces the profile's nodes (tests replay recordings)."""
    if nodes is not None:
        cluster = Cluster(cluster.cfg if isinstance(cluster, Cluster) else cluster, nodes)
    results: list[CheckResult] = []
    with as_cluster(cluster) as ctx_cluster, progress_bar(
            total=len(checks), desc="checklist", unit="check", disable=not show_progress) as bar:
        ctx = Context(ctx_cluster)
        for check in checks:
            bar.set_postfix_str(check.__name__.removeprefix("check_"))
            try:
                results.extend(check(ctx))
            except Exception as e:  # a check's bug must not hide the other checks
                results.append(_crashed(check, e))
            bar.update(1)
    return ChecklistReport(results)


GiB = 1024**3
