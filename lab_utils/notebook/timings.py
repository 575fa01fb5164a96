"""How long a whole notebook will take, predicted before the runner starts it, and checked
after (`python -m lab_utils run` / `make lab` print both).

A notebook's time is its kernel's start plus its code cells. Each cell is predicted from
the best thing measured so far, in this order:

1. **the same cell in the last runs** on this profile with the same workload and engine
   settings: the median over the last `KEPT_RUNS` (`results/<profile>/timings.json`,
   written after every notebook the runner executes: per cell its seconds, read from the
   executed copy's timestamps);
2. **the forecast**, for the cells that start a topology or measure one: a start's time
   from the calibration records (`starts.startup_seconds`; a node with no start
   measured yet takes the slowest first start measured on another), a sweep's, mixed
   run's, the policy and front-door comparisons' and 01's two switches' from the forecast
   model fed by 01's engine profile (`timing`), plus the per-run cost the forecast leaves
   out (building prompts, reading the instances' counters) as 01's own sweep measured it
   in this series, and the comparisons' front-door starts as 03's policy comparison
   measured them;
3. **the median cell of this series** (a cell nothing measured before: usually a table or a
   plot), named in the ETA's line as not measured before, so a long one (the checklist, the
   NIXL probe, 01's engine profile) on a first run is visibly a guess.

The kernel's start is the median over the notebooks of this series (notebook time less
its cells), else over the latest run's: one notebook's varies by seconds.

On a fresh clone 00 has no ETA (nothing measured yet), nor 01 (its start and sweeps have
nothing to be predicted from on the CPU rehearsal); 02 and 05 are this series' kernel and
median cells (02's NIXL probe counted as one); 03 and 04 the forecast from 01's
measurements (04's misses what nothing before it does: the first prefill/decode handshake
in its start, vllm-router's start). From the second run on a machine (a facilitator's staging run, then
the workshop), every cell is the last runs'.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from lab_utils.config import LabConfig, checkout_path
from lab_utils.forecast.run import architecture_of
from lab_utils.forecast.timing import minutes, sweep_seconds
from lab_utils.notebook.cell_forecast import SWAPS, Found, forecast_cell, runs_of, unmeasured
from lab_utils.notebook.forecasting import TOPOLOGY, eta_inputs
from lab_utils.notebook.optional import SKIPPED, optional_parts, read_book
from lab_utils.util.atomic import atomic_write_text


def notebook_files(nb: str | None = None) -> list[Path]:
    """The checkout's notebooks (the one numbered `nb`), in order."""
    return sorted(checkout_path("notebooks").glob(f"{nb or '[0-9][0-9]'}_*.ipynb"))


def settings_digest(cfg: LabConfig) -> str:
    """What the cells' times depend on: the workload and the engine's settings."""
    text = json.dumps({"workload": cfg.workload.model_dump(mode="json"),
                       "vllm": cfg.vllm.model_dump(mode="json"),
                       "model": cfg.model.name}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stamp(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def cell_seconds(executed: Any) -> dict[str, float]:
    """Per code cell id of an executed notebook (an nbformat node), the seconds from its
    input reaching the kernel to the kernel's reply, as nbclient stamped them (not a cell
    `skip_optional` left out: its time is not the cell's)."""
    out = {}
    for cell in executed.cells:
        t = cell.get("metadata", {}).get("execution", {})
        a, b = t.get("iopub.execute_input"), t.get("shell.execute_reply")
        skipped = cell.get("metadata", {}).get(SKIPPED)
        if cell.cell_type == "code" and a and b and cell.get("id") and not skipped:
            out[cell["id"]] = round((_stamp(b) - _stamp(a)).total_seconds(), 2)
    return out


def _file(cfg: LabConfig) -> Path:
    return cfg.results_dir / "timings.json"


def load_timings(cfg: LabConfig) -> dict[str, Any]:
    """{"notebooks": {name: {"cells": {id: s}, "kernel_s", "s", "series", "digest"}}}:
    the last time each notebook ran here; empty when none ran or the file is unreadable."""
    return read_timings(_file(cfg))


def read_timings(path: Path) -> dict[str, Any]:
    """A timings.json (`load_timings`), of this profile or of another run's results."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data.get("notebooks"), dict) else {"notebooks": {}}
    except (OSError, ValueError, AttributeError):
        return {"notebooks": {}}


def record_notebook(cfg: LabConfig, name: str, executed: Any, wall_s: float,
                    series: str) -> dict[str, Any]:
    """Write what the notebook `name` measured into timings.json (under its `series`: the
    runner's run id), keeping the `KEPT_RUNS` - 1 runs before it; return its entry."""
    cells = cell_seconds(executed)
    entry = {"cells": cells, "s": round(wall_s, 1), "series": series,
             "kernel_s": round(max(wall_s - sum(cells.values()), 0.0), 2),
             "digest": settings_digest(cfg)}
    data = load_timings(cfg)
    before = data["notebooks"].get(name)
    if isinstance(before, dict):  # the runs before it, newest first, without their own
        older = [before] + list(before.pop("earlier", []))
        entry["earlier"] = older[:KEPT_RUNS - 1]
    data["notebooks"][name] = entry
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(_file(cfg), json.dumps(data, indent=1, sort_keys=True) + "\n")
    return entry


KEPT_RUNS = 3  # runs per notebook a cell's time is the median of


def recent_cells(entry: dict[str, Any] | None, digest: str) -> dict[str, float]:
    """Per cell, the median of its time over the notebook's kept runs with these settings
    (one run disturbed by something else on the machine does not carry the ETA)."""
    runs = [entry, *entry.get("earlier", [])] if isinstance(entry, dict) else []
    seen: dict[str, list[float]] = {}
    for run in runs:
        if run.get("digest") == digest:
            for cid, secs in run.get("cells", {}).items():
                seen.setdefault(cid, []).append(secs)
    return {cid: statistics.median(v) for cid, v in seen.items()}


# what a cell does, by its source: (pattern, kind); the first match wins
_STEPS = ((r"start_tensor_parallel\(", "tp start"), (r"run_sweep\(cfg, tp, mixed=True", "tp mixed"),
          (r"run_sweep\(cfg, tp\b", "tp sweep"),
          (r"two_switches\(", "switches"), (r"compare_policies\(", "policies"),
          (r"compare_front_doors\(", "front doors"),
          (r"run_sweep\([^)]*mixed=True", "mixed"), (r"run_sweep\(", "sweep"),
          (r"session\.start\(", "start"))


def step_of(source: str) -> str | None:
    return next((kind for pattern, kind in _STEPS if re.search(pattern, source)), None)


@dataclass
class NotebookEta:
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # source -> seconds
    guessed: list[str] = field(default_factory=list)  # cells not measured before
    missing: list[str] = field(default_factory=list)  # steps nothing can predict yet
    # what a forecast cell leaves out because this machine has not measured it yet
    unmeasured: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.missing:
            return (f"no ETA yet: nothing measured predicts its {', '.join(self.missing)} "
                    "(01 measures the engine, and each start is recorded, for the ETAs after)")
        said = ", ".join(f"{src} {s:.0f} s" for src, s in self.parts.items() if s >= 0.5)
        text = f"ETA about {self.seconds:.0f} s ({said})"
        if self.unmeasured:
            text = (f"ETA at least {self.seconds:.0f} s ({said}), more by what it does not "
                    f"know until this run measures it: {'; '.join(self.unmeasured)}")
        if self.guessed:
            text += (f"; {len(self.guessed)} cell(s) not measured before, counted as this "
                     f"series' median cell: {', '.join(self.guessed[:4])}"
                     + (" ..." if len(self.guessed) > 4 else ""))
        return text


def _per_run_overhead(cfg: LabConfig, series_cells: dict[str, dict[str, float]],
                      found: Found) -> float:
    """Seconds per measured run (a repeat of a load point) that the forecast (`found`: its
    inputs) leaves out, as 01's sweep and mixed run measured them: (measured - forecast) /
    runs."""
    nb01 = _notebook_cells(series_cells, "01")
    if not nb01 or found is None:
        return 0.0
    inputs, cores, _ = found
    arch = architecture_of(cfg, "baseline", cores)
    w = cfg.workload
    extra = [(nb01[cid] - sweep_seconds(inputs, arch, w, mixed=kind == "mixed"))
             / runs_of(w, kind == "mixed") for cid, source in _sources("01").items()
             if (kind := step_of(source)) in ("sweep", "mixed") and cid in nb01]
    return max(statistics.median(extra), 0.0) if extra else 0.0


def cell_eta(cfg: LabConfig, nb: str, source: str, timed: Any = None) -> str | None:
    """'about N s (...)' for a serving cell of notebook `nb` about to run (`source`: its
    code; the session prints it before the cell, `ServingSession`): the cell's median over
    its last runs here when this checkout's cell of that code was measured with these
    settings, else the forecast (`forecast_cell`; `timed`: the split instance's requests
    timed in this kernel); None for a cell that serves nothing or nothing to predict from."""
    kind = step_of(source)
    if kind is None or kind in ("start", "tp start"):  # a start prints its own
        return None
    books, digest = load_timings(cfg)["notebooks"], settings_digest(cfg)
    cid = next((c for c, src in _sources(nb).items() if src.strip() == source.strip()), None)
    last = recent_cells(next((e for n, e in books.items() if n.startswith(nb)), None), digest)
    if cid in last:
        return f"about {minutes(last[cid])} (this cell's median over its last runs here)"
    found = eta_inputs(cfg)
    ran = {name: e["cells"] for name, e in books.items() if e.get("digest") == digest}
    overhead = _per_run_overhead(cfg, ran, found)
    secs = forecast_cell(cfg, nb, kind, found, overhead, _swap_seconds(cfg, ran, found, overhead),
                         timed)
    if secs is None or found is None:
        return None
    return (f"about {minutes(secs)} (forecast from {found[2]}"
            + (f", and {overhead:.1f} s per run outside the requests as 01's sweep measured it"
               if overhead >= 0.05 else "") + ")")


def _notebook_cells(cells: dict[str, dict[str, float]], nb: str) -> dict[str, float]:
    return next((c for name, c in cells.items() if name.startswith(nb)), {})


def _sources(nb: str, path: Path | None = None) -> dict[str, str]:
    """Code cell id -> source of notebook `nb` (from `path`, else the checkout's)."""
    book = _book(nb, path)
    return {c["id"]: c.source for c in book.cells if c.cell_type == "code"} if book else {}


def _book(nb: str, path: Path | None = None) -> Any:
    found = [path] if path else notebook_files(nb)
    return read_book(found[0]) if found else None


def optional_seconds(books: dict[str, Any], digest: str | None = None
                     ) -> list[tuple[str, str, float | None]]:
    """(notebook, part, seconds its cells took in the last runs, None when not run) for
    every optional part of every notebook: what `--skip-optional` saves. `books`:
    timings.json's "notebooks"; `digest`: only runs with these settings (None: any)."""
    out = []
    for path in notebook_files():
        entry = books.get(path.name)
        last = recent_cells(entry, digest or (entry or {}).get("digest", ""))
        for heading, ids in optional_parts(_book(path.name[:2], path)).items():
            found = [last[i] for i in ids if i in last]
            out.append((path.name[:2], heading, sum(found) if found else None))
    return out


def optional_lines(cfg: LabConfig) -> list[str]:
    """What `--skip-optional` leaves out, and the time each part took in the last runs."""
    found = optional_seconds(load_timings(cfg)["notebooks"], settings_digest(cfg))
    return ["optional parts (`run --skip-optional` leaves them out):"] + [
        f"  {nb} {part}: " + (f"{s:.0f} s in the last runs here" if s is not None
                              else "not run here yet") for nb, part, s in found]


def _swap_seconds(cfg: LabConfig, series_cells: dict[str, dict[str, float]], found: Found,
                  overhead: float) -> float:
    """Seconds to put a front door in place, as 03's policy comparison of this series
    measured it: the cell's time less its two runs' forecast, over its `SWAPS` starts."""
    nb03 = _notebook_cells(series_cells, "03")
    cid = next((c for c, src in _sources("03").items() if step_of(src) == "policies"), None)
    if found is None or cid not in nb03:
        return 0.0
    inputs, cores, _ = found
    one = cfg.workload.model_copy(update={"repeats": 1})
    runs = 2 * (sweep_seconds(inputs, architecture_of(cfg, "replicated", cores), one,
                              mixed=True) + overhead)
    return max((nb03[cid] - runs) / SWAPS, 0.0)


def notebook_eta(cfg: LabConfig, path: Path, series: str,
                 skip: bool = False) -> NotebookEta | None:
    """The ETA of the notebook at `path` (see the module's docstring), without its optional
    parts with `skip`; None when nothing at all was measured yet (no earlier run, no
    notebook of this series)."""
    nb = path.name[:2]
    data = load_timings(cfg)
    digest = settings_digest(cfg)
    books = data["notebooks"]
    last = recent_cells(books.get(path.name), digest)
    this = {name: e["cells"] for name, e in books.items() if e.get("series") == series}
    kernels = ([e["kernel_s"] for e in books.values() if e.get("series") == series]
               or [e["kernel_s"] for e in books.values() if e.get("digest") == digest])
    measured_cells = [s for cells in this.values() for s in cells.values()]
    if not last and not this:
        return None
    kernel = statistics.median(kernels) if kernels else 0.0
    median_cell = statistics.median(measured_cells) if measured_cells else 0.0
    found = eta_inputs(cfg) if nb in TOPOLOGY else None  # read once for every cell
    overhead = _per_run_overhead(cfg, this, found) if nb in TOPOLOGY else 0.0
    swap = _swap_seconds(cfg, this, found, overhead) if nb in TOPOLOGY else 0.0
    parts = {"kernel start": kernel, "last runs": 0.0, "forecast": 0.0, "median cell": 0.0}
    guessed: list[str] = []
    missing: list[str] = []
    unknown: list[str] = []
    left_out = ({cid for ids in optional_parts(_book(nb, path)).values() for cid in ids}
                if skip else set())
    for cid, source in _sources(nb, path).items():
        if not source.strip() or cid in left_out:
            continue
        if cid in last:
            parts["last runs"] += last[cid]
            continue
        kind = step_of(source)
        s = forecast_cell(cfg, nb, kind, found, overhead, swap) if kind else None
        if s is not None:
            parts["forecast"] += s
            if nb == "04" and kind and (why := unmeasured(cfg, kind)):
                unknown.append(why)
            continue
        if kind:
            missing.append(kind)
        parts["median cell"] += median_cell
        first = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
        guessed.append(f"{cid} `{first[:40]}`")
    return NotebookEta(seconds=sum(parts.values()), parts={k: v for k, v in parts.items() if v},
                       guessed=guessed, missing=list(dict.fromkeys(missing)),
                       unmeasured=list(dict.fromkeys(unknown)))


def whole_notebook_lines(cfg: LabConfig) -> list[str]:
    """Each notebook's whole ETA as `make lab` would print it now (`notebook_eta`: the last
    runs' cells on this profile, else the forecast), or why there is none."""
    said = [(p.name[:2], notebook_eta(cfg, p, series="")) for p in notebook_files()]
    if not any(e for _, e in said):
        return ["whole notebooks: no run recorded on this profile yet (`make lab` records "
                "each cell's time in results/<profile>/timings.json)"]
    return ["whole notebooks, kernel and every cell (headless, no reading time):"] + [
        f"  {nb}: {e.line() if e else 'no ETA: not run here yet'}" for nb, e in said]
