"""No secret in what a keyed rehearsal leaves behind.

The session's shared instances want an API key (the canary, in vllm.api_key_file) and run
with the canary HF token in their environment (tests/conftest.py). Through them, the lab's
own commands (`serve`, `status`, a small `bench`) run as a user runs them; then neither
canary may show in what those commands printed, in the instances' command lines, or in
any file under the profile's results directory (instance logs, the lab's state, results
files). The simulated cluster's series checks the same over SSH, with the notebooks.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.leaks import cmdline_hits, file_hits
from support.profiles import CANARY_API_KEY, CANARY_HF_TOKEN

pytestmark = pytest.mark.slow

CANARIES = (CANARY_API_KEY, CANARY_HF_TOKEN)


def _lab(cfg, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab_utils", *args, "--config", str(cfg.source)],
                          capture_output=True, text=True, timeout=900, env=os.environ.copy())


def test_no_canary_in_output_command_lines_or_results(rehearsal, tmp_path):
    urls = rehearsal.up()
    cfg = rehearsal.cfg
    assert os.environ["HF_TOKEN"] == CANARY_HF_TOKEN  # the instances were given it
    key_file = cfg.resolve_path(cfg.vllm.api_key_file)
    assert key_file.read_text().strip() == CANARY_API_KEY  # and want this key

    said = []
    for args in (("serve", "--topology", "baseline"), ("status",),
                 ("bench", "--url", urls["baseline"], "--api-key-file", str(key_file),
                  "--out", str(cfg.results_dir / "canary-bench.json"), "--concurrency", "1",
                  "--num-prompts", "2", "--warmup", "0", "--repeats", "1",
                  "--input-len", "32", "--output-len", "4")):
        p = _lab(cfg, *args)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
        said.append(p.stdout + p.stderr)
    assert (cfg.results_dir / "canary-bench.json").exists()  # the key was accepted

    for canary in CANARIES:
        assert not any(canary in s for s in said), canary
        assert cmdline_hits(canary) == []
        hits, scanned = file_hits(canary, cfg.results_dir)
        logs = list(cfg.results_dir.rglob("*.log"))
        assert len(logs) >= 3 and scanned > len(logs), (scanned, logs)  # the instances' logs
        assert hits == []
