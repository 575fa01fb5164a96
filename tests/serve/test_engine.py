"""Real engines: the proof of transfer on the CPU rehearsal, the CLI's serve/cleanup, and
vLLM's router as the front door (`proxy.kind: "vllm-router"`).

These start real vLLM instances (CPU build) with NixlConnector and move KV over NIXL.
They are slow (an instance takes 15-90 s to start here) and CI runs them.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lab_utils.cluster import Cluster
from lab_utils.config import api_key
from lab_utils.kv.shapes import kv_shape_from_dir
from lab_utils.measure.loadgen import auth_headers
from lab_utils.measure.prompts import fresh_prompts, load_tokenizer
from lab_utils.on_node import nixl_threads, proctools
from lab_utils.on_node.proctools import is_alive, port_is_free
from lab_utils.serve.pd import complete, prove_transfer, prove_via_proxy
from lab_utils.serve.router import VERSION

from support.leaks import cmdline_hits
from support.profiles import CANARY_API_KEY, write_profile

pytestmark = pytest.mark.slow

LENGTHS = [20, 33, 64, 90, 128, 200, 257, 400]  # 1 to 13 blocks of 32, partial and full
MAX_TOKENS = 24


def test_rehearsal_torch_is_cpu_build():
    import torch

    assert torch.version.cuda is None, f"rehearsal env has a CUDA torch: {torch.__version__}"


def test_tiny_model_same_seed_same_bytes(tmp_path):
    from lab_utils.cluster.tiny_model import fingerprint, generate

    a = fingerprint(generate(tmp_path / "a", seed=0))
    b = fingerprint(generate(tmp_path / "b", seed=0))
    c = fingerprint(generate(tmp_path / "c", seed=1))
    assert a == b and a != c
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    assert "chat_template" in json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())


def test_proof_of_transfer(rehearsal, engine_cfg):
    urls = rehearsal.up()
    cfg = engine_cfg
    tok = load_tokenizer(cfg.model_path)
    kv = kv_shape_from_dir(cfg.model_path, cfg.model.dtype)
    assert kv.bytes_per_token == 2 * 4 * 2 * 64 * 2
    prompts, seed = fresh_prompts(tok, LENGTHS)
    proofs = prove_transfer(prompts, model=cfg.model.name, prefill_url=urls["prefill"],
                            decode_url=urls["decode"], baseline_url=urls["baseline"],
                            kv=kv, max_tokens=MAX_TOKENS, api_key=api_key(cfg, "vllm"))
    report = "\n".join(json.dumps({k: v for k, v in p.as_dict().items()
                                   if k not in ("pd_tokens", "baseline_tokens")}) for p in proofs)
    print(f"\nprompt seed {seed}\n{report}")
    for ids, p in zip(prompts, proofs, strict=True):
        assert p.prompt_tokens == len(ids)
        assert p.external_kv_transfer == len(ids), f"not all prompt tokens came over NIXL: {p}"
        assert p.local_compute == 0 and p.local_cache_hit == 0, p
        assert p.nixl_transfers >= 1
        assert p.nixl_bytes == kv.transfer_bytes(len(ids), p.block_size), p
        assert len(p.pd_tokens) == MAX_TOKENS
        assert p.pd_tokens == p.baseline_tokens, f"P/D output differs from baseline: {p}"
        assert len(set(p.pd_tokens)) > 1, "output is one repeated token: the model is too flat"
    assert len({tuple(p.pd_tokens) for p in proofs}) == len(proofs), "prompts gave equal outputs"
    assert proofs[0].block_size == cfg.vllm.block_size

    # The model is context-sensitive: changing only the first token changes the output,
    # so equal outputs above mean the transferred KV was right, not that the model ignores it.
    base = prompts[3]
    changed = [(base[0] + 1) % 256 + 3] + base[1:]
    assert changed != base
    proof_changed = prove_transfer([changed], model=cfg.model.name, prefill_url=urls["prefill"],
                                   decode_url=urls["decode"], baseline_url=urls["baseline"],
                                   kv=kv, max_tokens=MAX_TOKENS, api_key=api_key(cfg, "vllm"))[0]
    assert proof_changed.tokens_match and proof_changed.external_kv_transfer == len(changed)
    assert proof_changed.pd_tokens != proofs[3].pd_tokens


def test_nixl_threads_wait_and_the_model_threads_are_back_on_their_cpus(rehearsal, engine_cfg):
    """On the CPU profile, NIXL's progress delay took in every process of the prefill and
    the decode (their logs say so, and no thread of theirs keeps a core busy while they are
    idle), and `serve` put each worker's model thread back on its bind and recorded it."""
    rehearsal.up()
    by_role = {r.extra["role"]: r for r in rehearsal.records() if r.kind == "vllm"}
    specs = {s.name: s for s in engine_cfg.instances("disaggregated")}
    assert engine_cfg.nixl_progress_delay_us() == 1000
    for role in ("prefill", "decode"):
        rec = by_role[role]
        log = Path(rec.log_path).read_text(errors="replace")
        assert "lab: NIXL progress-thread delay 1000 us in nixl" in log, log[-2000:]
        # sampled here over a second, by the function `serve` uses to find busy threads
        assert nixl_threads.spinning(rec.pgid) == [], f"{role}: a thread polls without pause"
        threads = rec.extra.get("nixl_threads")
        assert threads, f"{role}: nothing recorded"
        # the worker's main thread, which vLLM's NIXL worker moves to the last core, is
        # back on the instance's bind (the kernel says so)
        main = [t for t in threads if t.get("thread") == nixl_threads.MAIN_THREAD]
        assert len(main) == 1, threads
        bind = nixl_threads.cpu_set(specs[rec.name].cpu_bind)
        assert os.sched_getaffinity(main[0]["tid"]) == bind, (main, bind)
        assert main[0]["policy"] == "CPUs " + ",".join(map(str, sorted(bind)))
        assert [t for t in threads if t not in main] == [], threads  # nothing was busy
    assert "nixl_threads" not in by_role["baseline"].extra  # no NIXL there, nothing touched


def test_an_instance_with_a_key_refuses_v1_without_it(rehearsal, engine_cfg):
    """The rehearsal's instances got vllm.api_key_file's key through VLLM_API_KEY: /v1,
    and with the lab's guard /invocations (vLLM's SageMaker route, which runs completions)
    and /tokenize, answer 401 without it and serve with it; /health and /metrics stay open."""
    url = rehearsal.up()["baseline"]
    key = api_key(engine_cfg, "vllm")
    rec = next(r for r in rehearsal.records() if r.extra["role"] == "baseline")
    assert key not in Path(f"/proc/{rec.pid}/cmdline").read_text()
    assert key not in json.dumps(rec.argv) and key not in Path(rec.log_path).read_text()
    body = {"model": engine_cfg.model.name, "prompt": [5, 6, 7], "max_tokens": 2}
    with httpx.Client(timeout=60) as c:
        assert c.get(f"{url}/v1/models").status_code == 401
        assert c.post(f"{url}/v1/completions", json=body).status_code == 401
        assert c.post(f"{url}/invocations", json=body).status_code == 401
        assert c.post(f"{url}/tokenize", json={"model": engine_cfg.model.name,
                                               "prompt": "hi"}).status_code == 401
        assert c.post(f"{url}/invocations", json=body, headers=auth_headers(key)).status_code == 200
        wrong = {"Authorization": "Bearer sk-wrong"}
        assert c.post(f"{url}/v1/completions", json=body, headers=wrong).status_code == 401
        assert c.get(f"{url}/v1/models", headers=auth_headers(key)).status_code == 200
        ok = c.post(f"{url}/v1/completions", json=body, headers=auth_headers(key))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert c.get(f"{url}/health").status_code == 200
        assert c.get(f"{url}/metrics").status_code == 200


def test_a_held_prefill_does_not_hold_up_the_labs_processes(rehearsal, engine_cfg):
    """A prompt the prefill keeps for a decode that never reads it: the prefill holds its
    blocks for the whole lease. With each instance in a session of its own (the lab's
    start before), a process outside those sessions got no CPU for most of the lease
    (11-12 s of a 12 s lease here). The lab now starts them in the caller's session, where
    a watcher must not be held up; the other watchers' figures are printed, not judged."""
    from tools.pd_stall import hold

    urls = rehearsal.up()
    lease = float(engine_cfg.kv_transfer.extra_config["kv_lease_duration"])
    held = hold(urls["prefill"], engine_cfg.model.name,
                auth_headers(api_key(engine_cfg, "vllm")), lease)["held_up_s"]
    print(f"\nheld up during a {lease:.0f} s hold: {held}")
    assert held["this session"] < 3.0, held


def test_the_kernel_compiled_for_logprobs_outlives_the_instance(rehearsal, engine_cfg):
    """vLLM compiles a kernel (Inductor: the C++ compiler, here) the first time a request
    asks for logprobs, and the instance serves nothing meanwhile (on the simulated
    cluster's 2 cores 50 s: docs/SIMCLUSTER.md). Inductor's cache lives in the temporary
    directory, and each instance's TMPDIR is a private one that goes when it stops: a cache
    there made every fresh instance compile again. After a logprobs request to each
    instance, their caches are one, the node's, and it holds a compiled kernel and the
    precompiled header."""
    rehearsal.up()
    records = [r for r in rehearsal.records() if r.kind == "vllm"]
    body = {"model": engine_cfg.model.name, "prompt": [5, 6, 7, 8], "max_tokens": 2,
            "temperature": 0, "logprobs": 2}
    with httpx.Client(timeout=300, headers=auth_headers(api_key(engine_cfg, "vllm"))) as c:
        for rec in records:
            r = c.post(f"{rec.url}/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["choices"][0]["logprobs"], (rec.name, r.text)
    caches = {Path(r.extra["tmpdir"], f"torchinductor_{getpass.getuser()}").resolve()
              for r in records}
    assert len(records) == 3 and len(caches) == 1, (records, caches)
    cache = caches.pop()
    assert cache.parent == Path(records[0].extra["tmpdir"]).parent, cache  # the node's
    assert list(cache.rglob("*.so")), f"no compiled kernel in {cache}"
    assert list((cache / "precompiled_headers").rglob("*.[gp]ch")), f"no header in {cache}"


def test_serve_starts_the_proxy_and_no_duplicates(rehearsal, engine_cfg):
    rehearsal.up()
    before = {r.name: r.pid for r in rehearsal.records()}
    cli = [sys.executable, "-m", "lab_utils", "serve", "--topology", "disaggregated",
           "--config", str(engine_cfg.source)]
    for _ in range(2):
        p = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    after = {r.name: r.pid for r in rehearsal.records()}
    assert set(after) == set(before) | {"proxy"}  # one proxy, even after two serves
    assert {k: after[k] for k in before} == before  # instances reused, not restarted
    proxy = next(r for r in rehearsal.records() if r.name == "proxy")
    assert proxy.url == f"http://127.0.0.4:{engine_cfg.proxy.port}"
    health = httpx.get(f"{proxy.url}/health", timeout=10).json()
    assert health["mode"] == "disaggregated" and set(health["backends"].values()) == {"ok"}
    with httpx.Client(timeout=60) as c:
        r = c.post(f"{proxy.url}/v1/completions", json={
            "model": engine_cfg.model.name, "prompt": [7, 8, 9, 10], "max_tokens": 4,
            "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_port_in_use_names_holder(rehearsal, engine_cfg):
    """A port the config assigns, held by something else: refused, naming port, node, PID."""
    from lab_utils.errors import PortInUseError
    from lab_utils.serve.launcher import start_instance

    rehearsal.up()
    spec = engine_cfg.instances("replicated")[0]
    address = engine_cfg.nodes[spec.node].lan_address
    with socket_held(address, spec.port), pytest.raises(PortInUseError) as e, \
            Cluster(engine_cfg) as cluster:
        start_instance(cluster, spec)
    msg = str(e.value)
    assert f"port {spec.port}" in msg and spec.node in msg
    assert f"PID {os.getpid()}" in msg


def _lab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab_utils", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


@pytest.mark.stops_rehearsal  # its `cleanup` stops them
def test_serve_through_vllm_router_proves_transfer_and_cleanup_stops_it(rehearsal, engine_cfg,
                                                                        tmp_path):
    """`proxy.kind: "vllm-router"` as a user runs it: `serve --topology disaggregated`
    starts vLLM's router in front of the session's pair, the proof of transfer passes
    through it (the instances want their key, which the router must send them from its
    environment), and `cleanup`, run from another directory (and again: it is safe
    twice), leaves nothing running: neither the router nor the session's instances, nor
    any process of their groups."""
    urls = rehearsal.up()
    # the same profile (so `serve` reuses the session's instances), with vllm-router in front
    data = json.loads(engine_cfg.source.read_text())
    data["proxy"]["kind"] = "vllm-router"
    cfg = write_profile(tmp_path, data)
    served = _lab("serve", "--topology", "disaggregated", "--config", str(cfg.source))
    assert served.returncode == 0, served.stdout[-2000:] + served.stderr[-3000:]
    with Cluster(cfg) as cluster:
        records = {r.name: r for r in cluster.running()}
    door = records["proxy"]
    assert door.extra["kind"] == "vllm-router" and door.url in served.stdout
    lan = cfg.nodes[cfg.proxy.node].lan_address
    log = Path(door.log_path).read_text()
    assert "--vllm-pd-disaggregation" in log and f"Starting router on {lan}:{cfg.proxy.port}" in log
    assert Path(f"/proc/{door.pid}/cmdline").read_text().startswith("vllm::router")  # its title
    assert cmdline_hits(CANARY_API_KEY) == []  # the instances' key is in no command line

    tok = load_tokenizer(cfg.model_path)
    prompts, _ = fresh_prompts(tok, [40, 150])
    key = api_key(cfg, "vllm")
    with httpx.Client(timeout=120, headers=auth_headers(key)) as c:
        base = [complete(c, urls["baseline"], cfg.model.name, ids, 8) for ids in prompts]
    proofs = prove_via_proxy(prompts, base, model=cfg.model.name, proxy_url=door.url,
                             decode_urls=[urls["decode"]],
                             kv=kv_shape_from_dir(cfg.model_path, cfg.model.dtype), max_tokens=8,
                             timeout=180, instance_key=key)
    assert all(p.ok for p in proofs), [p.as_dict() for p in proofs]
    metrics = httpx.get(f"http://{lan}:{cfg.proxy.router_metrics_port}/metrics", timeout=10).text
    assert "vllm_router_pd_decode_requests_total" in metrics

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _lab("cleanup", "--config", str(cfg.source), cwd=elsewhere)
    assert done.returncode == 0 and "proxy" in done.stdout, done.stdout + done.stderr
    again = _lab("cleanup", "--config", str(cfg.source), cwd=elsewhere)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {"baseline", "prefill", "decode"} <= {r.extra.get("role") for r in records.values()}
    assert [r.name for r in records.values() if is_alive(r.pid, r.start_ticks)] == []
    for rec in records.values():
        assert proctools.group_members(rec.pgid) == [], f"{rec.name} left processes behind"
    assert rehearsal.records() == []
    assert port_is_free(lan, cfg.proxy.port) and port_is_free(lan, cfg.proxy.router_metrics_port)
    assert "nothing recorded" in _lab("status", "--config", str(cfg.source)).stdout
    print(f"vllm-router {VERSION}: proof of {len(proofs)} prompts passed through it")


class socket_held:
    """Listen on (address, port) for the duration of a `with` block."""

    def __init__(self, address: str, port: int):
        import socket

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()


@pytest.mark.stops_rehearsal
def test_demo_from_scratch_proves_transfer_and_leaves_nothing(engine_cfg, tmp_path):
    """`make lab`'s job on a fresh profile: the model does not exist yet."""
    from lab_utils.serve.topology import cleanup

    from support.profiles import make_profile_data, write_profile

    cleanup(engine_cfg)  # two cores: not beside the shared instances
    data = make_profile_data(str(tmp_path / "results"))
    data["model"]["path"] = str(tmp_path / "fresh-model")
    cfg = write_profile(tmp_path, data)
    p = subprocess.run([sys.executable, "-m", "lab_utils", "demo", "--prompts", "2", "--config",
                        str(cfg.source)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "every prompt token came over NIXL, bytes as predicted, and the output equals" in p.stdout
    assert (tmp_path / "fresh-model" / "config.json").exists()
    state = json.loads((cfg.results_dir / "state.json").read_text())
    assert state["processes"] == []


@pytest.mark.stops_rehearsal
def test_handshake_timeout_fails_the_request_and_warm_up_recovers(engine_cfg, tmp_path):
    """vLLM waits 5 s for the prefill's side channel. Freeze the prefill's engine core
    (which serves the side channel) during the first decode: that request fails, the
    instances survive, and the warm-up `serve` relies on gets through once it answers."""
    import signal

    from lab_utils.errors import LabError
    from lab_utils.serve.launcher import start_instance, wait_ready
    from lab_utils.serve.pd import decode, prefill, warm_up
    from lab_utils.serve.topology import cleanup

    from support.profiles import make_profile_data, write_profile

    cleanup(engine_cfg)  # two cores: not beside the shared instances
    cfg = write_profile(tmp_path, make_profile_data(str(tmp_path / "results")))
    cluster = Cluster(cfg)
    recs = [start_instance(cluster, s)[0] for s in cfg.instances("disaggregated")]
    try:
        wait_ready(cluster, recs, show_progress=False)
        pre, dec = recs
        cores = [p for p in proctools.group_members(pre.pgid)
                 if b"EngineCore" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert cores, "prefill engine core process not found"
        ids = list(range(200, 240))
        with httpx.Client(timeout=120) as c:
            params = prefill(c, pre.url, cfg.model.name, ids)
            for p in cores:
                os.kill(p, signal.SIGSTOP)
            try:
                with pytest.raises(LabError, match="500"):
                    decode(c, dec.url, cfg.model.name, ids, 4, params)
            finally:
                for p in cores:
                    os.kill(p, signal.SIGCONT)
        assert warm_up(pre.url, dec.url, cfg.model.name) >= 1
        assert all(proctools.is_alive(r.pid, r.start_ticks) for r in recs)
    finally:
        cleanup(cluster)
        cluster.close()
    assert all(proctools.group_members(r.pgid) == [] for r in recs)
