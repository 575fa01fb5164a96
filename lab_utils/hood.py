"""The serving notebooks' "open the hood" cells: what the engine and the connector do,
read from the running instances rather than told.

- `watch_scheduler` (01): the mixed workload on one instance while its `/metrics` are
  sampled: the scheduler's running and waiting queues and the KV cache's use over time,
  and every request's tokens on one time line, where a long prompt's prefill shows as a
  gap in all the streams decoding beside it (chunked prefill splits that prefill over
  steps when it exceeds the step's token budget, which caps the gap).
- `kv_transfer_params` (04): what a prefill instance returns for a request, the block ids
  and where to fetch them, and the instances' command lines and KV environment.
- `CONNECTOR_SIDES` (04): which NixlConnector methods run in the scheduler and which in
  the worker (a test checks each against the installed vLLM).
"""

from __future__ import annotations

import random
import time

from lab_utils.config import LabConfig, api_key
from lab_utils.measure.loadgen import RequestRecord, run_point, run_sync
from lab_utils.measure.workload import build_requests
from lab_utils.serve.metrics import fetch_metrics
from lab_utils.util.background import Background

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "KV cache used": "vllm:kv_cache_usage_perc"}


class _Sampler(Background):
    def __init__(self, url: str, period_s: float):
        super().__init__("metrics-sampler")
        self.rows: list[dict[str, float | None]]  # one per sample: time and the gauges
        self.url, self.period_s, self.rows = url, period_s, []

    def _run(self) -> None:
        import httpx

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


def watch_scheduler(cfg: LabConfig, served, tokenize, detokenize, period_s: float = 0.02):
    """Run the mixed workload once at the highest concurrency on `served` while sampling
    its instance's queues; return (samples frame, request records, figure)."""
    import pandas as pd

    w = cfg.workload
    c = max(w.concurrency or [1])
    long = w.mixed_long_len or 4 * w.input_len
    mixed = w.model_copy(update={"mixed_long_len": long, "concurrency": [c]})
    specs = build_requests(mixed, w.warmup + w.num_prompts, tokenize, detokenize, mixed=True,
                           seed=random.SystemRandom().randrange(2**31))
    with _Sampler(served.instance_urls()[0], period_s) as sampler:
        records, _ = run_sync(run_point(served.proxy_url, cfg.model.name, specs, concurrency=c,
                                        warmup=w.warmup, timeout_s=w.request_timeout_s,
                                        show_progress=False, api_key=api_key(cfg, "proxy")))
    frame = pd.DataFrame(sampler.rows)
    return frame, records, _figure(frame, records, long, c)


def _figure(frame, records: list[RequestRecord], long: int, concurrency: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6))
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
        t = r.sent_s + r.ttft_ms / 1e3
        times = [t]
        for gap in r.itl_ms:
            t += gap / 1e3
            times.append(t)
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


# ---- 04 ----------------------------------------------------------------------------------


def kv_transfer_params(cfg: LabConfig, served, prompt_ids: list[int]) -> tuple[dict, dict]:
    """One request through the P/D protocol by hand, as the proxy does it: the prompt to the
    first prefill instance for one token with `do_remote_decode`, then the request with the
    `kv_transfer_params` it answered to the first decode instance (which reads the blocks,
    so the prefill does not hold them until its lease runs out). Returns the params and the
    decode's answer."""
    import httpx

    from lab_utils.measure.loadgen import auth_headers
    from lab_utils.serve.protocol import decode_request, prefill_request, transfer_params

    body = {"model": cfg.model.name, "prompt": prompt_ids, "max_tokens": 8, "temperature": 0}
    with httpx.Client(timeout=cfg.workload.request_timeout_s,
                      headers=auth_headers(api_key(cfg, "vllm"))) as client:
        r = client.post(served.urls("prefill")[0].rstrip("/") + "/v1/completions",
                        json=prefill_request(body))
        r.raise_for_status()
        params = transfer_params(r.json()) or {}
        d = client.post(served.urls("decode")[0].rstrip("/") + "/v1/completions",
                        json=decode_request(body, params))
        d.raise_for_status()
    return params, d.json()


KV_ENV_PREFIXES = ("VLLM_NIXL", "UCX_", "VLLM_CPU", "NIXL_", "CUDA_VISIBLE")


def command_lines(cfg: LabConfig, kv_buffer_device: str | None) -> list[dict]:
    """The prefill and decode instances' command lines, KV connector config and KV-related
    environment, rendered by the same code that starts them (`serve --dry-run`'s plan;
    secrets show as "<set>")."""
    import json

    from lab_utils.cluster import Cluster
    from lab_utils.serve.plan import make_plan

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
    import pandas as pd

    return pd.DataFrame([{"side": side, "method": m, "what it does": what}
                         for side, methods in CONNECTOR_SIDES.items()
                         for m, what in methods.items()])
