"""The measuring steps of the serving notebooks (01, 03, 04), one call per cell.

The steps are the same for every architecture: one request shown in detail
(`single_request`), the configured sweep and the mixed long/short workload
(`run_sweep`), all with one load generator and one workload, so 01, 03 and 04 are
comparable. Then each notebook's own: 01's decode roofline, engine profile and reference
outputs; 04's proof of transfer and its reading (`conclude_transfer`); and each
notebook's conclusions from its recorded results (`conclude`).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import time

import httpx
import pandas as pd
from matplotlib.figure import Figure

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError, ProcessFailedError
from lab_utils.forecast.profile import measure_profile
from lab_utils.kv.budget import kv_buffer_device, model_hf_config
from lab_utils.kv.shapes import kv_shape
from lab_utils.measure import roofline as hardware
from lab_utils.measure.benchmark import CacheCounts, sweep
from lab_utils.measure.loadgen import RequestSpec, auth_headers, run_point, run_sync
from lab_utils.measure.prompts import exact_prompt
from lab_utils.measure.workload import build_requests
from lab_utils.notebook import lessons
from lab_utils.notebook import transfer_lesson as lesson
from lab_utils.notebook.record import say
from lab_utils.notebook.session import tokenizer_of
from lab_utils.notebook.time_split import cpu_now
from lab_utils.on_node import nixl_threads as nixl_threads_mod
from lab_utils.results import (
    Proof,
    Reference,
    ResultsEnvelope,
    Roofline,
    calibration,
    load_optional,
    load_results,
)
from lab_utils.results.claims import claim, save_claims
from lab_utils.results.forecast import EngineProfile
from lab_utils.results.sweep import BenchmarkResult, RequestRecord, SweepCpu
from lab_utils.serve.metrics import fetch_metrics, read_counters
from lab_utils.serve.pd import complete, prove_via_proxy
from lab_utils.serve.topology import Served, quiet_nixl_threads
from lab_utils.serve.tp import stop_lone_ranks
from lab_utils.util.numbers import fmt_num, titled

REFERENCE_LENGTHS = (48, 96, 160, 224)  # the prompts whose greedy output 01 records
REFERENCE_TOKENS = 16


def single_request(cfg: LabConfig, served: Served) -> RequestRecord:
    """One streamed request of the workload's shape, measured in detail."""
    tokenize, _ = tokenizer_of(served, cfg)
    w = cfg.workload
    spec = RequestSpec(exact_prompt(tokenize, w.input_len, random.Random(w.seed + 7)), w.output_len)
    records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, [spec], concurrency=1,
                                       timeout_s=w.request_timeout_s, show_progress=False,
                                       api_key=api_key(cfg, "proxy")))
    return records[0]


def cache_meter(served: Served):
    """A reader of `served`'s instances' prompt-token counters (`CacheCounts`: instance ->
    prompt tokens, of them prefix-cache hits); an instance whose counters cannot be read
    (a vLLM without the by-source counter) is left out."""
    instances = [(r.name, r.url) for r in served.instance_records() if r.url]

    def read() -> CacheCounts:
        out = {}
        for name, url in instances:
            with contextlib.suppress(LabError):
                c = read_counters(fetch_metrics(url), require_nixl=False)
                out[name] = (c.prompt_tokens, c.prompt_tokens_local_cache_hit)
        return out

    return read


def run_name(served: Served, run: str) -> str:
    """The seed namespace of a run: the topology (so the notebook), the run's kind
    ("sweep", "policy round_robin", ...) and, from the second time on the instances of one
    session, its number (`Served.runs`, the session's count): a run made again gets
    prompts of its own."""
    name = f"{served.topology}/{run}"
    served.runs[name] += 1
    return name if served.runs[name] == 1 else f"{name}#{served.runs[name]}"


def run_sweep(cfg: LabConfig, served: Served, *, mixed: bool = False,
              workload=None, run: str = "sweep") -> BenchmarkResult:
    """The configured workload (or `workload`) through the proxy; mixed: at the highest
    concurrency only, one long prompt every `mixed_long_every` requests. `run` names the run (its prompts are its own, `run_name`); every repeat records the instances'
    prefix-cache hit share, and hits make it invalid (`benchmark.mark_cache_hits`)."""
    tokenize, detokenize = tokenizer_of(served, cfg)
    w = workload or cfg.workload
    if w.dataset:  # the config's paths are read against the checkout
        w = w.model_copy(update={"dataset": str(cfg.resolve_path(w.dataset))})
    if mixed:
        w = w.model_copy(update={"concurrency": [max(w.concurrency or [1])], "request_rates": []})
    print(f"workload: {w.describe(mixed)}")
    nixl_threads(cfg, served)  # threads that appeared since the start are set too
    cpu_before, started = cpu_now(cfg, served), time.monotonic()
    result = sweep(served.proxy_url, cfg.model.name,
                   lambda n, seed: build_requests(w, n, tokenize, detokenize, mixed=mixed,
                                                  seed=seed, max_model_len=cfg.vllm.max_model_len),
                   w, mixed=mixed, api_key=api_key(cfg, "proxy"), run=run_name(served, "mixed" if mixed and run == "sweep" else run),
                   cache_meter=cache_meter(served),
                   # chat requests share the chat template's first tokens, and a dataset's
                   # prompts come back at later points: those hits are the workload's own,
                   # recorded but not a reason to reject the run
                   hits_expected=w.chat or bool(w.dataset and not mixed))
    if cpu_before is not None and (cpu_after := cpu_now(cfg, served)) is not None:
        result.cpu = SweepCpu(
            wall_s=time.monotonic() - started, host_cores=os.cpu_count() or 1,
            by_process={k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after})
    if any(p.summary.failed for p in result.points):
        check_alive(cfg, served)
    if mixed:
        print(first_tokens_line(result, w))
    return result


def first_tokens_line(result: BenchmarkResult, w) -> str:
    """A mixed run's first tokens by kind at its load: the long prompts', the short ones',
    and how many short ones took over five times the fastest short one (a median over all requests
    lands between the two humps)."""
    load = max((p.value for p in result.combined if p.mode == "concurrency"), default=None)
    if load is None:
        return "first tokens by kind: no load point measured"
    firsts = result.first_tokens(load, w.long_len)
    long = [v for rep in firsts[True] for v in rep]
    short = [v for rep in firsts[False] for v in rep]
    if not long or not short:
        return "first tokens by kind: not both kinds completed"
    slow = sum(v > 5 * min(short) for v in short)
    return (f"first tokens at concurrency {load:g}, by kind: the {w.long_len:,}-token prompts' "
            f"median {fmt_num(statistics.median(long))} ms ({len(long)} requests); the short "
            f"prompts' median {fmt_num(statistics.median(short))} ms ({len(short)}), of which "
            f"{slow} took over five times as long as the fastest short one "
            f"({fmt_num(min(short))} ms). A median "
            "over all requests lands between the two.")


def nixl_threads(cfg: LabConfig, served: Served) -> list[dict]:
    """Lower the NIXL progress threads of `served`'s prefill and decode instances to the
    lowest normal priority again (new ones too) when `kv_transfer.lower_nixl_threads` is on; one row per
    thread: instance, role, node, process, thread, tid, policy (`serve.topology.quiet_nixl_threads`).
    [] for a topology without NIXL or with the setting off."""
    if served.topology != "disaggregated":
        return []
    with Cluster(cfg) as cluster:
        return quiet_nixl_threads(cluster, served.records)


def nixl_thread_state(cfg: LabConfig) -> str:
    """What NIXL's progress threads did in this profile's P/D run (`lessons.NIXL_THREADS`):
    "lowered" or "busy" when a busy one was found (or no delay is set), "waiting" when the
    lab set a progress delay and found none busy."""
    with Cluster(cfg) as cluster:
        found = nixl_threads_mod.busy_only(
            t for r in cluster.running() if r.extra.get("role") in ("prefill", "decode")
            for t in r.extra.get("nixl_threads", []))
    if found or not cfg.nixl_progress_delay_us():
        return "lowered" if cfg.lower_nixl_threads() else "busy"
    return "waiting"


def nixl_threads_frame(cfg: LabConfig, served: Served) -> pd.DataFrame:
    """Notebook 04's table of NIXL's progress threads: which thread of which instance got
    which scheduling policy (set again now, so threads that appeared since are in it), and
    the worker main threads put back on their CPUs."""
    rows = nixl_threads(cfg, served)
    delay, busy = cfg.nixl_progress_delay_us(), nixl_threads_mod.busy_only(rows)
    if delay:
        print(f"NIXL's progress threads wait in poll() up to {math.ceil(delay / 1000)} ms "
              f"between rounds (kv_transfer.nixl_progress_delay_us = {delay})"
              + ("" if not cfg.lower_nixl_threads() else
                 ": none of them keeps a core busy" if not busy else
                 f", yet {len(busy)} thread(s) polled without pause (each instance's log "
                 "says, in lines starting 'lab:', whether the delay was set in its processes); "
                 "they are lowered instead (below)"))
    if not cfg.lower_nixl_threads():
        print("kv_transfer.lower_nixl_threads is off for this profile: NIXL's progress threads "
              "keep their normal priority")
    elif not busy and not delay:
        print("no busy NIXL progress thread was found in the prefill or decode instances")
    if rows:
        print("Below, each thread the lab set (the model's threads put on their configured "
              "CPUs, any busy NIXL thread lowered; one that already had them shows the same "
              "before and now): what it had before and what it has now.")
    cols = ["instance", "role", "node", "process", "thread", "tid", "before", "policy"]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows],
                        columns=cols).rename(columns={"policy": "now"})


def check_alive(cfg: LabConfig, served: Served, lines: int = 8) -> None:
    """Raise, naming the process and its log's last lines, if one of `served`'s processes
    has died (a sweep whose requests failed asks this before anything else)."""
    with Cluster(cfg) as cluster:
        dead = [rec for rec in served.records
                if cluster.knows(rec.node) and not cluster.node(rec.node).is_alive(rec)]
        if not dead:
            return
        said = []
        for rec in dead:  # every one: a split model's rank takes the others down with it
            tail = cluster.node(rec.node).log_tail(rec, lines).rstrip()
            left = cluster.node(rec.node).stop(rec, 5.0)  # its engine, workers: orphans
            said.append(f"{rec.name} on {rec.node} stopped during the sweep"
                        + (" (the processes it left running were stopped)" if left else "")
                        + f"; its log {rec.log_path} ends with:\n{tail}")
        lone = stop_lone_ranks(cluster, served.records)
        raise ProcessFailedError("\n".join(said) + (f"\n{lone}" if lone else "")
                                 + "\nSo its requests failed. Re-run the cell that starts the "
                                 "topology, then the sweep.")


def reference_outputs(cfg: LabConfig, served: Served) -> Reference:
    """Fresh prompts (a new seed each run, recorded) and their greedy tokens, one at a
    time through the proxy: what notebook 04's prefill/decode output must equal."""
    tokenize, _ = tokenizer_of(served, cfg)
    seed = random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    prompts = [exact_prompt(tokenize, n, rng) for n in REFERENCE_LENGTHS]
    with httpx.Client(timeout=cfg.workload.request_timeout_s,
                      headers=auth_headers(api_key(cfg, "proxy"))) as client:
        tokens = [complete(client, served.proxy_url, cfg.model.name, p, REFERENCE_TOKENS)
                  for p in prompts]
    return Reference(seed=seed, max_tokens=REFERENCE_TOKENS, prompts=prompts, tokens=tokens)


def prove_kv_transfer(cfg: LabConfig, served: Served, reference: Reference) -> list:
    """Notebook 01's reference prompts through the P/D proxy with counter deltas."""
    kv = kv_shape(model_hf_config(cfg), cfg.model.dtype)
    return prove_via_proxy(reference.prompts, reference.tokens, model=cfg.model.name,
                           proxy_url=served.proxy_url, decode_urls=served.urls("decode"), kv=kv,
                           max_tokens=reference.max_tokens,
                           timeout=cfg.workload.request_timeout_s,
                           strict=cfg.vllm.device == "cpu", api_key=api_key(cfg, "proxy"),
                           instance_key=api_key(cfg, "vllm"))


def profile_engine(cfg: LabConfig, served: Served, gpu_name: str | None = None) -> EngineProfile:
    """The engine profile the forecasts of 03 and 04 are made from
    (`lab_utils.forecast.profile`), with its table. Its proxy hop is the proxy's
    per-request cost, recorded in the proxy node's calibration record
    (`results.calibration`) for the forecasts made before 01 (published GB10 figures)."""
    proxy = next((r for r in served.records if r.kind == "proxy"), None)
    inst = served.instance_records()[0]
    profile = measure_profile(cfg, inst, served.proxy_url, tokenizer_of(served, cfg)[0],
                              gpu_name, proxy.pgid if proxy else None)
    calibration.record_proxy(cfg, proxy.node if proxy else cfg.proxy.node, profile.hop,
                             backend=inst.node)
    return profile


def decode_roofline(cfg: LabConfig, gpu_name: str | None) -> Roofline:
    """Decode's ceiling per stream: memory bandwidth / bytes of weights read per token
    (`gpu_name`: notebook 00's, `require_environment(cfg).gpu_name`)."""
    bw, source = hardware.memory_bandwidth(cfg, gpu_name)
    weights = hardware.weight_bytes(cfg)
    roof = Roofline(memory_bandwidth_GBps=bw, bandwidth_source=source, weight_bytes=weights,
                    max_tokens_per_s_per_stream=bw * 1e9 / weights if bw and weights else None)
    say(cfg, "01:roofline", [claim(
        "01", f"{bw or 0:.1f} GB/s ({source}) over {weights / 1e9:.3g} GB of {cfg.model.name}'s "
        f"weights read per step: at most {roof.max_tokens_per_s_per_stream or 0:,.0f} tokens/s "
        "per stream", figures={"GBps": bw, "weight_bytes": weights})])
    return roof


def plot_decode_roofline(result: BenchmarkResult, roof: Roofline, device: str | None = None):
    """Decode tokens/s per stream (1000 / median TPOT) against the memory roofline
    (`device`: the profile's, named in the title on the CPU rehearsal)."""
    points = [(c.value, tpot) for c in result.combined
              if c.mode == "concurrency" and (tpot := c.median("median_tpot_ms"))]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.plot([v for v, _ in points], [1000.0 / t for _, t in points], "o-",
            label="measured: 1000 / median TPOT")
    if roof.max_tokens_per_s_per_stream and roof.weight_bytes:
        ax.axhline(roof.max_tokens_per_s_per_stream, ls="--", color="grey",
                   label=f"roofline: {roof.memory_bandwidth_GBps:.0f} GB/s / "
                         f"{roof.weight_bytes / 1e9:.3g} GB of weights")
        ax.set_yscale("log")
    ax.set(xlabel="concurrent requests", ylabel="decode tokens/s per stream",
           title=titled("Decode speed per stream vs the memory-bandwidth bound", device))
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def proof_record(proofs: list) -> Proof:
    """The proof of transfer as notebook 04 records it."""
    return Proof(ok=bool(proofs) and all(p.ok for p in proofs), prompts=[p.row() for p in proofs])


def proof_frame(proofs: list):
    return pd.DataFrame([{
        "prompt tokens": p.prompt_tokens, "via NIXL": p.external_kv_transfer,
        "computed": p.local_compute, "cache hit": p.local_cache_hit, "NIXL bytes": p.nixl_bytes,
        "expected bytes": p.expected_bytes, "transfer ms": round(p.nixl_xfer_ms, 2),
        "same tokens as 01": p.tokens_match, "diverged at output token (from 0)": p.verdict.diverged_at,
        "log-probability gap (nats)": p.verdict.margin, "tokens": p.verdict.why, "ok": p.ok}
        for p in proofs])


def conclude(cfg: LabConfig, notebook: str) -> list[str]:
    """Notebook `notebook`'s conclusions from its recorded results (and the ones it compares
    with), printed, saved as claims beside the results (`claims.json`, checked by `audit`)
    and returned (`lab_utils.notebook.lessons`)."""
    device = cfg.vllm.device
    if notebook == "01":
        said = lessons.conclude_01(load_results(cfg, "01").payload, device)
    elif notebook == "02":
        said = lessons.conclude_02(load_results(cfg, "02").payload, cfg.workload.input_len)
    elif notebook == "03":
        rep = load_results(cfg, "03").payload
        said = lessons.conclude_03(load_results(cfg, "01").payload.sweep, rep.sweep, rep.mixed,
                                   device, rep.forecast, rep.policy, rep.policies)
    elif notebook == "04":
        dis, rep03 = load_results(cfg, "04").payload, load_optional(cfg, "03")
        said = lessons.conclude_04(rep03.payload.sweep if rep03 else None, dis.sweep,
                                   rep03.payload.mixed if rep03 else None, dis.mixed, dis.proof,
                                   device, load_results(cfg, "01").payload,
                                   nixl_thread_state(cfg), dis.forecast,
                                   rep03.payload.policies if rep03 else None,
                                   rep03.payload.policy if rep03 else None)
    elif notebook == "tp":
        tp = load_results(cfg, "tp").payload
        others = {name: env.payload.sweep for name, nb in (("replicated", "03"),
                                                            ("disaggregated", "04"))
                  if (env := load_optional(cfg, nb)) is not None}
        said = lessons.conclude_tp(load_results(cfg, "01").payload.sweep, tp, others, device)
    else:
        raise LabError(f"no conclusions for notebook {notebook!r} (01-04, tp)")
    save_claims(cfg.results_dir, notebook, said)
    print(lessons.conclusions_of(said))
    return [c.text for c in said]


def conclude_transfer(cfg: LabConfig, proof: Proof, kv: ResultsEnvelope,
                      baseline: ResultsEnvelope, *results: BenchmarkResult,
                      went: dict | None = None):
    """Notebook 04's reading of its own run (`lab_utils.notebook.transfer_lesson`): the
    table of the proof's moves against 02, and the sentences drawn from it, the first
    sweep's concurrency-1 TTFT against 01's, which part of TTFT dominated (from `went`,
    `time_split.where_time_went`), and a note if any run stood still."""
    rows = lesson.transfer_rows(proof, kv.payload, kv_buffer_device(cfg))
    split = went["said"][1] if went else None
    said = lesson.conclusions(rows, lesson.hop_cost(baseline.payload.sweep, results[0], proof),
                              split)
    if note := lesson.stall_note(*results):
        said += ["", note]
    save_claims(cfg.results_dir, "04:transfer", [claim("04", t) for t in said if t])
    # the probe's time at the same size exists only where 02 probed that exact size
    return pd.DataFrame(rows).dropna(axis=1, how="all").round(3), said
