"""Calibration records: what a real run measured about a node, to replace the plan's and
the workshop's estimates from then on.

One file per node of a profile, `results/<profile>/calibration/<node>.json`, rewritten
(atomically) after every start of the lab's vLLM instances there (`serve.calibrate`):
the node's MemTotal and, when nothing of the lab ran on it yet, what the OS and other
processes held (MemTotal - MemAvailable); per instance the figures vLLM logged at start
(KV cache, weights, compile, CUDA graphs, engine init: `serve.startup.figures`), its
gpu_memory_utilization, the memory its processes hold (PSS of its process group) and the
seconds to healthy; every start's time, first starts (the compile cache missed, or the
first start recorded on the node) apart from later ones. `Calibration.measured` derives
the figures the plan uses, each with "measured on <node>, <date>".
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lab_utils.config import LabConfig
from lab_utils.util.atomic import atomic_write_text

MAX_STARTS = 50  # start times kept per node, newest last
# The workshop agenda's allowance to start a topology (docs/FACILITATOR.md): a guess
STARTUP_ALLOWANCE_S = 300.0


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        activations, CUDA graphs, context), process (memory of an instance's processes
        outside vLLM's pool), os_reserve, first_start_s and later_start_s."""
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
                overheads.append((int(u * total) - f["weights_bytes"] - f["kv_bytes"], at))
            if inst.get("process_bytes") is not None:
                processes.append((inst["process_bytes"], at))
        if overheads:
            out["cuda_overhead"] = (max(o for o, _ in overheads), label(overheads[-1][1]))
        if processes:
            out["process"] = (max(p for p, _ in processes), label(processes[-1][1]))
        for key in ("first_start_s", "later_start_s"):
            value = getattr(self, key)
            if value is not None:
                at = [s["at"] for s in self.starts if s.get("first") == (key == "first_start_s")]
                out[key] = (value, label(at[-1] if at else None))
        return out


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
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, cal.to_json() + "\n")
    return p
