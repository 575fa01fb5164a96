"""Unit tests of lab_utils.results.store: envelope, atomic writes, history and load errors."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab_utils import results
from lab_utils.config import REPO_ROOT, parse_config
from lab_utils.errors import LabError, ResultsMissingError
from lab_utils.results import BaselinePayload, store
from lab_utils.util.atomic import atomic_write_text

from support.payloads import baseline_dict
from support.results_files import HARDWARE, SOFTWARE, baseline, config_dict, old_file


def write(cfg, payload, notebook="01"):
    if isinstance(payload, dict):
        payload = baseline(**payload)
    return results.write_results(cfg, notebook, payload, software=SOFTWARE, hardware=HARDWARE)


def data(env) -> dict:
    """The test data `write` put in a notebook 01 payload."""
    return env.payload.sweep.workload


def test_round_trip(cfg):
    path = write(cfg, {"ttft_ms": [1.5, 2.5], "label": "x"})
    assert path == cfg.results_dir / "baseline_metrics.json"
    env = results.load_results(cfg, "01")
    assert env.schema_version == results.SCHEMA_VERSION
    assert (env.kind, env.notebook, env.profile) == ("baseline_metrics", "01", cfg.profile)
    assert isinstance(env.payload, BaselinePayload)
    assert env.payload == baseline(ttft_ms=[1.5, 2.5], label="x")
    assert env.config == cfg.snapshot()
    assert env.software == SOFTWARE and env.hardware == HARDWARE
    assert store._parse_time(env.timestamp).utcoffset().total_seconds() == 0
    assert results.load_envelope(path) == env
    # indent=2, envelope keys in declared order
    text = path.read_text()
    assert text.startswith('{\n  "schema_version": 1,\n  "kind": "baseline_metrics"')


def test_registry():
    assert {k: (s.file_name, s.notebook_file) for k, s in results.RESULTS.items()} == {
        "00": ("environment.json", "00_Environment_Setup.ipynb"),
        "01": ("baseline_metrics.json", "01_Local_Inference_Baseline.ipynb"),
        "02": ("kv_transfer_metrics.json", "02_KV_Cache_Transfer.ipynb"),
        "03": ("replicated_metrics.json", "03_Replicated_Serving.ipynb"),
        "04": ("disaggregated_metrics.json", "04_Disaggregated_Serving.ipynb"),
        "tp": ("tensor_parallel_metrics.json", "04_Disaggregated_Serving.ipynb"),
    }
    assert results.results_spec(4).file_name == "disaggregated_metrics.json"
    with pytest.raises(LabError, match="unknown notebook"):
        results.results_spec("07")


def test_history_keeps_previous_file(cfg):
    path = write(cfg, {"run": 1})
    first = path.read_text()
    first_ts = json.loads(first)["timestamp"]
    write(cfg, {"run": 2})
    write(cfg, {"run": 3})
    history = sorted((cfg.results_dir / "history").iterdir())
    assert len(history) == 2
    assert history[0].read_text() == first
    assert history[0].name.startswith("baseline_metrics.") and history[0].suffix == ".json"
    assert history[0].name[len("baseline_metrics.") :][:8] == first_ts[:10].replace("-", "")
    assert data(results.load_envelope(history[1])) == {"run": 2}
    assert data(results.load_results(cfg, "01")) == {"run": 3}


@pytest.mark.parametrize("mask", [0o077, 0o027])
def test_results_files_are_no_more_open_than_the_umask(cfg, umask, mask):
    umask(mask)
    write(cfg, {"run": 1})
    write(cfg, {"run": 2})  # the first goes to history/
    files = [p for p in cfg.results_dir.rglob("*") if p.is_file()]
    assert len(files) == 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o666 & ~mask, f
    path = cfg.results_dir / "baseline_metrics.json"
    path.chmod(0o644)  # a mode its owner chose is kept
    write(cfg, {"run": 3})
    assert path.stat().st_mode & 0o777 == 0o644


def test_history_unreadable_old_file_and_collisions(cfg):
    path = cfg.results_dir / "baseline_metrics.json"
    path.parent.mkdir(parents=True)
    for i in range(2):
        path.write_text(f"garbage {i}")
        os.utime(path, (1_700_000_000, 1_700_000_000))  # same mtime -> same name
        write(cfg, {"i": i})
        path.unlink()
    names = sorted(p.name for p in (cfg.results_dir / "history").iterdir())
    assert names == [
        "baseline_metrics.20231114T221320.000000Z-2.json",
        "baseline_metrics.20231114T221320.000000Z.json",
    ]
    contents = {(cfg.results_dir / "history" / n).read_text() for n in names}
    assert contents == {"garbage 0", "garbage 1"}


def test_missing_results_names_notebook(cfg):
    with pytest.raises(ResultsMissingError) as e:
        results.load_results(cfg, "02")
    msg = str(e.value)
    assert "02_KV_Cache_Transfer.ipynb" in msg
    assert str(cfg.results_dir / "kv_transfer_metrics.json") in msg
    assert "--from 02 --to 02" in msg


def test_corrupt_json_names_file(cfg):
    path = cfg.results_dir / "baseline_metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"schema_version": 1, "kind": ')
    with pytest.raises(LabError) as e:
        results.load_results(cfg, "01")
    msg = str(e.value)
    assert str(path) in msg and "not valid JSON" in msg
    assert "01_Local_Inference_Baseline.ipynb" in msg


def test_invalid_envelope_names_field(cfg):
    path = write(cfg, {"a": 1})
    data = json.loads(path.read_text())
    del data["payload"]
    data["hardware"] = "not a dict"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsMissingError) as e:
        results.load_envelope(path)
    msg = str(e.value)
    assert str(path) in msg and "payload" in msg and "hardware" in msg
    assert "re-run notebooks/01_Local_Inference_Baseline.ipynb" in msg


def test_wrong_profile_names_both(cfg, tmp_path):
    path = write(cfg, {"a": 1})
    other = parse_config(config_dict(tmp_path / "results", profile="spark-pair"))
    other.results_dir.mkdir(parents=True)
    (other.results_dir / path.name).write_text(path.read_text())
    with pytest.raises(ResultsMissingError) as e:
        results.load_results(other, "01")
    assert "'unit-test'" in str(e.value) and "'spark-pair'" in str(e.value)


def test_newer_schema_refused(cfg):
    path = write(cfg, {"a": 1})
    data = json.loads(path.read_text())
    data["schema_version"] = results.SCHEMA_VERSION + 1
    data["new_field"] = "from the future"
    path.write_text(json.dumps(data))
    with pytest.raises(LabError, match="update the lab") as e:
        results.load_results(cfg, "01")
    assert str(path) in str(e.value)


def test_nan_written_as_null(cfg):
    path = write(cfg, {"x": math.nan, "nested": [{"y": math.inf}, (1.0, -math.inf)]})
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    raw = json.loads(path.read_text())
    assert raw["payload"]["sweep"]["workload"] == {"x": None, "nested": [{"y": None}, [1.0, None]]}


def test_crash_before_replace_keeps_old_file(cfg, monkeypatch):
    path = write(cfg, {"run": 1})
    before = path.read_bytes()
    real_replace = os.replace

    def crash(src, dst):
        if Path(dst) == path:
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write(cfg, {"run": 2})
    assert path.read_bytes() == before
    assert sorted(p.name for p in cfg.results_dir.iterdir()) == ["baseline_metrics.json", "history"]
    assert not [p for p in (cfg.results_dir / "history").iterdir() if p.suffix == ".tmp"]


def test_atomic_write_text_cleans_up_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def fail(src, dst):
        raise OSError("boom")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


CHILD = """
import json, sys
from lab_utils.config import parse_config
from lab_utils.results import write_results
from support.payloads import baseline_dict, model, sweep_dict
cfg = parse_config(json.load(open(sys.argv[1])))
big = [i * 0.5 for i in range(150_000)]
seq = 0
while True:
    seq += 1
    payload = model("01", baseline_dict(sweep_dict(workload={"seq": seq, "big": big})))
    write_results(cfg, "01", payload, software={}, hardware={})
    print(seq, flush=True)
"""


def test_killed_writer_leaves_valid_file(cfg, tmp_path):
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(config_dict(tmp_path / "results")))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cfg_file)],
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])},
        text=True,
    )
    caught_mid_write = False
    try:
        done = 0
        while done < 3:  # a few complete writes, so there is an old file and history
            line = proc.stdout.readline()
            assert line, "writer exited early"
            done = int(line)
        deadline = time.monotonic() + 20
        while not caught_mid_write and time.monotonic() < deadline:
            # a temp file next to the results file means a write is under way: kill now
            caught_mid_write = any(p.suffix == ".tmp" for p in cfg.results_dir.iterdir())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert caught_mid_write, "never saw the writer mid-write"
    env = results.load_results(cfg, "01")
    assert data(env)["seq"] >= done
    assert len(data(env)["big"]) == 150_000 and data(env)["big"][-1] == 149_999 * 0.5
    history = list((cfg.results_dir / "history").glob("*.json"))
    assert len(history) >= done - 1
    for old in history:
        assert data(results.load_envelope(old))["seq"] <= data(env)["seq"]


def test_secret_env_redacted(tmp_path):
    data = config_dict(tmp_path / "results")
    data["vllm"]["extra_env"] = {"HF_TOKEN": "hf_secret123", "OMP_NUM_THREADS": "4"}
    cfg = parse_config(data)
    path = write(cfg, {"a": 1})
    assert "hf_secret123" not in path.read_text()
    env = results.load_envelope(path)
    assert env.config["vllm"]["extra_env"] == {"HF_TOKEN": "<redacted>", "OMP_NUM_THREADS": "4"}


def test_write_results_refuses_a_dict(cfg):
    with pytest.raises(LabError, match="BaselinePayload, not a dict"):
        results.write_results(cfg, "01", baseline_dict())
    with pytest.raises(LabError, match="KvTransferPayload"):
        results.write_results(cfg, "02", baseline(a=1))
    assert not (cfg.results_dir / "baseline_metrics.json").exists()


@pytest.mark.parametrize("payload, kind, problem", [
    ({"anything": 1}, None, "payload.topology: Field required"),
    ({**baseline_dict(), "sweep": {"points": "nonsense"}}, None, "payload.sweep"),
    ({**baseline_dict(), "surprise": 1}, None, "payload.surprise: Extra inputs"),
    (baseline_dict(), "benchmark", "holds 'benchmark' results"),
])
def test_foreign_or_garbage_payload_names_the_notebook(cfg, payload, kind, problem):
    path = old_file(cfg, "01", payload, kind=kind)
    with pytest.raises(ResultsMissingError) as e:
        results.load_results(cfg, "01")
    msg = str(e.value)
    assert str(path) in msg and problem in msg, msg
    assert ("re-run notebooks/01_Local_Inference_Baseline.ipynb "
            "(or `python -m lab_utils run --from 01 --to 01`)") in msg
    assert "Traceback" not in msg and e.value.__cause__ is None


def test_envelope_of_another_kind_keeps_a_dict_payload(cfg, tmp_path):
    path = results.write_envelope(cfg, tmp_path / "bench.json", "benchmark", "cli",
                                  {"target": "x"}, software={}, hardware={})
    assert results.load_envelope(path).payload == {"target": "x"}


def test_load_optional(cfg):
    assert results.load_optional(cfg, "02") is None
    old_file(cfg, "02", {"nonsense": True})
    with pytest.raises(ResultsMissingError, match="02_KV_Cache_Transfer"):
        results.load_optional(cfg, "02")
