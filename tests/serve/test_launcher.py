"""The vLLM launcher without starting vLLM: command line, environment, secrets, readiness
failures reported with the log tail and the known fix; and the notebook runner."""

from __future__ import annotations

import json
import os
import sys

import pytest

from lab_utils.cluster import Cluster
from lab_utils.errors import LabError, ProcessFailedError
from lab_utils.serve import launcher


def spec(cfg, topology, role):
    return next(s for s in cfg.instances(topology) if s.role == role)


def test_prefill_command_and_env(test_cfg):
    s = spec(test_cfg, "disaggregated", "prefill")
    argv = launcher.server_command(Cluster(test_cfg), s)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.2"
    assert argv[argv.index("--port") + 1] == str(s.port)
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_buffer_device": "cpu",
                  "kv_connector_extra_config": {"kv_lease_duration": 12}}
    env = launcher.server_env(test_cfg, s)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == test_cfg.nodes["spark-01"].data_address
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(s.side_channel_port)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_decode_is_consumer_and_baseline_has_no_connector(test_cfg):
    d = launcher.server_command(Cluster(test_cfg), spec(test_cfg, "disaggregated", "decode"))
    assert json.loads(d[d.index("--kv-transfer-config") + 1])["kv_role"] == "kv_consumer"
    b = spec(test_cfg, "baseline", "baseline")
    assert "--kv-transfer-config" not in launcher.server_command(Cluster(test_cfg), b)
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in launcher.server_env(test_cfg, b)


def test_per_node_thread_binding_for_replicas(test_cfg):
    envs = [launcher.server_env(test_cfg, s) for s in test_cfg.instances("replicated")]
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0", "1"]


def test_cuda_profile_command(tmp_path):
    from lab_utils.config import REPO_ROOT, load_config

    cfg = load_config(REPO_ROOT / "environment_config.json.example")
    s = spec(cfg, "disaggregated", "decode")
    argv = launcher.server_command(Cluster(cfg), s)  # builds its SSH node, connects nowhere
    assert argv[0] == cfg.nodes["spark-02"].python
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.45"
    env = launcher.server_env(cfg, s)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "192.168.100.11"
    assert env["UCX_NET_DEVICES"] == "rocep1s0f1:1,roceP2p1s0f1:1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_cuda_instances_get_the_toolkit_and_serve_a_fetched_hub_model_offline():
    from lab_utils.config import REPO_ROOT, load_config

    cfg = load_config(REPO_ROOT / "environment_config.json.example")
    assert cfg.model.source == "hub"
    s = spec(cfg, "disaggregated", "prefill")
    env = launcher.server_env(cfg, s)
    assert env["HF_HUB_OFFLINE"] == "1"  # start_instance fetched the snapshot first
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    path = env["PATH"].split(":")
    assert path[0] == "/usr/local/cuda/bin"  # nvcc, ptxas for FlashInfer/Triton on sm_121
    assert path[1] == "/home/REPLACE-user/spark-disagg-lab/.venv/bin" and "/usr/bin" in path
    assert "$" not in env["PATH"]  # the SSH wrapper exports values literally
    other = cfg.model_copy(deep=True)
    other.nodes["spark-01"].cuda_home = "/opt/cuda-13.0"
    env = launcher.server_env(other, s)
    assert env["CUDA_HOME"] == "/opt/cuda-13.0" and env["PATH"].startswith("/opt/cuda-13.0/bin:")


def test_nixl_progress_delay_goes_to_prefill_and_decode_on_cpu_only(test_cfg):
    """The CPU profile's prefill and decode get the delay and the directory whose
    sitecustomize sets it, first on PYTHONPATH; the baseline and a CUDA profile do not, and
    0 turns it off."""
    from lab_utils.config import REPO_ROOT, load_config

    site = str(REPO_ROOT / launcher.NIXL_SITE)
    for role in ("prefill", "decode"):
        env = launcher.server_env(test_cfg, spec(test_cfg, "disaggregated", role))
        assert env[launcher.NIXL_DELAY_ENV] == "1000"
        assert env["PYTHONPATH"].split(":")[0] == site
        assert (REPO_ROOT / launcher.NIXL_SITE / "sitecustomize.py").is_file()
    base = launcher.server_env(test_cfg, spec(test_cfg, "baseline", "baseline"))
    assert launcher.NIXL_DELAY_ENV not in base and site not in base.get("PYTHONPATH", "")
    off = test_cfg.model_copy(deep=True)
    off.kv_transfer.nixl_progress_delay_us = 0
    env = launcher.server_env(off, spec(off, "disaggregated", "decode"))
    assert launcher.NIXL_DELAY_ENV not in env and site not in env.get("PYTHONPATH", "")
    cuda = load_config(REPO_ROOT / "environment_config.json.example")
    env = launcher.server_env(cuda, spec(cuda, "disaggregated", "decode"))
    assert cuda.nixl_progress_delay_us() == 0 and launcher.NIXL_DELAY_ENV not in env
    cuda.kv_transfer.nixl_progress_delay_us = 2000  # asked for: the deployed copy's dir
    env = launcher.server_env(cuda, spec(cuda, "disaggregated", "decode"))
    assert env[launcher.NIXL_DELAY_ENV] == "2000"
    assert env["PYTHONPATH"].split(":")[0] == (
        f"{cuda.nodes['spark-02'].workdir}/{launcher.NIXL_SITE}")


def test_cpu_instances_get_no_cuda_environment(test_cfg):
    env = launcher.server_env(test_cfg, spec(test_cfg, "baseline", "baseline"))
    assert "CUDA_HOME" not in env and "PATH" not in env


@pytest.mark.parametrize("cached", [True, False])
def test_hub_fetch_uses_the_node_cache_before_the_network(tmp_path, cached):
    """`model fetch`/start on a node: a snapshot already in its cache is used without the
    network; only a missing one is downloaded (a stand-in huggingface_hub records calls)."""
    import subprocess

    from lab_utils.cluster import provision

    (tmp_path / "huggingface_hub").mkdir()
    (tmp_path / "huggingface_hub" / "__init__.py").write_text(
        "import os\n"
        "def snapshot_download(repo, revision=None, local_files_only=False):\n"
        "    open(os.environ['CALLS'], 'a').write(f'{local_files_only}\\n')\n"
        f"    if local_files_only and not {cached}:\n"
        "        raise OSError('not in the cache')\n"
        "    return '/cache/snapshots/abc'\n")
    calls = tmp_path / "calls"
    r = subprocess.run([sys.executable, "-c", provision._HUB_FETCH_CODE, "org/model", ""],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(tmp_path), "CALLS": str(calls)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == "/cache/snapshots/abc"
    assert calls.read_text().split() == (["True"] if cached else ["True", "False"])


def test_hf_token_only_in_environment(tmp_path):
    from support.profiles import make_profile_data, write_profile

    token = tmp_path / "hf_token"
    token.write_text("hf_canary_123\n")
    token.chmod(0o600)
    data = make_profile_data(str(tmp_path / "results"))
    data["model"].update(source="hub", name="org/model", path=None)
    data["hf_token_file"] = str(token)
    cfg = write_profile(tmp_path, data)
    s = spec(cfg, "baseline", "baseline")
    assert "hf_canary_123" not in " ".join(launcher.server_command(Cluster(cfg), s))
    assert launcher.server_env(cfg, s)["HF_TOKEN"] == "hf_canary_123"
    assert "hf_canary_123" not in json.dumps(cfg.snapshot())
    token.chmod(0o644)
    with pytest.raises(LabError, match="chmod 600"):
        launcher.server_env(cfg, s)


def keyed_profile(tmp_path, **key_files):
    """The rehearsal profile with key files: proxy=VALUE and/or vllm=VALUE."""
    from support.profiles import make_profile_data, write_profile, write_secret

    data = make_profile_data(str(tmp_path / "results"))
    for section, value in key_files.items():
        data[section]["api_key_file"] = str(write_secret(tmp_path / f"{section}_key", value))
    return write_profile(tmp_path, data)


def test_the_instances_get_the_api_key_by_environment_only(tmp_path):
    from lab_utils.serve.plan import make_plan
    from lab_utils.serve.proxy import settings_from_config

    cfg = keyed_profile(tmp_path, proxy="sk-canary-proxy-4d1e")  # the instances use it too
    for topology in ("baseline", "replicated", "disaggregated"):
        plan = make_plan(Cluster(cfg), topology, read_nodes=False)
        for s in cfg.instances(topology):
            assert launcher.server_env(cfg, s)["VLLM_API_KEY"] == "sk-canary-proxy-4d1e"
            assert "sk-canary" not in " ".join(launcher.server_command(Cluster(cfg), s))
        assert all(i.env["VLLM_API_KEY"] == "<set>" for i in plan.instances)
        assert "sk-canary" not in plan.text()
    assert "sk-canary" not in json.dumps(cfg.snapshot())
    p = settings_from_config(cfg, "disaggregated")
    assert p.api_key == p.backend_api_key == "sk-canary-proxy-4d1e"

    cfg = keyed_profile(tmp_path, proxy="sk-canary-proxy-4d1e", vllm="sk-canary-vllm-7b2c90")
    s = spec(cfg, "disaggregated", "decode")
    assert launcher.server_env(cfg, s)["VLLM_API_KEY"] == "sk-canary-vllm-7b2c90"
    p = settings_from_config(cfg, "replicated")
    assert (p.api_key, p.backend_api_key) == ("sk-canary-proxy-4d1e", "sk-canary-vllm-7b2c90")
    assert (p.max_tokens, p.max_n) == (cfg.vllm.max_model_len, cfg.proxy.max_n)

    assert "VLLM_API_KEY" not in launcher.server_env(keyed_profile(tmp_path), s)
    with pytest.raises(LabError, match=r"API key \(vllm.api_key_file\) file .* is empty"):
        launcher.server_env(keyed_profile(tmp_path, vllm=""), s)
    with pytest.raises(LabError, match=r"vllm.api_key_file has 1 characters, fewer than 16") as e:
        launcher.server_env(keyed_profile(tmp_path, vllm="x"), s)
    assert "'x'" not in str(e.value)


def test_a_keyed_instance_wants_the_key_on_every_route_but_health_and_metrics(tmp_path, monkeypatch):
    """vLLM checks the key under /v1 only; its /invocations runs completions (with
    kv_transfer_params) for anyone, so the launcher loads the lab's guard with the key."""
    import httpx
    from fastapi import FastAPI

    from lab_utils.on_node.api_guard import RequireKey

    from support.fakes import ServerThread

    cfg = keyed_profile(tmp_path, vllm="sk-canary-vllm-7b2c90")
    s = spec(cfg, "disaggregated", "decode")
    argv = launcher.server_command(Cluster(cfg), s)
    assert argv[argv.index("--middleware") + 1] == launcher.KEY_GUARD
    assert "--middleware" not in launcher.server_command(Cluster(keyed_profile(tmp_path)), s)
    env = launcher.server_env(cfg, s)
    assert str(launcher.PACKAGE_DIR.parent) in env["PYTHONPATH"].split(":")

    app = FastAPI()
    for path in ("/invocations", "/tokenize", "/v1/completions"):
        app.post(path)(lambda: {"ok": True})
    for path in ("/health", "/metrics"):
        app.get(path)(lambda: {"ok": True})
    module, name = launcher.KEY_GUARD.rsplit(".", 1)
    assert name == RequireKey.__name__ and module == RequireKey.__module__
    monkeypatch.setenv("VLLM_API_KEY", "sk-canary-vllm-7b2c90")
    app.add_middleware(RequireKey)
    with ServerThread(app, "127.0.0.5") as server:
        for path in ("/invocations", "/tokenize", "/v1/completions"):
            assert httpx.post(f"{server.url}{path}").status_code == 401, path
            assert httpx.post(f"{server.url}{path}", headers={"Authorization": "Bearer nope"}).status_code == 401
            assert httpx.post(f"{server.url}{path}",
                              headers={"Authorization": "Bearer sk-canary-vllm-7b2c90"}).status_code == 200
        for path in ("/health", "/metrics"):
            assert httpx.get(f"{server.url}{path}").status_code == 200, path


def test_the_proxy_gets_the_keys_by_environment_only(tmp_path, monkeypatch):
    """start_proxy hands both keys to the proxy process in its environment (over SSH: on
    stdin), where the proxy prefers them to the key files, which a remote controller lacks."""
    from lab_utils.cluster.nodes import LocalNode
    from lab_utils.serve.proxy import settings_from_config
    from lab_utils.serve.topology import start_proxy

    cfg = keyed_profile(tmp_path, proxy="sk-canary-proxy-4d1e", vllm="sk-canary-vllm-7b2c90")
    started = {}
    monkeypatch.setattr(LocalNode, "ensure_port_free", lambda *a: None)
    monkeypatch.setattr(LocalNode, "start_detached",
                        lambda self, name, argv, **kw: started.update(argv=argv, **kw))
    start_proxy(Cluster(cfg), "disaggregated")
    assert "sk-canary" not in " ".join(started["argv"]) + json.dumps(started.get("extra"))
    env = started["env"]
    assert (env["LAB_PROXY_API_KEY"], env["VLLM_API_KEY"]) == ("sk-canary-proxy-4d1e", "sk-canary-vllm-7b2c90")

    for section in ("proxy", "vllm"):
        (tmp_path / f"{section}_key").unlink()  # as on a remote controller
    for name in ("LAB_PROXY_API_KEY", "VLLM_API_KEY"):
        monkeypatch.setenv(name, env[name])
    p = settings_from_config(cfg, "disaggregated")
    assert (p.api_key, p.backend_api_key) == ("sk-canary-proxy-4d1e", "sk-canary-vllm-7b2c90")
    assert (p.max_tokens, p.max_n) == (cfg.vllm.max_model_len, cfg.proxy.max_n)


def test_death_during_startup_reports_log_tail_and_fix(test_cfg, tmp_path):
    cluster = Cluster(test_cfg)
    node = cluster.node("spark-01")
    crash = ("import sys; print('starting'); "
             "print(\"OSError: [Errno 98] error while attempting to bind on address "
             "('127.0.0.2', 9100): address already in use\", file=sys.stderr); sys.exit(1)")
    rec = node.start_detached("crasher", [sys.executable, "-c", crash],
                              log_path=str(tmp_path / "crash.log"), url="http://127.0.0.2:9")
    with pytest.raises(ProcessFailedError) as e:
        launcher.wait_ready(cluster, [rec], timeout=30, show_progress=False)
    msg = str(e.value)
    assert "crasher" in msg and "exited before it became ready" in msg
    assert "address already in use" in msg  # the log tail
    assert "known failure" in msg and "free port" in msg  # the fix


def test_not_ready_in_time_is_reported(test_cfg, tmp_path):
    cluster = Cluster(test_cfg)
    node = cluster.node("spark-01")
    rec = node.start_detached("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                              log_path=str(tmp_path / "s.log"), url="http://127.0.0.2:9")
    try:
        with pytest.raises(ProcessFailedError, match="not ready after 2 s"):
            launcher.wait_ready(cluster, [rec], timeout=2, show_progress=False)
    finally:
        node.stop(rec, 1.0)


def test_run_executes_notebooks_with_lab_config(test_cfg, tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from lab_utils.runner import run_notebooks

    nbdir = tmp_path / "nbs"
    nbdir.mkdir()
    out = tmp_path / "seen.json"
    cell = ("import json, os\nfrom lab_utils import load_config\ncfg = load_config()\n"
            f"json.dump({{'env': os.environ['LAB_CONFIG'], 'profile': cfg.profile}}, open({str(out)!r}, 'w'))")
    nbformat.write(new_notebook(cells=[new_code_cell(cell)]), nbdir / "00_Probe.ipynb")
    nbformat.write(new_notebook(cells=[new_code_cell("raise SystemExit('not selected')")]),
                   nbdir / "05_Other.ipynb")
    env_before = os.environ.get("LAB_CONFIG")
    written = run_notebooks(test_cfg, start="00", stop="01", notebooks_dir=nbdir)
    assert [p.name for p in written] == ["00_Probe.ipynb"]
    assert written[0].parent == test_cfg.results_dir / "executed"
    assert json.loads(out.read_text()) == {"env": str(test_cfg.source), "profile": "test-local-cpu"}
    assert os.environ.get("LAB_CONFIG") == env_before
    assert nbformat.read(nbdir / "00_Probe.ipynb", as_version=4).cells[0].outputs == []


def test_kv_buffer_device_auto_follows_notebook_02(test_cfg):
    from lab_utils.notebook import kv_buffer_device
    from lab_utils.results import write_results

    from support.payloads import kv_dict, model

    assert test_cfg.kv_transfer.kv_buffer_device == "auto"
    assert kv_buffer_device(test_cfg) == "cpu"  # 02 not run yet: the safe default
    spec = test_cfg.instances("disaggregated")[0]
    assert launcher.kv_transfer_config(test_cfg, spec)["kv_buffer_device"] == "cpu"
    payload = kv_dict(recommendation={"kv_buffer_device": "cuda", "reason": "x"})
    write_results(test_cfg, "02", model("02", payload))
    assert kv_buffer_device(test_cfg) == "cuda"
    # the launcher reads no file: it uses the device it is given
    assert launcher.kv_transfer_config(test_cfg, spec)["kv_buffer_device"] == "cpu"
    kv = launcher.kv_transfer_config(test_cfg, spec, kv_buffer_device="cuda")
    assert kv["kv_buffer_device"] == "cuda"
    argv = launcher.server_command(Cluster(test_cfg), spec, kv_buffer_device="cuda")
    assert '"kv_buffer_device":"cuda"' in argv[argv.index("--kv-transfer-config") + 1]
    forced = test_cfg.model_copy(update={"kv_transfer": test_cfg.kv_transfer.model_copy(
        update={"kv_buffer_device": "cpu"})})
    assert kv_buffer_device(forced) == "cpu"  # the config overrides 02


def test_progress_bars_log_a_line_when_run_headless(tmp_path, monkeypatch):
    import io

    from lab_utils.util import progress

    log = tmp_path / "progress.log"
    monkeypatch.delenv(progress.PROGRESS_LOG_ENV, raising=False)
    with progress.progress_bar(total=2, desc="quiet", file=io.StringIO()) as bar:
        bar.update(2)
    assert not log.exists()  # not headless: nothing logged
    monkeypatch.setenv(progress.PROGRESS_LOG_ENV, str(log))
    with progress.progress_bar(total=3, desc="concurrency 2 #1", unit="req", file=io.StringIO()) as bar:
        bar.update(3)
    with progress.progress_bar(total=2, desc="waiting", unit="instance", file=io.StringIO()) as bar:
        bar.update(1)
        bar.set_postfix_str("waiting: decode")
    with progress.progress_bar(total=2, desc="off", disable=True) as bar:
        bar.update(2)
    assert log.read_text().splitlines() == ["concurrency 2 #1: 3/3 req in 0 s",
                                            "waiting: 1/2 instance in 0 s (waiting: decode)"]


def test_runner_prints_progress_and_names_a_long_cell(test_cfg, tmp_path, monkeypatch, capsys):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    from lab_utils import runner

    monkeypatch.setattr(runner, "HEARTBEAT_S", 1.0)
    nbdir = tmp_path / "nbs"
    nbdir.mkdir()
    bars = ("from lab_utils.util.progress import progress_bar\n"
            "for name in ('first', 'second'):\n"
            "    with progress_bar(total=4, desc=name, unit='req') as bar:\n"
            "        bar.update(4)")
    nbformat.write(new_notebook(cells=[new_markdown_cell("# title"), new_code_cell(bars),
                                       new_code_cell("import time\ntime.sleep(3.5)")]),
                   nbdir / "00_Progress.ipynb")
    runner.run_notebooks(test_cfg, notebooks_dir=nbdir)
    out = capsys.readouterr().out.splitlines()
    assert "  first: 4/4 req in 0 s" in out and "  second: 4/4 req in 0 s" in out
    beats = [line for line in out if line.startswith("  cell 3/3 running for ")]
    assert beats and all(line.endswith(": import time") for line in beats), out
    assert os.environ.get("LAB_PROGRESS_LOG") is None
