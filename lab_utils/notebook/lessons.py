"""What notebooks 01-04 conclude, computed from their own results: what won, by how much,
at which load, what it cost, and whether the forecast the notebook made before measuring
held (its interval), with the numbers quoted. Each `conclude_NN` returns claims
(`results.claims`): the sentence and the comparisons that make it true. "As expected"
is said only of a graded forecast, never of a belief.

Over 400 lines on purpose: each notebook's conclusions side by side, built the same way,
so that one can be read against the others.

Whether a difference counts is decided by the lab's one rule (`points.compare`: more
than `points.MARGIN` of the smaller value and, with repeats on both sides, min-max ranges
apart), the same as the report's, the comparison tables' and the forecast grading's.
"""

from __future__ import annotations

from lab_utils.forecast.grade import grade_rows
from lab_utils.measure.benchmark import read_late
from lab_utils.results import BaselinePayload, Proof, TensorParallelPayload
from lab_utils.results.claims import Claim, Comparison, Graded, Located, claim, comparison
from lab_utils.results.experiments import policy_sides
from lab_utils.results.forecast import Forecast
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.payloads import Policies
from lab_utils.results.points import (
    BY_KEY,
    COMPARED,
    MARGIN,
    Measured,
    MetricKey,
    Point,
    compare,
    differs,
)
from lab_utils.results.sweep import BenchmarkResult
from lab_utils.util.numbers import join_words

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


def _margin(c: Comparison) -> str:
    """The subject against the reference as a ratio with the direction in words ("1.3x
    lower"), or that they do not differ by the lab's rule."""
    return "no difference by the lab's rule" if c.better is None else c.margin()


def _was(c: Comparison) -> str:
    """"was 1.3x higher", or "did not differ by the lab's rule"."""
    return "did not differ by the lab's rule" if c.better is None else f"was {c.margin()}"


def forecast_said(fc: Forecast | None, runs: dict[str, BenchmarkResult | None], key: MetricKey,
                  workload: str, value: float, notebook: str) -> tuple[str, list[Graded]]:
    """Whether the forecast the notebook made before measuring held for `key` at one load
    ("as the forecast made before the sweep expected (predicted 794 tok/s, interval
    640-980 tok/s, measured 739 tok/s)", or "not as ...: outside its interval"), and the
    grade that makes it true; ("", []) without a graded forecast there."""
    load = None if fc is None else next(
        (r.load for r in fc.rows if r.workload == workload and r.mode == "concurrency"
         and float(r.value) == value), None)
    if fc is None or load is None:
        return "", []
    row = next((r for r in grade_rows(fc, runs) if r.metric == key
                and r.workload == workload and r.load == load and r.graded), None)
    if row is None or row.lo is None or row.hi is None or row.measured is None:
        return "", []
    m = BY_KEY[key]
    grade = [Graded(notebook=notebook, workload=workload, load=load, metric=key,
                    inside=row.inside)]
    if row.inside:
        where = "inside its interval"
    else:
        edge = row.hi if row.measured > row.hi else row.lo
        side = "above" if row.measured > row.hi else "below"
        where = (f"{side} its interval ({abs(row.measured - edge) / edge:.1%} {side} its "
                 + ("end; different from the forecast by the lab's rule)" if row.differs else
                    "end; not different from the forecast by the lab's rule)"))
    return (f"the forecast made before the sweep predicted {m.text(row.predicted)} "
            f"(interval {m.text(row.lo, False)}-{m.text(row.hi)}); the measurement, "
            f"{m.text(row.measured)}, fell {where}", grade)


COMPARED_KEYS: tuple[MetricKey, ...] = tuple(m.key for m in COMPARED)


def _lost(subject: Located, reference: Located) -> list[Comparison]:
    """Every compared metric but the ITL tail (the one a routing choice is judged on) that
    both sides measured and the reference won: what the subject's choice cost."""
    return [x for k in COMPARED_KEYS if k != "p99_itl_ms" and subject[3].median(k) is not None
            and reference[3].median(k) is not None
            for x in [comparison(k, subject, reference)] if x.better == "reference"]


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g} ms"


def _tps(p: Point) -> str:
    """A point's output throughput as the sentences quote it ("505")."""
    tps = p.median("output_throughput")
    return "–" if tps is None else f"{tps:.0f}"


# ---- 01 ---------------------------------------------------------------------------------


def _single_request(payload: BaselinePayload, lo: Point) -> list[Claim]:
    """The request measured alone at the top of 01 against the sweep's lowest load: apart
    by the lab's rule, it is said why they are not the same kind of request."""
    one, at = getattr(payload, "single_request", None), lo.of("median_ttft_ms")
    if one is None or one.ttft_ms is None or at is None or lo.value != 1:
        return []
    sweep = f"the sweep's TTFT p50 at concurrency 1 ({at.median:.3g} ms"
    sweep += f", {at.min:.3g}-{at.max:.3g} ms over its {at.n} runs)" if at.ranged else ")"
    text = f"The request measured alone at the top took {one.ttft_ms:.3g} ms to its first token, "
    if not compare(Measured.one(one.ttft_ms), at, "median_ttft_ms").differs:
        text += f"as {sweep} did by the lab's rule."
    else:
        text += (f"{BY_KEY['median_ttft_ms'].times(one.ttft_ms, at.median)} than {sweep}: "
                "it was the instance's first request since it started"
                + (", while the sweep sends warm-up requests first and leaves them out"
                   if (payload.sweep.workload or {}).get("warmup") else "")
                + ", so the two are not the same kind of request.")
    return [claim("01", text, single_ttft_ms=one.ttft_ms, sweep_ttft_p50_ms=at.median)]


def conclude_01(payload: BaselinePayload, device: str = "cpu") -> list[Claim]:
    """Batching: output throughput from the lowest to the highest concurrency, at what
    cost in TPOT and TTFT, and whether the forecast of the sweep held there."""
    pts = _points(payload.sweep)
    if len(pts) < 2:
        return [claim("01", "Only one valid load point: nothing to compare across concurrency.")]
    lo, hi = pts[min(pts)], pts[max(pts)]
    at = lambda p: ("single instance", "01", "sweep", p)  # noqa: E731
    tps, tpot, ttft = (comparison(k, at(hi), at(lo))
                       for k in ("output_throughput", "median_tpot_ms", "median_ttft_ms"))
    # a cost the top load's spread hides can show at a load between (its own comparison)
    between = [c for v in sorted(pts) if min(pts) < v < max(pts)
               for c in [comparison("median_tpot_ms", at(pts[v]), at(lo))]
               if c.better == "reference" and tpot.better is None]
    also = "".join(f"; at concurrency {c.value:g} it was {c.margin()} "
                   f"({_ms(c.subject.value.median)})" for c in between)
    fc, grade = forecast_said(getattr(payload, "forecast", None), {"standard": payload.sweep},
                              "output_throughput", "standard", max(pts), "01")
    fc = f" At concurrency {max(pts):g}, {fc}." if fc else ""
    said = []
    if tps.better == "subject":
        said.append(claim("01", f"Batching paid: output throughput rose {tps.margin().split()[0]} "
                          f"from concurrency {min(pts):g} to {max(pts):g} ({_tps(lo)} -> "
                          f"{_tps(hi)} tok/s) while TPOT p50 {_was(tpot)} "
                          f"({_ms(lo.median('median_tpot_ms'))} -> "
                          f"{_ms(hi.median('median_tpot_ms'))}{also}) and TTFT p50 {_was(ttft)} "
                          f"({_ms(lo.median('median_ttft_ms'))} -> "
                          f"{_ms(hi.median('median_ttft_ms'))}): up to {max(pts):g} requests "
                          f"could share a step.{fc}",
                          tps, tpot, ttft, *between, graded=grade))
    else:
        said.append(claim("01", f"Batching did not pay: output throughput at concurrency "
                          f"{max(pts):g} was {_margin(tps)} against {min(pts):g} ({_tps(lo)} "
                          f"tok/s at {min(pts):g}, {_tps(hi)} at {max(pts):g}): the instance was "
                          "already saturated with one request"
                          + (f"; {CPU_NOTE}." if device == "cpu" else ".") + fc, tps,
                          graded=grade))
    said += _single_request(payload, lo)
    roof = payload.roofline
    if roof and roof.max_tokens_per_s_per_stream and (lo_tpot := lo.median("median_tpot_ms")):
        per_stream = 1000 / lo_tpot
        share = per_stream / roof.max_tokens_per_s_per_stream
        said.append(claim("01", f"One stream decoded {per_stream:.0f} tokens/s, {share:.0%} of the memory "
                    f"roofline ({roof.max_tokens_per_s_per_stream:.0f} tokens/s)"
                    + (": far below it, so something other than reading the weights sets the "
                       "pace here (this run does not measure what)." if share < 0.2 else
                       ": within reach of it, as a memory-bound decode would be."),
                          per_stream=per_stream, roofline=roof.max_tokens_per_s_per_stream))
    if payload.profile and payload.profile.prefill:
        p = sorted(payload.profile.prefill, key=lambda q: q.x)
        said.append(claim("01", "Prefill (profile): " + ", ".join(
            f"{q.median:.3g} ms for {q.x:g} tokens" for q in p) + ".",
            figures={f"{q.x:g} tokens": q.median for q in p}))
    if read_late(payload.sweep, "concurrency", max(pts)):
        said.append(claim("01", f"At concurrency {max(pts):g} the load generator read many "
                          "tokens late: its ITL and TPOT there are the client's, not the "
                          "engine's."))
    return said


# ---- 02 ---------------------------------------------------------------------------------


def _above(ratio: float) -> bool:
    """Whether a transfer took longer than the estimate by the lab's rule (measured /
    predicted = `ratio`: more than `points.MARGIN` above it)."""
    return ratio > 1 and differs(Measured.one(ratio), Measured.one(1.0))


ABOVE = f"more than {MARGIN:.0%} above the estimate"
"""How the 02 sentences name the transfers `_above` picks, the threshold stated."""


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
    head = (f"The estimate divides by the best READ bandwidth the probe reached (a decode "
            f"reads the prefill's KV), "
            f"{best['bandwidth_GBps']:.3g} GB/s, at {_mib(best['bytes'])}")
    if best is largest:
        return head + (", its largest transfer: there the two agree by construction, so read "
                       "the smaller sizes.")
    smallest = min(mine, key=lambda r: r["bytes"])
    if not differs(Measured.one(best["bandwidth_GBps"]), Measured.one(largest["bandwidth_GBps"])):
        return head + (f"; its largest transfer ({_mib(largest['bytes'])}) reached "
                       f"{largest['bandwidth_GBps']:.3g} GB/s, within {MARGIN:.0%} of it: "
                       "no size stands out by the lab's rule, so the estimate holds across "
                       "them.")
    return head + (f", not at its largest transfer ({_mib(largest['bytes'])} reached "
                   f"{largest['bandwidth_GBps']:.3g} GB/s, "
                   f"{best['bandwidth_GBps'] / largest['bandwidth_GBps']:.1f}x less): the "
                   "estimate is exact near that size and optimistic above it, where the "
                   "bandwidth fell"
                   + (", and below it by any fixed cost per transfer"
                      if best is not smallest else
                      " (it was the smallest size probed: nothing below it was measured)")
                   + ".")


def _spread_ms(kv: KvTransferPayload, nbytes: int) -> float:
    """The run-to-run variation of one size's READs in the probe: p90 - p50 (ms); 0 when
    the probe did not record that size."""
    row = next((r for r in kv.probe.rows if r.get("op") == "READ" and r.get("bytes") == nbytes
                and r.get("p90_us") is not None and r.get("p50_us") is not None), None)
    return (row["p90_us"] - row["p50_us"]) / 1e3 if row else 0.0


def _fastest_is(kv: KvTransferPayload, nbytes: int) -> bool:
    """Whether the probe's best READ bandwidth was at `nbytes` (the estimate's divisor)."""
    reads = [r for r in kv.probe.rows if r.get("op") == "READ" and r.get("bandwidth_GBps")]
    return bool(reads) and max(reads, key=lambda r: r["bandwidth_GBps"]).get("bytes") == nbytes


def conclude_02(kv: KvTransferPayload, input_len: int | None = None) -> list[Claim]:
    """Whether short prompts paid a fixed per-transfer cost above size / bandwidth."""
    rows = [(r, r.measured_ms, r.predicted_ms) for r in kv.predicted_vs_measured
            if r.measured_ms and r.predicted_ms]
    ratios = [(r.prompt_tokens, m / p) for r, m, p in rows]
    said = []
    per_token = kv.kv_per_token_bytes
    if input_len:
        blocks = -(-input_len // kv.block_size)
        said.append(f"A {input_len}-token prompt of {kv.model} holds "
                    f"{blocks * kv.block_size * per_token / 2**20:.3g} MiB of KV "
                    f"({blocks} blocks of {kv.block_size} tokens x {per_token:,} bytes).")
    if len(ratios) < 2:
        said.append("The probe measured fewer than two prompt sizes: no comparison.")
        return [claim("02", t) for t in said]
    short, long = ratios[0], ratios[-1]
    # as percentages with a decimal: "x1.10" would read as exactly the 10% threshold
    over = [f"{n} tokens +{(q - 1) * 100:.1f}%" for n, q in ratios if _above(q)]
    fell = "at the largest size only" if len(over) == 1 else "at the larger sizes"
    first, measured, predicted = rows[0]
    excess_us = (measured - predicted) * 1e3
    spread_us = _spread_ms(kv, first.kv_bytes) * 1e3
    s, lg = short[1], long[1]
    at = f"{ABOVE} at: {', '.join(over)}"
    noise = f"run-to-run variation (p90 - p50: {spread_us:.0f} µs)"
    if _above(s) and s > lg and excess_us <= spread_us:
        said.insert(0, f"The shortest prompt's transfer took {s:.2f}x the size / best-bandwidth "
                       f"estimate, the longest {lg:.2f}x, but the shortest's excess "
                       f"({excess_us:.0f} µs) is no larger than its own {noise}: no fixed cost "
                       f"per transfer stands out of the noise ({at}).")
    elif _above(s) and s > lg:
        said.insert(0, f"The shortest prompt paid a fixed cost: its transfer took {s:.2f}x the "
                       f"size / best-bandwidth estimate, the longest {lg:.2f}x; its excess "
                       f"({excess_us:.0f} µs) is larger than its {noise} ({at}).")
    elif _above(lg) and _above(s) and excess_us <= spread_us:
        said.insert(0, f"The longest prompt's transfer took {lg:.2f}x the size / best-bandwidth "
                       f"estimate (the bandwidth fell {fell}); the shortest's {s:.2f}x is an "
                       f"excess of {excess_us:.0f} µs, no larger than its own {noise}, so no "
                       f"fixed cost per transfer stands out of the noise ({at}).")
    elif _above(lg) and _above(s):
        said.insert(0, f"Both ends took longer than the size / best-bandwidth estimate: the "
                       f"shortest prompt's transfer {s:.2f}x (a fixed cost per transfer, or the "
                       f"lower bandwidth of small sizes), the longest {lg:.2f}x (the bandwidth "
                       f"fell {fell}); {at}.")
    elif _above(lg) and _fastest_is(kv, first.kv_bytes):
        said.insert(0, f"The shortest prompt's transfer was the fastest per byte of the "
                       f"probe, so the estimate, which divides by that best bandwidth, matches "
                       f"it by construction ({s:.2f}x); the longer ones took more, up to "
                       f"{lg:.2f}x at the longest ({at}). With the smallest transfer the "
                       "fastest per byte, no fixed cost per transfer can show in this run.")
    elif _above(lg):
        said.insert(0, f"The longest prompt's transfer took {lg:.2f}x the size / best-bandwidth "
                       f"estimate, the shortest {s:.2f}x, within {MARGIN:.0%} of the estimate: "
                       f"here the bandwidth fell {fell}, and no fixed cost per transfer shows "
                       f"({at}).")
    else:
        said.insert(0, f"The shortest prompt's transfer took {s:.2f}x the size / best-bandwidth "
                       f"estimate, no more than the longest ({lg:.2f}x): at these sizes the "
                       "fixed cost per transfer is too small to see beside the bytes"
                       + (f"; {ABOVE} only at: {', '.join(over)}." if over else "."))
    where = best_transfer_sentence(kv.probe.rows)
    if where:
        said.append(where)
    rec = kv.recommendation
    said.append(f"kv_buffer_device for 04: {rec.kv_buffer_device!r} ({rec.reason}).")
    return [claim("02", t) for t in said]


# ---- 03 ---------------------------------------------------------------------------------


def conclude_03(baseline: BenchmarkResult, replicated: BenchmarkResult,
                mixed: BenchmarkResult | None = None, device: str = "cpu",
                forecast: Forecast | None = None, policy: str | None = None,
                policies: Policies | None = None) -> list[Claim]:
    """Capacity: two replicas against one instance at the highest common concurrency (and
    whether 03's forecast held there); a request alone at the lowest; the long prompts'
    effect on the ITL tail."""
    a, b = _points(baseline), _points(replicated)
    common = sorted(set(a) & set(b))
    if not common:
        return [claim("03", "No load point measured by both 01 and 03: nothing to compare.")]
    top, one = common[-1], common[0]
    single = lambda p: ("single instance", "01", "sweep", p)  # noqa: E731
    reps = lambda p: ("replicated", "03", "sweep", p)  # noqa: E731
    tps = comparison("output_throughput", reps(b[top]), single(a[top]))
    fc, grade = forecast_said(forecast, {"standard": replicated, "mixed": mixed},
                              "output_throughput", "standard", top, "03")
    fc = f" For replicated serving at {top:g}, {fc}." if fc else ""
    said = []
    if tps.better == "subject":
        said.append(claim("03", f"Two replicas added capacity: at concurrency {top:g} output "
                          f"throughput was {tps.margin()} than one instance's ({_tps(a[top])} -> "
                          f"{_tps(b[top])} tok/s).{fc}", tps, graded=grade))
    else:
        cmps = [comparison("output_throughput", reps(b[c]), single(a[c])) for c in common]
        lost = [f"{c.value:g}: {_margin(c)}" for c in cmps]
        fewer = all(c.better == "reference" for c in cmps)
        said.append(claim("03", ("Two replicas served less than one instance" if fewer else
                                 "Two replicas did not add capacity") + " (output throughput "
                          f"against one instance at concurrency {', '.join(lost)})"
                          + (f": {CPU_NOTE}, so a second replica brings no cores of its own "
                             "and cannot add capacity here; this run does not split the loss "
                             "it measured into its causes. On two Sparks each has its own GPU."
                             if device == "cpu"
                             else "; check that both nodes serve (status).") + fc, *cmps,
                          graded=grade))
    # the tails too: a lone request can keep its median and still meet a slower worst case
    keys: tuple[MetricKey, ...] = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
                                   "p99_itl_ms")
    cmps = [comparison(k, reps(b[one]), single(a[one])) for k in keys
            if a[one].median(k) is not None and b[one].median(k) is not None]
    if cmps:
        said.append(claim("03", f"At concurrency {one:g}, one request at a time, medians and "
                          "tails: "
                          + "; ".join(f"{BY_KEY[c.metric].label} {_ms(c.reference.value.median)} "
                                      f"alone, {_ms(c.subject.value.median)} on replicas "
                                      f"({_margin(c)})" for c in cmps)
                          + (f". {CPU_NOTE[0].upper()}{CPU_NOTE[1:]}."
                             if device == "cpu" and any(c.better for c in cmps) else "."),
                          *cmps))
    m = _points(mixed)
    if m and top in m and b.get(top) and m[top].median("p99_itl_ms") is not None:
        c = comparison("p99_itl_ms", ("replicated, mixed", "03", "mixed", m[top]), reps(b[top]))
        routed = f", replicas routed {policy.replace('_', '-')}" if policy else ""
        others = [(name, p) for name, p in (policies.runs.items() if policies else [])
                  if name != policy and (p.mode, p.value) == (m[top].mode, m[top].value)
                  and p.median("p99_itl_ms") is not None]

        # the configured policy as the policy comparison judges it: its runs together
        ref_run, ref = (policy_sides(policies.runs, mixed, policy).get(policy or "")
                        if policies else None) or ("mixed", m[top])

        def cost(name: str, p: Point) -> tuple[str, list[Comparison]]:
            """What routing `name` cost against the configured policy, as 03's policy
            comparison judged it (`policy_sides`)."""
            lost = _lost((f"replicated, {name}", "03", f"policy {name}", p),
                         (f"replicated, {policy or 'mixed'}", "03", ref_run, ref))
            return ((", at the cost of " + ", ".join(f"{BY_KEY[x.metric].label} {x.margin()}"
                                                     for x in lost)
                     + f" (against {(policy or 'the mixed sweep').replace('_', '-')}, as the "
                       "policy comparison judged it)") if lost else
                    ", no other metric worse"), lost
        costs = {name: cost(name, p) for name, p in others}
        said.append(claim("03", f"Mixed workload at concurrency {top:g} (one load point"
                          f"{routed}): ITL p99 {_ms(m[top].median('p99_itl_ms'))} against "
                          f"{_ms(b[top].median('p99_itl_ms'))} without long prompts "
                          f"({_margin(c)})" + "".join(
                              f"; routed {name.replace('_', '-')} (03's policy comparison, one "
                              f"run) {_ms(p.median('p99_itl_ms'))}{costs[name][0]}"
                              for name, p in others)
                          + ".", c, *(x for _, lost in costs.values() for x in lost),
                          figures={f"p99_itl_{name}": p.median("p99_itl_ms")
                                   for name, p in others}))
    return said


# ---- 04 ---------------------------------------------------------------------------------


def _nixl_cause(baseline: BaselinePayload | None, disaggregated: BenchmarkResult) -> str:
    """What 01 measured about a decode beside stand-ins for NIXL's threads, against this run."""
    beside = baseline.profile.beside_busy if baseline and baseline.profile else None
    if baseline is None or beside is None or not beside.ratio:
        return ""
    pd_one, single_one = _points(disaggregated).get(1.0), _points(baseline.sweep).get(1.0)
    a, b = (p.median("median_tpot_ms") if p else None for p in (pd_one, single_one))
    ratio = a / b if a is not None and b else None
    here = f"; here TPOT at concurrency 1 was {ratio:.1f}x 01's" if ratio else ""
    if ratio and max(ratio, beside.ratio) > 1.5 * min(ratio, beside.ratio):
        here += (", so 01's stand-ins do not match what the decode met here and the forecast's "
                 "time per token is off by as much (docs/MEASURING.md)")
    return (f" 01 measured a decode step on this machine {beside.ratio:.1f}x slower beside "
            f"{beside.threads} stand-ins for NIXL's threads ({beside.policy}){here}.")


def _against_policies(pd: Point, policies: Policies | None, mixed_rep: BenchmarkResult | None,
                      policy: str | None) -> tuple[str, list[Comparison]]:
    """The P/D ITL tail against 03's other routing policies of the same replicas at the same
    mixed load (`experiments.policy_sides`): routing alone also moves the tail."""
    if policies is None:
        return "", []
    out, cmps = [], []
    for name, (run, p) in policy_sides(policies.runs, mixed_rep, policy).items():
        if name == policy or (p.mode, p.value) != (pd.mode, pd.value):
            continue
        side = (f"replicated, {name}", "03", run, p)
        x = comparison("p99_itl_ms", ("disaggregated", "04", "mixed", pd), side)
        lost = _lost(("disaggregated", "04", "mixed", pd), side)
        cmps += [x, *lost]
        verdict = x.margin() if x.better else x.no_difference()
        named = ("disaggregated", "routed so")
        listed = ", ".join(f"{BY_KEY[c.metric].label} {c.values(*named)} ({c.margin()})"
                           for c in lost)
        # a cost is what a gain was paid with: only where disaggregation won the tail
        tail = (f", at the cost of {listed}" if x.better == "subject" else
                f": routing alone kept the tail lower, and those replicas also won {listed}"
                if x.better == "reference" else f", the replicas winning {listed}")
        out.append(f"against 03's same replicas routed {name.replace('_', '-')} (one run), "
                   f"ITL p99 {x.values(*named)} ({verdict})"
                   + (tail if lost else ", the replicas winning no other metric there"
                      if x.better != "reference" else ": routing alone kept the tail lower"))
    return ("; " + "; ".join(out)) if out else "", cmps


def conclude_04(replicated: BenchmarkResult | None, disaggregated: BenchmarkResult,
                mixed_rep: BenchmarkResult | None, mixed_dis: BenchmarkResult | None,
                proof: Proof | None, device: str = "cpu",
                baseline: BaselinePayload | None = None, nixl: str = "busy",
                forecast: Forecast | None = None, policies: Policies | None = None,
                policy: str | None = None) -> list[Claim]:
    """The ITL tail under mixed load against replicated serving, with its cost in TTFT and
    whether 04's forecast held; throughput; TTFT at the lowest load. `baseline`: 01's
    results, for what its profile measured beside NIXL's threads; `nixl`: what NIXL's
    progress threads did in this run (`NIXL_THREADS`: "busy" as vLLM gets them, "lowered"
    busy at nice 19, "waiting" in poll() with the lab's progress delay)."""
    said = []
    if proof is not None:
        said.append(claim("04", f"The KV cache moved: {'proved' if proof.ok else 'NOT proved'} "
                          f"for {len(proof.prompts)} prompts, {proof.tokens_equal} with output "
                          "equal to 01's.", prompts=len(proof.prompts), equal=proof.tokens_equal))
    mr, md = _points(mixed_rep), _points(mixed_dis)
    common = sorted(set(mr) & set(md))
    pd_mixed = lambda p: ("disaggregated", "04", "mixed", p)  # noqa: E731
    rep_mixed = lambda p: ("replicated", "03", "mixed", p)  # noqa: E731
    if common:
        c = common[-1]
        itl = comparison("p99_itl_ms", pd_mixed(md[c]), rep_mixed(mr[c]))
        late = ((mixed_dis is not None and read_late(mixed_dis, "concurrency", c))
                or (mixed_rep is not None and read_late(mixed_rep, "concurrency", c)))
        alone = _points(getattr(baseline, "mixed", None)).get(c)
        text = (f"mixed workload at concurrency {c:g} (one load point), ITL p99: "
                f"{_ms(mr[c].median('p99_itl_ms'))} on replicas, "
                f"{_ms(md[c].median('p99_itl_ms'))} disaggregated ({_margin(itl)})"
                + (f"; {_ms(alone.median('p99_itl_ms'))} on 01's single instance (01's mixed "
                   f"sweep at the same load, baseline_metrics.json)" if alone else ""))
        costs = [comparison(k, pd_mixed(md[c]), rep_mixed(mr[c])) for k in COMPARED_KEYS
                 if md[c].median(k) is not None and mr[c].median(k) is not None]
        lost = [x for x in costs if x.better == "reference"]
        paid = ("; what it cost there (every metric the replicas won at that point): "
                + ", ".join(f"{BY_KEY[x.metric].label} "
                            f"{x.values('disaggregated', 'on replicas')} ({x.margin()})"
                            for x in lost)
                if lost else "; the replicas won on no other metric at that point")
        fc, grade = forecast_said(forecast, {"standard": disaggregated, "mixed": mixed_dis},
                                  "p99_itl_ms", "mixed", c, "04")
        fc = f". For its ITL p99 there, {fc}" if fc else ""
        routed, by_policy = _against_policies(md[c], policies, mixed_rep, policy)
        beaten_by = [x.reference.name.removeprefix("replicated, ").replace("_", "-")
                     for x in by_policy if x.metric == "p99_itl_ms" and x.better == "reference"]
        if itl.better == "subject":
            head = ("Disaggregation protected the ITL tail" if not beaten_by else
                    f"Disaggregation protected the ITL tail against "
                    f"{(policy or 'the sweep').replace('_', '-')} replicas, but "
                    f"{join_words(beaten_by)} routing protected it more")
            said.insert(0, claim("04", f"{head}: {text}{paid}"
                                 f"{routed}{fc}.", itl, *costs, *by_policy, graded=grade))
        else:
            said.insert(0, claim(
                "04", "Disaggregation did not protect the ITL tail"
                + (" measurably" if itl.better is None else "") + f": {text}{paid}{fc}"
                + (f". {CPU_NOTE[0].upper()}{CPU_NOTE[1:]}"
                   + (", and every prefill or decode instance runs a NIXL thread that polls "
                      "without pause." if nixl != "waiting" else ".") if device == "cpu" else ".")
                + _nixl_cause(baseline, disaggregated)
                + (" The load generator read tokens late there: ITL is partly the client's."
                   if late else "") + (f" Also{routed}." if routed else ""), itl, *costs,
                *by_policy, graded=grade))
    else:
        said.insert(0, claim("04", "No mixed workload measured by both 03 and 04: the ITL "
                             "tail under long prompts is not compared."))
    r, d = _points(replicated), _points(disaggregated)
    both = sorted(set(r) & set(d))
    if both:
        c, one = both[-1], both[0]
        pd_at = lambda p: ("disaggregated", "04", "sweep", p)  # noqa: E731
        rep_at = lambda p: ("replicated", "03", "sweep", p)  # noqa: E731
        every = [comparison("output_throughput", pd_at(d[x]), rep_at(r[x])) for x in both]
        single = _points(baseline.sweep) if baseline else {}
        vs_single = [comparison("output_throughput", pd_at(d[x]),
                                ("single instance", "01", "sweep", single[x]))
                     for x in sorted(set(d) & set(single))]
        mixed_too = [comparison("output_throughput", pd_mixed(md[x]), rep_mixed(mr[x]))
                     for x in common]

        def raised(cs: list[Comparison], what: str) -> str:
            up = [f"{c.value:g}" for c in cs if c.better == "subject"]
            return (f"against {what} it did at concurrency {join_words(up)}" if up else
                    f"against {what} it did not at any load both measured")
        said.append(claim(
            "04", "Output throughput, disaggregated against replicated, at every load both "
            "measured: " + "; ".join(f"concurrency {t.value:g}: {_tps(d[t.value])} against "
                                     f"{_tps(r[t.value])} tok/s ({_margin(t)})" for t in every)
            + ". vLLM's documentation says disaggregated prefill does not raise throughput; "
            + raised(every, "replicated serving")
            + (f", {raised(vs_single, chr(48) + '1' + chr(39) + 's single instance')}"
               if vs_single else "")
            + (f", and on the mixed workload {raised(mixed_too, 'replicated serving')}"
               if mixed_too else "") + ".", *every, *vs_single, *mixed_too))
        ttft = comparison("median_ttft_ms", pd_at(d[one]), rep_at(r[one]))
        said.append(claim("04", f"TTFT p50 at concurrency {one:g}: "
                          f"{_ms(r[one].median('median_ttft_ms'))} replicated, "
                          f"{_ms(d[one].median('median_ttft_ms'))} disaggregated "
                          f"({_margin(ttft)})"
                          + ("; 'Where the time went' above splits a request's TTFT into its "
                             "parts (the prefill, the proxy hop, the KV move, the first decode "
                             "step)." if ttft.better == "reference" else "."), ttft))
        p50, p99 = d[one].median("median_ttft_ms"), d[one].median("p99_ttft_ms")
        if p50 and p99 and p99 > TAIL_FACTOR * p50:
            said.append(claim(
                "04", f"The first-token tail at concurrency {one:g}: TTFT p99 "
                f"{_ms(p99)} disaggregated against its median of {_ms(p50)} "
                f"({p99 / p50:.0f}x; replicated {_ms(r[one].median('p99_ttft_ms'))})"
                + (": a few requests waited far longer than the rest. On the CPU rehearsal that "
                   "is the measured price of NIXL's lowered threads, which get a small share of "
                   "a busy core (docs/REHEARSAL.md)." if nixl == "lowered" else "."),
                p50=p50, p99=p99))
    return said


# ---- 04, optional section: one model across the nodes ------------------------------------


def conclude_tp(baseline: BenchmarkResult, tp: TensorParallelPayload,
                others: dict[str, BenchmarkResult], device: str = "cpu") -> list[Claim]:
    """The split model's output against 01's (by the rule its check used, named), its cost
    per token at the lowest load, and its throughput against the other two-node
    architectures at the highest. `others`: their sweeps by name ("replicated",
    "disaggregated"), where they ran."""
    rows = tp.same_output
    equal = sum(r.tokens_equal for r in rows)
    ties = [f"output token {r.diverged_at}, counted from 0, {r.divergence_margin:.2f} nats" for r in rows
            if r.tokens_ok and not r.tokens_equal and r.divergence_margin is not None]
    rule = ("by the split model's check: a prompt passes when its greedy tokens equal 01's or "
            "part from them only where the split model's own logprobs put 01's token within "
            "0.5 nats of its choice, the first token included. "
            + ("04's proof of transfer wants exact equality on the CPU rehearsal; a split model "
               "cannot promise that, as its ranks add up their parts of each layer in another "
               "order than one instance adds the whole" if device == "cpu" else
               "04's proof allows a near tie after the first token only, as its first token "
               "comes from the transferred KV alone; a split model moves no KV")
            + "; so the two checks differ on purpose")
    verdict = (f"passed its check: {equal} of {len(rows)} prompts gave 01's greedy tokens "
               "exactly" + (f", {len(ties)} parted from them at a near tie ({'; '.join(ties)})"
                            if ties else "") if tp.output_ok else
               f"failed its check for {sum(not r.tokens_ok for r in rows)} of {len(rows)} "
               "prompts (" + "; ".join(r.tokens_why for r in rows if not r.tokens_ok) + ")")
    said = [claim("tp", f"The split model's output {verdict}. The rule, {rule}.",
                  prompts=len(rows), equal=equal)]
    a, b = _points(baseline), _points(tp.sweep)
    common = sorted(set(a) & set(b))
    if not common:
        return said + [claim("tp", "No load point measured by both 01 and the split model: "
                             "nothing to compare.")]
    one, top = common[0], common[-1]
    split = lambda p: ("tensor-parallel", "tp", "sweep", p)  # noqa: E731
    tpot = comparison("median_tpot_ms", split(b[one]), ("single instance", "01", "sweep", a[one]))
    text = (f"at concurrency {one:g} a token took {_ms(b[one].median('median_tpot_ms'))} "
            f"(TPOT p50) split over {tp.ranks} nodes against "
            f"{_ms(a[one].median('median_tpot_ms'))} on 01's single instance ({_margin(tpot)})")
    if tpot.better == "subject":
        said.append(claim("tp", f"Split, the model was faster per token: {text}.", tpot))
    elif tpot.better == "reference":
        said.append(claim("tp", f"Split, the model was slower per token: {text}"
                          + (". The ranks share the machine's two cores with the proxy and the "
                             "load generator and exchange every layer's output through Gloo on "
                             "loopback; this run does not measure how much of the difference "
                             "each of those is, nor what two GPUs over RoCE would show."
                             if device == "cpu" else "."), tpot))
    else:
        said.append(claim("tp", f"Splitting the model neither paid nor cost per token by the "
                          f"lab's rule: {text}.", tpot))
    for name, other in others.items():
        o = _points(other)
        if top in o:
            nb = {"replicated": "03", "disaggregated": "04"}[name]
            c = comparison("output_throughput", split(b[top]), (name, nb, "sweep", o[top]))
            said.append(claim("tp", f"Throughput at concurrency {top:g}: {_tps(o[top])} tok/s "
                              f"{name}, {_tps(b[top])} split ({_margin(c)})"
                              + (f": {name} was ahead in this run." if c.better == "reference"
                                 else "."), c))
    return said


def conclusions_of(rows: list[Claim]) -> str:
    """The sentences as the notebooks print them."""
    return "\n".join(f"- {c.text}" for c in rows)


__all__ = ["conclude_01", "conclude_02", "conclude_03", "conclude_04", "conclude_tp",
           "conclusions_of", "forecast_said"]
