"""What notebook 04 concludes about the KV move from its own run.

Three comparisons, each against a figure an earlier notebook measured or derived:

- the bytes NIXL moved per prompt against notebook 02's KV arithmetic (whole blocks of
  `block_size` tokens x bytes per token of the served model);
- the time NIXL spent moving them against the time 02's probe predicts for that many
  bytes (size / the best READ bandwidth the probe reached from the same kind of memory);
- what going through the pair costs a request: TTFT at one request at a time through the
  prefill/decode pair against notebook 01's single instance, and how much of the
  difference the KV move itself explains.
"""

from __future__ import annotations

import statistics
from typing import Any

from lab_utils.kv.budget import best_bandwidth
from lab_utils.results import Proof
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.sweep import BenchmarkResult


def transfer_rows(proof: Proof, kv: KvTransferPayload, kv_buffer_device: str) -> list[dict[str, Any]]:
    """One row per proof prompt: bytes moved against 02's arithmetic, time against the
    probe's prediction (None where the probe measured no READ from that memory)."""
    # the probe's memory type that matches where the instances stage their KV
    best = best_bandwidth(kv.probe.rows, "VRAM" if kv_buffer_device == "cuda" else "DRAM")
    probed = {t.kv_bytes: t.measured_ms for t in kv.predicted_vs_measured}
    rows = []
    for p in proof.prompts:
        blocks = -(-p.prompt_tokens // kv.block_size)
        arithmetic = blocks * kv.block_size * kv.kv_per_token_bytes
        predicted = p.nixl_bytes / (best * 1e9) * 1e3 if best else None
        measured = p.nixl_xfer_ms
        rows.append({
            "prompt tokens": p.prompt_tokens, "blocks": blocks,
            "NIXL bytes": p.nixl_bytes, "02's arithmetic (bytes)": arithmetic,
            "bytes as predicted": p.nixl_bytes == arithmetic,
            "transfer ms": measured, "probe predicts ms": predicted,
            "measured / predicted": measured / predicted if measured is not None and predicted else None,
            "probe, same bytes ms": probed.get(p.nixl_bytes),
        })
    return rows


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def hop_cost(baseline: BenchmarkResult, disaggregated: BenchmarkResult,
             proof: Proof) -> dict[str, Any] | None:
    """TTFT at concurrency 1 on the single instance (01) and through the pair (04), and the
    median NIXL transfer time of the proof's prompts. None when either sweep has no valid
    concurrency-1 point to compare."""
    one, two = baseline.point_at(1), disaggregated.point_at(1)
    if not one or not two or not one.valid or not two.valid:
        return None
    moves = [p.nixl_xfer_ms for p in proof.prompts if p.nixl_xfer_ms is not None]
    single, pair = one.median("median_ttft_ms"), two.median("median_ttft_ms")
    if single is None or pair is None:
        return None
    return {"single_ttft_ms": single, "pd_ttft_ms": pair, "extra_ms": pair - single,
            "transfer_ms": statistics.median(moves) if moves else None,
            "single_tpot_ms": one.median("median_tpot_ms"), "pd_tpot_ms": two.median("median_tpot_ms")}


def conclusions(rows: list[dict[str, Any]], hop: dict[str, Any] | None,
                split: str | None = None) -> list[str]:
    """The sentences notebook 04 prints under the table, from this run's figures; `split`:
    the sentence that says which part of TTFT dominated (`time_split.split_sentence`)."""
    out = []
    if rows:
        same = sum(r["bytes as predicted"] for r in rows)
        out.append(f"Bytes: {same} of {len(rows)} prompts moved exactly what 02's arithmetic "
                   "predicts (whole blocks x bytes per token)"
                   + ("." if same == len(rows) else "; the others did not: look at the rows "
                      "that say False before trusting any figure below."))
        ratios = [r["measured / predicted"] for r in rows if r["measured / predicted"] is not None]
        if ratios:
            text = (f"Time: NIXL's transfers took {statistics.median(ratios):.1f}x the time "
                    "02's probe predicts from its best bandwidth (median over the prompts).")
            if len(ratios) > 1 and max(ratios) > 3 * min(ratios):
                text += (f" The prompts ranged from {min(ratios):.1f}x to {max(ratios):.1f}x: with "
                         f"{len(ratios)} prompts spread this wide, read the rows above, not the median.")
                i, slow = max(((i, r) for i, r in enumerate(rows)
                               if r["measured / predicted"] is not None),
                              key=lambda x: x[1]["measured / predicted"])
                text += (f" Furthest above its prediction: the {slow['prompt tokens']}-token "
                         f"prompt ({slow['transfer ms']:.2f} ms, "
                         f"{slow['measured / predicted']:.1f}x), sent {_ordinal(i + 1)} of "
                         f"{len(rows)}; what made it so is not measured here.")
            same = [(r["transfer ms"], r["probe, same bytes ms"]) for r in rows
                    if r["probe, same bytes ms"] and r["transfer ms"] is not None]
            if same:
                vllm_ms = statistics.median(m for m, _ in same)
                probe_ms = statistics.median(q for _, q in same)
                text += (f" For the same number of bytes the probe itself took {probe_ms:.2f} ms "
                         f"and vLLM's transfer {vllm_ms:.2f} ms: the difference from the probe "
                         "at equal size is what vLLM adds around the NIXL read (descriptors, "
                         "the completion check, the notification), the rest is the fixed cost "
                         "of a small transfer that a best-bandwidth prediction leaves out.")
            out.append(text)
        else:
            out.append("Time: 02's probe measured no READ from this kind of memory, so there "
                       "is no prediction to compare with.")
    if hop is None:
        out.append("Through the pair: not compared (01 or 04 has no valid concurrency-1 point).")
    else:
        # where the requests' own split follows, it gives their KV move: the proof's
        # prompts (other lengths) are not quoted beside it
        move = None if split else hop["transfer_ms"]
        share = ""
        if move is not None and 0 < move <= hop["extra_ms"]:
            share = f"; the KV move itself is {move:.1f} ms of it (median of the proof's prompts)"
        elif move is not None and hop["extra_ms"] > 0:
            share = (f"; the proof's KV moves took a median of {move:.1f} ms, more than that "
                     "whole difference: they were timed on the proof's own prompts, not on "
                     "these requests")
        out.append(f"Through the pair: at one request at a time, TTFT was "
                   f"{hop['pd_ttft_ms']:.1f} ms through the proxy, the prefill, the handoff "
                   f"and the decode against {hop['single_ttft_ms']:.1f} ms on 01's one "
                   f"instance, asked directly: {hop['extra_ms']:+.1f} ms per request{share}. "
                   "That is every difference between the two paths, not the hop alone"
                   + ("; the split below times the parts." if split else "."))
    if split:
        out.append(split)
    return out


def stall_note(*results: BenchmarkResult) -> str | None:
    """One separate note when the machine stood still during any measured run, else None."""
    held = [pt.summary.held_up_s for r in results for pt in r.points]
    stood = [h for h in held if h > 0]
    if not stood:
        return None
    return (f"Note: the machine stood still in {len(stood)} of {len(held)} runs, "
            f"{sum(stood):.1f} s in all (longest {max(stood):.1f} s); those runs' latencies "
            "include it and the report names them.")
