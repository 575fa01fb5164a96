"""What notebooks 01-04 conclude, computed from their own results: what won, by how much,
where the expectation the notebook started from held or failed, and the likely cause,
with the numbers quoted. Each `conclude_NN` returns plain sentences; the first says
whether the notebook's expectation held.

Whether a difference counts is decided by the lab's one rule (`points.compare`: more
than `points.MARGIN` of the smaller value and, with repeats on both sides, min-max ranges
apart), the same as the report's, the comparison tables' and the forecast grading's.
"""

from __future__ import annotations

from lab_utils.measure.benchmark import read_late
from lab_utils.results import BaselinePayload, Proof, TensorParallelPayload
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.points import BY_KEY, Measured, Point, compare_points, differs
from lab_utils.results.sweep import BenchmarkResult

# what NIXL's progress threads did in a run: as vLLM gets them, busy and lowered by the lab
# (kv_transfer.lower_nixl_threads), or waiting in poll() (kv_transfer.nixl_progress_delay_us)
NIXL_THREADS = ("busy", "lowered", "waiting")
TAIL_FACTOR = 3.0  # a TTFT p99 over this many medians is a tail worth a sentence
CPU_NOTE = ("on the CPU rehearsal every instance shares the machine's two cores with the "
            "others, the proxy and the load generator")


def _points(result: BenchmarkResult | None, mode: str = "concurrency") -> dict[float, Point]:
    if result is None:
        return {}
    return {float(c.value): c for c in result.combined if c.mode == mode and c.valid}


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def better(a: Point, b: Point, key: str) -> str | None:
    """"a" or "b": the better of two points on `key` when they differ by the lab's rule
    (`points.compare_points`: none when their prefix-cache hit shares differ), else None."""
    return compare_points(a, b, key).better


def _margin(a: Point, b: Point, key: str, won: str | None) -> str:
    """b against a as a ratio with the direction in words ("1.3x lower"), or that they do
    not differ by the lab's rule (`better` said None)."""
    return "no difference by the lab's rule" if won is None else _times(key, b, a)


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g} ms"


def _tps(p: Point) -> str:
    """A point's output throughput as the sentences quote it ("505")."""
    tps = p.median("output_throughput")
    return "–" if tps is None else f"{tps:.0f}"


def _times(key: str, x: Point, y: Point) -> str:
    """x against y on `key` as a ratio with the direction in words ("1.4x higher")."""
    vx, vy = x.median(key), y.median(key)
    return "–" if vx is None or vy is None else BY_KEY[key].times(vx, vy)


# ---- 01 ---------------------------------------------------------------------------------


def conclude_01(payload: BaselinePayload, device: str = "cpu") -> list[str]:
    """Expectation: batching raises throughput with concurrency, at some cost in TPOT."""
    pts = _points(payload.sweep)
    if len(pts) < 2:
        return ["Only one valid load point: nothing to compare across concurrency."]
    lo, hi = pts[min(pts)], pts[max(pts)]
    gain = _ratio(hi.median("output_throughput"), lo.median("output_throughput"))
    said = []
    if better(lo, hi, "output_throughput") == "b":
        rose = f"rose {gain:.1f}x" if gain is not None else "rose"
        said.append(f"As expected, batching paid: output throughput {rose} from "
                    f"concurrency {min(pts):g} to {max(pts):g} ({_tps(lo)} -> "
                    f"{_tps(hi)} tok/s) while TPOT was "
                    f"{_times('median_tpot_ms', hi, lo)}: "
                    f"{max(pts):g} requests shared each step.")
    else:
        said.append(f"Not as expected: output throughput did not grow with concurrency "
                    f"({_tps(lo)} tok/s at {min(pts):g}, "
                    f"{_tps(hi)} at {max(pts):g}). The instance was already "
                    "saturated with one request"
                    + (f"; {CPU_NOTE}." if device == "cpu" else "."))
    roof = payload.roofline
    if roof and roof.max_tokens_per_s_per_stream and (lo_tpot := lo.median("median_tpot_ms")):
        per_stream = 1000 / lo_tpot
        share = per_stream / roof.max_tokens_per_s_per_stream
        said.append(f"One stream decoded {per_stream:.0f} tokens/s, {share:.0%} of the memory "
                    f"roofline ({roof.max_tokens_per_s_per_stream:.0f} tokens/s)"
                    + (": the tiny model's weights sit in the CPU's caches, so per-step "
                       "overheads, not memory, set the pace here." if share < 0.2 else
                       ": memory bandwidth is what limits one stream."))
    if payload.profile and payload.profile.prefill:
        p = sorted(payload.profile.prefill, key=lambda q: q.x)
        said.append(f"Prefill (profile): {p[0].median:.3g} ms for {p[0].x:g} tokens, "
                    f"{p[-1].median:.3g} ms for {p[-1].x:g}: "
                    f"{(p[-1].median - p[0].median) / (p[-1].x - p[0].x) * 1000:.3g} ms per "
                    "1,000 more prompt tokens.")
    if read_late(payload.sweep, "concurrency", max(pts)):
        said.append(f"At concurrency {max(pts):g} the load generator read many tokens late: "
                    "its ITL and TPOT there are the client's, not the engine's.")
    return said


# ---- 02 ---------------------------------------------------------------------------------


def _above(ratio: float) -> bool:
    """Whether a transfer took longer than the estimate by the lab's rule (measured /
    predicted = `ratio`: more than `points.MARGIN` above it)."""
    return ratio > 1 and differs(Measured.one(ratio), Measured.one(1.0))


def _mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def best_transfer_sentence(rows: list[dict], seg_type: str = "DRAM") -> str | None:
    """Which of the probe's transfers reached the best bandwidth, the one the estimate
    divides by, and whether it was the largest (then the two agree there by construction)."""
    mine = [r for r in rows if r.get("seg_type") == seg_type and r.get("op") == "READ"
            and r.get("bandwidth_GBps")]
    if not mine:
        return None
    best = max(mine, key=lambda r: r["bandwidth_GBps"])
    largest = max(mine, key=lambda r: r["bytes"])
    head = (f"The estimate divides by the best bandwidth the probe reached, "
            f"{best['bandwidth_GBps']:.3g} GB/s, at {_mib(best['bytes'])}")
    if best is largest:
        return head + (", its largest transfer: there the two agree by construction, so read "
                       "the smaller sizes.")
    return head + (f", not at its largest transfer ({_mib(largest['bytes'])} reached "
                   f"{largest['bandwidth_GBps']:.3g} GB/s, "
                   f"{best['bandwidth_GBps'] / largest['bandwidth_GBps']:.1f}x less): the "
                   "estimate is exact near that size and optimistic both below it (a fixed "
                   "cost per transfer) and above it (the bandwidth falls).")


def conclude_02(kv: KvTransferPayload, input_len: int | None = None) -> list[str]:
    """Expectation: short prompts pay a fixed per-transfer cost above size / bandwidth."""
    ratios = [(r.prompt_tokens, r.measured_ms / r.predicted_ms)
              for r in kv.predicted_vs_measured if r.measured_ms and r.predicted_ms]
    said = []
    per_token = kv.kv_per_token_bytes
    if input_len:
        blocks = -(-input_len // kv.block_size)
        said.append(f"A {input_len}-token prompt of {kv.model} holds "
                    f"{blocks * kv.block_size * per_token / 2**20:.3g} MiB of KV "
                    f"({blocks} blocks of {kv.block_size} tokens x {per_token:,} bytes).")
    if len(ratios) < 2:
        return said + ["The probe measured fewer than two prompt sizes: no comparison."]
    short, long = ratios[0], ratios[-1]
    over = [f"{n} tokens x{q:.2f}" for n, q in ratios if _above(q)]
    if _above(short[1]) and short[1] > long[1]:
        said.insert(0, f"As expected, the shortest prompt paid a fixed cost: its transfer "
                       f"took {short[1]:.2f}x the size / best-bandwidth estimate, the longest "
                       f"{long[1]:.2f}x (measured above the estimate at: {', '.join(over)}).")
    elif _above(long[1]):
        said.insert(0, f"Not as expected: the longest prompt's transfer took {long[1]:.2f}x "
                       f"the size / best-bandwidth estimate, the shortest {short[1]:.2f}x: "
                       "here the bandwidth fell at the larger sizes, which hides any fixed "
                       f"cost per transfer (above the estimate at: {', '.join(over)}).")
    else:
        said.insert(0, f"Not as expected: the shortest prompt's transfer took {short[1]:.2f}x "
                       f"the size / best-bandwidth estimate, no more than the longest "
                       f"({long[1]:.2f}x): at these sizes the fixed cost per transfer is "
                       "too small to see beside the bytes"
                       + (f"; above the estimate only at: {', '.join(over)}." if over else "."))
    where = best_transfer_sentence(kv.probe.rows)
    if where:
        said.append(where)
    rec = kv.recommendation
    said.append(f"kv_buffer_device for 04: {rec.kv_buffer_device!r} ({rec.reason}).")
    return said


# ---- 03 ---------------------------------------------------------------------------------


def conclude_03(baseline: BenchmarkResult, replicated: BenchmarkResult,
                mixed: BenchmarkResult | None = None, device: str = "cpu") -> list[str]:
    """Expectation: replicas add capacity at high load and change little at concurrency 1."""
    a, b = _points(baseline), _points(replicated)
    common = sorted(set(a) & set(b))
    if not common:
        return ["No load point measured by both 01 and 03: nothing to compare."]
    top, one = common[-1], common[0]
    gain = _ratio(b[top].median("output_throughput"), a[top].median("output_throughput"))
    said = []
    if better(a[top], b[top], "output_throughput") == "b":
        said.append(f"As expected, two replicas added capacity: at concurrency {top:g} output "
                    f"throughput rose {'from 0' if gain is None else f'{gain:.1f}x'} "
                    f"({_tps(a[top])} -> {_tps(b[top])} tok/s).")
    else:
        lost = [f"{c:g}: {_times('output_throughput', b[c], a[c])}" for c in common]
        said.append("Not as expected: two replicas did not add capacity (output throughput "
                    f"against one instance at concurrency {', '.join(lost)})"
                    + (f". The likely cause: {CPU_NOTE}, so two busy replicas each get half "
                       "of what one got alone; on two Sparks each has its own GPU."
                       if device == "cpu" else "; check that both nodes serve (status)."))
    for key in ("median_ttft_ms", "p99_ttft_ms"):
        same = not differs(a[one].of(key), b[one].of(key))
        said.append(f"At concurrency {one:g}, {BY_KEY[key].label}: {_ms(a[one].median(key))} alone, "
                    f"{_ms(b[one].median(key))} on replicas ({_times(key, b[one], a[one])}): "
                    + ("the same, as expected (each request still runs alone on one engine)."
                       if same else "not the same; a request alone on a replica should see "
                       "the single instance's latency" + (f" ({CPU_NOTE})." if device == "cpu"
                                                          else ".")))
    m = _points(mixed)
    if m and top in m and b.get(top):
        said.append(f"Mixed workload at concurrency {top:g}: ITL p99 "
                    f"{_ms(m[top].median('p99_itl_ms'))} against {_ms(b[top].median('p99_itl_ms'))} "
                    "without long prompts: a long prefill stalls the decodes in its steps.")
    return said


# ---- 04 ---------------------------------------------------------------------------------


def _nixl_cause(baseline: BaselinePayload | None, disaggregated: BenchmarkResult) -> str:
    """What 01 measured about a decode beside stand-ins for NIXL's threads, against this run."""
    beside = baseline.profile.beside_busy if baseline and baseline.profile else None
    if baseline is None or beside is None or not beside.ratio:
        return ""
    pd_one, single_one = _points(disaggregated).get(1.0), _points(baseline.sweep).get(1.0)
    ratio = (_ratio(pd_one.median("median_tpot_ms"), single_one.median("median_tpot_ms"))
             if pd_one and single_one else None)
    here = f"; here TPOT at concurrency 1 was {ratio:.1f}x 01's" if ratio else ""
    if ratio and max(ratio, beside.ratio) > 1.5 * min(ratio, beside.ratio):
        here += (", so 01's stand-ins do not match what the decode met here and the forecast's "
                 "time per token is off by as much (docs/MEASURING.md)")
    return (f" 01 measured a decode step on this machine {beside.ratio:.1f}x slower beside "
            f"{beside.threads} stand-ins for NIXL's threads ({beside.policy}){here}.")


def conclude_04(replicated: BenchmarkResult | None, disaggregated: BenchmarkResult,
                mixed_rep: BenchmarkResult | None, mixed_dis: BenchmarkResult | None,
                proof: Proof | None, device: str = "cpu",
                baseline: BaselinePayload | None = None, nixl: str = "busy") -> list[str]:
    """Expectation: P/D protects the ITL tail under mixed load, at the cost of throughput
    and of a transfer and a hop in TTFT. `baseline`: 01's results, for what its profile
    measured beside NIXL's threads; `nixl`: what NIXL's progress threads did in this run
    (`NIXL_THREADS`: "busy" as vLLM gets them, "lowered" busy at nice 19, "waiting" in
    poll() with the lab's progress delay)."""
    said = []
    if proof is not None:
        said.append(f"The KV cache moved: {'proved' if proof.ok else 'NOT proved'} for "
                    f"{len(proof.prompts)} prompts, {proof.tokens_equal} with output equal "
                    "to 01's.")
    mr, md = _points(mixed_rep), _points(mixed_dis)
    common = sorted(set(mr) & set(md))
    if common:
        c = common[-1]
        won = better(mr[c], md[c], "p99_itl_ms")
        late = ((mixed_dis is not None and read_late(mixed_dis, "concurrency", c))
                or (mixed_rep is not None and read_late(mixed_rep, "concurrency", c)))
        alone = _points(getattr(baseline, "mixed", None)).get(c)
        text = (f"mixed workload at concurrency {c:g}, ITL p99: {_ms(mr[c].median('p99_itl_ms'))} "
                f"on replicas, {_ms(md[c].median('p99_itl_ms'))} disaggregated "
                f"({_margin(mr[c], md[c], 'p99_itl_ms', won)})"
                + (f"; {_ms(alone.median('p99_itl_ms'))} on 01's single instance" if alone else ""))
        if won == "b":
            said.insert(0, f"As expected, disaggregation protected the ITL tail: {text}.")
        else:
            said.insert(0, "Not as expected: disaggregation did not protect the ITL tail"
                           + (" measurably" if won is None else "") + f": {text}"
                           + (f". {CPU_NOTE[0].upper()}{CPU_NOTE[1:]}"
                              + (", and every prefill or decode instance runs a NIXL thread "
                                 "that polls without pause." if nixl != "waiting" else ".")
                              if device == "cpu" else ".")
                           + _nixl_cause(baseline, disaggregated)
                           + (" The load generator read tokens late there: ITL is partly the "
                              "client's." if late else ""))
    else:
        said.insert(0, "No mixed workload measured by both 03 and 04: the ITL-tail "
                       "expectation is not tested.")
    r, d = _points(replicated), _points(disaggregated)
    both = sorted(set(r) & set(d))
    if both:
        c, one = both[-1], both[0]
        won = better(r[c], d[c], "output_throughput")
        said.append(f"Throughput at concurrency {c:g}: {_tps(r[c])} tok/s "
                    f"replicated, {_tps(d[c])} disaggregated "
                    f"({_margin(r[c], d[c], 'output_throughput', won)})"
                    + ("; one node only prefills, as vLLM's documentation warns." if won == "a"
                       else "."))
        said.append(f"TTFT p50 at concurrency {one:g}: {_ms(r[one].median('median_ttft_ms'))} "
                    f"replicated, {_ms(d[one].median('median_ttft_ms'))} disaggregated: every "
                    "request pays a prefill round trip, the KV move and the hop.")
        p50, p99 = d[one].median("median_ttft_ms"), d[one].median("p99_ttft_ms")
        if p50 and p99 and p99 > TAIL_FACTOR * p50:
            said.append(f"The first-token tail at concurrency {one:g}: TTFT p99 "
                        f"{_ms(p99)} disaggregated against its median of {_ms(p50)} "
                        f"({p99 / p50:.0f}x; replicated {_ms(r[one].median('p99_ttft_ms'))})"
                        + (": a few requests waited far longer than the rest. On the CPU "
                           "rehearsal that is the measured price of NIXL's lowered threads, "
                           "which get a small share of a busy core (docs/REHEARSAL.md, "
                           "`python -m lab_utils.bench.nixl_policies`)." if nixl == "lowered"
                           else "."))
    return said


# ---- 04, optional section: one model across the nodes ------------------------------------


def conclude_tp(baseline: BenchmarkResult, tp: TensorParallelPayload,
                others: dict[str, BenchmarkResult], device: str = "cpu") -> list[str]:
    """Expectation: splitting leaves the output as it was, and makes every decode step wait
    for the ranks' all-reduces over the link; whether reading half the weights per rank
    pays for that is what the sweep decides. `others`: the other two-node architectures'
    sweeps by name ("replicated", "disaggregated"), where they ran."""
    rows = tp.same_output
    equal = sum(r.tokens_equal for r in rows)
    ties = [f"token {r.diverged_at}, {r.divergence_margin:.2f} nats" for r in rows
            if r.tokens_ok and not r.tokens_equal and r.divergence_margin is not None]
    if tp.output_ok:
        said = [f"As expected, splitting the model over {tp.ranks} ranks left its output as it "
                f"was: {equal} of {len(rows)} prompts gave 01's greedy tokens exactly"
                + (f", {'the other' if len(ties) == 1 else 'the others'} parted from them "
                   f"at a near tie ({'; '.join(ties)}): the "
                   "ranks add up their halves of each layer in another order than one "
                   "instance adds the whole." if ties else ".")]
    else:
        said = [f"Not as expected: the split model's output is not 01's for "
                f"{sum(not r.tokens_ok for r in rows)} of {len(rows)} prompts ("
                + "; ".join(r.tokens_why for r in rows if not r.tokens_ok) + ")."]
    a, b = _points(baseline), _points(tp.sweep)
    common = sorted(set(a) & set(b))
    if not common:
        return said + ["No load point measured by both 01 and the split model: nothing to "
                       "compare."]
    one, top = common[0], common[-1]
    won = better(a[one], b[one], "median_tpot_ms")
    text = (f"at concurrency {one:g} a token took {_ms(b[one].median('median_tpot_ms'))} "
            f"(TPOT p50) split over {tp.ranks} nodes against {_ms(a[one].median('median_tpot_ms'))} "
            f"on 01's single instance ({_margin(a[one], b[one], 'median_tpot_ms', won)})")
    if won == "b":
        said.append(f"Reading 1/{tp.ranks} of the weights per rank paid for the all-reduces: {text}.")
    else:
        said.append(f"The all-reduces cost more than reading 1/{tp.ranks} of the weights saved: "
                    f"{text}"
                    + (". On the CPU rehearsal the ranks share the machine's two cores and "
                       "exchange every layer's output through Gloo on loopback; what two GPUs "
                       "over RoCE would show is not measured here." if device == "cpu" else "."))
    for name, other in others.items():
        o = _points(other)
        if top in o:
            w = better(o[top], b[top], "output_throughput")
            said.append(f"Throughput at concurrency {top:g}: {_tps(o[top])} tok/s {name}, "
                        f"{_tps(b[top])} split ({_margin(o[top], b[top], 'output_throughput', w)})"
                        + (f": {name} wins on a model that fits one node." if w == "a" else "."))
    return said


def conclusions_of(rows: list[str]) -> str:
    """The sentences as the notebooks print them."""
    return "\n".join(f"- {s}" for s in rows)


__all__ = ["better", "conclude_01", "conclude_02", "conclude_03", "conclude_04",
           "conclude_tp", "conclusions_of"]
