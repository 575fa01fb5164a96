"""Test profiles: the rehearsal profile moved to a private results directory and ports,
the simulated cluster's profile, and a line printed on the terminal past pytest's capture."""

from __future__ import annotations

import json

from lab_utils.config import DEFAULT_PROFILE, LabConfig

PORT_SHIFT = 1000  # keep tests off the ports of a lab the user may have running


CANARY_HF_TOKEN = "hf_canaryLabTestToken7c41e0d9b2"
CANARY_API_KEY = "sk-canaryLabTestApiKey3f9a62e1d4"


def write_secret(path, value: str):
    """A secret file as the lab wants it: one line, mode 600."""
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def make_profile_data(results_root: str) -> dict:
    data = json.loads(DEFAULT_PROFILE.read_text())
    data["profile"] = "test-local-cpu"
    data["results_root"] = results_root
    for role in ("baseline", "replica", "prefill", "decode", "tp"):
        s = data["vllm"][role]
        s["port"] += PORT_SHIFT
        if s.get("side_channel_port"):
            s["side_channel_port"] += PORT_SHIFT
    data["topology"]["tensor_parallel"]["master_port"] += PORT_SHIFT
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


# The simulated cluster's tests check what only it can show (deploy over SSH, P/D across
# namespaces with an API key, secrets, faults), not numbers, and the rehearsal box runs
# P/D requests there slowly (docs/SIMCLUSTER.md): one load point with requests that
# overlap (concurrency 2, which the local series also measures, so notebook 04 has 03's
# figures at that point to compare with), a few prompts, one repeat. The workshop's
# workload stays in configs/simcluster.json.
SIMCLUSTER_CHECK_WORKLOAD = {"concurrency": [2], "num_prompts": 4, "warmup": 1, "repeats": 1}


def simcluster_profile(tmp_dir, name: str, kv_extra: dict | None = None, *,
                       api_key: bool = False, **proxy) -> LabConfig:
    """configs/simcluster.json with its results under `tmp_dir`, the workload sized for
    checking (`SIMCLUSTER_CHECK_WORKLOAD`), the canary token in an hf_token_file (so the
    instances get it the way a real run does), with `api_key` the canary API key in
    proxy.api_key_file (the proxy's and so the instances' key), `proxy` settings and
    `kv_extra` for kv_transfer.extra_config."""
    from support.simcluster import CONFIG

    data = json.loads(CONFIG.read_text())
    data["profile"] = name
    data["workload"].update(SIMCLUSTER_CHECK_WORKLOAD)
    data["results_root"] = str(tmp_dir / "results")
    data["hf_token_file"] = str(write_secret(tmp_dir / "hf_token", CANARY_HF_TOKEN))
    if api_key:
        data["proxy"]["api_key_file"] = str(write_secret(tmp_dir / "api_key", CANARY_API_KEY))
    data["proxy"].update(proxy)
    data["kv_transfer"].setdefault("extra_config", {}).update(kv_extra or {})
    return write_profile(tmp_dir, data)
