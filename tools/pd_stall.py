"""Reproduce the rehearsal's disaggregated stall and vary one setting at a time.

`python -m tools.pd_stall --set kv_transfer.ucx_tls=tcp --set ...` starts the
disaggregated topology of a local profile with the given config changes, then measures:

- **idle spin**: for 10 s with no request, the threads of the instances' processes that
  used more than half a CPU, and their share of user and system time;
- **one at a time**: `--single` requests sent one after another through the proxy, each
  with its TTFT, TPOT and the time the machine stood still during it;
- **load**: `--num-prompts` requests at concurrency `--concurrency` through the proxy
  (the lab's load generator and workload, `loadgen.run_point`, as notebook 04 runs them):
  wall time, median TPOT, stood still.

NIXL's progress threads are lowered (nice 19, 0.1 ms slice) as the profile says
(`kv_transfer.lower_nixl_threads`; `--set kv_transfer.lower_nixl_threads=false` for
normal priority; `--set kv_transfer.nixl_progress_delay_us=0` for NIXL's busy polling as
vLLM gets it). `--compare` instead measures P/D as vLLM leaves it, lowered, and with the
lab's progress delay against the single instance and the replicated pair
(`tools.pd_compare`).

With `--hold`, also:

- **hold**: one prompt sent to the prefill alone with `do_remote_decode`, which no decode
  then reads, so the prefill holds its KV blocks for the whole lease; meanwhile watchers
  (`python -m lab_utils.measure.stalls`) sleep 0.1 s at a time and note when they woke
  late: one in this process's session (where the lab starts the instances), one in a
  session of its own, and as root the same two under SCHED_FIFO.

It stops everything it started and prints one markdown row per run, so the tables of
experiments in docs/REHEARSAL.md can be reproduced row by row. Local profiles only: it
reads the instances' threads from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab_utils import config as labconfig
from lab_utils.cluster import Cluster
from lab_utils.measure import stalls
from lab_utils.measure.loadgen import auth_headers
from lab_utils.measure.workload import server_tokenizer
from lab_utils.serve.topology import Served
from tools import pd_compare
from tools.pd_compare import measure_point

IDLE_S = 10.0
BUSY_SHARE = 0.5


def _apply(raw: dict[str, Any], setting: str) -> None:
    """`a.b.c=VALUE` (VALUE parsed as JSON when it is JSON, else kept as a string)."""
    key, _, value = setting.partition("=")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    *path, last = key.split(".")
    node = raw
    for part in path:
        node = node.setdefault(part, {})
    node[last] = parsed


def _lab(cfg_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab_utils", *args, "--config", str(cfg_path)],
                          capture_output=True, text=True)


def _tasks(pid: int) -> dict[int, tuple[int, int]]:
    """Every thread of `pid` and of its descendants: tid -> (utime, stime) in ticks."""
    out: dict[int, tuple[int, int]] = {}
    pending = [pid]
    while pending:
        p = pending.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(fields[11]), int(fields[12]))
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    pending += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def idle_spin(pids: list[int], seconds: float = IDLE_S) -> dict[str, Any]:
    """Threads under `pids` busy while nothing is asked of them."""
    tick = os.sysconf("SC_CLK_TCK")
    before = {tid: t for pid in pids for tid, t in _tasks(pid).items()}
    time.sleep(seconds)
    after = {tid: t for pid in pids for tid, t in _tasks(pid).items()}
    busy, user, system = [], 0.0, 0.0
    for tid, (u1, s1) in after.items():
        u0, s0 = before.get(tid, (u1, s1))
        share = (u1 - u0 + s1 - s0) / tick / seconds
        if share > BUSY_SHARE:
            busy.append(tid)
            user += (u1 - u0) / tick / seconds
            system += (s1 - s0) / tick / seconds
    return {"busy_threads": len(busy), "tids": busy, "busy_cpu": round(user + system, 2),
            "busy_system_share": round(system / (user + system), 2) if busy else None}


def one_at_a_time(url: str, model: str, n: int, headers: dict[str, str]) -> list[dict[str, Any]]:
    import httpx

    rows = []
    for i in range(n):
        body = {"model": model, "prompt": f"{i} {time.time()} " + "the lab measures " * 30,
                "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True}
        times: list[float] = []
        with stalls.Watch() as watch:
            t0 = time.monotonic()
            with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                              timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        times.append(time.monotonic())
            e2e = time.monotonic() - t0
        rows.append({"status": r.status_code, "ttft_ms": (times[0] - t0) * 1e3 if times else None,
                     "tpot_ms": (times[-1] - times[0]) * 1e3 / (len(times) - 1) if len(times) > 1 else None,
                     "e2e_s": e2e, "held_up_s": watch.held_up_s})
        time.sleep(1.0)
    return rows


def _watcher(seconds: float, own_session: bool, fifo: bool) -> subprocess.Popen:
    argv = [sys.executable, "-m", "lab_utils.measure.stalls", "--seconds", str(seconds), "--json"]
    return subprocess.Popen(argv + (["--fifo"] if fifo else []), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=own_session)


def hold(prefill_url: str, model: str, headers: dict[str, str], lease_s: float) -> dict[str, Any]:
    """One prompt to the prefill alone, its KV blocks then held unread for `lease_s`; how
    long each watcher stood still meanwhile (watchers: see the module's docstring)."""
    import httpx

    from lab_utils.serve import pd

    seconds = lease_s + 6.0
    kinds = [("this session", False, False), ("own session", True, False)]
    if os.geteuid() == 0:
        kinds += [("this session, SCHED_FIFO", False, True), ("own session, SCHED_FIFO", True, True)]
    watchers = {name: _watcher(seconds, own, fifo) for name, own, fifo in kinds}
    try:
        time.sleep(1.0)
        with httpx.Client(timeout=60, headers=headers) as client:
            pd.prefill(client, prefill_url, model, list(range(10, 138)))
        held = {}
        for name, w in watchers.items():
            out, _ = w.communicate(timeout=seconds + 120)
            held[name] = json.loads(out.strip().splitlines()[-1])["held_up_s"]
    finally:
        for w in watchers.values():
            if w.poll() is None:
                w.kill()
                w.wait()
    return {"lease_s": lease_s, "watched_s": seconds, "held_up_s": held}


def _median(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return statistics.median(known) if known else None


def run(config: Path, settings: list[str], label: str, single: int, concurrency: int,
        num_prompts: int, with_hold: bool = False) -> dict[str, Any]:
    raw = json.loads(config.read_text())
    for s in settings:
        _apply(raw, s)
    with tempfile.TemporaryDirectory(prefix="pd-stall-") as tmp:
        # relative paths in a config resolve against the checkout, wherever the file is
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(raw))
        cfg = labconfig.load_config(cfg_path)
        url = f"http://{cfg.nodes[cfg.proxy.node].lan_address}:{cfg.proxy.port}"
        headers = auth_headers(labconfig.api_key(cfg, "proxy"))
        row: dict[str, Any] = {"label": label, "settings": settings}
        try:
            t0 = time.monotonic()
            started = _lab(cfg_path, "serve", "--topology", "disaggregated")
            if started.returncode:
                raise SystemExit(f"serve failed:\n{started.stdout[-2000:]}{started.stderr[-2000:]}")
            row["start_s"] = round(time.monotonic() - t0, 1)
            with Cluster(cfg) as cluster:
                instances = [r for r in cluster.running("disaggregated") if r.kind == "vllm"]
            row["idle"] = idle_spin([r.pid for r in instances])
            if with_hold:
                prefill_url = next(r.url for r in instances if r.name.startswith("prefill"))
                assert prefill_url is not None  # an instance's record has its URL
                lease = float(cfg.kv_transfer.extra_config.get("kv_lease_duration", 30))
                row["hold"] = hold(prefill_url, cfg.model.name,
                                   auth_headers(labconfig.api_key(cfg, "vllm")), lease)
            singles = one_at_a_time(url, cfg.model.name, single, headers)
            row["single"] = {"ttft_ms_first": singles[0]["ttft_ms"] if singles else None,
                             "ttft_ms_median_rest": _median([r["ttft_ms"] for r in singles[1:]]),
                             "tpot_ms_median": _median([r["tpot_ms"] for r in singles[1:]]),
                             "held_up_s": round(sum(r["held_up_s"] for r in singles), 1)}
            served = Served("disaggregated", Cluster(cfg).running("disaggregated"))
            tokenize, detokenize = server_tokenizer(served.instance_urls()[0], cfg.model.name,
                                                    labconfig.api_key(cfg, "vllm"))
            w = cfg.workload.model_copy(update={"warmup": 0})
            point = measure_point(cfg.model_copy(update={"workload": w}), served, tokenize,
                                  detokenize, mixed=False, concurrency=concurrency, n=num_prompts)
            row["load"] = {"duration_s": point["duration_s"], "tpot_ms_median": point["tpot_ms"],
                           "ttft_ms_median": point["ttft_ms"], "held_up_s": point["held_up_s"],
                           "failed": point["failed"]}
        finally:
            _lab(cfg_path, "cleanup")
    return row


def markdown(row: dict[str, Any]) -> str:
    idle, single, load = row.get("idle", {}), row.get("single", {}), row.get("load", {})

    def f(x, fmt="{:.0f}"):
        return "-" if x is None else fmt.format(x)
    return (f"| {row['label']} | {idle.get('busy_threads', '-')} ({f(idle.get('busy_cpu'), '{:.1f}')} CPU, "
            f"{f(idle.get('busy_system_share'), '{:.0%}')} sys) | {f(single.get('ttft_ms_median_rest'))} | "
            f"{f(single.get('tpot_ms_median'), '{:.1f}')} | {f(single.get('held_up_s'), '{:.1f}')} | "
            f"{f(load.get('duration_s'), '{:.1f}')} | {f(load.get('tpot_ms_median'), '{:.1f}')} | "
            f"{f(load.get('held_up_s'), '{:.1f}')} | {load.get('failed', load.get('error', '-'))} |")


def hold_markdown(row: dict[str, Any]) -> str:
    h = row["hold"]
    lines = [f"| watcher, during a {h['lease_s']:.0f} s hold ({row['label']}) | stood still s |",
             "|---|---|"]
    lines += [f"| {name} | {s:.1f} |" for name, s in h["held_up_s"].items()]
    return "\n".join(lines)


HEADER = ("| run | idle: busy threads | one at a time: TTFT ms | TPOT ms | stood still s "
          "| load: duration s | TPOT ms | stood still s | failed |\n|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.pd_stall", description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/local-cpu.json"))
    ap.add_argument("--set", dest="settings", action="append", default=[],
                    help="a config change, e.g. kv_transfer.ucx_tls=tcp (repeatable)")
    ap.add_argument("--label", default=None)
    ap.add_argument("--compare", action="store_true",
                    help="instead: the single instance, the replicated pair and P/D with NIXL's "
                         "threads as vLLM leaves them, lowered, and waiting (tools.pd_compare)")
    ap.add_argument("--prompts", type=int, default=12,
                    help="with --compare: requests at concurrency 1 (default 12)")
    ap.add_argument("--single", type=int, default=6, help="requests sent one at a time (default 6)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--hold", action="store_true",
                    help="also hold KV blocks on the prefill for one lease, with watchers in "
                         "this session and in a session of their own")
    ap.add_argument("--json", type=Path, default=None, help="append the run's figures to this JSON-lines file")
    a = ap.parse_args(argv)
    if a.compare:
        rows = pd_compare.compare(a.config.resolve(), a.prompts)
        if a.json:
            with a.json.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        print(pd_compare.markdown(rows))
        print()
        print("\n".join(pd_compare.verdicts(rows)))
        return 0
    row = run(a.config.resolve(), a.settings, a.label or (", ".join(a.settings) or "as shipped"),
              a.single, a.concurrency, a.num_prompts, a.hold)
    if a.json:
        with a.json.open("a") as f:
            f.write(json.dumps(row) + "\n")
    print(HEADER)
    print(markdown(row))
    if "hold" in row:
        print()
        print(hold_markdown(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
