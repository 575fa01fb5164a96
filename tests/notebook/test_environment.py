"""Notebook 00's verdict, and how the later notebooks require it."""

from __future__ import annotations

import pytest

from lab_utils.checks.frame import ChecklistReport, CheckResult
from lab_utils.errors import LabError
from lab_utils.notebook import record_environment, require_environment


def _report(status: str) -> ChecklistReport:
    return ChecklistReport([CheckResult("python", "spark-01", "pass", "ok"),
                            CheckResult("cuda_build", "spark-02", status, "torch cu129",
                                        fix="install cu130" if status != "pass" else None)])


def test_environment_blessed(test_cfg):
    record_environment(test_cfg, _report("pass"))
    env = require_environment(test_cfg)
    assert env.blessed is True and env.gpu_name is None  # no gpu check: no GPU


def test_environment_with_failures_is_refused_then_continued_knowingly(test_cfg, capsys):
    with pytest.raises(LabError, match="cuda_build on spark-02: torch cu129 .fix: install cu130"):
        record_environment(test_cfg, _report("fail"))
    with pytest.raises(LabError, match="fix them and re-run"):
        require_environment(test_cfg)  # recorded, not blessed, no consent
    record_environment(test_cfg, _report("fail"), continue_despite_failures=True)
    payload = require_environment(test_cfg)
    assert payload.continued_despite_failures and not payload.blessed
    assert "continuing on an environment with failed checks" in capsys.readouterr().out


def test_the_verdict_says_what_this_profile_could_not_establish(test_cfg, spark_cfg, capsys):
    """On the rehearsal every node's LAN and data addresses are one, and n/a checks did not
    run: the verdict names both; on two Sparks with two networks it names neither."""
    report = _report("n/a")
    report.results.append(CheckResult("python", "spark-02", "n/a", "same machine"))
    record_environment(test_cfg, report)
    out = capsys.readouterr().out
    assert "python" not in out.split("not established here")[1].splitlines()[0]  # it ran
    assert "verdict: blessed: no check failed" in out
    assert "not established here (n/a on this profile): cuda_build" in out
    same = [n for n, node in test_cfg.nodes.items()
            if "serving" in node.roles and node.lan_address == node.data_address]
    assert same and f"{', '.join(same)}: LAN and data-plane address are the same" in out
    record_environment(spark_cfg, _report("pass"))
    out = capsys.readouterr().out
    assert "not established" not in out and "cannot tell the two networks apart" not in out
