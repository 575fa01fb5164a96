"""What the serving notebooks (01, 03, 04) do, one call per step.

`ServingSession` starts a topology with the lab proxy in front (every architecture is
measured through the same proxy path) and stops what it started: in the notebook's last
cell, when any later cell fails or is interrupted (an IPython hook), and when the kernel
exits. It holds the notebook's one `Cluster` (one connection per node), closed when it
stops. The measuring steps are the same for every architecture: one request shown in
detail, the configured sweep, the mixed long/short workload, all with one load generator
and one workload, so 01, 03 and 04 are comparable. `record_baseline`, `record_replicated`
and `record_disaggregated` build each notebook's results (`lab_utils.payloads`) from what
it measured and write them.
"""

from __future__ import annotations

import atexit
import contextlib
import random
from dataclasses import dataclass
from pathlib import Path

from lab_utils.cluster import Cluster
from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError
from lab_utils.forecast.profile import EngineProfile
from lab_utils.forecast.run import Forecast
from lab_utils.kv.budget import choose_buffer_device, model_hf_config
from lab_utils.kv.shapes import kv_shape
from lab_utils.measure.benchmark import BenchmarkResult, sweep
from lab_utils.measure.loadgen import RequestRecord, RequestSpec, auth_headers, run_point, run_sync
from lab_utils.measure.prompts import exact_prompt
from lab_utils.measure.workload import build_requests, server_tokenizer
from lab_utils.payloads import (
    BaselinePayload,
    DisaggregatedPayload,
    FrontDoors,
    Instance,
    Proof,
    Reference,
    ReplicatedPayload,
    Roofline,
)
from lab_utils.results import ResultsEnvelope, load_optional, load_results, write_results
from lab_utils.serve.launcher import wait_ready
from lab_utils.serve.topology import PROXY, serve, start_proxy, urls

REFERENCE_LENGTHS = (48, 96, 160, 224)  # the prompts whose greedy output 01 records
REFERENCE_TOKENS = 16


def kv_buffer_device(cfg: LabConfig) -> str:
    """The kv_buffer_device prefill and decode instances get: the configured one, or for
    "auto" notebook 02's recommendation on this profile (else "cpu")."""
    recommendation = None
    if cfg.kv_transfer.kv_buffer_device == "auto":
        kv = load_optional(cfg, "02")
        recommendation = kv.payload.recommendation if kv else None
    return choose_buffer_device(cfg, recommendation)


@dataclass
class Served:
    topology: str
    records: list[ProcessRecord]
    kv_buffer_device: str | None = None  # what prefill and decode instances were given

    @property
    def proxy_url(self) -> str:
        url = next(r.url for r in self.records if r.name == PROXY)
        assert url is not None  # the proxy's record has its URL
        return url

    def urls(self, role: str) -> list[str]:
        return urls(self.records, role)

    def instance_urls(self) -> list[str]:
        return [r.url for r in self.records if r.kind == "vllm" and r.url is not None]


class ServingSession:
    """Starts topologies for one notebook and guarantees they stop with it."""

    def __init__(self, cfg: LabConfig):
        self.cfg = cfg
        self.cluster = Cluster(cfg)
        self.started: list[ProcessRecord] = []
        self._hooked = False
        atexit.register(self.stop, quiet=True)

    def start(self, topology: str) -> Served:
        """Start (or reuse) the topology and the proxy; wait until all are healthy."""
        self._hook()
        print(f"starting {topology} on {self.cfg.profile} (a vLLM instance takes 15-90 s "
              "to start on the CPU rehearsal, minutes for a large model)", flush=True)
        before = {r.name for r in self.cluster.running()}
        device = kv_buffer_device(self.cfg) if topology == "disaggregated" else None
        records = serve(self.cluster, topology, with_proxy=True, kv_buffer_device=device)
        self.started += [r for r in records if r.name not in before]
        for r in records:
            print(f"  {r.name:<12} {r.node:<12} {r.url}")
        return Served(topology, records, device)

    def swap_front_door(self, served: Served, kind: str, policy: str | None = None) -> None:
        """Put the front door of `kind` ("lab" or "vllm-router"; `policy`: the replicated
        routing policy) in front of `served`'s instances, on the same port, replacing the
        one there; wait until it is healthy."""
        old = next(r for r in served.records if r.name == PROXY)
        rec, new = start_proxy(self.cluster, served.topology, kind=kind, policy=policy)
        if new:
            wait_ready(self.cluster, [rec], timeout=120, show_progress=False)
        served.records = [rec if r is old else r for r in served.records]
        if old in self.started or new:
            self.started = [r for r in self.started if r is not old] + [rec]

    def stop(self, quiet: bool = False) -> list[str]:
        """Stop what this session started (not instances it found running), and close the
        connections to the nodes (a later `start` opens them again)."""
        stopped = self.cluster.stop(list(reversed(self.started))) if self.started else []
        self.started = []
        self.cluster.close()
        if stopped and not quiet:
            print(f"stopped: {', '.join(stopped)}")
        return stopped

    def _hook(self) -> None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None or self._hooked:
            return
        shell.events.register("post_run_cell", self._after_cell)
        self._hooked = True

    def _after_cell(self, result) -> None:
        if (result.error_in_exec or result.error_before_exec) and self.started:
            names = self.stop(quiet=True)
            print(f"a cell failed or was interrupted: stopped {', '.join(names)}. Fix the "
                  "cause and re-run from the cell that starts the topology.")


def tokenizer_of(served: Served, cfg: LabConfig):
    """Tokenize with the serving instance itself (no local copy of the model needed)."""
    return server_tokenizer(served.instance_urls()[0], cfg.model.name, api_key(cfg, "vllm"))


def single_request(cfg: LabConfig, served: Served) -> RequestRecord:
    """One streamed request of the workload's shape, measured in detail."""
    tokenize, _ = tokenizer_of(served, cfg)
    w = cfg.workload
    spec = RequestSpec(exact_prompt(tokenize, w.input_len, random.Random(w.seed + 7)), w.output_len)
    records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, [spec], concurrency=1,
                                       timeout_s=w.request_timeout_s, show_progress=False,
                                       api_key=api_key(cfg, "proxy")))
    return records[0]


def describe(rec: RequestRecord) -> str:
    if rec.error:
        return f"the request failed: {rec.error}"
    itl = sorted(rec.itl_ms)
    together = (f"; {rec.read_together} of them 0 ms: tokens the client read together, late"
                if rec.read_together else "")
    return (f"prompt {rec.prompt_tokens or rec.prompt_len} tokens, {rec.completion_tokens} "
            f"generated\n  TTFT {rec.ttft_ms:.1f} ms (queue + prefill + first token)\n"
            f"  TPOT {rec.tpot_ms:.2f} ms per output token after the first\n"
            f"  ITL  median {itl[len(itl) // 2]:.2f} ms, max {itl[-1]:.2f} ms "
            f"({len(itl)} gaps{together})\n  end-to-end {rec.e2el_ms:.1f} ms")


def eta_inputs(cfg: LabConfig):
    """The forecast inputs an ETA is made from, 01's machine's cores (`architecture_of`
    applies them where the nodes share it) and where the inputs come from: 01's profile when it exists, else on a GPU profile the published
    GB10 figures; None when neither applies (the CPU rehearsal before 01)."""
    from lab_utils.forecast.inputs import from_results, spark_inputs_for

    base = load_optional(cfg, "01")
    profile = base.payload.profile if base else None
    if profile is not None:
        kv = load_optional(cfg, "02")
        return (from_results(profile, kv.payload if kv else None, kv_buffer_device(cfg)),
                profile.host_cores, "01's engine profile")
    if cfg.vllm.device == "cuda":
        return spark_inputs_for(cfg.model.name, cfg.workload), None, "published GB10 figures"
    return None


def eta(cfg: LabConfig, topology: str, w, mixed: bool = False) -> str | None:
    """'about N min (...)': the forecast model's time for this sweep; None: no inputs yet."""
    from lab_utils.forecast.run import architecture_of
    from lab_utils.forecast.timing import minutes, sweep_seconds

    found = eta_inputs(cfg)
    if found is None:
        return None
    inputs, cores, source = found
    secs = sweep_seconds(inputs, architecture_of(cfg, topology, cores), w, mixed=mixed)
    return f"about {minutes(secs)} (forecast from {source})"


def eta_lines(cfg: LabConfig) -> list[str]:
    """What `python -m lab_utils eta` prints: the predicted measuring time of 01, 03 and 04
    with this config's workload (one line saying why not, when there is nothing to
    predict from)."""
    from lab_utils.forecast.timing import minutes, notebook_seconds

    found = eta_inputs(cfg)
    if found is None:
        return ["nothing to predict from yet: run notebook 01 (its engine profile), or use a "
                "GPU profile (published GB10 figures)"]
    inputs, cores, source = found
    times = notebook_seconds(inputs, cfg, cores)
    w = cfg.workload
    lines = [f"predicted measuring time per notebook, forecast from {source}, workload "
             f"{w.input_len} in / {w.output_len} out, concurrency {w.concurrency}, "
             f"{w.num_prompts} prompts x {w.repeats} repeat(s)"
             + (f", mixed {w.mixed_long_len} every {w.mixed_long_every}"
                if w.mixed_long_len else "")]
    lines += [f"  {nb}: {minutes(secs)}" for nb, secs in times.items()]
    lines.append(f"  total: {minutes(sum(times.values()))} (instance start-up, the checklist, "
                 "the probe and reading time come on top)")
    return lines


def run_sweep(cfg: LabConfig, served: Served, *, mixed: bool = False,
              workload=None) -> BenchmarkResult:
    """The configured workload (or `workload`) through the proxy; mixed: at the highest
    concurrency only, one long prompt every `mixed_long_every` requests. Prints the
    predicted time first (`eta`) when there is something to predict it from."""
    tokenize, detokenize = tokenizer_of(served, cfg)
    w = workload or cfg.workload
    with contextlib.suppress(LabError, ValueError):
        if (when := eta(cfg, served.topology, w, mixed)) is not None:
            print(f"{'mixed run' if mixed else 'sweep'}: {when}", flush=True)
    if mixed:
        w = w.model_copy(update={"concurrency": [max(w.concurrency or [1])], "request_rates": []})
    result = sweep(served.proxy_url, cfg.model.name,
                   lambda n, seed: build_requests(w, n, tokenize, detokenize, mixed=mixed,
                                                  seed=seed),
                   w, mixed=mixed, api_key=api_key(cfg, "proxy"))
    if any(p.summary.get("failed") for p in result.points):
        check_alive(cfg, served)
    return result


def check_alive(cfg: LabConfig, served: Served, lines: int = 8) -> None:
    """Raise, naming the process and its log's last lines, if one of `served`'s processes
    has died (a sweep whose requests failed asks this before anything else)."""
    from lab_utils.errors import ProcessFailedError

    with Cluster(cfg) as cluster:
        for rec in served.records:
            if cluster.knows(rec.node) and not cluster.node(rec.node).is_alive(rec):
                tail = cluster.node(rec.node).log_tail(rec, lines).rstrip()
                raise ProcessFailedError(
                    f"{rec.name} on {rec.node} stopped during the sweep, so its requests "
                    f"failed; its log {rec.log_path} ends with:\n{tail}\nRe-run the cell "
                    "that starts the topology, then the sweep.")


SWEEP_COLUMNS = {"request_throughput": "req/s", "output_throughput": "output tok/s",
                 "median_ttft_ms": "TTFT p50 (ms)", "p99_ttft_ms": "TTFT p99 (ms)",
                 "median_tpot_ms": "TPOT p50 (ms)", "median_itl_ms": "ITL p50 (ms)",
                 "p99_itl_ms": "ITL p99 (ms)"}


def sweep_frame(result: BenchmarkResult):
    """One row per load point: the headline metrics with units, whether the point is
    valid, and the spread (the widest max - min over repeats, in % of the median, among
    the metrics shown)."""
    import pandas as pd

    rows = []
    for c in result.combined:
        row = {"load": f"{c['mode']} {c['value']:g}", "valid": c["valid"]}
        row.update({label: c.get(k) for k, label in SWEEP_COLUMNS.items()})
        spreads = [c[f"{k}_spread"] / c[k] * 100 for k in SWEEP_COLUMNS
                   if c.get(k) and c.get(f"{k}_spread") is not None]
        row["spread %"] = max(spreads) if spreads and c.get("repeats", 1) > 1 else None
        rows.append(row)
    return pd.DataFrame(rows).round(2)


def reference_outputs(cfg: LabConfig, served: Served) -> Reference:
    """Fresh prompts (a new seed each run, recorded) and their greedy tokens, one at a
    time through the proxy: what notebook 04's prefill/decode output must equal."""
    import httpx

    from lab_utils.serve.pd import complete

    tokenize, _ = tokenizer_of(served, cfg)
    seed = random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    prompts = [exact_prompt(tokenize, n, rng) for n in REFERENCE_LENGTHS]
    with httpx.Client(timeout=cfg.workload.request_timeout_s,
                      headers=auth_headers(api_key(cfg, "proxy"))) as client:
        tokens = [complete(client, served.proxy_url, cfg.model.name, p, REFERENCE_TOKENS)
                  for p in prompts]
    return Reference(seed=seed, max_tokens=REFERENCE_TOKENS, prompts=prompts, tokens=tokens)


def prove_transfer(cfg: LabConfig, served: Served, reference: Reference) -> list:
    """Notebook 01's reference prompts through the P/D proxy with counter deltas."""
    from lab_utils.serve.pd import prove_via_proxy

    kv = kv_shape(model_hf_config(cfg), cfg.model.dtype)
    return prove_via_proxy(reference.prompts, reference.tokens, model=cfg.model.name,
                           proxy_url=served.proxy_url, decode_urls=served.urls("decode"), kv=kv,
                           max_tokens=reference.max_tokens,
                           timeout=cfg.workload.request_timeout_s,
                           strict=cfg.vllm.device == "cpu", api_key=api_key(cfg, "proxy"),
                           instance_key=api_key(cfg, "vllm"))


def measure_profile(cfg: LabConfig, served: Served, gpu_name: str | None = None) -> EngineProfile:
    """The engine profile the forecasts of 03 and 04 are made from
    (`lab_utils.forecast.profile`), with its table."""
    from lab_utils.forecast.profile import measure_profile as measure

    return measure(cfg, served, tokenizer_of(served, cfg)[0], gpu_name)


def make_forecast(cfg: LabConfig, kind: str) -> Forecast:
    """Forecast `kind` ("replicated" or "disaggregated") from 01's profile and 02's
    results, and nothing else."""
    from lab_utils.forecast.run import forecast_for

    kv = load_optional(cfg, "02")
    return forecast_for(cfg, kind, load_results(cfg, "01").payload.profile,
                        kv.payload if kv else None, kv_buffer_device(cfg))


def forecast(cfg: LabConfig, kind: str) -> Forecast:
    """`make_forecast`, printed, for the notebook to record before it measures."""
    from lab_utils.forecast.run import show

    fc = make_forecast(cfg, kind)
    show(fc)
    return fc


def profile_frame(profile: EngineProfile):
    from lab_utils.forecast.profile import profile_frame as frame

    return frame(profile)


def grade(fc: Forecast, result: BenchmarkResult, mixed: BenchmarkResult | None = None):
    """The forecast against this notebook's measurements: what it says, and the table."""
    from lab_utils.forecast import grade as g

    rows = g.grade_rows(fc, {"standard": result, "mixed": mixed})
    print("\n".join(g.sentences(fc.architecture, rows)))
    return g.grade_frame(rows)


def roofline(cfg: LabConfig, gpu_name: str | None) -> Roofline:
    """Decode's ceiling per stream: memory bandwidth / bytes of weights read per token
    (`gpu_name`: notebook 00's, `require_environment(cfg).gpu_name`)."""
    from lab_utils.measure import roofline as hardware

    bw, source = hardware.memory_bandwidth(cfg, gpu_name)
    weights = hardware.weight_bytes(cfg)
    return Roofline(memory_bandwidth_GBps=bw, bandwidth_source=source, weight_bytes=weights,
                    max_tokens_per_s_per_stream=bw * 1e9 / weights if bw and weights else None)


def plot_decode_roofline(result: BenchmarkResult, roof: Roofline):
    """Decode tokens/s per stream (1000 / median TPOT) against the memory roofline."""
    from matplotlib.figure import Figure

    points = [c for c in result.combined if c["mode"] == "concurrency" and c.get("median_tpot_ms")]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.plot([c["value"] for c in points], [1000.0 / c["median_tpot_ms"] for c in points], "o-",
            label="measured: 1000 / median TPOT")
    if roof.max_tokens_per_s_per_stream:
        assert roof.weight_bytes is not None  # the bound is computed from it
        ax.axhline(roof.max_tokens_per_s_per_stream, ls="--", color="grey",
                   label=f"roofline: {roof.memory_bandwidth_GBps:.0f} GB/s / "
                         f"{roof.weight_bytes / 1e9:.3g} GB of weights")
        ax.set_yscale("log")
    ax.set(xlabel="concurrent requests", ylabel="decode tokens/s per stream",
           title="Decode speed per stream vs the memory-bandwidth bound")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def instances(served: Served) -> list[Instance]:
    """The processes serving the topology, as the results record them."""
    return [Instance(name=r.name, node=r.node, url=r.url, kind=r.kind, role=r.extra.get("role"))
            for r in served.records]


def record_baseline(cfg: LabConfig, served: Served, result: BenchmarkResult, *,
                    single: RequestRecord, roofline: Roofline, reference: Reference,
                    profile: EngineProfile | None = None) -> Path:
    """Write notebook 01's results: the sweep, the request shown in detail, the roofline,
    the reference outputs and the engine profile."""
    return write_results(cfg, "01", BaselinePayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=None,
        single_request=single, roofline=roofline, reference=reference, profile=profile))


def record_replicated(cfg: LabConfig, served: Served, result: BenchmarkResult,
                      mixed: BenchmarkResult | None, forecast: Forecast | None = None) -> Path:
    """Write notebook 03's results: the sweep, the mixed run, the routing policy and the
    forecast made before them."""
    return write_results(cfg, "03", ReplicatedPayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=mixed,
        policy=cfg.topology.replicated.policy, forecast=forecast))


def record_disaggregated(cfg: LabConfig, served: Served, result: BenchmarkResult,
                         mixed: BenchmarkResult | None, proof: Proof,
                         front_doors: FrontDoors | None = None,
                         forecast: Forecast | None = None) -> Path:
    """Write notebook 04's results: the sweep, the mixed run, the kv_buffer_device the
    instances were given, the proof of transfer and, when run, the front-door comparison."""
    device = served.kv_buffer_device or kv_buffer_device(cfg)
    return write_results(cfg, "04", DisaggregatedPayload(
        topology=served.topology, instances=instances(served), sweep=result, mixed=mixed,
        kv_buffer_device=device, proof=proof, front_doors=front_doors, forecast=forecast))


def compare_front_doors(cfg: LabConfig, session: ServingSession, served: Served,
                        concurrency: int | None = None) -> FrontDoors | None:
    """One sweep point (the sweep's lowest concurrency unless given), once through the
    lab's proxy, then once through vllm-router on the same port in front of the same
    instances; the lab's proxy is put back afterwards, whatever happens. None, with the reason printed,
    when vllm-router cannot stand in here."""
    from importlib.metadata import PackageNotFoundError, version

    from lab_utils.serve import router

    if cfg.proxy.api_key_file:
        print("skipped: proxy.api_key_file is set, and vllm-router checks no client key")
        return None
    try:
        got = version("vllm-router")
    except PackageNotFoundError:
        print(f"skipped: vllm-router is not installed (pip install vllm-router=={router.VERSION})")
        return None
    c = concurrency or min(cfg.workload.concurrency or [1])
    # one repeat through each: a side-by-side look, not a ranking (the sweep has the spread)
    w = cfg.workload.model_copy(update={"concurrency": [c], "request_rates": [], "repeats": 1})
    runs = {}
    try:
        for kind in ("lab", "vllm-router"):
            session.swap_front_door(served, kind)
            print(f"concurrency {c} through {'the lab proxy' if kind == 'lab' else kind} "
                  f"({w.num_prompts} requests)", flush=True)
            runs[kind] = run_sweep(cfg, served, workload=w)
    finally:
        session.swap_front_door(served, "lab")
    return FrontDoors(point=f"concurrency {c}", lab=runs["lab"], vllm_router=runs["vllm-router"],
                      router_version=got)


def compare_policies(cfg: LabConfig, session: ServingSession, served: Served):
    """03's look at routing: the mixed workload once at its highest concurrency through the
    lab proxy with each routing policy in turn (the configured one is put back after),
    side by side."""
    import pandas as pd

    w = cfg.workload
    if not w.mixed_long_len:
        print("skipped: workload.mixed_long_len is not set (the policies differ only when "
              "requests of different lengths overlap)")
        return None
    one = w.model_copy(update={"repeats": 1})
    rows = []
    try:
        for policy in ("round_robin", "least_outstanding"):
            session.swap_front_door(served, "lab", policy=policy)
            print(f"{policy}: the mixed workload at concurrency {max(w.concurrency)}", flush=True)
            c = run_sweep(cfg, served, mixed=True, workload=one).combined[0]
            rows.append({"policy": policy, **{label: c.get(k) for k, label in SWEEP_COLUMNS.items()}})
    finally:
        session.swap_front_door(served, "lab", policy=cfg.topology.replicated.policy)
    return pd.DataFrame(rows).round(2)


def compare_frame(reference: ResultsEnvelope, result: BenchmarkResult, names: tuple[str, str],
                  key: str = "sweep"):
    """Headline metrics of a reference notebook's sweep (or `key`: "mixed") and this one's,
    side by side, with the change in percent (positive: higher) and which is better (with
    "=" where the difference is within 10% or inside both repeats' ranges)."""
    import pandas as pd

    from lab_utils.lessons import differs

    keys = ["output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"]
    higher_better = {"output_throughput"}
    theirs: BenchmarkResult | None = getattr(reference.payload, key)
    if theirs is None:
        raise LabError(f"notebook {reference.notebook}'s results have no {key!r} run; re-run it")
    ref = {(c["mode"], c["value"]): c for c in theirs.combined}
    rows = []
    for c in result.combined:
        r = ref.get((c["mode"], c["value"]))
        if r is None:
            continue
        for k in keys:
            a, b = r.get(k), c.get(k)
            better = "="
            if differs(r, c, k):
                assert a is not None and b is not None  # differs() needs both
                better = names[1] if (b > a) == (k in higher_better) else names[0]
            rows.append({"load": f"{c['mode']} {c['value']:g}", "metric": SWEEP_COLUMNS[k],
                         names[0]: a, names[1]: b,
                         "change %": (b - a) / a * 100 if a and b is not None else None,
                         "better": better, "both valid": bool(r["valid"] and c["valid"])})
    return pd.DataFrame(rows).round(2)


def conclude(cfg: LabConfig, notebook: str) -> list[str]:
    """Notebook `notebook`'s conclusions from its recorded results (and the ones it compares
    with), printed and returned (`lab_utils.lessons`)."""
    from lab_utils import lessons

    device = cfg.vllm.device
    if notebook == "01":
        said = lessons.conclude_01(load_results(cfg, "01").payload, device)
    elif notebook == "02":
        said = lessons.conclude_02(load_results(cfg, "02").payload, cfg.workload.input_len)
    elif notebook == "03":
        rep = load_results(cfg, "03").payload
        said = lessons.conclude_03(load_results(cfg, "01").payload.sweep, rep.sweep, rep.mixed,
                                   device)
    elif notebook == "04":
        dis, env03 = load_results(cfg, "04").payload, load_optional(cfg, "03")
        said = lessons.conclude_04(env03.payload.sweep if env03 else None, dis.sweep,
                                   env03.payload.mixed if env03 else None, dis.mixed, dis.proof,
                                   device)
    else:
        raise LabError(f"no conclusions for notebook {notebook!r} (01-04)")
    print(lessons.conclusions_of(said))
    return said


def versus_reference(cfg: LabConfig, notebook: str, result: BenchmarkResult, key: str = "sweep"):
    """This run's sweep (or `key`: "mixed") beside the reference run's of the same notebook
    (`python -m lab_utils reference`); None, said, when no reference is loaded."""
    from lab_utils.results import load_reference_results, reference_origin

    ref = load_reference_results(cfg, notebook)
    if ref is None or getattr(ref.payload, key, None) is None:
        print("no reference run loaded for this notebook (python -m lab_utils reference DIR "
              "loads one): nothing to compare with")
        return None
    print(f"NOTE: notebook {notebook}'s comparison is with a REFERENCE run's, not this "
          f"cluster's ({reference_origin(ref.reference or {})})")
    return compare_frame(ref, result, ("reference", "yours"), key=key)


def watch_scheduler(cfg: LabConfig, served: Served):
    """01's look inside the engine (`lab_utils.hood.watch_scheduler`): the mixed workload
    once, the scheduler's queues sampled from /metrics, every request's tokens on a time
    line. Prints how a request fills the paged KV cache; returns the figure."""
    from lab_utils import hood

    tokenize, detokenize = tokenizer_of(served, cfg)
    w = cfg.workload
    print(hood.blocks_of(w.input_len + w.output_len, cfg.vllm.block_size or 16)
          + f": a request of {w.input_len} prompt + {w.output_len} output tokens")
    frame, records, fig = hood.watch_scheduler(cfg, served, tokenize, detokenize)
    if not frame.empty:
        print(f"{len(frame)} /metrics samples: at most {frame['running'].max():.0f} running and "
              f"{frame['waiting'].max():.0f} waiting; KV cache at most "
              f"{frame['KV cache used'].max():.1%} used")
    return fig


def protocol_by_hand(cfg: LabConfig, served: Served):
    """04's look at what travels (`lab_utils.hood`): one fresh prompt through prefill and
    decode by hand, the kv_transfer_params printed; the instances' command lines and KV
    environment; which connector methods run on which side."""
    import json

    import pandas as pd

    from lab_utils import hood

    tokenize, _ = tokenizer_of(served, cfg)
    prompt = exact_prompt(tokenize, cfg.workload.input_len, random.Random())
    params, answer = hood.kv_transfer_params(cfg, served, prompt)
    print("kv_transfer_params the prefill answered (the decode instance got them as they are):")
    print(json.dumps(params, indent=1))
    ids = params.get("remote_block_ids") or []
    groups = ids if ids and isinstance(ids[0], list) else [ids]  # one list per KV cache group
    print(f"{len(prompt)} prompt tokens held in {sum(map(len, groups))} blocks of "
          f"{cfg.vllm.block_size or 16} (block ids {groups[0]}"
          + (f" and {len(groups) - 1} more group(s)" if len(groups) > 1 else "")
          + f"); the decode read them and answered {answer['choices'][0]['text']!r}")
    lines = hood.command_lines(cfg, served.kv_buffer_device)
    for line in lines:
        print(f"\n{line['instance']} on {line['node']}:\n  {line['command line']}\n"
              f"  kv_transfer_config: {json.dumps(line['kv_transfer_config'])}\n"
              f"  KV environment: {line['KV environment']}")
    return pd.DataFrame(hood.connector_frame())


def proof_record(proofs: list) -> Proof:
    """The proof of transfer as notebook 04 records it."""
    return Proof(ok=bool(proofs) and all(p.ok for p in proofs), prompts=[p.row() for p in proofs])


def proof_frame(proofs: list):
    import pandas as pd

    return pd.DataFrame([{
        "prompt tokens": p.prompt_tokens, "via NIXL": p.external_kv_transfer,
        "computed": p.local_compute, "cache hit": p.local_cache_hit, "NIXL bytes": p.nixl_bytes,
        "expected bytes": p.expected_bytes, "transfer ms": round(p.nixl_xfer_ms, 2),
        "same tokens as 01": p.tokens_match, "diverged at": p.verdict.diverged_at,
        "margin (nats)": p.verdict.margin, "tokens": p.verdict.why, "ok": p.ok}
        for p in proofs])


def transfer_lesson(cfg: LabConfig, proof: Proof, kv: ResultsEnvelope, baseline: ResultsEnvelope,
                    *results: BenchmarkResult):
    """Notebook 04's reading of its own run (`lab_utils.transfer_lesson`): the table of the
    proof's moves against 02, and the sentences drawn from it, the first sweep's
    concurrency-1 TTFT against 01's, and a note if any run stood still."""
    import pandas as pd

    from lab_utils import transfer_lesson as lesson

    rows = lesson.transfer_rows(proof, kv.payload, kv_buffer_device(cfg))
    said = lesson.conclusions(rows, lesson.hop_cost(baseline.payload.sweep, results[0], proof))
    if note := lesson.stall_note(*results):
        said += ["", note]
    # the probe's time at the same size exists only where 02 probed that exact size
    return pd.DataFrame(rows).dropna(axis=1, how="all").round(3), said
