"""The order instances start in: on a CUDA profile, instances sharing a machine start one
at a time (each once the one before answers /health), since vLLM on GB10 sizes its KV
cache from the machine's free memory while it starts; on the CPU rehearsal all at once.
Shown by `serve --dry-run`, and followed by `serve` (here with fake starts and waits)."""

from __future__ import annotations

import json

import pytest

from lab_utils.cli import main
from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import REPO_ROOT, load_config, parse_config
from lab_utils.serve import make_plan, topology
from lab_utils.serve.plan import start_waves

EXAMPLE = REPO_ROOT / "environment_config.json.example"


def two_prefill_one_decode(tmp_path, device: str = "cuda"):
    data = json.loads(EXAMPLE.read_text())
    data["results_root"] = str(tmp_path / "results")
    data["topology"]["disaggregated"]["prefill"] = ["spark-01", "spark-01"]
    data["topology"]["replicated"]["nodes"] = ["spark-01", "spark-01"]
    for role in ("baseline", "replica", "prefill", "decode"):
        data["vllm"][role]["gpu_memory_utilization"] = 0.2
    path = tmp_path / "2p1d.json"
    path.write_text(json.dumps(data))
    cfg = parse_config(data, str(path))
    assert cfg.vllm.device == device
    return cfg, path


def names(waves):
    return [[s.name for s in w] for w in waves]


def test_cuda_instances_on_one_machine_start_one_after_another(tmp_path):
    cfg, _ = two_prefill_one_decode(tmp_path)
    assert names(start_waves(cfg, cfg.instances("disaggregated"))) == [
        ["prefill-0", "decode-0"], ["prefill-1"]]
    assert names(start_waves(cfg, cfg.instances("replicated"))) == [["replica-0"], ["replica-1"]]
    # one instance per machine: one wave, nothing waits
    example = load_config(EXAMPLE)
    assert names(start_waves(example, example.instances("disaggregated"))) == [
        ["prefill-0", "decode-0"]]


def test_the_rehearsal_starts_everything_at_once():
    cfg = load_config(REPO_ROOT / "configs/local-cpu.json")
    specs = cfg.instances("disaggregated")
    assert len({cfg.nodes[s.node].machine(s.node) for s in specs}) == 1  # one machine
    assert names(start_waves(cfg, specs)) == [[s.name for s in specs]]


def test_dry_run_shows_the_order(tmp_path, capsys):
    cfg, path = two_prefill_one_decode(tmp_path)
    plan = make_plan(Cluster(cfg), "disaggregated", read_nodes=False)
    assert plan.start_order == [["prefill-0", "decode-0"], ["prefill-1"]]
    main(["serve", "--config", str(path), "--topology", "disaggregated", "--dry-run", "--offline"])
    out = capsys.readouterr().out
    assert "Start order: one at a time on each machine" in out
    assert "  wave 1: prefill-0, decode-0\n  wave 2: prefill-1, once wave 1 answers /health" in out
    main(["serve", "--config", str(REPO_ROOT / "configs/local-cpu.json"), "--topology",
          "disaggregated", "--dry-run", "--offline"])
    assert "Start order: all at once (prefill-0, decode-0)" in capsys.readouterr().out


def test_serve_waits_for_each_wave_before_starting_the_next(tmp_path, monkeypatch):
    cfg, _ = two_prefill_one_decode(tmp_path)
    events: list[tuple] = []

    def start(cluster, spec, kv_buffer_device=None):
        events.append(("start", spec.name))
        return ProcessRecord(name=spec.name, node=spec.node, pid=1, pgid=1, start_ticks=0, log_path="",
                             argv=[], kind="vllm",
                             url=f"http://x:{spec.port}", extra={"role": spec.role}), True

    monkeypatch.setattr(topology, "check_plans", lambda *a: None)
    monkeypatch.setattr(topology, "deploy", lambda *a: None)
    monkeypatch.setattr(topology, "_warm_up_pairs", lambda *a: events.append(("warm-up",)))
    monkeypatch.setattr(topology, "start_instance", start)
    def wait(cluster, records, **kw):
        events.append(("healthy", *sorted(r.name for r in records)))
        return {r.name: 10.0 * len(records) for r in records}

    monkeypatch.setattr(topology, "wait_ready", wait)
    recorded = {}
    monkeypatch.setattr(topology.calibrate, "before_start", lambda cluster, nodes: {})
    monkeypatch.setattr(topology.calibrate, "record",
                        lambda cluster, started, ready, before: recorded.update(ready))
    records = topology.serve(Cluster(cfg), "disaggregated", show_progress=False)
    assert [r.name for r in records] == ["prefill-0", "decode-0", "prefill-1"]
    assert events == [("start", "prefill-0"), ("start", "decode-0"),
                      ("healthy", "decode-0", "prefill-0"),
                      ("start", "prefill-1"),
                      ("healthy", "decode-0", "prefill-0", "prefill-1"), ("warm-up",)]
    # each instance's seconds to healthy are counted from its own wave's start
    assert recorded == {"prefill-0": 20.0, "decode-0": 20.0, "prefill-1": 30.0}


def _pd_records(cfg) -> list[ProcessRecord]:
    return [ProcessRecord(name=s.name, node=s.node, pid=1, pgid=1, start_ticks=0, log_path="",
                          argv=[], kind="vllm", url=f"http://x:{s.port}", extra={"role": s.role})
            for s in cfg.instances("disaggregated")]


class _FakeNode:
    def __init__(self, log: str):
        self.log = log

    def log_tail(self, rec, lines=40):
        return self.log


class _FakeCluster:
    """Stops recorded, every node's log the given text."""

    def __init__(self, cfg, log: str):
        self.cfg, self.stopped, self._node = cfg, [], _FakeNode(log)

    def node(self, name):
        return self._node

    def stop(self, records, grace_s=None):
        self.stopped += [r.name for r in records]
        return []


DEAD_LOG = ("(EngineCore pid=7) ERROR [core.py:1512] TimeoutError: RPC call to execute_model "
            "timed out.\n")


def test_a_decode_that_died_in_the_warm_up_is_restarted_once(tmp_path, monkeypatch, capsys):
    from lab_utils.errors import LabError
    from lab_utils.serve import pd

    cfg = load_config(REPO_ROOT / "configs/local-cpu.json")
    records = _pd_records(cfg)
    started = list(records)
    tries = []

    def warm_up(p, d, model, api_key=None):
        tries.append((p, d))
        if len(tries) == 1:
            raise LabError("decode answered 500: EngineCore encountered an issue")
        return 1

    alive = {"prefill-0": True, "decode-0": False}
    monkeypatch.setattr(pd, "warm_up", warm_up)
    monkeypatch.setattr(topology, "healthy",
                        lambda url, api_key=None: alive[next(r.name for r in records
                                                              if r.url == url)])

    def start(cluster, spec, kv_buffer_device=None):
        alive[spec.name] = True
        return ProcessRecord(name=spec.name, node=spec.node, pid=2, pgid=2, start_ticks=0,
                             log_path="", argv=[], kind="vllm", url=f"http://x:{spec.port}",
                             extra={"role": spec.role}), True

    waited = []
    monkeypatch.setattr(topology, "start_instance", start)
    monkeypatch.setattr(topology, "wait_ready",
                        lambda cluster, recs, **kw: waited.append([r.name for r in recs]))
    cluster = _FakeCluster(cfg, DEAD_LOG)
    topology._warm_up_pairs(cluster, records, started, None, False)
    out = capsys.readouterr().out
    assert "restarting decode-0 once" in out and "engine_step_timeout" in out
    assert cluster.stopped == ["decode-0"] and waited == [["decode-0"]]
    assert [(r.name, r.pid) for r in records] == [("prefill-0", 1), ("decode-0", 2)]
    assert sorted((r.name, r.pid) for r in started) == [("decode-0", 2), ("prefill-0", 1)]
    assert len(tries) == 2


def test_a_warm_up_that_fails_twice_raises_with_the_log(tmp_path, monkeypatch):
    from lab_utils.errors import LabError
    from lab_utils.serve import pd

    cfg = load_config(REPO_ROOT / "configs/local-cpu.json")
    records = _pd_records(cfg)

    def warm_up(p, d, model, api_key=None):
        raise LabError("decode answered 500")

    monkeypatch.setattr(pd, "warm_up", warm_up)
    monkeypatch.setattr(topology, "healthy", lambda url, api_key=None: url.endswith(":8300"))
    monkeypatch.setattr(topology, "start_instance", lambda c, spec, kv_buffer_device=None: (
        next(r for r in _pd_records(cfg) if r.name == spec.name), True))
    monkeypatch.setattr(topology, "wait_ready", lambda *a, **kw: {})
    with pytest.raises(LabError) as e:
        topology._warm_up_pairs(_FakeCluster(cfg, DEAD_LOG), records, [], None, False)
    # once restarted, then refused: the message carries the log's lines and the known failure
    assert "RPC call to execute_model timed out" in str(e.value)
    assert "Known failure: engine_step_timeout" in str(e.value)


def test_an_interrupt_lost_in_a_del_while_waiting_still_stops_what_serve_started(tmp_path, monkeypatch):
    """Seen over SSH: Ctrl-C landed in a paramiko channel's `__del__`, Python swallowed it,
    and serve went on to report everything started. Now it stops what it started."""
    cfg, _ = two_prefill_one_decode(tmp_path)

    class Swallows:
        def __del__(self):
            raise KeyboardInterrupt  # what a SIGINT landing here does

    def start(cluster, spec, kv_buffer_device=None):
        return ProcessRecord(name=spec.name, node=spec.node, pid=1, pgid=1, start_ticks=0, log_path="",
                             argv=[], kind="vllm", url=f"http://x:{spec.port}",
                             extra={"role": spec.role}), True

    def wait(cluster, records, **kw):
        Swallows()  # dropped at once: the interrupt is raised and swallowed in its __del__
        return {r.name: 1.0 for r in records}

    for name, fake in [("check_plans", lambda *a: None), ("deploy", lambda *a: None),
                       ("_warm_up_pairs", lambda *a: None), ("start_instance", start),
                       ("wait_ready", wait)]:
        monkeypatch.setattr(topology, name, fake)
    monkeypatch.setattr(topology.calibrate, "before_start", lambda cluster, nodes: {})
    monkeypatch.setattr(topology.calibrate, "record", lambda *a: None)
    cluster = Cluster(cfg)
    stopped: list[str] = []
    monkeypatch.setattr(cluster, "stop", lambda records, grace_s=None: stopped.extend(
        r.name for r in records))
    with pytest.raises(KeyboardInterrupt):
        topology.serve(cluster, "disaggregated", show_progress=False)
    # this fake wait does not check as the real one does each second, so the loss is
    # found by serve's own check once the last wave is up: all three were started
    assert stopped == ["prefill-0", "decode-0", "prefill-1"]
