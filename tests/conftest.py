"""Shared fixtures: a test copy of the rehearsal profile (own ports, own results dir) and
one set of real vLLM instances per test session, restarted only if a test stopped them.

With LAB_STRICT=1 (set by `make test`, hence in CI) a skipped test counts as a failure:
nothing that needs the real engine may silently drop out.

A canary Hugging Face token is in the environment of the whole run (every process a test
starts inherits it); the security tests look for it where a secret must never appear.
At the end of the run, no process's private temporary directory may be left behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from lab_utils.config import DEFAULT_PROFILE, LabConfig
from lab_utils.nodes import PRIVATE_TMP_PREFIX

PORT_SHIFT = 1000  # keep tests off the ports of a lab the user may have running
CANARY_HF_TOKEN = "hf_canaryLabTestToken7c41e0d9b2"


def pytest_configure(config):
    os.environ["HF_TOKEN"] = CANARY_HF_TOKEN


@pytest.fixture(scope="session", autouse=True)
def private_tmps_removed():
    """Every process the lab starts with a private TMPDIR (`Node.private_tmp`: the vLLM
    instances) has it removed when it is stopped or found dead; checked after everything
    else in the session has been torn down."""
    tmp = Path(tempfile.gettempdir())
    before = {p.name for p in tmp.glob(f"{PRIVATE_TMP_PREFIX}*")}
    yield
    left = sorted({p.name for p in tmp.glob(f"{PRIVATE_TMP_PREFIX}*")} - before)
    assert not left, f"the run left these private temporary directories in {tmp}: {left}"


def make_profile_data(results_root: str) -> dict:
    data = json.loads(DEFAULT_PROFILE.read_text())
    data["profile"] = "test-local-cpu"
    data["results_root"] = results_root
    for role in ("baseline", "replica", "prefill", "decode"):
        s = data["vllm"][role]
        s["port"] += PORT_SHIFT
        if s.get("side_channel_port"):
            s["side_channel_port"] += PORT_SHIFT
    data["proxy"]["port"] += PORT_SHIFT
    data["kv_transfer"]["probe_port"] += PORT_SHIFT
    return data


def write_profile(tmp_dir, data: dict) -> LabConfig:
    path = tmp_dir / "profile.json"
    path.write_text(json.dumps(data, indent=2))
    from lab_utils.config import load_config

    return load_config(path)


def show(request, line: str) -> None:
    """Put `line` in pytest's output even when the test passes (measured figures for the
    record): through the terminal reporter, with output capture suspended, since capture
    would swallow it otherwise."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capman is None:
        print(line)
        return
    with capman.global_and_fixture_disabled():
        reporter.write_line("\n" + line)


@pytest.fixture
def test_cfg(tmp_path) -> LabConfig:
    """The rehearsal profile with results (and the state file) under tmp_path."""
    return write_profile(tmp_path, make_profile_data(str(tmp_path / "results")))


@pytest.fixture(scope="session")
def engine_cfg(tmp_path_factory) -> LabConfig:
    root = tmp_path_factory.mktemp("engine")
    return write_profile(root, make_profile_data(str(root / "results")))


class Rehearsal:
    """The session's vLLM instances: baseline + disaggregated (prefill, decode)."""

    TOPOLOGIES = ("baseline", "disaggregated")

    def __init__(self, cfg: LabConfig):
        self.cfg = cfg
        self.startup_s: float | None = None

    def up(self) -> dict[str, str]:
        """Ensure all instances run (start what is missing); return role -> URL."""
        import time

        from lab_utils.topology import serve

        t0 = time.monotonic()
        records = serve(self.cfg, *self.TOPOLOGIES, show_progress=False)
        if self.startup_s is None:
            self.startup_s = time.monotonic() - t0
            print(f"\n[rehearsal] baseline + prefill + decode ready in {self.startup_s:.0f} s")
        return {r.extra["role"]: r.url for r in records}

    def records(self):
        from lab_utils.topology import running

        return running(self.cfg)


@pytest.fixture(scope="session")
def rehearsal(engine_cfg):
    from lab_utils.topology import cleanup

    r = Rehearsal(engine_cfg)
    yield r
    cleanup(engine_cfg)


def pytest_collection_modifyitems(config, items):
    """The notebook series runs first, on a quiet machine (its numbers are measured);
    tests that stop the shared rehearsal instances run last, so the others share one
    start-up of them (about 90 s here)."""
    def order(item) -> int:
        if item.get_closest_marker("series"):
            return 0
        if item.get_closest_marker("simcluster"):  # before the rehearsal instances start
            return 1
        return 3 if item.get_closest_marker("stops_rehearsal") else 2

    items.sort(key=order)


@pytest.fixture(scope="session")
def simcluster():
    """The simulated three-node cluster (tests/simcluster.py), up for the session."""
    import simcluster as sc

    reason = sc.unavailable_reason()
    if reason:
        pytest.skip(f"the simulated cluster cannot be built here: {reason}")
    sc.up()
    yield sc
    from lab_utils.ssh import SSHNode

    SSHNode.close_all()
    sc.down()


def simcluster_profile(tmp_dir, name: str, kv_extra: dict | None = None, **proxy) -> LabConfig:
    """configs/simcluster.json with its results under `tmp_dir`, the canary token in an
    hf_token_file (so the instances get it the way a real run does), `proxy` settings and
    `kv_extra` for kv_transfer.extra_config."""
    from simcluster import CONFIG

    data = json.loads(CONFIG.read_text())
    data["profile"] = name
    data["results_root"] = str(tmp_dir / "results")
    token = tmp_dir / "hf_token"
    token.write_text(CANARY_HF_TOKEN + "\n")
    token.chmod(0o600)
    data["hf_token_file"] = str(token)
    data["proxy"].update(proxy)
    data["kv_transfer"].setdefault("extra_config", {}).update(kv_extra or {})
    return write_profile(tmp_dir, data)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under LAB_STRICT=1 a skip is a failure (see module docstring)."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("LAB_STRICT") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under LAB_STRICT=1 (CI must run every test): {reason}"
