"""The forecast's inputs, read from notebooks 01 and 02 only, or built from published
GB10 figures for the "expected on two Sparks" forecast.

`from_results` turns 01's engine profile and 02's KV layout and NIXL probe into the
model's `Inputs`, at the low, median or high edge of every measured curve. Nothing here
opens 03's or 04's results: the forecast must be the same whatever they hold.
"""

from __future__ import annotations

from lab_utils.config import WorkloadConfig
from lab_utils.errors import LabError
from lab_utils.forecast.curves import Curve, point
from lab_utils.forecast.model import EngineCosts, Inputs
from lab_utils.kv.shapes import PUBLISHED_CONFIGS, kv_shape
from lab_utils.results.forecast import CurvePoint, Edge, EngineProfile
from lab_utils.results.kv_transfer import KvTransferPayload
from lab_utils.results.points import compare

SEG_TYPE = {"cpu": "DRAM", "cuda": "VRAM"}  # kv_buffer_device -> the probe's memory type


def transfer_points(kv: KvTransferPayload, buffer_device: str) -> list[CurvePoint]:
    """02's probe READs from the memory the KV is staged in: ms against bytes; the
    interval runs from the median to the 99th percentile."""
    seg = SEG_TYPE.get(buffer_device, "DRAM")
    rows = [r for r in kv.probe.rows if r.get("seg_type") == seg and r.get("op") == "READ"
            and r.get("median_us") is not None]
    if not rows and seg != "DRAM":
        rows = [r for r in kv.probe.rows if r.get("seg_type") == "DRAM" and r.get("op") == "READ"]
    return [CurvePoint(x=r["bytes"], median=r["median_us"] / 1e3, lo=r["median_us"] / 1e3,
                  hi=(r.get("p99_us") or r["median_us"]) / 1e3, n=r.get("iterations", 1))
            for r in rows]


def from_results(profile: EngineProfile | None, kv: KvTransferPayload | None,
                 buffer_device: str = "cpu", edge: Edge = "median") -> Inputs:
    """The model's inputs from 01's profile and 02's results (None: not run yet)."""
    if profile is None:
        raise LabError("notebook 01's results have no engine profile: re-run notebook 01 "
                       "(the forecast is made from its profile)")
    engine = EngineCosts(
        prefill=Curve.of(profile.prefill, edge),
        decode=tuple((float(line.context), Curve.of(line.points, edge)) for line in profile.decode),
        token_budget=profile.token_budget)
    transfer = None
    sources = {"engine": "01's engine profile (prefill, decode step, proxy hop"
                         + (", proxy + client CPU per token)" if profile.stream_cpu_ms_per_token
                            else ")")}
    if kv is not None:
        pts = transfer_points(kv, buffer_device)
        if pts:
            transfer = Curve.of(pts, edge)
            sources["transfer"] = (f"02's NIXL probe, {SEG_TYPE.get(buffer_device, 'DRAM')} "
                                   "READ, ms against bytes")
        sources["kv layout"] = f"02: {kv.kv_per_token_bytes} bytes per token, blocks of {kv.block_size}"
    factors = {}
    for key, b, stand_ins, who in (
            ("NIXL's threads", profile.beside_busy, "stand-ins for them", "P/D's decode"),
            ("other replicas", profile.beside_replicas,
             "stand-ins for the other replicas' idle workers", "a replica's decode")):
        if b is not None and b.ratio:
            factors[key] = b.factor
            basis = (compare(b.beside.measured(), b.alone.measured()).basis
                     if b.beside is not None else "")
            taken = ("that factor" if b.factor != 1.0 else
                     f"no factor (no difference by the lab's rule: {basis})" if not b.differs
                     else "no factor (a step no slower beside them is noise)")
            one = stand_ins.replace("stand-ins", "stand-in", 1) if b.threads == 1 else stand_ins
            beside = f"{b.beside.span()} beside, " if b.beside is not None else ""
            sources[key] = (f"01 measured a decode step beside {b.threads} {one} "
                            f"({b.policy}): {beside}{b.alone.span()} alone, medians "
                            f"{b.ratio:.2f}x; {who} steps take {taken}")
    shortest = min(profile.prefill, key=lambda p: p.x)
    return Inputs(engine=engine, hop_ms=max(profile.hop.at(edge), 0.0), transfer=transfer,
                  decode_beside=factors.get("NIXL's threads", 1.0),
                  replica_beside=factors.get("other replicas", 1.0),
                  kv_bytes_per_token=kv.kv_per_token_bytes if kv else 0,
                  block_size=kv.block_size if kv else 16,
                  jitter_ms=max(shortest.hi - shortest.lo, 0.0),
                  active_cores=profile.active_cores,
                  stream_cpu_ms=(profile.stream_cpu_ms_per_token.at(edge)
                                 if profile.stream_cpu_ms_per_token else 0.0),
                  sources=sources)


def edges(profile: EngineProfile | None, kv: KvTransferPayload | None, buffer_device: str):
    """`edge -> Inputs`, for `model.ranged`."""
    return lambda edge: from_results(profile, kv, buffer_device, edge)


# ---- published figures: the forecast for two DGX Sparks --------------------------------------

# Each input with its source. Decode: a step reads every weight once (the memory roofline),
# plus every running request's KV; prefill: the model's FLOPs at a sustained rate. These are
# estimates from published numbers, not measurements: the forecast made from them is a guess
# to be graded when the lab runs on the Sparks.
GB10 = {
    "memory_bandwidth_GBps": (273.0, "NVIDIA DGX Spark specifications: 273 GB/s LPDDR5x"),
    "bf16_dense_tflops": (
        125.0, "NVIDIA's 1 PFLOP (FP4, sparse) GB10 figure / 2 for dense / 4 for bf16: an "
               "estimate; notebook 01 measures prefill on the Spark"),
    "prefill_efficiency": (0.5, "prefill reaching half that peak: a planning figure, not "
                                "measured"),
    "request_overhead_ms": (5.0, "a guess for HTTP, tokenizing and scheduling per request"),
    "hop_ms": (1.0, "a planning figure for this lab's proxy on a Spark pair's controller, not "
                    "measured there (python -m lab_utils.bench.proxy measures it on yours)"),
}
# NIXL between two GB10s, one rail, UCX, batch 1: (bytes, average latency in us), as recorded
# by nixlbench (tests/fixtures/dgx-spark-recorded/nixlbench.gb10-pair.single-rail.*.txt;
# SOURCES.md there names the run). A test reads the recordings and checks these rows.
GB10_NIXL_US = {
    "DRAM": ((65536, 9.6), (131072, 17.0), (262144, 28.3), (524288, 51.1), (1048576, 94.5),
             (2097152, 185.8), (4194304, 368.7), (8388608, 731.4), (16777216, 1455.3),
             (33554432, 2904.1), (67108864, 5803.6)),
    "VRAM": ((65536, 163.5), (131072, 327.8), (262144, 811.1), (524288, 1234.6),
             (1048576, 2633.9), (2097152, 5607.3), (4194304, 9948.2), (8388608, 13861.5),
             (16777216, 27883.9), (33554432, 75632.9)),
}
NIXL_SOURCE = ("nixlbench between two GB10s, one rail, {seg} to {seg} "
               "(tests/fixtures/dgx-spark-recorded/nixlbench.gb10-pair.single-rail.{seg}.txt)")


SPARK_MODEL = "Qwen/Qwen3-8B"  # the cluster example's model (environment_config.json.example)


def dense_params(hf: dict) -> tuple[float, float]:
    """(parameters, bytes of weights one decode step reads) of a dense decoder-only model in
    bf16: every layer's attention and MLP matrices plus the LM head; the embedding counts
    in the parameters but one row of it is read per token."""
    h, i, n, v = (hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"],
                  hf["vocab_size"])
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    hd = hf.get("head_dim", h // heads)
    per_layer = h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * i
    read = n * per_layer + v * h  # the LM head (untied)
    return float(read + (0 if hf.get("tie_word_embeddings") else v * h)), float(read * 2)


def spark_inputs_for(model: str, w: WorkloadConfig, buffer_device: str = "cpu",
                     hop: tuple[float, str] | None = None) -> Inputs:
    """Inputs for one GB10 per instance, from the figures in `GB10` and the recorded NIXL
    rates, for `model` (its published config, else `SPARK_MODEL`'s) at workload `w`.
    `hop`: the proxy's measured ms per request and its label ("measured on <node>,
    <date>"; `results.calibration.proxy_ms`), in place of `GB10["hop_ms"]`."""
    hf = PUBLISHED_CONFIGS.get(model) or PUBLISHED_CONFIGS[SPARK_MODEL]
    params, weight_bytes = dense_params(hf)
    kv_bytes_per_token = kv_shape(hf).bytes_per_token
    bw = GB10["memory_bandwidth_GBps"][0] * 1e9
    flops = GB10["bf16_dense_tflops"][0] * 1e12 * GB10["prefill_efficiency"][0]
    fixed = GB10["request_overhead_ms"][0]

    def step_ms(batch: int, context: int) -> float:
        return (weight_bytes + batch * context * kv_bytes_per_token) / bw * 1e3

    prefill = [point(n, [fixed + step_ms(1, n) + 2 * params * n / flops * 1e3])
               for n in sorted({16, w.input_len, w.long_len})]
    batches = sorted({1, *w.concurrency, 2 * max(w.concurrency)})
    decode = tuple((float(c), Curve.of([point(b, [step_ms(b, c)]) for b in batches]))
                   for c in sorted({w.input_len, w.long_len}))
    seg = SEG_TYPE.get(buffer_device, "DRAM")
    rows = GB10_NIXL_US[seg]
    transfer = Curve(tuple(float(b) for b, _ in rows), tuple(us / 1e3 for _, us in rows))
    hop_ms, hop_source = hop or GB10["hop_ms"]
    sources = {k: f"{v[0]:g} ({v[1]})" for k, v in {**GB10, "hop_ms": (hop_ms, hop_source)}.items()}
    sources["transfer"] = NIXL_SOURCE.format(seg=seg)
    return Inputs(engine=EngineCosts(prefill=Curve.of(prefill), decode=decode, token_budget=8192),
                  hop_ms=hop_ms, transfer=transfer,
                  kv_bytes_per_token=kv_bytes_per_token, block_size=16,
                  jitter_ms=1.0, sources=sources)
