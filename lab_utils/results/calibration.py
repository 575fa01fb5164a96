"""Calibration records: what a real run measured about a node, to replace the plan's and
the workshop's estimates from then on.

One file per node of a profile, `results/<profile>/calibration/<node>.json`, rewritten
(atomically) after every start of the lab's vLLM instances there (`serve.calibrate`):
the node's MemTotal and, when nothing of the lab ran on it yet, what the OS and other
processes held (MemTotal - MemAvailable); per instance the figures vLLM logged at start
(KV cache, weights, compile, CUDA graphs, engine init: `serve.startup.figures`), its
gpu_memory_utilization, the memory its processes hold (PSS of its process group) and the
seconds to healthy; every start's time, first starts (the compile cache missed, or the
first start recorded on the node) apart from later ones. Two more figures come from the
notebooks' own measurements: the NIXL probe's rate per memory type (notebook 02,
`record_probe`, on the initiator's record: the node that moves the data), and the proxy's
per-request cost (notebook 01's proxy hop, `record_proxy`, on the proxy node's record).
`Calibration.measured` derives the figures the plan, the probe's plan and the forecasts
use, each with "measured on <node>, <date>".
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lab_utils.config import LabConfig
from lab_utils.results.forecast import CurvePoint
from lab_utils.util.atomic import atomic_write_text

MAX_STARTS = 50  # start times kept per node, newest last
# The workshop agenda's allowance to start a topology (docs/FACILITATOR.md): a guess
STARTUP_ALLOWANCE_S = 300.0


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


GiB = 2**30
# CUDA's total memory as vLLM reads it on a GB10: 121.69 GiB in vLLM's own message
# (tests/fixtures/dgx-spark-recorded/vllm-error.free-memory-below-utilization.gb10.reflowed.txt),
# above the 119.7 GiB of MemTotal; vLLM's pool is gpu_memory_utilization x this.
GB10_CUDA_TOTAL = int(121.69 * GiB)


def cuda_total(mem_total: int | None) -> int:
    """The total vLLM sizes its pool from on a GB10 of `mem_total` bytes of MemTotal (0
    when that is not known)."""
    return max(mem_total, GB10_CUDA_TOTAL) if mem_total else 0

@dataclass
class Calibration:
    node: str
    profile: str
    device: str
    mem_total_bytes: int | None = None
    os_reserve_bytes: int | None = None  # MemTotal - MemAvailable with no lab instance there
    os_reserve_at: str | None = None
    instances: dict[str, dict] = field(default_factory=dict)  # by role: the latest start
    starts: list[dict] = field(default_factory=list)  # {"instance", "role", "s", "first", "at"}
    probe: dict[str, dict] = field(default_factory=dict)  # by memory type: the latest probe
    proxy: dict = field(default_factory=dict)  # the latest proxy hop measured through it
    updated_at: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @property
    def first_start_s(self) -> float | None:
        first = [s["s"] for s in self.starts if s.get("first")]
        return max(first) if first else None

    @property
    def later_start_s(self) -> float | None:
        later = [s["s"] for s in self.starts if not s.get("first")]
        return statistics.median(later) if later else None

    def measured(self) -> dict[str, tuple[float, str]]:
        """What the plan and the workshop take from here, each value with its label
        ("measured on <node>, <date>"): kv_bytes per role ("kv_bytes:<role>"),
        cuda_overhead (vLLM's pool less weights and KV cache, as the plan counts it:
        activations, CUDA graphs, context), process per role ("process:<role>": memory of
        an instance's processes outside vLLM's pool and the host KV, `serve.calibrate`)
        and the largest of them ("process", for a role not measured here), os_reserve, first_start_s and later_start_s, the probe's
        GB/s per memory type ("probe_GBps:<DRAM|VRAM>") and the proxy's ms per request
        ("proxy_ms")."""
        out: dict[str, tuple[float, str]] = {}

        def label(at: str | None) -> str:
            return f"measured on {self.node}, {(at or self.updated_at)[:10]}"

        if self.os_reserve_bytes is not None:
            out["os_reserve"] = (self.os_reserve_bytes, label(self.os_reserve_at))
        overheads, processes = [], []
        for role, inst in sorted(self.instances.items()):
            f, at = inst.get("figures", {}), inst.get("at")
            if "kv_bytes" in f:
                out[f"kv_bytes:{role}"] = (f["kv_bytes"], label(at))
            u, total = inst.get("utilization"), self.mem_total_bytes
            if self.device == "cuda" and u and total and "kv_bytes" in f and "weights_bytes" in f:
                overheads.append((math.ceil(u * cuda_total(total)) - f["weights_bytes"]
                                  - f["kv_bytes"], at))
            if inst.get("process_bytes") is not None:
                processes.append((inst["process_bytes"], at))
                out[f"process:{role}"] = (inst["process_bytes"], label(at))
        if overheads:
            out["cuda_overhead"] = (max(o for o, _ in overheads), label(overheads[-1][1]))
        if processes:
            out["process"] = (max(p for p, _ in processes), label(processes[-1][1]))
        for key in ("first_start_s", "later_start_s"):
            value = getattr(self, key)
            if value is not None:
                at = [s["at"] for s in self.starts if s.get("first") == (key == "first_start_s")]
                out[key] = (value, label(at[-1] if at else None))
        for seg, p in sorted(self.probe.items()):
            out[f"probe_GBps:{seg}"] = (p["GBps"], label(p.get("at")))
        if "ms" in self.proxy:
            out["proxy_ms"] = (self.proxy["ms"], label(self.proxy.get("at")))
        return out

    def next_start_s(self, role: str) -> tuple[float, str] | None:
        """The expected seconds to healthy of the next start of `role` here, and its label:
        a later start's when this role has started here before and later starts were
        measured, else a first start's; None when no start was measured."""
        m = self.measured()
        seen = any(s.get("role") == role for s in self.starts)
        for key in (("later_start_s", "first_start_s") if seen else ("first_start_s",)):
            if key in m:
                value, where = m[key]
                return value, f"{where}, {key.split('_')[0]} start"
        return None


def probe_rates(rows: list[dict]) -> dict[str, dict]:
    """Per memory type of a probe's rows: the bytes of one pass over its sizes and
    operations over their median times (the rate the probe's plan divides its bytes by),
    and that rate per operation."""
    out: dict[str, dict] = {}
    for seg in dict.fromkeys(r.get("seg_type") for r in rows):
        mine = [r for r in rows if r.get("seg_type") == seg and r.get("median_us")]
        if not seg or not mine:
            continue

        def rate(rs: list[dict]) -> float:
            return sum(r["bytes"] for r in rs) / (sum(r["median_us"] for r in rs) / 1e6) / 1e9

        out[seg] = {"GBps": round(rate(mine), 4), "bytes": sum(r["bytes"] for r in mine),
                    "sizes": len({r["bytes"] for r in mine}),
                    "by_op": {op: round(rate([r for r in mine if r.get("op") == op]), 4)
                              for op in dict.fromkeys(r.get("op") for r in mine) if op}}
    return out


def record_probe(cfg: LabConfig, initiator: str, target: str, rows: list[dict]) -> Path | None:
    """Write the probe's measured rates (`probe_rates`) into the initiator's record; None
    when no row has a time."""
    rates = probe_rates(rows)
    if not rates:
        return None
    cal = load(cfg, initiator) or Calibration(initiator, cfg.profile, cfg.vllm.device)
    at = now_utc()
    for seg, r in rates.items():
        cal.probe[seg] = {**r, "target": target, "at": at}
    return save(cfg, cal)


def record_proxy(cfg: LabConfig, node: str, hop: CurvePoint, *, backend: str) -> Path:
    """Write what the proxy on `node` added to a request: notebook 01's proxy hop (ms, a
    request through the proxy less the same request sent directly to `backend`, at `hop.x`
    prompt tokens; the median and range of `hop.n` pairs)."""
    cal = load(cfg, node) or Calibration(node, cfg.profile, cfg.vllm.device)
    cal.proxy = {"ms": round(hop.median, 3), "lo": round(hop.lo, 3), "hi": round(hop.hi, 3),
                 "n": hop.n, "prompt_tokens": hop.x, "kind": cfg.proxy.kind,
                 "backend": backend, "at": now_utc()}
    return save(cfg, cal)


def proxy_ms(cfg: LabConfig) -> tuple[float, str] | None:
    """The proxy's measured ms per request on this profile's proxy node, with its label;
    None when the front door configured now (lab proxy or vllm-router) was not measured."""
    return proxy_measured(cfg.results_dir, cfg.profile, cfg.proxy.kind, cfg.proxy.node)


def proxy_measured(results_dir: Path, profile: str, kind: str = "lab",
                   node: str | None = None) -> tuple[float, str] | None:
    """The latest measured ms per request of a `kind` front door among a profile's records
    (only `node`'s when given), never below 0 (a hop within the noise of the direct
    request), with its label "measured on <node>, <date>"."""
    found = [c for c in load_all(results_dir, profile) if "ms" in c.proxy
             and c.proxy.get("kind", "lab") == kind and node in (None, c.node)]
    if not found:
        return None
    value, label = max(found, key=lambda c: c.proxy.get("at", "")).measured()["proxy_ms"]
    return max(value, 0.0), label


def path(cfg: LabConfig, node: str) -> Path:
    return cfg.results_dir / "calibration" / f"{node}.json"


def load(cfg: LabConfig, node: str) -> Calibration | None:
    """The node's record, or None when there is none (or it cannot be read: an estimate
    is then used, as before any run)."""
    try:
        data = json.loads(path(cfg, node).read_text())
        if data.get("profile") != cfg.profile or data.get("node") != node:
            return None
        return Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None


def load_all(results_dir: Path, profile: str) -> list[Calibration]:
    """Every node's record of a profile's results directory, by node name."""
    out = []
    for p in sorted((Path(results_dir) / "calibration").glob("*.json")):
        try:
            cal = Calibration(**json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if cal.profile == profile and cal.node == p.stem:
            out.append(cal)
    return out


def save(cfg: LabConfig, cal: Calibration) -> Path:
    cal.updated_at = now_utc()
    cal.starts = cal.starts[-MAX_STARTS:]
    p = path(cfg, cal.node)
    atomic_write_text(p, cal.to_json() + "\n")  # creates calibration/ if need be
    return p
