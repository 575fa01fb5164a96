"""The notebook series over SSH on the simulated three-node cluster, run headless from
the controller's namespace as a user would: every notebook ran, zero failed requests, the
proxy ran on the controller, the proof of transfer held; and the canary HF token never
showed in a command line (sampled during the whole run), a log, a results file or an
executed notebook."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from lab_utils.results import load_results

from support.leaks import CmdlineWatch, file_hits
from support.profiles import CANARY_HF_TOKEN, show, simcluster_profile
from support.simcluster import REPO, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.simcluster]

SERIES_TIMEOUT_S = 45 * 60


@pytest.fixture(scope="module")
def sim_series(simcluster, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("simcluster-series")
    cfg = simcluster_profile(root, "test-simcluster")
    argv = simcluster.lab_argv("controller", "run", "--config", str(cfg.source))
    t0 = time.monotonic()
    with CmdlineWatch(CANARY_HF_TOKEN) as watch:
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


def test_nothing_left_running_on_any_node(sim_series, simcluster):
    from lab_utils.cluster import Cluster

    cfg, _, _, _ = sim_series
    assert Cluster(cfg).running() == []
    assert simcluster.strays() == []


def test_the_canary_token_never_leaked(sim_series):
    cfg, _, watch, _ = sim_series
    assert watch.samples > 100 and not watch.hits, sorted(watch.hits)
    hits, scanned = file_hits(CANARY_HF_TOKEN, cfg.results_dir, ROOT, skip=("hf_token",))
    logs = list(cfg.results_dir.rglob("*.log")) + list(ROOT.rglob("*.log"))
    notebooks = list((cfg.results_dir / "executed").glob("*.ipynb"))
    assert len(notebooks) == 6 and logs and scanned > len(logs), (scanned, logs)
    assert hits == []
