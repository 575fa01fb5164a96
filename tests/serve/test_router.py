"""`proxy.kind: "vllm-router"`: the command line the lab gives vLLM's router, judged by the
router's own parser (the pinned vllm-router package), its environment, and the config's
refusals."""

from __future__ import annotations

import pytest
from vllm_router.launch_router import parse_router_args

from lab_utils.config import with_proxy
from lab_utils.errors import ConfigError, LabError
from lab_utils.serve import router

from support.profiles import make_profile_data, write_profile, write_secret


def _cfg(tmp_path, **proxy):
    data = make_profile_data(str(tmp_path / "results"))
    data["proxy"].update(kind="vllm-router", **proxy)
    return data


def test_disaggregated_argv_is_read_by_the_routers_parser(tmp_path):
    cfg = write_profile(tmp_path, _cfg(tmp_path, request_timeout_s=12.5, router_metrics_port=29123))
    argv = router.router_argv(cfg, "disaggregated")
    args = parse_router_args(argv[1:])
    lan = cfg.nodes[cfg.proxy.node].lan_address
    pre = [s for s in cfg.instances("disaggregated") if s.role == "prefill"]
    dec = [s for s in cfg.instances("disaggregated") if s.role == "decode"]
    assert args.vllm_pd_disaggregation and args.kv_connector == "nixl"
    assert [u for u, _ in args.prefill_urls] == [f"http://{cfg.nodes[s.node].lan_address}:{s.port}" for s in pre]
    assert args.decode_urls == [f"http://{cfg.nodes[s.node].lan_address}:{s.port}" for s in dec]
    assert (args.host, args.port) == (lan, cfg.proxy.port)
    assert (args.prometheus_host, args.prometheus_port) == (lan, 29123)
    assert args.request_timeout_secs == 13 and args.max_payload_size == cfg.proxy.max_body_bytes
    assert args.policy == "round_robin" and args.worker_urls == []
    assert args.api_key is None  # no key on the command line


def test_replicated_argv_maps_the_policy(tmp_path):
    data = _cfg(tmp_path)
    data["topology"]["replicated"]["policy"] = "least_outstanding"
    cfg = write_profile(tmp_path, data)
    args = parse_router_args(router.router_argv(cfg, "replicated")[1:])
    replicas = cfg.instances("replicated")
    assert not args.vllm_pd_disaggregation and len(args.worker_urls) == len(replicas) >= 1
    assert args.policy == "power_of_two"
    base = parse_router_args(router.router_argv(cfg, "baseline")[1:])
    assert len(base.worker_urls) == 1


def test_the_instances_key_goes_in_the_environment_only(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-stale-from-the-shell")
    data = _cfg(tmp_path)
    cfg = write_profile(tmp_path, data)
    assert "OPENAI_API_KEY" not in router.router_env(cfg)  # no key configured: none sent
    data["vllm"]["api_key_file"] = str(write_secret(tmp_path / "vllm_key", "sk-instances-7f2a"))
    cfg = write_profile(tmp_path, data)
    assert router.router_env(cfg)["OPENAI_API_KEY"] == "sk-instances-7f2a"
    assert not any("sk-instances" in a for a in router.router_argv(cfg, "disaggregated"))


def test_the_config_refuses_a_client_key_and_a_taken_metrics_port(tmp_path):
    data = _cfg(tmp_path, api_key_file=str(write_secret(tmp_path / "k", "sk-proxy-key-0123456789")))
    with pytest.raises(ConfigError, match="does not check its clients' key"):
        write_profile(tmp_path, data)
    data = _cfg(tmp_path)
    data["proxy"]["router_metrics_port"] = data["proxy"]["port"]
    with pytest.raises(ConfigError, match="router_metrics_port"):
        write_profile(tmp_path, data)
    data["proxy"]["kind"] = "lab"  # the lab proxy serves no second port: no conflict
    write_profile(tmp_path, data)


def test_a_missing_binary_names_the_install(tmp_path):
    cfg = write_profile(tmp_path, _cfg(tmp_path, vllm_router=str(tmp_path / "nowhere" / "vllm-router")))
    with pytest.raises(LabError, match=f"pip install vllm-router=={router.VERSION}"):
        router.binary(cfg)
    assert router.binary(write_profile(tmp_path, _cfg(tmp_path))).endswith("vllm-router")


def test_kind_override_is_checked_like_the_file(tmp_path):
    data = make_profile_data(str(tmp_path / "results"))
    cfg = write_profile(tmp_path, data)
    routed = with_proxy(cfg, kind="vllm-router")
    assert (routed.proxy.kind, cfg.proxy.kind) == ("vllm-router", "lab")
    assert routed.source == cfg.source and routed.results_dir == cfg.results_dir
    data["proxy"]["api_key_file"] = str(write_secret(tmp_path / "k", "sk-proxy-key-0123456789"))
    with pytest.raises(ConfigError, match="does not check its clients' key"):
        with_proxy(write_profile(tmp_path, data), kind="vllm-router")


def test_policy_override_is_checked_like_the_file(tmp_path):
    cfg = write_profile(tmp_path, make_profile_data(str(tmp_path / "results")))
    both = with_proxy(cfg, kind="vllm-router", policy="least_outstanding")
    assert (both.proxy.kind, both.topology.replicated.policy) == ("vllm-router", "least_outstanding")
    assert with_proxy(cfg, policy="least_outstanding").proxy.kind == cfg.proxy.kind
    assert both.source == cfg.source and both.snapshot()["proxy"] == {
        **cfg.snapshot()["proxy"], "kind": "vllm-router"}
    with pytest.raises(ConfigError, match=r"topology\.replicated\.policy: \"fastest\" is invalid"):
        with_proxy(cfg, policy="fastest")
