"""Test profiles: the rehearsal profile moved to a private results directory and ports,
the simulated cluster's profile, and a line printed on the terminal past pytest's capture."""

from __future__ import annotations

import json

from lab_utils.config import DEFAULT_PROFILE, LabConfig

PORT_SHIFT = 1000  # keep tests off the ports of a lab the user may have running


CANARY_HF_TOKEN = "hf_canaryLabTestToken7c41e0d9b2"


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


def simcluster_profile(tmp_dir, name: str, kv_extra: dict | None = None, **proxy) -> LabConfig:
    """configs/simcluster.json with its results under `tmp_dir`, the canary token in an
    hf_token_file (so the instances get it the way a real run does), `proxy` settings and
    `kv_extra` for kv_transfer.extra_config."""
    from support.simcluster import CONFIG

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
