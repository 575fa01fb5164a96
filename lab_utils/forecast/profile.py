"""Notebook 01's engine profile: the measured curves the forecast is made from.

Three curves, each point measured several times (the spread is kept):

- **prefill**: the time to the first token of a lone request with one output token, sent
  to the instance directly, at a few prompt lengths (from one block to the mixed
  workload's long prompt). Fresh random prompts each time, so the prefix cache never
  answers.
- **decode**: the time of one decode step against the number of requests decoding
  together, at a short and a long context. `b` requests start together; each one's
  step time is the mean gap between its tokens over the second half of its output, when
  every prefill is long done and all `b` are decoding (a mean, so tokens the client read
  together, late, still count at their true rate).
- **hop**: what the lab proxy adds to a request: a lone request of the workload's prompt
  length through the proxy minus the same request shape sent directly, in interleaved
  pairs.
- **stream CPU** (instances on this machine only): the CPU time the proxy and the load
  generator spend per streamed token, from `b` requests (the largest decode batch) sent
  through the proxy: the proxy's process group's CPU plus this process's, over the
  tokens. On a shared machine that CPU competes with the instances (`model`,
  assumption 6).

Where the instance runs on this machine (the CPU rehearsal), the profile also records how
many CPU cores the instance's processes keep busy while it decodes (`active_cores`, from
/proc) and how many the machine has: an instance that keeps both cores of a 2-core
machine busy will run at half speed when a second one works beside it. One request of
each kind is sent first and not counted (the first requests after start-up are slower).
"""

from __future__ import annotations

import os
import random
import time

from lab_utils.cluster.state import ProcessRecord
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError
from lab_utils.forecast import beside
from lab_utils.forecast.curves import point
from lab_utils.forecast.model import default_token_budget
from lab_utils.measure.loadgen import RequestSpec, run_point, run_sync
from lab_utils.measure.prompts import exact_prompt
from lab_utils.on_node.proctools import group_cpu_seconds
from lab_utils.results.forecast import CurvePoint, DecodeLine, EngineProfile
from lab_utils.util.progress import progress_bar

REPEATS = 5  # lone requests per prefill length and per hop pair
DECODE_REPEATS = 3
DECODE_TOKENS = 32  # at least: each decode run's output length


def prefill_lengths(cfg: LabConfig) -> list[int]:
    """One block, the workload's prompt, the mixed workload's long prompt (or 4x the
    prompt) and the midpoint, within what the model accepts."""
    w, bs = cfg.workload, cfg.vllm.block_size or 16
    long = w.long_len
    top = cfg.vllm.max_model_len - max(w.output_len, DECODE_TOKENS) - 1
    return sorted({min(n, top) for n in (bs, w.input_len, (w.input_len + long) // 2, long)})


def settled_step_ms(itl_ms: list[float]) -> float:
    """A request's ms per decode step: its mean token gap over the second half of its
    output, when every request of its run is decoding (0 with no gap)."""
    tail = itl_ms[len(itl_ms) // 2:]
    return sum(tail) / max(len(tail), 1)


def _run(url: str, model: str, specs: list[RequestSpec], concurrency: int, key: str | None,
         timeout_s: float):
    records, _ = run_sync(run_point(url, model, specs, concurrency=concurrency,
                                    timeout_s=timeout_s, show_progress=False, api_key=key))
    bad = [r.error for r in records if r.error]
    if bad or len(records) != len(specs):
        raise LabError(f"the profile's requests to {url} failed: {bad[:2]}")
    return records


def measure_profile(cfg: LabConfig, inst: ProcessRecord, proxy: str, tokenize,
                    gpu_name: str | None = None, proxy_pgid: int | None = None) -> EngineProfile:
    """Measure the profile on notebook 01's running instance (`inst`: its record; `proxy`:
    the URL of the proxy in front of it, `proxy_pgid` its process group; `tokenize`:
    text -> token ids of the served model)."""
    t0 = time.monotonic()
    rng = random.Random(random.SystemRandom().randrange(2**31))  # fresh prompts every run
    direct = inst.url
    assert direct is not None  # an instance's record has its URL
    vkey, pkey = api_key(cfg, "vllm"), api_key(cfg, "proxy")
    model, timeout = cfg.model.name, cfg.workload.request_timeout_s
    out_tokens = max(cfg.workload.output_len, DECODE_TOKENS)
    lengths, batches = prefill_lengths(cfg), sorted({1, *cfg.workload.concurrency})
    contexts = sorted({cfg.workload.input_len,
                       min(cfg.workload.long_len, cfg.vllm.max_model_len - 2 * out_tokens)})
    total = (len(lengths) * REPEATS + 2 * REPEATS
             + (len(contexts) * len(batches) + 1 + 4) * DECODE_REPEATS)
    for url, key in ((direct, vkey), (proxy, pkey)):  # warm-up, not counted
        _run(url, model, [RequestSpec(exact_prompt(tokenize, cfg.workload.input_len, rng), 2)], 1,
             key, timeout)
    local = cfg.nodes[inst.node].connection == "local"
    busy_s = wall_s = 0.0
    with progress_bar(total=total, desc="profile", unit="run") as bar:
        prefill = []
        for n in lengths:
            ttft = []
            for _ in range(REPEATS):
                rec = _run(direct, model, [RequestSpec(exact_prompt(tokenize, n, rng), 1)], 1,
                           vkey, timeout)[0]
                ttft.append(rec.ttft_ms)
                bar.update(1)
            prefill.append(point(n, ttft))
        hops = []
        for _ in range(REPEATS):
            pair = []
            for url, key in ((direct, vkey), (proxy, pkey)):
                spec = RequestSpec(exact_prompt(tokenize, cfg.workload.input_len, rng), 1)
                pair.append(_run(url, model, [spec], 1, key, timeout)[0].ttft_ms)
                bar.update(1)
            hops.append(pair[1] - pair[0])
        decode = []
        for ctx in contexts:
            pts = []
            for b in batches:
                steps = []
                for _ in range(DECODE_REPEATS):
                    specs = [RequestSpec(exact_prompt(tokenize, ctx, rng), out_tokens)
                             for _ in range(b)]
                    cpu0, t_start = group_cpu_seconds(inst.pgid) if local else 0.0, time.monotonic()
                    recs = _run(direct, model, specs, b, vkey, timeout)
                    if local:
                        busy_s += group_cpu_seconds(inst.pgid) - cpu0
                        wall_s += time.monotonic() - t_start
                    per = [settled_step_ms(r.itl_ms) for r in recs if len(r.itl_ms) >= 2]
                    steps.append(sum(per) / len(per))
                    bar.update(1)
                pts.append(point(b, steps))
            decode.append(DecodeLine(context=ctx + (3 * out_tokens) // 4, points=pts))
        stream_cpu = None
        if local and proxy_pgid is not None:
            b, per_token = max(batches), []
            for _ in range(DECODE_REPEATS):
                specs = [RequestSpec(exact_prompt(tokenize, cfg.workload.input_len, rng),
                                     out_tokens) for _ in range(b)]
                p0, c0 = group_cpu_seconds(proxy_pgid), time.process_time()
                recs = _run(proxy, model, specs, b, pkey, timeout)
                used = group_cpu_seconds(proxy_pgid) - p0 + time.process_time() - c0
                tokens = sum(r.completion_tokens or len(r.itl_ms) + 1 for r in recs)
                per_token.append(used * 1e3 / max(tokens, 1))
                bar.update(1)
            stream_cpu = point(b, per_token)

        def one_decode() -> float:
            rec = _run(direct, model, [RequestSpec(exact_prompt(tokenize, contexts[0], rng),
                                                   out_tokens)], 1, vkey, timeout)[0]
            return settled_step_ms(rec.itl_ms)
        busy = beside.measure(cfg, inst, one_decode, DECODE_REPEATS, lambda: bar.update(1))
        others = beside.replica_stand_ins(cfg)
        replicas = (beside.measure(cfg, inst, one_decode, DECODE_REPEATS, lambda: bar.update(1),
                                   others, yielding=True) if others else None)
    budget = default_token_budget(cfg.vllm.device, 128.0 if gpu_name and "GB10" in gpu_name
                                  else None)
    return EngineProfile(prefill=prefill, decode=decode,
                         hop=point(cfg.workload.input_len, hops), token_budget=budget,
                         device=cfg.vllm.device, elapsed_s=round(time.monotonic() - t0, 1),
                         active_cores=round(busy_s / wall_s, 2) if local and wall_s else None,
                         host_cores=os.cpu_count() if local else None,
                         stream_cpu_ms_per_token=stream_cpu, beside_busy=busy,
                         beside_replicas=replicas)


def profile_frame(profile: EngineProfile):
    """The profile as one table: what was measured (its unit in its name), at what, and the
    median and range over its repeats; a figure measured once has no range (blank)."""
    import pandas as pd

    def row(curve: str, at: str, p: CurvePoint | None = None, value: float | None = None) -> dict:
        return {"measured": curve, "at": at,
                "median": p.median if p is not None else value,
                "min": p.lo if p is not None else None, "max": p.hi if p is not None else None}

    rows = [row("prefill: ms to first token", f"{p.x:g} prompt tokens", p)
            for p in profile.prefill]
    for line in profile.decode:
        rows += [row(f"decode step: ms, context {line.context}", f"{p.x:g} decoding", p)
                 for p in line.points]
    rows.append(row("proxy hop: ms added", f"{profile.hop.x:g} prompt tokens", profile.hop))
    if (sc := profile.stream_cpu_ms_per_token) is not None:
        rows.append(row("proxy + client CPU per streamed token: ms", f"{sc.x:g} streams", sc))
    for b, like in ((profile.beside_busy, "stand-ins for NIXL's threads"),
                    (profile.beside_replicas, "idle replicas' yielding workers")):
        if b is None:
            continue
        ratio = (f"; {b.alone.span()} alone: "
                 + (f"{b.ratio:.2f}x" if b.differs else "no difference by the lab's rule")
                 if b.ratio else "")
        rows.append(row(f"decode step beside {b.threads} {like}: ms ({b.policy}; CPUs "
                        f"{', '.join(b.binds)})", f"1 decoding{ratio}", b.beside))
    if profile.active_cores is not None:
        rows.append(row(f"CPU cores busy while decoding (of {profile.host_cores})",
                        "the instance's processes", value=profile.active_cores))
    frame = pd.DataFrame(rows).round(2)
    return frame.astype(object).where(frame.notna(), "")
