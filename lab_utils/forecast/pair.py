"""Calibrate the P/D forecast on notebook 04's own pair, timed before its sweep.

What a P/D request costs on top of one instance's work is mostly vLLM's, not the model's:
the decode instance runs the NIXL connector's bookkeeping every step, and a request
waits for the side channel, the transfer's notification and a scheduling round before its
first decode step. None of that exists in 01's single instance, and 02's probe moves
bytes between two bare NIXL agents. So 04 sends a few fresh requests one at a time
through its pair before it forecasts (`notebook.time_split.measure_split`), as 01 profiles
its instance before its own sweep, and the model takes two figures from them
(assumption 8 of `forecast.model`):

- the decode instance's time per token: their median settled token gap over 01's decode
  step alone at the same context (`Inputs.decode_beside`, in place of 01's stand-ins);
- the fixed cost of a P/D request beyond the model's terms: what makes the model's median
  TTFT for them equal theirs (`Inputs.pd_extra_ms`, never below 0; where instances share
  a machine the model stretches it like every fixed cost, so it is solved for, not
  subtracted).

Only concurrency 1 is measured; every other load point, and the mixed workload, is still
the model's prediction.
"""

from __future__ import annotations

from dataclasses import replace

from lab_utils.forecast.model import Architecture, Inputs, Load, forecast
from lab_utils.results.forecast import PairProfile


def calibrate(inputs: Inputs, arch: Architecture, pair: PairProfile, output_len: int,
              seed: int = 0) -> tuple[Inputs, str]:
    """`inputs` with the pair's two figures in place, and the sentence that says so."""
    context = pair.prompt_tokens + (3 * output_len) // 4  # the settled tail's mean position
    alone = inputs.engine.decode_step(1, context)
    factor = pair.step_ms / alone if pair.step_ms and alone > 0 else inputs.decode_beside
    stepped = replace(inputs, decode_beside=factor, pd_extra_ms=0.0)
    probe = Load(input_len=pair.prompt_tokens, output_len=output_len,
                 num_prompts=max(pair.requests, 1), concurrency=1, seed=seed)

    def ttft(extra: float) -> float:
        return forecast(replace(stepped, pd_extra_ms=extra), arch, probe).metrics[
            "median_ttft_ms"] or 0.0

    without = ttft(0.0)
    extra = max(pair.ttft_ms - without, 0.0)
    if extra > 0:  # sharing stretches the extra too: scale it so the model meets the pair
        slope = (ttft(extra) - without) / extra
        extra = extra / slope if slope > 0 else extra
    step = ("no time per token measured: 01's factor kept" if not pair.step_ms else
            f"{pair.step_ms:.2f} ms per token, {factor:.2f}x 01's decode step alone at that "
            "context, which the decode instance's steps take in place of 01's stand-ins")
    gap = max(pair.ttft_ms - without, 0.0)
    stretched = (f" ({gap:.1f} ms once sharing the machine stretches it)"
                 if abs(gap - extra) >= 0.05 else "")
    said = (f"04's pair timed before the sweep: {pair.requests} fresh requests of "
            f"{pair.prompt_tokens} tokens one at a time, TTFT median {pair.ttft_ms:.1f} ms "
            f"against {without:.1f} ms from the model's other terms, so each request's "
            f"decode leg gets {extra:.1f} ms more{stretched}; {step}")
    return replace(stepped, pd_extra_ms=extra), said


def calibrated_edges(edges_of, factor: float, extra: float):
    """`edge -> Inputs` with the pair's figures at every edge (they are one measurement)."""
    return lambda edge: replace(edges_of(edge), decode_beside=factor, pd_extra_ms=extra)
