"""Results files for the tests of `lab_utils.results`: a profile whose results go under a
test's directory, the envelope's software and hardware as the tests write them, a notebook
01 payload carrying test data, and a results file as the lab wrote it before the payload
models (dict payloads)."""

from __future__ import annotations

import json
from pathlib import Path

from lab_utils.config import REPO_ROOT
from lab_utils.results import BaselinePayload, results_spec

from support.payloads import baseline_dict, model, sweep_dict

LOCAL_CPU = REPO_ROOT / "configs" / "local-cpu.json"


def config_dict(results_root: Path, profile: str = "unit-test") -> dict:
    if LOCAL_CPU.exists():
        data = json.loads(LOCAL_CPU.read_text())
    else:
        data = {
            "profile": profile,
            "nodes": {
                "local": {
                    "connection": "local",
                    "roles": ["serving", "controller"],
                    "lan_address": "127.0.0.1",
                    "data_address": "127.0.0.1",
                }
            },
            "model": {"name": "tiny", "source": "tiny"},
            "vllm": {
                "device": "cpu",
                "baseline": {"port": 8100},
                "replica": {"port": 8200},
                "prefill": {"port": 8300, "side_channel_port": 5600},
                "decode": {"port": 8400, "side_channel_port": 5700},
            },
            "topology": {
                "baseline": {"node": "local"},
                "replicated": {"nodes": ["local"]},
                "disaggregated": {"prefill": ["local"], "decode": ["local"]},
            },
            "proxy": {"node": "local", "port": 8000},
        }
    data["profile"] = profile
    data["results_root"] = str(results_root)
    return data


SOFTWARE = {"python": "3.x", "vllm": None}
HARDWARE = {"hostname": "test"}


def baseline(**workload) -> BaselinePayload:
    """A notebook 01 payload whose sweep's workload carries `workload` (test data)."""
    return model("01", baseline_dict(sweep_dict(workload=workload)))


def old_file(cfg, notebook: str, payload: dict, kind: str | None = None) -> Path:
    """A results file as the lab wrote it before the payload models (dict payloads)."""
    spec = results_spec(notebook)
    path = cfg.results_dir / spec.file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema_version": 1, "kind": kind or spec.kind, "notebook": spec.notebook,
        "timestamp": "2025-01-01T00:00:00.000000Z", "profile": cfg.profile,
        "config": cfg.snapshot(), "software": SOFTWARE, "hardware": HARDWARE,
        "payload": payload}, indent=2))
    return path
