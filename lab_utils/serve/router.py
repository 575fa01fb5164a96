"""vLLM's router as the lab's front door (`proxy.kind: "vllm-router"`).

`vllm-router` (the PyPI package of the same name, a Rust binary) routes OpenAI requests
over vLLM instances; with `--vllm-pd-disaggregation` it runs the same prefill/decode
protocol as the lab's proxy for NixlConnector. `python -m lab_utils proxy` replaces itself
with it (`run`) when `proxy.kind` (or its `--kind`) says so, so `serve` starts it exactly
where it starts the lab's proxy: the same node, address, port, log, process group, health
wait, `status` and `cleanup`.

How the lab's settings map onto it:
- backends: the topology's instance URLs (`--worker-urls`, or `--prefill`/`--decode`);
- policy: `round_robin` as is; `least_outstanding` becomes `power_of_two` (the less
  loaded of two picked at random: with two replicas, the less loaded one);
- `proxy.request_timeout_s` -> `--request-timeout-secs`, `proxy.max_body_bytes` ->
  `--max-payload-size`; `proxy.connect_timeout_s` has no counterpart;
- the instances' API key: vllm-router sends `Bearer $OPENAI_API_KEY` to them, so the key
  goes into that variable of its environment (never onto its command line);
- the proxy's own API key: vllm-router checks none from its clients, so the config
  refuses `proxy.api_key_file` with it;
- its Prometheus metrics: `proxy.router_metrics_port` on the proxy node's LAN address.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from pathlib import Path

from lab_utils.errors import LabError
from lab_utils.serve.proxy_settings import settings_from_config

VERSION = "0.1.17"  # the version whose command line and answers the lab was checked with
POLICY = {"round_robin": "round_robin", "least_outstanding": "power_of_two"}


def binary(cfg) -> str:
    """The vllm-router command: `proxy.vllm_router`, else the one beside this Python."""
    want = cfg.proxy.vllm_router or str(Path(sys.executable).parent / "vllm-router")
    found = shutil.which(want)
    if not found:
        raise LabError(f"vllm-router not found at {want} on {cfg.proxy.node} (proxy.kind is "
                       f"\"vllm-router\"): install it into the lab's venv there with `pip install "
                       f"vllm-router=={VERSION}`, or name the command in proxy.vllm_router")
    return found


def router_argv(cfg, mode: str, command: str = "vllm-router") -> list[str]:
    """vllm-router's command line for `mode` (baseline, replicated or disaggregated)."""

    s = settings_from_config(cfg, mode)
    p, node = cfg.proxy, cfg.nodes[cfg.proxy.node]
    argv = [command, "--host", node.lan_address, "--port", str(p.port),
            "--policy", POLICY[s.policy],
            "--request-timeout-secs", str(math.ceil(p.request_timeout_s)),
            "--max-payload-size", str(p.max_body_bytes),
            "--prometheus-host", node.lan_address, "--prometheus-port", str(p.router_metrics_port),
            "--worker-startup-check-interval", "1", "--log-level", "warning"]
    if s.mode == "replicated":
        return argv + ["--worker-urls", *s.backends]
    argv += ["--vllm-pd-disaggregation", "--kv-connector", "nixl"]
    for url in s.prefill:
        argv += ["--prefill", url]
    for url in s.decode:
        argv += ["--decode", url]
    return argv


def router_env(cfg) -> dict[str, str]:
    """This process's environment with the instances' key as vllm-router sends it."""

    env = dict(os.environ)
    key = settings_from_config(cfg, "baseline").backend_api_key
    env.pop("OPENAI_API_KEY", None)
    if key:
        env["OPENAI_API_KEY"] = key
    return env


def run(cfg, mode: str) -> None:
    """Become vllm-router for `mode` (never returns)."""
    argv = router_argv(cfg, mode, binary(cfg))
    print("starting vllm-router: " + " ".join(argv), flush=True)
    os.execve(argv[0], argv, router_env(cfg))
