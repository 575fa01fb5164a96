"""Config loading and validation: every bad input gets a message naming the field, the
value and the fix, and the CLI prints it without a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from lab_utils.config import DEFAULT_PROFILE, REPO_ROOT, find_config_path, load_config, parse_config
from lab_utils.errors import ConfigError, LabError

BASE = json.loads(DEFAULT_PROFILE.read_text())


def mutated(change) -> dict:
    data = copy.deepcopy(BASE)
    change(data)
    return data


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(data, "test.json")
    return str(e.value)


def test_shipped_profiles_load():
    cfg = load_config(DEFAULT_PROFILE)
    assert cfg.profile == "local-cpu"
    assert cfg.results_dir == REPO_ROOT / "results" / "local-cpu"
    addresses = {n.lan_address for n in cfg.nodes.values()}
    assert len(addresses) == len(cfg.nodes), "rehearsal nodes need distinct loopback addresses"
    assert "127.0.0.1" not in addresses


def test_example_config_loads():
    cfg = load_config(REPO_ROOT / "environment_config.json.example")
    assert set(cfg.nodes) == {"spark-01", "spark-02", "controller"}
    assert cfg.vllm.device == "cuda"


def test_unknown_key_suggests_close_match():
    msg = error_of(mutated(lambda d: d["nodes"]["spark-01"].update(lan_adress="127.0.0.2")))
    assert "nodes.spark-01.lan_adress" in msg
    assert "unknown key" in msg and "did you mean 'lan_address'" in msg


def test_unknown_top_level_key():
    msg = error_of(mutated(lambda d: d.update(profil="x")))
    assert "profil" in msg and "did you mean 'profile'" in msg


def test_missing_field_named():
    msg = error_of(mutated(lambda d: d["vllm"]["decode"].pop("port")))
    assert "vllm.decode.port" in msg and "required field is missing" in msg
    assert "environment_config.json.example" in msg


def test_bad_address_named_with_fix():
    msg = error_of(mutated(lambda d: d["nodes"]["spark-02"].update(data_address="10.0.0.300")))
    assert "nodes.spark-02.data_address" in msg and '"10.0.0.300"' in msg
    assert "not an IP address" in msg and "data-plane" in msg


def test_two_services_on_one_host_and_port():
    msg = error_of(mutated(lambda d: d["proxy"].update(node="spark-01", port=8300)))
    # the proxy moved onto spark-01 is not a controller: fix the role first, then the port
    d = mutated(lambda d: (d["proxy"].update(node="spark-01", port=8300),
                           d["nodes"]["spark-01"]["roles"].append("controller")))
    msg = error_of(d)
    assert "port 8300" in msg and "two services on one host and port" in msg
    assert "prefill-0" in msg and "proxy" in msg


def test_side_channel_port_shared_on_one_host():
    msg = error_of(mutated(lambda d: d["vllm"]["decode"].update(side_channel_port=5600)))
    assert "port 5600" in msg
    assert "side-channel port shared by two instances on one host" in msg


def test_same_role_twice_on_a_node_gets_consecutive_ports():
    cfg = parse_config(mutated(lambda d: d["topology"]["disaggregated"].update(
        prefill=["spark-01", "spark-01"])))
    ports = [(s.port, s.side_channel_port) for s in cfg.instances("disaggregated") if s.role == "prefill"]
    assert ports == [(8300, 5600), (8301, 5601)]


def test_topology_node_must_exist():
    msg = error_of(mutated(lambda d: d["topology"]["baseline"].update(node="spark-1")))
    assert "topology.baseline.node" in msg and "did you mean 'spark-01'" in msg


def test_all_problems_reported_at_once():
    def change(d):
        d["nodes"]["spark-01"]["lan_address"] = "nope"
        d["vllm"]["prefill"]["port"] = 70000
    msg = error_of(mutated(change))
    assert "nodes.spark-01.lan_address" in msg and "vllm.prefill.port" in msg


def test_invalid_json_names_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"profile": "x",\n  "nodes": }')
    with pytest.raises(ConfigError, match="line 2"):
        load_config(p)


def test_a_lone_surrogate_is_refused_where_a_pair_is_not(tmp_path):
    """JSON's \\udXXX escapes can spell half a character, which no file, command line or
    log can hold; the config names the field instead of a UnicodeEncodeError later."""
    data = json.loads(DEFAULT_PROFILE.read_text())
    p = tmp_path / "c.json"
    data["model"]["name"] = "tiny-\ud83d\ude00"  # a pair: one character, fine
    p.write_text(json.dumps(data))
    assert load_config(p).model.name == "tiny-\U0001f600"
    data["model"]["name"] = "tiny-\ud800llama"
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"model\.name: .*lone surrogate"):
        load_config(p)


def test_comments_ignored_and_snapshot_has_no_secrets(tmp_path):
    data = mutated(lambda d: d["vllm"]["decode"].update(extra_env={"HF_TOKEN": "hf_canary"}))
    data["_note"] = "comments are allowed"
    cfg = parse_config(data)
    snap = json.dumps(cfg.snapshot())
    assert "hf_canary" not in snap and "_note" not in snap


def test_lookup_order(tmp_path, monkeypatch):
    other = tmp_path / "other.json"
    other.write_text(json.dumps(mutated(lambda d: d.update(profile="from-env"))))
    monkeypatch.delenv("LAB_CONFIG", raising=False)
    assert find_config_path("x.json").name == "x.json"
    monkeypatch.setenv("LAB_CONFIG", str(other))
    assert load_config().profile == "from-env"
    assert find_config_path(DEFAULT_PROFILE) == DEFAULT_PROFILE


def test_relative_paths_resolve_against_repo_root():
    cfg = parse_config(BASE)
    assert cfg.resolve_path("models/x") == REPO_ROOT / "models" / "x"


@pytest.mark.parametrize("change,expect", [
    (lambda d: d["nodes"]["spark-01"].update(lan_adress="1"), "did you mean 'lan_address'"),
    (lambda d: d["vllm"]["decode"].update(side_channel_port=5600), "side-channel port shared"),
    (lambda d: d["nodes"]["spark-01"].update(lan_address="spark one"), "not an IP address"),
])
def test_cli_prints_message_without_traceback(tmp_path, change, expect):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutated(change)))
    p = subprocess.run([sys.executable, "-m", "lab_utils", "cleanup", "--config", str(bad)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    assert expect in p.stderr
    assert "Traceback" not in p.stderr + p.stdout


def test_ssh_serving_nodes_need_a_shared_absolute_model_path():
    def to_ssh(d):
        d["nodes"]["spark-01"].update(connection="ssh", python="/usr/bin/python3",
                                      workdir="/srv/lab", ssh={"host": "10.0.0.1"},
                                      lan_address="10.0.0.1", data_address="10.0.1.1")
    msg = error_of(mutated(to_ssh))
    assert "model.node_path" in msg and "absolute path" in msg and "spark-01" in msg
    cfg = parse_config(mutated(lambda d: (to_ssh(d), d["model"].update(node_path="/srv/models/tiny"))))
    assert cfg.model_path_on("spark-01") == "/srv/models/tiny"
    assert cfg.model_path_on("spark-02") == str(cfg.resolve_path("models/tiny-llama"))


def test_ssh_node_needs_python_and_absolute_workdir():
    msg = error_of(mutated(lambda d: d["nodes"]["spark-02"].update(
        connection="ssh", ssh={"host": "10.0.0.2"}, workdir="lab", lan_address="10.0.0.2",
        data_address="10.0.1.2")))
    assert "nodes.spark-02.python" in msg and "nodes.spark-02.workdir" in msg


def test_dtype_choices_are_vllms():
    pytest.importorskip("vllm", reason="needs the rehearsal's vLLM (installed by make venv)")
    import typing

    from vllm.config.model import ModelDType

    from lab_utils.config import VLLM_DTYPES

    assert set(VLLM_DTYPES) == set(typing.get_args(ModelDType))


def test_secrets_redacted_by_name_pattern_and_by_value(tmp_path, monkeypatch):
    key = tmp_path / "proxy_key"
    key.write_text("sk-proxy-canary-4711\n")
    key.chmod(0o600)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-canary-0815")

    def change(d):
        d["proxy"]["api_key_file"] = str(key)
        d["vllm"]["extra_env"] = {"AUTH": "a-canary-1", "CREDENTIALS": "c-canary-2",
                                  "AWS_ACCESS_KEY_ID": "k-canary-3", "OMP_NUM_THREADS": "4"}
        # secrets where no name says so: a description, an unflagged argument
        d["description"] = "key is sk-proxy-canary-4711"
        d["vllm"]["decode"]["extra_args"] = ["--chat-template", "sk-env-canary-0815"]
    snap = json.dumps(parse_config(mutated(change)).snapshot())
    for canary in ("a-canary-1", "c-canary-2", "k-canary-3", "sk-proxy-canary-4711",
                   "sk-env-canary-0815"):
        assert canary not in snap
    assert '"OMP_NUM_THREADS": "4"' in snap


def test_hf_token_one_rule(tmp_path, monkeypatch):
    from lab_utils.config import hf_token

    token = tmp_path / "hf_token"
    token.write_text("hf_file_canary\n")
    token.chmod(0o644)
    hub = {"source": "hub", "name": "org/model", "path": None}
    # a tiny model needs no token: the file is not even read (its bad mode is not an error)
    cfg = parse_config(mutated(lambda d: d.update(hf_token_file=str(token))))
    assert hf_token(cfg) is None
    cfg = parse_config(mutated(lambda d: (d.update(hf_token_file=str(token)), d["model"].update(hub))))
    with pytest.raises(LabError, match=r"readable by others .*chmod 600"):
        hf_token(cfg)
    token.chmod(0o600)
    assert hf_token(cfg) == "hf_file_canary"
    # no file: $HF_TOKEN, for the download and the instances alike
    monkeypatch.setenv("HF_TOKEN", "hf_env_canary")
    assert hf_token(parse_config(mutated(lambda d: d["model"].update(hub)))) == "hf_env_canary"
    token.write_text("\n")
    with pytest.raises(LabError, match="is empty"):
        hf_token(cfg)


def test_loopback_rule_applies_to_an_alias_once_resolved(tmp_path, monkeypatch):
    """A host name hides where it points until ~/.ssh/config resolves it: the rule is
    applied then, before any connection is attempted."""
    from lab_utils.cluster import Cluster

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host far-spark\n  HostName 192.0.2.7\n")
    monkeypatch.setenv("HOME", str(home))
    connects = []
    import paramiko

    monkeypatch.setattr(paramiko.SSHClient, "connect", lambda *a, **k: connects.append(a))
    cfg = parse_config(mutated(lambda d: d["nodes"]["spark-01"].update(
        connection="ssh", ssh={"host": "far-spark"}, python="/usr/bin/python3",
        workdir="/srv/lab")) | {"model": {**BASE["model"], "node_path": "/srv/models/tiny"}})
    with Cluster(cfg) as cluster, pytest.raises(LabError) as e:
        cluster.node("spark-01").run(["true"])
    assert "nodes.spark-01.lan_address" in str(e.value) and "192.0.2.7" in str(e.value)
    assert connects == []


def test_results_root_is_judged_where_a_symlink_leads(tmp_path):
    link = tmp_path / "results-link"
    link.symlink_to("/etc")
    with pytest.raises(ConfigError, match=r"results_root: .* is invalid: is /etc/lab, the root or a system"):
        parse_config(mutated(lambda d: d.update(results_root=str(link / "lab"))))
    parse_config(mutated(lambda d: d.update(results_root=str(tmp_path / "results"))))


@pytest.mark.parametrize("tls, refused", [
    ("tcp", True), ("rc,tcp", True), ("^cuda_copy", True), ("^cuda,tcp", True),
    ("rc,cuda_copy", False), ("rc_mlx5,cuda", False), ("^sm,cma", False), (None, False),
    ("all", False), ("^all", True)])
def test_ucx_tls_without_cuda_refused_on_a_cuda_profile(tls, refused):
    """nixl 1.5.1's UCX backend refuses a UCX_TLS that enables no CUDA transport on a node
    with a GPU (its validateTlsCudaSupport: "does not enable CUDA memory support"); the
    config refuses it first, on CUDA profiles only."""
    example = json.loads((REPO_ROOT / "environment_config.json.example").read_text())
    example["kv_transfer"]["ucx_tls"] = tls
    if refused:
        message = error_of(example)
        assert "kv_transfer.ucx_tls" in message and "cuda_copy" in message
        assert "does not enable CUDA memory support" in message
    else:
        parse_config(example, "test.json")
    assert parse_config(mutated(lambda d: d["kv_transfer"].update(ucx_tls=tls or "tcp")),
                        "test.json").kv_transfer.ucx_tls == (tls or "tcp")  # CPU: any value


def test_lower_nixl_threads_is_on_for_cpu_profiles_only():
    assert parse_config(BASE, "t.json").lower_nixl_threads() is True  # local-cpu, unset
    def cuda(d):
        d["vllm"]["device"] = "cuda"
        for node in ("spark-01", "spark-02"):
            d["nodes"][node]["data_over_lan"] = True
    assert parse_config(mutated(cuda), "t.json").lower_nixl_threads() is False
    off = mutated(lambda d: d["kv_transfer"].update(lower_nixl_threads=False))
    assert parse_config(off, "t.json").lower_nixl_threads() is False
    assert "kv_transfer.lower_nixl_threads" in error_of(
        mutated(lambda d: d["kv_transfer"].update(lower_nixl_threads="yes")))
    forced = mutated(lambda d: (cuda(d), d["kv_transfer"].update(lower_nixl_threads=True)))
    assert "kv_transfer.lower_nixl_threads: true with vllm.device" in error_of(forced)


def test_secret_spellings_and_control_characters():
    """A password in a URL and a `PASS_WORD` name are masked; `--allow-credentials` (CORS,
    no secret) is allowed; C1 control characters count as control characters."""
    from lab_utils.config.values import (
        check_args,
        control_characters,
        scrub,
        secret_env_values,
    )

    assert scrub("DB_URL=postgres://bob:hunter2x@db:5432/x") == "DB_URL=postgres://<redacted>@db:5432/x"
    assert scrub("http://host:80/path") == "http://host:80/path"
    assert secret_env_values({"MYPASS_WORD": "s3cret-value", "LOG_LEVEL": "x"}) == ["s3cret-value"]
    check_args(["--allow-credentials"])
    for flag in ("--password=x", "--db-pass-word", "--token", "--api_key=x"):
        with pytest.raises(ValueError, match="secret"):
            check_args([flag])
    assert control_characters("a\x85b") and control_characters("a\x9fb")
    assert not control_characters("café ñ")


def test_a_workload_describes_itself_whole_or_as_one_run():
    from lab_utils.config import WorkloadConfig
    w = WorkloadConfig(input_len=128, output_len=32, concurrency=[1, 2, 4], num_prompts=24,
                       warmup=2, repeats=2, mixed_long_len=3000, mixed_long_every=4)
    assert w.describe() == ("128-token prompts; 32 output tokens (ignore_eos: each request "
                            "generates exactly that many); 24 requests per point; 2 warm-up "
                            "requests first, not counted; 2 repeats; concurrency 1, 2, 4; mixed "
                            "run: one 3000-token prompt in every 4 requests")
    assert w.describe(False).endswith("concurrency 1, 2, 4")
    assert w.describe(True).endswith("concurrency 4; one 3000-token prompt in every 4 requests")
    slo = w.model_copy(update={"slo": w.slo.model_copy(update={"ttft_ms": 2000, "tpot_ms": 200})})
    assert slo.describe().endswith("; goodput SLOs TTFT 2,000 ms / TPOT 200 ms")
