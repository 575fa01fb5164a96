"""The notebooks' "open the hood" cells: what the engine, NIXL and the connector do, read
from the running instances (or run for real) rather than told.

- `watch_scheduler` (01): the mixed workload on one instance while its `/metrics` are
  sampled: the scheduler's running and waiting queues and the KV cache's use over time,
  and every request's tokens on one time line, where a long prompt's prefill shows as a
  gap in all the streams decoding beside it (chunked prefill splits that prefill over
  steps when it exceeds the step's token budget, which caps the gap).
- `two_agents` (02): NIXL's API in a few lines, for real, meant to be read (notebook 02
  prints its source with `show`) and run: two agents in this process, each with a DRAM
  buffer registered with the UCX backend; the initiator learns the target's metadata,
  describes both buffers, READs the target's bytes into its own with one transfer, waits
  for it, and checks the copy. It is what NixlConnector does for a request's KV blocks,
  with one buffer instead of a descriptor per block and layer.
- `protocol_by_hand` (04): what a prefill instance returns for a request, the block ids
  and where to fetch them (`kv_transfer_params`, through `serve.pd`'s prefill and
  decode), and the instances' command lines and KV environment (`command_lines`).
- `CONNECTOR_SIDES` (04): which NixlConnector methods run in the scheduler and which in
  the worker (a test checks each against the installed vLLM).
"""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import random
import time

import httpx
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig, api_key
from lab_utils.errors import LabError
from lab_utils.kv.budget import block_size
from lab_utils.measure.benchmark import cache_hits
from lab_utils.measure.loadgen import auth_headers, run_point, run_sync
from lab_utils.measure.prompts import exact_prompt
from lab_utils.measure.workload import build_requests
from lab_utils.notebook.session import tokenizer_of
from lab_utils.notebook.steps import cache_meter
from lab_utils.results.sweep import RequestRecord
from lab_utils.serve import pd as prefill_decode
from lab_utils.serve.metrics import fetch_metrics
from lab_utils.serve.plan import make_plan
from lab_utils.serve.topology import Served
from lab_utils.util.background import Background
from lab_utils.util.numbers import titled

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "KV cache used": "vllm:kv_cache_usage_perc"}


class _Sampler(Background):
    def __init__(self, url: str, period_s: float):
        super().__init__("metrics-sampler")
        self.rows: list[dict[str, float | None]]  # one per sample: time and the gauges
        self.url, self.period_s, self.rows = url, period_s, []

    def _run(self) -> None:
        t0 = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                try:
                    snap = fetch_metrics(self.url, client, timeout=2.0, attempts=1)
                    self.rows.append({"t (s)": time.monotonic() - t0,
                                      **{k: snap.value(v) for k, v in GAUGES.items()}})
                except Exception:  # noqa: BLE001 (a missed sample is a gap, not a failure)
                    pass
                self._stop.wait(self.period_s)


def sample_scheduler(cfg: LabConfig, served: Served, tokenize, detokenize,
                     period_s: float = 0.02):
    """Run the mixed workload once at the highest concurrency on `served` while sampling
    its instance's queues; return (samples frame, request records, figure)."""
    w = cfg.workload
    c = max(w.concurrency or [1])
    long = w.long_len
    mixed = w.model_copy(update={"mixed_long_len": long, "concurrency": [c]})
    specs = build_requests(mixed, w.warmup + w.num_prompts, tokenize, detokenize, mixed=True,
                           seed=random.SystemRandom().randrange(2**31))
    with _Sampler(served.instance_urls()[0], period_s) as sampler:
        records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, specs, concurrency=c,
                                        warmup=w.warmup, timeout_s=w.request_timeout_s,
                                        show_progress=False, api_key=api_key(cfg, "proxy")))
    frame = pd.DataFrame(sampler.rows)
    return frame, records, _figure(frame, records, long, c, cfg.vllm.device)


def _figure(frame, records: list[RequestRecord], long: int, concurrency: int,
            device: str | None = None):
    fig = Figure(figsize=(10, 6))
    fig.suptitle(titled("The engine's scheduler under the mixed workload", device))
    top, bottom = fig.subplots(2, 1, sharex=False, height_ratios=(1, 2))
    if not frame.empty:
        top.step(frame["t (s)"], frame["running"], where="post", label="running")
        top.step(frame["t (s)"], frame["waiting"], where="post", label="waiting")
        top.set(ylabel="requests", title=f"The scheduler's queues (/metrics), concurrency "
                f"{concurrency}, one {long}-token prompt in every few")
        kv = top.twinx()
        kv.plot(frame["t (s)"], frame["KV cache used"] * 100, color="grey", lw=0.8)
        kv.set_ylabel("KV cache used (%)")
        top.legend(loc="upper left")
    for i, r in enumerate(records):
        if r.ttft_ms is None:
            continue
        times = list(itertools.accumulate((gap / 1e3 for gap in r.itl_ms),
                                          initial=r.sent_s + r.ttft_ms / 1e3))
        is_long = r.prompt_len >= long
        bottom.plot([r.sent_s, times[0]], [i, i], color="tab:red" if is_long else "lightgrey",
                    lw=2 if is_long else 1)
        bottom.scatter(times, [i] * len(times), s=2,
                       color="tab:red" if is_long else "tab:blue")
    bottom.set(xlabel="time since the first request (s)", ylabel="request",
               title="Each request's tokens (dots) after its wait for the first one (line); "
                     "red: the long prompts")
    fig.tight_layout()
    return fig


def blocks_of(tokens: int, block_size: int) -> str:
    """How a request's tokens fill the paged KV cache."""
    n = -(-tokens // block_size)
    return (f"{tokens} tokens fill {n} blocks of {block_size} (the last one "
            f"{tokens - (n - 1) * block_size}/{block_size} full)")


def watch_scheduler(cfg: LabConfig, served: Served):
    """01's look inside the engine (`sample_scheduler`): the mixed workload
    once, the scheduler's queues sampled from /metrics, every request's tokens on a time
    line. Prints how a request fills the paged KV cache; returns the figure."""
    tokenize, detokenize = tokenizer_of(served, cfg)
    w = cfg.workload
    print(blocks_of(w.input_len + w.output_len, block_size(cfg))
          + f": a request of {w.input_len} prompt + {w.output_len} output tokens")
    meter = cache_meter(served)
    before = meter()
    frame, records, fig = sample_scheduler(cfg, served, tokenize, detokenize)
    pct, _ = cache_hits(before, meter())
    if pct is not None:
        print(f"prefix-cache hits: {pct:.1f}% of the prompt tokens"
              + ("" if not pct else " (prompts the instance had seen: their prefills were "
                 "skipped, so the picture is not of this workload as fresh)"))
    if not frame.empty:
        span = float(frame["t (s)"].max() - frame["t (s)"].min())
        every = f", one every {span / (len(frame) - 1) * 1000:.0f} ms" if len(frame) > 1 else ""
        print(f"{len(frame)} /metrics samples over {span:.1f} s{every}: at most "
              f"{frame['running'].max():.0f} running and "
              f"{frame['waiting'].max():.0f} waiting; KV cache at most "
              f"{frame['KV cache used'].max():.1%} used")
    return fig


# ---- 02 ----------------------------------------------------------------------------------


def two_agents(nbytes: int = 4 << 20) -> dict:
    """One NIXL READ of `nbytes` between two agents on this machine's DRAM."""
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as e:
        raise LabError(f"NIXL is not installed where this notebook runs ({e}); it is on the "
                       "serving nodes. Run this cell on a machine with nixl (the rehearsal "
                       "has it), or read the code above.") from None

    logging.getLogger("nixl").setLevel(logging.WARNING)  # not its start-up chatter
    target = nixl_agent("target", nixl_agent_config(backends=["UCX"]))
    initiator = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)  # the "KV"
    dst = np.zeros(nbytes, dtype=np.uint8)
    where = {"target": (src.ctypes.data, nbytes, 0), "initiator": (dst.ctypes.data, nbytes, 0)}
    regs = [target.register_memory([(*where["target"], "")], mem_type="DRAM"),  # pin for the NIC
            initiator.register_memory([(*where["initiator"], "")], mem_type="DRAM")]
    peer = initiator.add_remote_agent(target.get_agent_metadata())  # the side channel's job
    local = initiator.get_xfer_descs([where["initiator"]], mem_type="DRAM")  # address, length, device
    remote = target.get_xfer_descs([where["target"]], mem_type="DRAM")
    handle = initiator.initialize_xfer("READ", local, remote, peer, b"done")
    times = []
    for _ in range(2):  # the first READ also opens the UCX connection
        t0 = time.perf_counter()
        state = initiator.transfer(handle)  # one-sided: the target's CPU takes no part
        while state not in ("DONE", "ERR"):
            state = initiator.check_xfer_state(handle)
        times.append((time.perf_counter() - t0) * 1e3)
    equal = bool(state == "DONE" and np.array_equal(src, dst))
    initiator.release_xfer_handle(handle)
    initiator.remove_remote_agent(peer)
    for agent, reg in zip((target, initiator), regs, strict=True):
        agent.deregister_memory(reg)
    del target, initiator  # their progress threads stop with them
    return {"bytes": nbytes, "state": state, "first READ ms": round(times[0], 3),
            "second READ ms": round(times[1], 3), "GB/s": round(nbytes / times[1] / 1e6, 2),
            "copy equals source": equal}


def show(fn) -> None:
    """Print a function's source: the notebook shows the code it is about to run."""
    print(inspect.getsource(fn))


# ---- 04 ----------------------------------------------------------------------------------


def kv_transfer_params(cfg: LabConfig, served: Served,
                       prompt_ids: list[int]) -> tuple[dict, list[int]]:
    """One request through the P/D protocol by hand, as the proxy does it: the prompt to the
    first prefill instance for one token with `do_remote_decode`, then the request with the
    `kv_transfer_params` it answered to the first decode instance (which reads the blocks,
    so the prefill does not hold them until its lease runs out). Returns the params and the
    decode's tokens. The requests are `serve.pd`'s, which say which instance failed, and
    how."""
    with httpx.Client(timeout=cfg.workload.request_timeout_s,
                      headers=auth_headers(api_key(cfg, "vllm"))) as client:
        params = prefill_decode.prefill(client, served.urls("prefill")[0], cfg.model.name,
                                        prompt_ids)
        tokens = prefill_decode.decode(client, served.urls("decode")[0], cfg.model.name,
                                       prompt_ids, 8, params)
    return params, tokens


KV_ENV_PREFIXES = ("VLLM_NIXL", "UCX_", "VLLM_CPU", "NIXL_", "CUDA_VISIBLE")


def command_lines(cfg: LabConfig, kv_buffer_device: str | None) -> list[dict]:
    """The prefill and decode instances' command lines, KV connector config and KV-related
    environment, rendered by the same code that starts them (`serve --dry-run`'s plan;
    secrets show as "<set>")."""
    with Cluster(cfg) as cluster:
        plan = make_plan(cluster, "disaggregated", kv_buffer_device=kv_buffer_device,
                         read_nodes=False)
    out = []
    for p in plan.instances:
        argv = list(p.argv)
        kv = (json.loads(argv[argv.index("--kv-transfer-config") + 1])
              if "--kv-transfer-config" in argv else None)
        out.append({"instance": p.name, "node": p.node, "command line": " ".join(argv),
                    "kv_transfer_config": kv,
                    "KV environment": {k: v for k, v in p.env.items()
                                       if k.startswith(KV_ENV_PREFIXES)}})
    return out


# NixlConnector's methods by the side they run on (vLLM's KV connector v1 interface; in
# vLLM 0.32 NixlConnector is an alias of NixlPullConnector). A test checks, in the installed
# vLLM's source, that each one hands its work to that side's object.
CONNECTOR_SIDES = {
    "scheduler": {
        "get_num_new_matched_tokens": "a new request: how many prompt tokens can come from "
                                      "the remote prefill instead of being computed",
        "update_state_after_alloc": "blocks were allocated for them: remember which to fill",
        "build_connector_meta": "each step: what the workers must load, and from where",
        "request_finished": "a request ends: on prefill, keep its blocks and return "
                            "kv_transfer_params; on decode, let them go",
    },
    "worker": {
        "register_kv_caches": "start-up: register the KV cache memory with NIXL",
        "start_load_kv": "before a step: start the NIXL READs of the blocks it needs (the "
                         "request waits until they complete; whole requests, not per layer)",
        "wait_for_save": "with kv_buffer_device 'cpu': copy the finished prompt's blocks to "
                         "the host buffer NIXL reads from",
        "get_finished": "after a step: which transfers completed, in both directions",
    },
}


def connector_frame():
    return pd.DataFrame([{"side": side, "method": m, "what it does": what}
                         for side, methods in CONNECTOR_SIDES.items()
                         for m, what in methods.items()])


def protocol_by_hand(cfg: LabConfig, served: Served):
    """04's look at what travels: one fresh prompt through prefill and decode by hand, the
    kv_transfer_params printed (`kv_transfer_params`); the instances' command lines and KV
    environment (`command_lines`); which connector methods run on which side
    (`connector_frame`)."""
    tokenize, detokenize = tokenizer_of(served, cfg)
    prompt = exact_prompt(tokenize, cfg.workload.input_len, random.Random())
    params, tokens = kv_transfer_params(cfg, served, prompt)
    print("kv_transfer_params the prefill answered (the decode instance got them as they are):")
    print(json.dumps(params, indent=1))
    ids = params.get("remote_block_ids") or []
    groups = ids if ids and isinstance(ids[0], list) else [ids]  # one list per KV cache group
    print(f"{len(prompt)} prompt tokens held in {sum(map(len, groups))} blocks of "
          f"{block_size(cfg)} (block ids {groups[0]}"
          + (f" and {len(groups) - 1} more group(s)" if len(groups) > 1 else "")
          + f"); the decode instance, handed these, answered {detokenize(tokens)!r}")
    print("This one request does not show where the decode's KV came from (a failed load "
          "falls back to computing the prompt locally); the proof above counted that, prompt "
          "by prompt, for its own prompts."
          + (" The rehearsal's tiny model has random weights, so the text is noise."
             if cfg.model.source == "tiny" else ""))
    lines = command_lines(cfg, served.kv_buffer_device)
    for line in lines:
        print(f"\n{line['instance']} on {line['node']}:\n  {line['command line']}\n"
              f"  kv_transfer_config: {json.dumps(line['kv_transfer_config'])}\n"
              f"  KV environment: {line['KV environment']}")
    return pd.DataFrame(connector_frame())
