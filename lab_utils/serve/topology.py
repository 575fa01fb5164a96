"""Topologies: the sets of vLLM instances the serving notebooks stand up.

`serve` starts a topology's instances (baseline: one; replicated: one per listed node;
disaggregated: prefill and decode instances with NixlConnector), reusing any already
running so a second call starts no duplicates, and waits until all are healthy; a plan
whose memory does not fit on a node (`serve.plan`) is refused before anything starts;
what the instances it started measured is recorded (`serve.calibrate`).
`plan.start_waves` orders the start: on a CUDA profile instances that share a machine start one
at a time, each once the one before is healthy (see there); elsewhere all at once. If
anything fails or the user interrupts, what this call started is stopped again.
`cleanup` stops everything the profile's state file lists, on every node. All act on a
`Cluster` their caller built (and closes). `Served` is a topology as the serving notebooks
hold it once started: its records, the proxy's URL, its instances' URLs by role.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lab_utils import known_failures
from lab_utils.cluster import Cluster, as_cluster
from lab_utils.cluster.provision import deploy
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError
from lab_utils.on_node import nixl_threads
from lab_utils.serve import calibrate, pd
from lab_utils.serve.launcher import healthy, process_failure, start_instance, wait_ready
from lab_utils.serve.plan import make_plan, merge_plans, start_waves
from lab_utils.serve.proxy_settings import KEY_ENV
from lab_utils.serve.tp import stop_lone_ranks
from lab_utils.util import interrupts

PROXY = "proxy"


@dataclass
class Served:
    topology: str
    records: list[ProcessRecord]
    kv_buffer_device: str | None = None  # what prefill and decode instances were given
    # runs made per name on these instances (shared by every Served of one notebook session)
    runs: Counter[str] = field(default_factory=Counter)
    # requests timed one at a time per topology, this session's (`time_split.time_instances`)
    timed: dict[str, Any] = field(default_factory=dict)
    # how a split model's ranks all-reduce, read once when they are up (`tp.collective`)
    collective: list[Any] = field(default_factory=list)

    @property
    def proxy_url(self) -> str:
        return next(_url(r) for r in self.records if r.name == PROXY)

    def urls(self, role: str) -> list[str]:
        return urls(self.records, role)

    def instance_records(self) -> list[ProcessRecord]:
        return [r for r in self.records if r.kind == "vllm"]

    def instance_urls(self) -> list[str]:
        return [_url(r) for r in self.instance_records() if r.url]  # not headless ranks


def _url(rec: ProcessRecord) -> str:
    assert rec.url is not None  # an instance's or the proxy's record has its URL
    return rec.url


def serve(cluster: Cluster, *topologies: str, show_progress: bool = True,
          with_proxy: bool = False, kv_buffer_device: str | None = None) -> list[ProcessRecord]:
    """Start (or reuse) every instance of the topologies in `start_waves` order, and with
    `with_proxy` the lab proxy in front of the (single) topology; return the records
    once all are healthy. On any failure or interrupt, what this call started stops.
    `kv_buffer_device`: what prefill and decode instances get (resolved by the caller,
    e.g. `notebook.kv_buffer_device`; None: the configured one)."""
    if with_proxy and len(topologies) != 1:
        raise ValueError("the proxy fronts exactly one topology")
    with interrupts.watched():  # a Ctrl-C that a __del__ swallowed still stops serve
        return _serve(cluster, topologies, show_progress, with_proxy, kv_buffer_device)


def _serve(cluster: Cluster, topologies: tuple[str, ...], show_progress: bool,
           with_proxy: bool, kv_buffer_device: str | None) -> list[ProcessRecord]:
    cfg = cluster.cfg
    if "tensor-parallel" in topologies and not cfg.instances("tensor-parallel"):
        raise LabError(f"the profile {cfg.profile} has no tensor-parallel topology: add "
                       "topology.tensor_parallel and vllm.tp (configs/local-cpu.json has both)")
    check_plans(cluster, topologies, kv_buffer_device)
    records: list[ProcessRecord] = []
    started: list[ProcessRecord] = []
    specs = [s for t in topologies for s in cfg.instances(t)]
    remote = {s.node for s in specs} | ({cfg.proxy.node} if with_proxy else set())
    deploy(cluster, sorted(n for n in remote if cfg.nodes[n].connection == "ssh"))
    # never reuse part of a split model
    if "tensor-parallel" in topologies and (
            said := stop_lone_ranks(cluster, cluster.running("tensor-parallel"))):
        print(f"warning: {said}; starting it again")
    found = {r.name for r in cluster.running()}  # what ran before this call
    try:
        before = calibrate.before_start(cluster, [s.node for s in specs])
        ready: dict[str, float] = {}
        for wave in start_waves(cfg, specs):
            for spec in wave:
                rec, new = start_instance(cluster, spec, kv_buffer_device=kv_buffer_device)
                records.append(rec)
                if new:
                    started.append(rec)
            for name, s in wait_ready(cluster, records, show_progress=show_progress).items():
                ready.setdefault(name, s)  # seconds from its own wave's start
        calibrate.record(cluster, [r for r in records if r in started], ready, before)
        if "disaggregated" in topologies:
            _warm_up_pairs(cluster, records, started, kv_buffer_device, show_progress)
            # NIXL's progress threads exist once the instances are up and have shaken
            # hands; on the CPU rehearsal they then run only when the engines do not
            quiet_nixl_threads(cluster, records)
        if with_proxy:
            rec, new = start_proxy(cluster, topologies[0])
            records.append(rec)
            if new:
                started.append(rec)
                wait_ready(cluster, [rec], timeout=60, show_progress=False)
        interrupts.check()
    except BaseException:
        # what this call started, and what it recorded but had not yet counted: an
        # interrupt can land between a process's record being saved and its start returning
        cluster.stop(started + [r for r in cluster.running()
                                if r.name not in found and r not in started])
        raise
    return records


def check_plans(cluster: Cluster, topologies: tuple[str, ...],
                kv_buffer_device: str | None) -> None:
    """Refuse, before anything starts, a topology whose memory plan does not fit on a node
    (MemTotal read from the nodes, which must answer anyway to be served on). Several
    topologies at once share their nodes, so their instances are summed per node."""
    plans = [make_plan(cluster, t, kv_buffer_device=kv_buffer_device) for t in topologies]
    for p in plans:
        p.check()
    if len(plans) > 1:
        merge_plans(cluster.cfg, plans).check()


def _warm_up_pairs(cluster: Cluster, records: list[ProcessRecord],
                   started: list[ProcessRecord], kv_buffer_device: str | None,
                   show_progress: bool) -> None:
    """Every prefill/decode pair does its NIXL handshake now, not in the first measured
    request (a handshake that fails transiently is retried by `warm_up`). An instance
    whose engine died in it is restarted once, saying so (`restart_dead`); a pair that
    fails again, or fails with both alive, raises with what their logs say."""

    cfg = cluster.cfg
    key = api_key(cfg, "vllm")
    pairs = [(p.name, d.name) for p in records if p.extra.get("role") == "prefill"
             for d in records if d.extra.get("role") == "decode"]
    for names in pairs:
        for attempt in (1, 2):
            by_name = {r.name: r for r in records}
            p, d = by_name[names[0]], by_name[names[1]]
            try:
                pd.warm_up(_url(p), _url(d), cfg.model.name, api_key=key)
                break
            except LabError as e:
                dead = [r for r in (p, d) if not healthy(_url(r), api_key=key)]
                if attempt == 2 or not dead:  # with each one's log tail and known failure
                    logs = [process_failure(cluster.node(r.node), r, "failed the warm-up")
                            for r in dead or [p, d]]
                    raise LabError("\n".join(map(str, [e, *logs]))) from e
                restart_dead(cluster, records, started, dead, kv_buffer_device, show_progress,
                             why=str(e))


def restart_dead(cluster: Cluster, records: list[ProcessRecord], started: list[ProcessRecord],
                 dead: list[ProcessRecord], kv_buffer_device: str | None, show_progress: bool,
                 why: str) -> None:
    """Stop the instances in `dead` and start them again in their place in `records` (and
    `started`), printing why with the known failure their logs show."""

    names = ", ".join(r.name for r in dead)
    seen = "; ".join(f.name for r in dead for f in known_failures.match_failures(
        cluster.node(r.node).log_tail(r, 400), include_warnings=False)) or "no known failure"
    print(f"warning: {names} stopped answering in the first prefill->decode round trip "
          f"({why.splitlines()[0][:300]}; their log: {seen}); restarting {names} once.")
    cluster.stop(dead)
    specs = {s.name: s for s in cluster.cfg.instances("disaggregated")}
    fresh = []
    for old in dead:
        rec, _ = start_instance(cluster, specs[old.name], kv_buffer_device=kv_buffer_device)
        records[records.index(old)] = rec
        if old in started:
            started.remove(old)
        started.append(rec)
        fresh.append(rec)
    wait_ready(cluster, fresh, show_progress=show_progress)


def start_proxy(cluster: Cluster, mode: str, kind: str | None = None,
                policy: str | None = None) -> tuple[ProcessRecord, bool]:
    """Start the front door on its node in `mode`: the lab proxy, or vllm-router with
    `proxy.kind: "vllm-router"` (`serve.router`). Reused if already running in that mode,
    kind and routing policy; any other is replaced, since all share the configured proxy
    port. `kind` overrides `proxy.kind`, `policy` the replicated topology's policy, for
    this start."""
    cfg = cluster.cfg
    kind = kind or cfg.proxy.kind
    policy = policy or cfg.topology.replicated.policy
    node = cluster.node(cfg.proxy.node)
    existing = cluster.alive(PROXY)
    if existing is not None:
        if (existing.extra.get("mode") == mode and existing.extra.get("kind", "lab") == kind
                and existing.extra.get("policy", cfg.topology.replicated.policy) == policy):
            return existing, False
        cluster.stop([existing])
    address = node.cfg.lan_address
    what = "the lab proxy" if kind == "lab" else "vllm-router"
    node.ensure_port_free(address, cfg.proxy.port, what)
    if kind == "vllm-router":
        node.ensure_port_free(address, cfg.proxy.router_metrics_port,
                              "vllm-router's metrics (proxy.router_metrics_port)")

    # the API keys by environment (over SSH: on the channel's stdin), never on argv
    env = {KEY_ENV[s]: key for s in ("proxy", "vllm") if (key := api_key(cfg, s))}
    config_path, cwd = str(cfg.source), None
    if node.cfg.connection == "ssh":  # run the deployed copy with a copy of this config
        assert cfg.source is not None and node.cfg.workdir  # a config file; an SSH workdir
        config_path = f"{node.cfg.workdir}/configs/{cfg.profile}.json"
        node.put_file(cfg.source, config_path)
        env["PYTHONPATH"], cwd = node.cfg.workdir, node.cfg.workdir
    argv = [node.python, "-m", "lab_utils", "proxy", "--config", config_path, "--mode", mode,
            "--kind", kind, "--policy", policy]
    rec = node.start_detached(PROXY, argv, env=env, cwd=cwd, kind="proxy", port=cfg.proxy.port,
                              log_path=f"{cfg.log_dir_on(cfg.proxy.node)}/proxy.log",
                              url=f"http://{address}:{cfg.proxy.port}",
                              extra={"mode": mode, "role": "proxy", "topology": mode,
                                     "kind": kind, "policy": policy})
    return rec, True


def quiet_nixl_threads(cluster: Cluster, records: list[ProcessRecord]) -> list[dict]:
    """With `kv_transfer.lower_nixl_threads` on, lower the NIXL progress threads of
    the prefill and decode instances among `records` (nice 19, 0.1 ms slice), put each
    one's worker main thread back on its configured CPUs on the CPU build
    (`on_node.nixl_threads.repin`), and record in each instance's record
    (`extra["nixl_threads"]`) which threads got which policy or CPUs; the rows of all of
    them (instance, role, node, process, thread, tid, before, policy). Safe to call
    again: threads found before are reported with their policy now (and what the first
    call found before), new ones are set. [] when the setting is off."""
    if not cluster.cfg.lower_nixl_threads():
        return []
    binds = {s.name: s.cpu_bind for s in cluster.cfg.instances("disaggregated")}
    rows = []
    for given in records:
        role = given.extra.get("role")
        rec = cluster.state.get(given.name)  # what earlier calls recorded
        if (given.kind != "vllm" or role not in ("prefill", "decode") or rec is None
                or rec.pid != given.pid or not cluster.knows(rec.node)):
            continue
        known = {t["tid"]: t for t in rec.extra.get("nixl_threads", [])}
        bind = binds.get(rec.name) if cluster.cfg.vllm.device == "cpu" else None
        found = cluster.node(rec.node).run_sent(nixl_threads, "quiet", str(rec.pgid),
                                             bind or "-", *map(str, known))
        now = {t["tid"]: t for t in json.loads(found)}
        for tid in set(known) - set(now):
            known[tid]["policy"] = "gone"
        for tid, t in now.items():
            first = known.get(tid, {})
            known[tid] = {**first, **t}
            if "before" in first:  # what the first call found stays
                known[tid]["before"] = first["before"]
        rec.extra["nixl_threads"] = list(known.values())
        cluster.state.add(rec)
        rows += [{"instance": rec.name, "role": role, "node": rec.node, **t}
                 for t in rec.extra["nixl_threads"]]
    return rows


def cleanup(cluster: Cluster | LabConfig) -> list[str]:
    """Stop everything recorded for the profile; safe to call any number of times."""
    with as_cluster(cluster) as cluster:
        return cluster.stop(cluster.running())


@contextlib.contextmanager
def topology_running(cluster: Cluster, topology: str, *, show_progress: bool = True,
                     kv_buffer_device: str | None = None) -> Iterator[list[ProcessRecord]]:
    """Serve `topology` for the duration of a `with` block, then stop it."""
    records = serve(cluster, topology, show_progress=show_progress,
                    kv_buffer_device=kv_buffer_device)
    try:
        yield records
    finally:
        cluster.stop(records)


def urls(records: list[ProcessRecord], role: str) -> list[str]:
    return [r.url for r in records if r.extra.get("role") == role and r.url]
