"""The proxy's settings: its backends per role, timeouts, limits and keys, and how they
come from a `LabConfig` (`serve.proxy` serves them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from lab_utils.config import api_key
from lab_utils.serve.launcher import instance_url


@dataclass
class ProxySettings:
    mode: str  # "replicated" | "disaggregated"
    backends: list[str] = field(default_factory=list)  # replicated
    prefill: list[str] = field(default_factory=list)  # disaggregated
    decode: list[str] = field(default_factory=list)
    policy: str = "round_robin"  # or "least_outstanding"
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 300.0
    max_body_bytes: int = 8 * 1024 * 1024
    api_key: str | None = None  # what clients of the proxy must send
    backend_api_key: str | None = None  # what the proxy sends to the instances
    max_n: int = 8  # the most choices (n, best_of) a request may ask for
    max_tokens: int | None = None  # the most output tokens a request may ask for
    body_timeout_s: float = 15.0  # a request body not read whole in this time is refused (408)
    header_timeout_s: float = 10.0  # request headers not complete in this time: 408, closed
    send_timeout_s: float = 60.0  # a client reading nothing of its response for this: reset
    vllm_rules: bool = True  # check requests with vLLM's own rules where vLLM is installed


# The keys reach a proxy started by the lab through its environment (over SSH on a remote
# controller, where the key files named in the config are not); else from those files.
KEY_ENV = {"proxy": "LAB_PROXY_API_KEY", "vllm": "VLLM_API_KEY"}


def settings_from_config(cfg, mode: str) -> ProxySettings:
    """The proxy's backends and limits for `mode`, from a `LabConfig`."""

    def urls(topology: str, role: str) -> list[str]:
        return [u for s in cfg.instances(topology) if s.role == role and (u := instance_url(cfg, s))]

    def key(service: Literal["proxy", "vllm"]) -> str | None:
        return os.environ.get(KEY_ENV[service]) or api_key(cfg, service)

    p = cfg.proxy
    topology = mode if mode in ("replicated", "baseline", "tensor-parallel") else "disaggregated"
    longest = max([cfg.vllm.max_model_len] + [s.settings.max_model_len for s in cfg.instances(topology)
                                              if s.settings.max_model_len])
    common = dict(connect_timeout_s=p.connect_timeout_s, request_timeout_s=p.request_timeout_s,
                  max_body_bytes=p.max_body_bytes, api_key=key("proxy"),
                  backend_api_key=key("vllm"), max_n=p.max_n, max_tokens=longest,
                  header_timeout_s=p.header_timeout_s, body_timeout_s=p.body_timeout_s,
                  send_timeout_s=p.send_timeout_s)
    if mode == "replicated":
        return ProxySettings(mode=mode, backends=urls("replicated", "replica"),
                             policy=cfg.topology.replicated.policy, **common)
    if mode == "baseline":  # one backend, the same path as the other architectures
        return ProxySettings(mode="replicated", backends=urls("baseline", "baseline"), **common)
    if mode == "tensor-parallel":  # one backend too: rank 0's API server
        return ProxySettings(mode="replicated", backends=urls(mode, "tp"), **common)
    return ProxySettings(mode=mode, prefill=urls("disaggregated", "prefill"),
                         decode=urls("disaggregated", "decode"), **common)
