"""The serving notebooks' session: what it started stops when a cell fails or is
interrupted, and only that."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from lab_utils.cluster import Cluster
from lab_utils.notebook import ServingSession


def _sleeper(cfg, name):
    node = Cluster(cfg).node("spark-01")
    return node, node.start_detached(name, [sys.executable, "-c", "import time; time.sleep(60)"],
                                     log_path=str(cfg.results_dir / f"{name}.log"))


def test_a_failed_cell_stops_what_the_session_started(test_cfg, capsys):
    node, mine = _sleeper(test_cfg, "started-here")
    _, theirs = _sleeper(test_cfg, "found-running")
    try:
        session = ServingSession(test_cfg)
        session.started.append(mine)
        session._after_cell(SimpleNamespace(error_in_exec=None, error_before_exec=None))
        assert node.is_alive(mine)  # a cell that succeeded stops nothing
        session._after_cell(SimpleNamespace(error_in_exec=KeyboardInterrupt(),
                                            error_before_exec=None))
        assert not node.is_alive(mine) and node.is_alive(theirs)
        assert "stopped started-here" in capsys.readouterr().out
        assert [r.name for r in session.cluster.running()] == ["found-running"]
        assert session.stop() == []  # nothing left of its own; twice is fine
    finally:
        node.stop(theirs, grace_s=1)
        node.stop(mine, grace_s=1)
