"""The notebook series over SSH on the simulated three-node cluster, run headless from
the controller's namespace as a user would, with an API key (proxy.api_key_file, so the
instances have it too): every notebook ran, zero failed requests, the proxy ran on the
controller, the proof of transfer held; the canary HF token and the canary API key never
showed in a command line (sampled during the whole run), a log, a results file or an
executed notebook. Then the disaggregated topology once more, asked from the LAN without
the key: the proxy and every instance refuse /v1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from lab_utils.results import load_results

from support.leaks import CmdlineWatch, file_hits
from support.profiles import CANARY_API_KEY, CANARY_HF_TOKEN, show, simcluster_profile
from support.simcluster import REPO, ROOT, lab_argv

pytestmark = [pytest.mark.slow, pytest.mark.simcluster]

SERIES_TIMEOUT_S = 45 * 60


@pytest.fixture(scope="module")
def sim_series(simcluster, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("simcluster-series")
    cfg = simcluster_profile(root, "test-simcluster", api_key=True)
    argv = simcluster.lab_argv("controller", "run", "--config", str(cfg.source))
    t0 = time.monotonic()
    with CmdlineWatch(CANARY_HF_TOKEN, CANARY_API_KEY) as watch:
        p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=SERIES_TIMEOUT_S)
    times = {}
    times_file = cfg.results_dir / "executed" / "times.json"
    if times_file.exists():
        times = json.loads(times_file.read_text())
    line = (f"[simcluster series] rc {p.returncode} in {time.monotonic() - t0:.0f} s: "
            + ", ".join(f"{name[:2]} {t:.0f} s" for name, t in times.items()))
    show(request, line)
    return cfg, p, watch, times


def test_the_series_ran_over_ssh_from_the_controller(sim_series):
    cfg, p, _, times = sim_series
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert [name[:2] for name in times] == ["00", "01", "02", "03", "04", "05"]
    assert load_results(cfg, "00").payload.blessed
    # the instances ran on the sparks, reached over SSH; the proxy on the controller
    where = {r.role: r.node for r in load_results(cfg, "04").payload.instances}
    assert where["prefill"] == "spark-01" and where["decode"] == "spark-02"
    assert where["proxy"] == "controller"


def test_zero_failed_requests_and_the_proof_held(sim_series):
    cfg, _, _, _ = sim_series
    for notebook in ("01", "03", "04"):
        payload = load_results(cfg, notebook).payload
        for point in payload.sweep.points:
            s = point.summary
            assert s["failed"] == 0 and s["valid"], (notebook, s.get("errors"))
    proof = load_results(cfg, "04").payload.proof
    assert proof.ok and len(proof.prompts) >= 3
    for prompt in proof.prompts:
        assert prompt.external_kv_transfer == prompt.prompt_tokens > 0
        assert prompt.nixl_bytes == prompt.expected_bytes > 0
        assert prompt.tokens_equal is True


# Run inside a namespace of the LAN: the status of each (method, url, with the key?) as JSON.
_ASK = """
import json, os, sys, httpx
out = []
for method, url, key in json.loads(sys.argv[1]):
    headers = {"Authorization": "Bearer " + os.environ["ASK_KEY"]} if key else {}
    body = {"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 2} if method == "POST" else None
    out.append(httpx.request(method, url, json=body, headers=headers, timeout=60).status_code)
print(json.dumps(out))
"""


def ask_from(ns: str, asks: list[tuple[str, str, bool]]) -> list[int]:
    """The status of each request, sent from namespace `ns` (the key, where asked, from
    the environment)."""
    p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _ASK, json.dumps(asks)],
                       env={**os.environ, "ASK_KEY": CANARY_API_KEY}, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_without_the_key_the_lan_gets_401_from_the_proxy_and_every_instance(sim_series):
    """The series' profile serves the disaggregated topology (prefill on spark-01, decode
    on spark-02, the proxy on the controller); from the controller's namespace, a LAN
    client without the key is refused /v1 everywhere, /health stays open, the key opens."""
    cfg, _, _, _ = sim_series
    serve = subprocess.run(lab_argv("controller", "serve", "--topology", "disaggregated",
                                    "--config", str(cfg.source)),
                           cwd=REPO, capture_output=True, text=True, timeout=900)
    try:
        assert serve.returncode == 0, (serve.stdout + serve.stderr)[-3000:]
        from lab_utils.cluster import Cluster

        records = Cluster(cfg).running()
        urls = [r.url for r in records]
        instances = [r.url for r in records if r.kind == "vllm"]
        assert len(instances) == 2 and len(urls) == 3, urls
        asks = [(m, f"{u}{path}", False) for u in urls
                for m, path in (("GET", "/v1/models"), ("POST", "/v1/completions"))]
        # vLLM's own SageMaker route, guarded by the lab's middleware
        asks += [("POST", f"{u}/invocations", False) for u in instances]
        assert ask_from("controller", asks) == [401] * len(asks), urls
        opened = [("GET", f"{u}/health", False) for u in urls] + \
                 [("POST", f"{u}/v1/completions", True) for u in urls]
        assert ask_from("controller", opened) == [200] * len(opened), urls
    finally:
        subprocess.run(lab_argv("controller", "cleanup", "--config", str(cfg.source)),
                       cwd=REPO, capture_output=True, text=True, timeout=300)


def test_nothing_left_running_on_any_node(sim_series, simcluster):
    from lab_utils.cluster import Cluster

    cfg, _, _, _ = sim_series
    assert Cluster(cfg).running() == []
    assert simcluster.strays() == []


@pytest.mark.parametrize("secret", [CANARY_HF_TOKEN, CANARY_API_KEY], ids=["hf-token", "api-key"])
def test_the_canary_secrets_never_leaked(sim_series, secret):
    cfg, _, watch, _ = sim_series
    assert watch.samples > 100 and not watch.hits, sorted(watch.hits)
    hits, scanned = file_hits(secret, cfg.results_dir, ROOT, skip=("hf_token", "api_key"))
    logs = list(cfg.results_dir.rglob("*.log")) + list(ROOT.rglob("*.log"))
    notebooks = list((cfg.results_dir / "executed").glob("*.ipynb"))
    assert len(notebooks) == 6 and logs and scanned > len(logs), (scanned, logs)
    assert hits == []
