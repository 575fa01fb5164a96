"""Predict how one instance, N replicas and xPyD prefill/decode serve a workload, from
the curves notebooks 01 and 02 measured, before 03 and 04 measure it.

The model is a discrete-event simulation of what the lab runs, at the level of engine
steps. Its assumptions, each a simplification a workshop attendee can check:

1. **An engine works in steps.** Each step, every request that is decoding gets one
   token, and prompts waiting for prefill fill the rest of the step's token budget
   (vLLM's `max_num_batched_tokens`; a prompt longer than what is left is prefilled in
   chunks over several steps, as vLLM's chunked prefill does). A prompt's first token
   comes at the end of the step that finishes its prefill; every later token at the end
   of a step it decodes in.
2. **A step costs decode plus prefill.** Its time is the measured decode step time at
   that many running requests and their mean context length (01's decode curve), plus
   the prefill work of the prompt tokens in it: the measured time of a lone prompt of
   that many tokens (01's prefill curve) less that curve's value at zero tokens.
3. **A request pays a fixed cost outside the steps**: 01's prefill curve at zero tokens
   less one decode step (HTTP, tokenizing, queueing, streaming), plus a seeded random
   share of the spread 01 measured for a lone short prompt (without it, requests that
   start together would stay in lockstep forever, which no real system does); every
   pass through the proxy costs 01's measured proxy hop.
4. **Prefill/decode:** a request goes to a prefill instance for one token, comes back
   through the proxy, and goes to a decode instance, which pulls its KV (whole blocks x
   bytes per token, 02's layout) in the time 02's NIXL probe measured for that many
   bytes, then computes its first token in its next step. The transfer does not slow
   either engine's steps.
5. **The front door** sends requests round-robin (or to the instance with the fewest in
   flight), as the lab proxy does; the client is the lab's load generator: a fixed
   number of requests in flight, or arrivals at a rate with the same seeded gaps.
6. **Instances on separate machines do not slow each other.** Instances that share one
   machine (the CPU rehearsal) share its cores: while `k` of them are working, each
   step (and each request's fixed cost) takes `max(1, k x a / C) / max(1, a / C)` times
   as long, where `a` is the number of cores 01's instance kept busy while decoding and
   `C` the machine's cores (processor sharing; 01's curves already include one instance
   competing with itself).
7. **What shares a machine slows a decode by a measured factor**: 01 timed a decode
   alone and beside stand-ins (`forecast.beside`) for what shares the decode's machine in
   P/D (its NIXL threads, and the prefills' idle workers, which poll for a second after
   each step), and for the other replicas' idle workers where replicas share one machine;
   a P/D decode instance's decode steps, and a replica's, take that ratio.
8. **03's and 04's instances are timed before their sweeps.** Each sends a few fresh
   requests one at a time through its own instances before it forecasts
   (`forecast.timed`). Their time per token replaces the factor of 7 (a replica's, or
   the P/D decode instance's); for P/D, what their TTFT has beyond the terms above
   (vLLM's handling of a P/D request: the side-channel handshake, the decode's wait for
   the transfer's notification, its scheduling) is added to every request's decode leg as
   a fixed cost, stretched by sharing like the others.

9. **A model split over N ranks** (tensor parallel) is one instance whose every step
   does 1/N of the single instance's work, then the ranks' all-reduces: a fixed cost per
   step (their latency; what the split instance's own time per token, timed before its
   sweep, has beyond 1/N of 01's step) plus, per token in the step, 2 per layer x hidden
   size x element size bytes over the link at the rate notebook 00 measured.

What it leaves out, knowingly: the CPU the proxy and the client use beyond the measured
per-token cost, and NIXL's beyond the factor of 7 (or 8); how vLLM's handling of a P/D
request grows with load beyond sharing the cores (8 measures it at one request); memory
limits (every request fits in the KV cache); and preemption.

Nothing here reads 03's or 04's results beyond the timing of 8. `forecast` runs one
architecture at one load point; `ranged` runs it at the median and at the low and high edges of the measured
curves; `band` widens that range by the model's own error graded earlier in the series,
which gives the forecast's interval.

Over 400 lines on purpose: the simulation is one event loop whose steps share the state
of every engine and request; split up, its assumptions above would no longer read next to
the code that makes them.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lab_utils.forecast.curves import Curve
from lab_utils.measure.loadgen import arrival_offsets
from lab_utils.results.forecast import Edge, ForecastPoint, Interval


# vLLM's default token budget per step for an OpenAI server (EngineArgs.get_batch_defaults):
# 2048 on CPU and on GPUs under 70 GiB, 8192 on GPUs with 70 GiB or more (a GB10's 128 GB
# unified memory counts), 16384 from 160 GiB.
def default_token_budget(device: str, device_memory_gib: float | None) -> int:
    if device != "cuda" or not device_memory_gib or device_memory_gib < 70:
        return 2048
    return 16384 if device_memory_gib >= 160 else 8192


@dataclass(frozen=True)
class EngineCosts:
    """One instance's measured speed: `prefill` (ms for a lone prompt of x tokens, to
    its first token), `decode` ((context tokens, curve of ms per step against running
    requests), ...), and the step's token budget."""

    prefill: Curve
    decode: tuple[tuple[float, Curve], ...]
    token_budget: int = 2048

    def decode_step(self, batch: int, context: float) -> float:
        lines = sorted(self.decode)
        if len(lines) == 1:
            return lines[0][1](batch)
        i = 0
        while i < len(lines) - 2 and context > lines[i + 1][0]:
            i += 1
        (c0, l0), (c1, l1) = lines[i], lines[i + 1]
        y0, y1 = l0(batch), l1(batch)
        y = y0 + (y1 - y0) * (context - c0) / (c1 - c0) if c1 != c0 else y0
        return max(y, 1e-3)

    def prefill_work(self, tokens: int) -> float:
        return max(0.0, self.prefill(tokens) - self.prefill(0)) if tokens else 0.0

    @property
    def fixed_ms(self) -> float:
        """A request's cost outside the engine's steps (assumption 3)."""
        shortest = min(c for c, _ in self.decode)
        return max(0.0, self.prefill(0) - self.decode_step(1, shortest))


@dataclass(frozen=True)
class Inputs:
    """Everything a forecast is made from, each input with where it came from."""

    engine: EngineCosts
    hop_ms: float
    transfer: Curve | None  # ms against bytes; None: no transfer measured
    kv_bytes_per_token: int
    block_size: int
    jitter_ms: float = 0.0  # spread of a lone request's time (01): each request draws from it
    active_cores: float | None = None  # cores one working instance keeps busy (01)
    stream_cpu_ms: float = 0.0  # proxy + client CPU ms per streamed token (01)
    # a P/D decode instance's steps beside the NIXL threads sharing its machine (01)
    decode_beside: float = 1.0
    # a replica's decode steps beside the other replicas on its machine (01)
    replica_beside: float = 1.0
    # what a P/D request's decode leg pays beyond the terms above, from 04's instances timed
    # before its sweep (`forecast.timed`; assumption 8)
    pd_extra_ms: float = 0.0
    # a model split over ranks (assumption 9): bytes each all-reduce step moves per token
    # (2 per layer x hidden size x element size), the link's rate (00's measurement, bytes
    # per ms; None: not measured), and the fixed cost of a step's all-reduces (the split
    # instance timed before its sweep; 0 until then)
    allreduce_bytes_per_token: int = 0
    link_bytes_per_ms: float | None = None
    tp_step_ms: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)

    def kv_bytes(self, prompt_tokens: int) -> int:
        blocks = -(-prompt_tokens // self.block_size)
        return blocks * self.block_size * self.kv_bytes_per_token

    def allreduce_ms(self, tokens: int) -> float:
        """A split step's all-reduces for `tokens` tokens: the fixed cost plus the bytes over
        the link (assumption 9)."""
        moved = (tokens * self.allreduce_bytes_per_token / self.link_bytes_per_ms
                 if self.link_bytes_per_ms else 0.0)
        return self.tp_step_ms + moved

    def transfer_ms(self, prompt_tokens: int) -> float:
        if self.transfer is None:
            raise ValueError("no KV transfer curve: notebook 02 has not measured one")
        return self.transfer(self.kv_bytes(prompt_tokens))


@dataclass(frozen=True)
class Architecture:
    """One instance (`replicas=1`), N replicas, or `prefill` x `decode` instances;
    `shared_cores`: all of them on one machine with that many cores (None: one machine
    each)."""

    replicas: int = 1
    prefill: int = 0
    decode: int = 0
    policy: str = "round_robin"
    shared_cores: int | None = None
    ranks: int = 1  # one instance split over this many nodes (tensor parallel)

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def name(self) -> str:
        if self.disaggregated:
            return f"{self.prefill}P{self.decode}D"
        if self.ranks > 1:
            return f"1 instance over {self.ranks} ranks"
        return "1 instance" if self.replicas == 1 else f"{self.replicas} replicas"


@dataclass(frozen=True)
class Load:
    """One load point of a workload: `concurrency` requests in flight or `rate` per s."""

    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int | None = None
    rate: float | None = None
    warmup: int = 0
    mixed_long_len: int | None = None
    mixed_long_every: int = 8
    burstiness: float = 1.0
    seed: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_itl_ms: float | None = None  # every token gap of a request at most this

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency else f"rate {self.rate:g}"

    def prompt_lengths(self) -> list[int]:
        """The measured requests' prompt lengths, as the load generator builds them (a long
        one every `mixed_long_every` requests, counting the warm-up ones)."""
        return [self.mixed_long_len if self.mixed_long_len and (self.warmup + j)
                % self.mixed_long_every == 0 else self.input_len for j in range(self.num_prompts)]


def loads_of(w, mixed: bool = False) -> list[Load]:
    """The load points of a `WorkloadConfig` (mixed: its highest concurrency with the long
    prompts, as the serving notebooks run it)."""
    common = dict(input_len=w.input_len, output_len=w.output_len, num_prompts=w.num_prompts,
                  warmup=w.warmup, burstiness=w.burstiness, seed=w.seed,
                  slo_ttft_ms=w.slo.ttft_ms, slo_tpot_ms=w.slo.tpot_ms, slo_itl_ms=w.slo.itl_ms)
    if mixed:
        return [Load(concurrency=max(w.concurrency or [1]), mixed_long_len=w.mixed_long_len,
                     mixed_long_every=w.mixed_long_every, **common)]
    return ([Load(concurrency=c, **common) for c in w.concurrency]
            + [Load(rate=r, **common) for r in w.request_rates])


# ---- the simulation ------------------------------------------------------------------------


@dataclass
class _Req:
    i: int
    prompt: int
    output: int
    sent: float
    prefill_left: int = 0
    generated: int = 0
    times: list[float] = field(default_factory=list)
    parent: _Req | None = None  # set: a P/D prefill leg (one token, then to a decode instance)
    done: float | None = None

    @property
    def done_at(self) -> float:
        """When a finished request finished."""
        assert self.done is not None
        return self.done


class _Engine:
    def __init__(self, sim: _Sim, costs: EngineCosts, name: str, beside: float = 1.0):
        self.sim, self.costs, self.name = sim, costs, name
        self.beside = beside  # its decode steps' factor for NIXL's threads beside it
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.busy_until: float | None = None
        self.busy_ms = 0.0
        self.demand = 0.0  # cores its current step wants (assumption 6)
        self.in_flight = 0
        self.steps = 0

    def admit(self, req: _Req, t: float) -> None:
        self.waiting.append(req)
        if self.busy_until is None:
            self._step(t)

    def _step(self, t: float) -> None:
        decoding = [r for r in self.running if r.prefill_left == 0]
        budget = self.costs.token_budget - len(decoding)
        chunks: list[tuple[_Req, int]] = []
        for r in [r for r in self.running if r.prefill_left > 0]:
            if budget <= 0:
                break
            take = min(r.prefill_left, budget)
            chunks.append((r, take))
            budget -= take
        while self.waiting and budget > 0:
            r = self.waiting.popleft()
            self.running.append(r)
            take = min(r.prefill_left, budget)
            chunks.append((r, take))
            budget -= take
        if not decoding and not chunks:
            self.busy_until = None
            return
        context = (sum(r.prompt + r.generated for r in decoding) / len(decoding)
                   if decoding else 0.0)
        ranks = self.sim.arch.ranks
        base = (self.costs.decode_step(max(len(decoding), 1), context) * self.beside
                + self.costs.prefill_work(sum(n for _, n in chunks))) / ranks
        if ranks > 1:
            base += self.sim.inputs.allreduce_ms(len(decoding) + sum(n for _, n in chunks))
        streamed = len(decoding) + sum(1 for r, n in chunks if n == r.prefill_left)
        self.demand = ((self.sim.inputs.active_cores or 0.0)
                       + streamed * self.sim.inputs.stream_cpu_ms / max(base, 1e-6))
        dur = base * self.sim.stretch(self)
        self.busy_until = t + dur
        self.busy_ms += dur
        self.steps += 1
        self.sim.at(t + dur, self._end, decoding, chunks)

    def _end(self, t: float, decoding: list[_Req], chunks: list[tuple[_Req, int]]) -> None:
        for r, n in chunks:
            r.prefill_left -= n
        for r in decoding + [r for r, _ in chunks if r.prefill_left == 0]:
            r.generated += 1
            r.times.append(t)
            if r.generated >= r.output:
                self.running.remove(r)
                self.in_flight -= 1
                self.sim.finished(r, self, t)
        self._step(t)


class _Sim:
    def __init__(self, inputs: Inputs, arch: Architecture, load: Load):
        self.inputs, self.arch, self.load = inputs, arch, load
        costs = inputs.engine
        if arch.disaggregated:
            self.prefills = [_Engine(self, costs, f"prefill {k}") for k in range(arch.prefill)]
            self.decodes = [_Engine(self, costs, f"decode {k}", inputs.decode_beside)
                            for k in range(arch.decode)]
        else:
            factor = inputs.replica_beside if arch.replicas > 1 else 1.0
            self.prefills, self.decodes = [], [_Engine(self, costs, f"replica {k}", factor)
                                               for k in range(arch.replicas)]
        self.events: list = []
        self.seq = 0
        self.reqs: list[_Req] = []
        self.rr: dict[str, int] = {}
        self.rng = random.Random(load.seed)
        self.lengths = load.prompt_lengths()
        self.pending = deque(range(len(self.lengths)))

    def stretch(self, engine: _Engine) -> float:
        """How much slower `engine` works now for sharing its machine (assumption 6)."""
        cores, a = self.arch.shared_cores, self.inputs.active_cores
        if not cores or not a:
            return 1.0
        wanted = max(engine.demand, a) + sum(e.demand for e in self.prefills + self.decodes
                                             if e is not engine and e.busy_until is not None)
        return max(1.0, wanted / cores) / max(1.0, a / cores)

    def at(self, t: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def pick(self, pool: list[_Engine], key: str) -> _Engine:
        if self.arch.policy == "least_outstanding":
            return min(pool, key=lambda e: e.in_flight)
        k = self.rr.get(key, 0)
        self.rr[key] = k + 1
        return pool[k % len(pool)]

    def send(self, t: float, i: int) -> None:
        r = _Req(i, self.lengths[i], self.load.output_len, sent=t)
        self.reqs.append(r)
        self._to_engine(t, r, prefill_leg=self.arch.disaggregated)

    def _to_engine(self, t: float, r: _Req, prefill_leg: bool) -> None:
        pool = self.prefills if prefill_leg else self.decodes
        engine = self.pick(pool, "prefill" if prefill_leg else "decode")
        engine.in_flight += 1
        j = self.inputs.jitter_ms / 2
        extra = self.inputs.pd_extra_ms if self.arch.disaggregated and not prefill_leg else 0.0
        fixed = (self.inputs.hop_ms + self.inputs.engine.fixed_ms + extra) * self.stretch(engine)
        arrive = t + max(fixed + self.rng.uniform(-j, j), 0.0)
        if prefill_leg:
            r = _Req(r.i, r.prompt, 1, sent=t, prefill_left=r.prompt, parent=r)
        elif self.arch.disaggregated:
            r.prefill_left = 1  # the KV arrives; the decode computes the last prompt token
            arrive += self.inputs.transfer_ms(r.prompt)
        else:
            r.prefill_left = r.prompt
        self.at(arrive, lambda now, e=engine, r=r: e.admit(r, now))

    def finished(self, r: _Req, engine: _Engine, t: float) -> None:
        if r.parent is not None:  # the prefill's one token is not streamed: on to decode
            self._to_engine(t, r.parent, prefill_leg=False)
            return
        r.done = t
        if self.load.concurrency:
            self.at(t, self._next)

    def _next(self, t: float) -> None:
        if self.pending:
            self.send(t, self.pending.popleft())

    def run(self) -> float:
        load = self.load
        if load.concurrency:
            for _ in range(min(load.concurrency, len(self.pending))):
                self._next(0.0)
        else:
            assert load.rate is not None  # a Load has a concurrency or a rate
            # the load generator's arrival gaps (measure.loadgen.arrival_offsets), same seed
            for t in arrival_offsets(len(self.pending), load.rate, load.burstiness,
                                     random.Random(load.seed)):
                i = self.pending.popleft()
                self.at(t * 1e3, self.send, i)
        end = 0.0
        while self.events:
            t, _, fn, args = heapq.heappop(self.events)
            fn(t, *args)
            end = max(end, t)
        return end


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass(frozen=True)
class Prediction:
    """One architecture at one load point: the metrics, in `vllm bench serve`'s names, and
    how busy each pool of instances was."""

    architecture: str
    load: str
    metrics: dict[str, float | None]
    busy: dict[str, float]  # pool -> busiest instance's share of the wall time
    transfer_ms: float | None  # the median request's KV move (P/D only)

    def bottleneck(self) -> str:
        pool, share = max(self.busy.items(), key=lambda kv: kv[1])
        return f"{pool} ({share:.0%} busy)"


def forecast(inputs: Inputs, arch: Architecture, load: Load) -> Prediction:
    """Simulate `arch` at `load`; the metrics of the measured requests."""
    if arch.disaggregated and (arch.decode < 1 or inputs.transfer is None):
        raise ValueError("a P/D forecast needs at least one decode instance and 02's transfer curve")
    sim = _Sim(inputs, arch, load)
    wall_ms = sim.run()
    done = [r for r in sim.reqs if r.done is not None]
    ttft = [r.times[0] - r.sent for r in done]
    gaps = [[b - a for a, b in zip(r.times, r.times[1:], strict=False)] for r in done]
    itl = [g for each in gaps for g in each]
    tpots = [(r.done_at - r.times[0]) / (len(r.times) - 1) if len(r.times) > 1 else None
             for r in done]  # per request, None with one token
    tpot = [t for t in tpots if t is not None]
    e2el = [r.done_at - r.sent for r in done]
    wall_s = max(wall_ms / 1e3, 1e-9)
    out_tokens = sum(len(r.times) for r in done)
    good = sum(1 for t, tp, each in zip(ttft, tpots, gaps, strict=True)
               if (load.slo_ttft_ms is None or t <= load.slo_ttft_ms)
               and (load.slo_tpot_ms is None or tp is None or tp <= load.slo_tpot_ms)
               and (load.slo_itl_ms is None or max(each, default=0.0) <= load.slo_itl_ms))
    metrics = {
        "request_throughput": len(done) / wall_s,
        "output_throughput": out_tokens / wall_s,
        "request_goodput": (good / wall_s if (load.slo_ttft_ms or load.slo_tpot_ms
                                              or load.slo_itl_ms) else None),
        "median_ttft_ms": _pct(ttft, 50), "p99_ttft_ms": _pct(ttft, 99),
        "median_tpot_ms": _pct(tpot, 50), "p99_tpot_ms": _pct(tpot, 99),
        "median_itl_ms": _pct(itl, 50), "p99_itl_ms": _pct(itl, 99),
        "median_e2el_ms": _pct(e2el, 50),
    }
    busy = {pool: max(e.busy_ms for e in engines) / max(wall_ms, 1e-9)
            for pool, engines in (("prefill", sim.prefills),
                                  ("decode" if arch.disaggregated else "instances", sim.decodes))
            if engines}
    moved = (inputs.transfer_ms(int(np.median([r.prompt for r in done])))
             if arch.disaggregated and done else None)
    return Prediction(arch.name, load.label, metrics, busy, moved)


@dataclass(frozen=True)
class Ranged:
    """A prediction at the median of the measured curves, and its interval: the range of
    each metric over the predictions at the curves' low and high edges."""

    median: Prediction
    lo: dict[str, float | None]
    hi: dict[str, float | None]

    def point(self, workload: str, mode: str, value: float) -> ForecastPoint:
        return ForecastPoint(
            workload=workload, mode=mode, value=value, load=self.median.load,
            architecture=self.median.architecture,
            metrics={k: Interval(median=v, lo=self.lo.get(k), hi=self.hi.get(k))
                     for k, v in self.median.metrics.items()},
            bottleneck=self.median.bottleneck(), transfer_ms=self.median.transfer_ms)


def ranged(inputs: Inputs, arch: Architecture, load: Load,
           edges_of: Callable[[Edge], Inputs] | None = None) -> Ranged:
    """The prediction at the curves' medians, with its interval from their edges.
    `edges_of(edge)` returns the inputs at that edge (None: the interval is the point)."""
    mid = forecast(inputs, arch, load)
    if edges_of is None:
        return Ranged(mid, dict(mid.metrics), dict(mid.metrics))
    a = forecast(edges_of("lo"), arch, load).metrics
    b = forecast(edges_of("hi"), arch, load).metrics
    lo: dict[str, float | None] = {}
    hi: dict[str, float | None] = {}
    for k, v in mid.metrics.items():
        vals = [x for x in (a.get(k), b.get(k), v) if x is not None and math.isfinite(x)]
        lo[k], hi[k] = (min(vals), max(vals)) if vals else (None, None)
    return Ranged(mid, lo, hi)


__all__ = ["Architecture", "EngineCosts", "Inputs", "Load", "Prediction", "Ranged",
           "default_token_budget", "forecast", "loads_of", "ranged"]
