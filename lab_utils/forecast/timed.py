"""Calibrate the replicated, the P/D and the split forecast on the notebook's own instances, timed a
few fresh requests one at a time before its sweep, as 01 profiles its instance before its
own sweep (`notebook.time_split.time_instances`).

What the model cannot know from 01 alone is what its instances pay beside each other and
beside vLLM's machinery for disaggregation:

- **Replicas on one machine** (the rehearsal): 01 times a decode beside a stand-in for
  the other replica's idle worker, a loop that is not vLLM; measured in one go it read
  0.78x-1.73x in four runs where the replicas measured 1.11x-1.38x. 03 times its replicas
  instead: their time per token over 01's decode step alone at that context is the
  factor a replica's decode steps take (`Inputs.replica_beside`). A replica's request
  path is the single instance's, so nothing is added to its TTFT.
- **Prefill/decode**: the decode instance runs the NIXL connector's bookkeeping every
  step, and a request waits for the side channel, the transfer's notification and a
  scheduling round before its first decode step; none of it exists in 01's instance or
  02's bare NIXL agents. The pair's time per token over 01's step is the decode
  instance's factor (`Inputs.decode_beside`), and the fixed cost that makes the model's
  median TTFT for those requests equal theirs is added to every request's decode leg
  (`Inputs.pd_extra_ms`, never below 0; where instances share a machine the model
  stretches it like every fixed cost, so it is solved for, not subtracted).

- **A split model** (tensor parallel): its time per token beyond 1/ranks of 01's step and
  the all-reduces' bytes over the link is what every step's all-reduces cost besides
  (`Inputs.tp_step_ms`: their latency, and on the rehearsal the two ranks' exchange
  through Gloo on a shared machine).

Only concurrency 1 is timed; every other load point, and the mixed workload, is still the
model's prediction. The model's miss at the timed point before it is calibrated
(`timed_errors`) is also a graded value of this architecture: the forecast's interval
counts it with the errors graded earlier in the series (`forecast.band`).
"""

from __future__ import annotations

from dataclasses import replace

from lab_utils.forecast.model import Architecture, Inputs, Load, forecast
from lab_utils.results.forecast import GradeRow, TimedProfile


def _probe(timed: TimedProfile, output_len: int, seed: int) -> Load:
    return Load(input_len=timed.prompt_tokens, output_len=output_len,
                num_prompts=max(timed.requests, 1), concurrency=1, seed=seed)


def timed_errors(inputs: Inputs, arch: Architecture, timed: TimedProfile, output_len: int,
                 seed: int = 0) -> list[GradeRow]:
    """The uncalibrated model against the timed requests, as graded rows (for
    `band.error_band`): TTFT p50 and the time per token."""
    m = forecast(inputs, arch, _probe(timed, output_len, seed)).metrics
    rows = [GradeRow("median_ttft_ms", m["median_ttft_ms"], timed.ttft_ms)]
    if timed.step_ms:
        rows.append(GradeRow("median_tpot_ms", m["median_tpot_ms"], timed.step_ms))
    return rows


def calibrate(inputs: Inputs, arch: Architecture, timed: TimedProfile, output_len: int,
              seed: int = 0) -> tuple[Inputs, str]:
    """`inputs` with the timed figures in place, and the sentence that says so."""
    context = timed.prompt_tokens + (3 * output_len) // 4  # the settled tail's mean position
    alone = inputs.engine.decode_step(1, context)
    said_alone = f"{alone:.2f} ms, read off 01's engine profile at {context} tokens"
    if arch.ranks > 1:
        return _calibrate_split(inputs, arch, timed, alone, said_alone)
    kept = inputs.decode_beside if arch.disaggregated else inputs.replica_beside
    factor = timed.step_ms / alone if timed.step_ms and alone > 0 else kept
    stepped = (replace(inputs, decode_beside=factor, pd_extra_ms=0.0) if arch.disaggregated
               else replace(inputs, replica_beside=factor, pd_extra_ms=0.0))
    who = "the decode instance's steps" if arch.disaggregated else "a replica's decode steps"
    step = ("no time per token measured: 01's factor kept" if not timed.step_ms else
            f"{timed.step_ms:.2f} ms per token, {factor:.2f}x the model's step for one request "
            f"at that context ({said_alone}), the factor {who} take in place of 01's "
            "stand-ins" + (" (below 1: faster than 01's profiled step; this run does not "
                           "measure why)" if factor < 1 else ""))
    head = (f"{'04' if arch.disaggregated else '03'}'s instances timed before the sweep: "
            f"{timed.requests} fresh requests of {timed.prompt_tokens} tokens one at a time, "
            f"TTFT median {timed.ttft_ms:.1f} ms")
    if not arch.disaggregated:
        return stepped, f"{head}; {step}"
    probe = _probe(timed, output_len, seed)

    def ttft(extra: float) -> float:
        return forecast(replace(stepped, pd_extra_ms=extra), arch, probe).metrics[
            "median_ttft_ms"] or 0.0

    without = ttft(0.0)
    gap = max(timed.ttft_ms - without, 0.0)
    extra = gap
    if gap > 0:  # sharing stretches the extra too: scale it so the model meets the pair
        slope = (ttft(gap) - without) / gap
        extra = gap / slope if slope > 0 else gap
    stretched = (f" ({gap:.1f} ms once sharing the machine stretches it)"
                 if abs(gap - extra) >= 0.05 else "")
    leg = ("each request's decode leg (from the prefill's answer to the first token on the "
           "decode instance)")
    said = (f"{head} against {without:.1f} ms from the model's other terms, so {leg} gets "
            f"{extra:.1f} ms more{stretched}; {step}" if gap > 0 else
            f"{head}, no more than the {without:.1f} ms the model's other terms give, so "
            f"nothing is added to {leg} (a measured term is never taken away); {step}")
    return replace(stepped, pd_extra_ms=extra), said


def _calibrate_split(inputs: Inputs, arch: Architecture, timed: TimedProfile,
                     alone: float, said_alone: str) -> tuple[Inputs, str]:
    """A split model: what its time per token has beyond 1/ranks of 01's step and the
    bytes over the link is the fixed cost of a step's all-reduces (`Inputs.tp_step_ms`)."""
    head = (f"the split instance timed before the sweep: {timed.requests} fresh requests of "
            f"{timed.prompt_tokens} tokens one at a time, TTFT median {timed.ttft_ms:.1f} ms")
    if not timed.step_ms:
        return inputs, f"{head}; no time per token measured: the all-reduces' latency is left out"
    share = alone / arch.ranks + replace(inputs, tp_step_ms=0.0).allreduce_ms(1)
    fixed = max(timed.step_ms - share, 0.0)
    return replace(inputs, tp_step_ms=fixed), (
        f"{head}; {timed.step_ms:.2f} ms per token against {share:.2f} ms for 1/{arch.ranks} "
        f"of 01's step ({said_alone}) and the bytes over the link, so the forecast adds "
        f"{fixed:.2f} ms to every step: the all-reduces' latency and whatever else the split "
        "adds, not told apart by this timing")


def calibrated_edges(edges_of, calibrated: Inputs):
    """`edge -> Inputs` with the timed figures at every edge (they are one measurement)."""
    return lambda edge: replace(edges_of(edge), decode_beside=calibrated.decode_beside,
                                replica_beside=calibrated.replica_beside,
                                pd_extra_ms=calibrated.pd_extra_ms,
                                tp_step_ms=calibrated.tp_step_ms)
