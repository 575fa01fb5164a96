"""Shared fixtures: a test copy of the rehearsal profile (own ports, own results dir),
one set of real vLLM instances per test session, restarted only if a test stopped them,
and one run of the notebook series per session (`series`, tests/support/series.py).

With LAB_STRICT=1 (set by `make test`, hence in CI) a skipped test counts as a failure:
nothing that needs the real engine may silently drop out.

A canary Hugging Face token is in the environment of the whole run (every process a test
starts inherits it); the security tests look for it where a secret must never appear.
At the end of the run, no process's private temporary directory may be left behind.
Each test's duration goes to the file tests/run_phases.py names (tests/support/durations.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from lab_utils.cluster.nodes import PRIVATE_TMP_PREFIX
from lab_utils.config import LabConfig

from support import durations
from support.profiles import (
    CANARY_API_KEY,
    CANARY_HF_TOKEN,
    make_profile_data,
    write_profile,
    write_secret,
)
from support.series import series  # noqa: F401  (the session's run of the notebooks)


def pytest_configure(config):
    os.environ["HF_TOKEN"] = CANARY_HF_TOKEN
    durations.register(config)


_TMPS_BEFORE = pytest.StashKey[set]()


def _is_xdist_worker(config) -> bool:
    """Whether this process is one of pytest-xdist's workers (the fast phase runs on
    several); the controller process sees every worker's reports."""
    return hasattr(config, "workerinput")


def _private_tmps() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{PRIVATE_TMP_PREFIX}*")}


def pytest_sessionstart(session):
    if not _is_xdist_worker(session.config):
        session.config.stash[_TMPS_BEFORE] = _private_tmps()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Every process the lab starts with a private TMPDIR (`Node.private_tmp`: the vLLM
    instances) has it removed when it is stopped or found dead: checked once the whole
    session (every worker's tests, every fixture) has been torn down, in the process that
    started it, so one worker's live instance is never taken for another's leftover."""
    if _is_xdist_worker(session.config) or _TMPS_BEFORE not in session.config.stash:
        return
    left = sorted(_private_tmps() - session.config.stash[_TMPS_BEFORE])
    if left:
        print(f"\nFAILED: the run left these private temporary directories in "
              f"{tempfile.gettempdir()}: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def umask():
    """Call with a mask to set the process's umask for the test; the old one comes back."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


@pytest.fixture
def no_node_reached(monkeypatch):
    """Fail the test if anything would start a process, open SSH or dial a socket; the
    calls refused, by name."""
    import socket
    import subprocess

    import paramiko

    calls: list[str] = []

    def refuse(what):
        def _refuse(*args, **kwargs):
            calls.append(what)
            raise AssertionError(f"{what} was called where nothing may be reached")
        return _refuse

    monkeypatch.setattr(subprocess, "Popen", refuse("subprocess.Popen"))
    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse("paramiko connect"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    return calls


@pytest.fixture
def test_cfg(tmp_path) -> LabConfig:
    """The rehearsal profile with results (and the state file) under tmp_path."""
    return write_profile(tmp_path, make_profile_data(str(tmp_path / "results")))


@pytest.fixture
def spark_cfg(tmp_path) -> LabConfig:
    """The two-Spark example profile with results under tmp_path (nothing is contacted)."""
    from lab_utils.config import parse_config

    example = Path(__file__).resolve().parents[1] / "environment_config.json.example"
    data = json.loads(example.read_text())
    data["results_root"] = str(tmp_path / "results")
    return parse_config(data, str(example))


@pytest.fixture(scope="session")
def engine_cfg(tmp_path_factory) -> LabConfig:
    """The rehearsal's profile; its instances want an API key (vllm.api_key_file), which
    the lab's clients and its proxy send them (the proxy itself wants none)."""
    root = tmp_path_factory.mktemp("engine")
    data = make_profile_data(str(root / "results"))
    data["vllm"]["api_key_file"] = str(write_secret(root / "vllm_api_key", CANARY_API_KEY))
    return write_profile(root, data)


class Rehearsal:
    """The session's vLLM instances: baseline + disaggregated (prefill, decode)."""

    TOPOLOGIES = ("baseline", "disaggregated")

    def __init__(self, cfg: LabConfig):
        self.cfg = cfg
        self.startup_s: float | None = None

    def up(self) -> dict[str, str]:
        """Ensure all instances run (start what is missing); return role -> URL."""
        import time

        from lab_utils.cluster import Cluster
        from lab_utils.serve.topology import serve

        t0 = time.monotonic()
        with Cluster(self.cfg) as cluster:
            records = serve(cluster, *self.TOPOLOGIES, show_progress=False)
        if self.startup_s is None:
            self.startup_s = time.monotonic() - t0
            print(f"\n[rehearsal] baseline + prefill + decode ready in {self.startup_s:.0f} s")
        return {r.extra["role"]: r.url for r in records}

    def records(self):
        from lab_utils.cluster import Cluster

        return Cluster(self.cfg).running()


@pytest.fixture(scope="session")
def rehearsal(engine_cfg):
    from lab_utils.serve.topology import cleanup

    r = Rehearsal(engine_cfg)
    yield r
    cleanup(engine_cfg)


def pytest_collection_modifyitems(config, items):
    """The notebook series runs first, on a quiet machine (its numbers are measured);
    then the simulated cluster (which takes 01-03 from the series as a reference run);
    tests that stop the shared rehearsal instances run last, so the others share one
    start-up of them (about 90 s here): first those that still use them (the `rehearsal`
    fixture), then those that stop them before they start."""
    def order(item) -> int:
        if item.get_closest_marker("series"):
            return 0
        if item.get_closest_marker("simcluster"):  # before the rehearsal instances start
            return 1
        if not item.get_closest_marker("stops_rehearsal"):
            return 2
        return 3 if "rehearsal" in getattr(item, "fixturenames", ()) else 4

    items.sort(key=order)


@pytest.fixture(scope="session")
def simcluster():
    """The simulated three-node cluster (tests/support/simcluster.py), up for the session."""
    from support import simcluster as sc

    reason = sc.unavailable_reason()
    if reason:
        pytest.skip(f"the simulated cluster cannot be built here: {reason}")
    sc.up()
    yield sc
    sc.down()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under LAB_STRICT=1 a skip is a failure (see module docstring)."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("LAB_STRICT") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under LAB_STRICT=1 (CI must run every test): {reason}"
