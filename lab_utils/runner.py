"""Run the notebooks headless, in order, on the active profile.

Each notebook is executed by nbclient in a fresh kernel whose environment carries
`LAB_CONFIG`, so `load_config()` inside it finds the same profile as the command line.
Executed copies (with outputs) are written under the profile's results directory; the
notebooks in the repository are never modified.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from lab_utils.atomic import atomic_write_text
from lab_utils.config import REPO_ROOT, LabConfig
from lab_utils.errors import LabError
from lab_utils.launcher import stop_records
from lab_utils.topology import running


def find_notebooks(notebooks_dir: str | os.PathLike | None = None, start: str | None = None,
                   stop: str | None = None) -> list[Path]:
    folder = Path(notebooks_dir) if notebooks_dir else REPO_ROOT / "notebooks"
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in found if (not start or p.name[:2] >= start) and (not stop or p.name[:2] <= stop)]


def _execute(path: Path, target: Path, timeout_per_cell: int) -> None:
    """Run one notebook in a fresh kernel; write the executed copy even when a cell fails."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="lab-kernel-") as tmp:
        # IPC sockets in a private directory: the kernel is not reachable over TCP
        km = KernelManager(kernel_name="python3", transport="ipc",
                           connection_file=str(Path(tmp) / "kernel.json"))
        client = NotebookClient(nb, km=km, timeout=timeout_per_cell, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except CellExecutionError as e:
            raise LabError(f"{path.name} failed (executed copy with the error: {target}):"
                           f"\n{e}") from None
        finally:
            nbformat.write(nb, target)
            if km.has_kernel:
                km.shutdown_kernel(now=False)


def _stop_leftovers(cfg: LabConfig, before: set[str], notebook: str) -> None:
    """No server outlives its notebook: stop what it started and left running."""
    left = [r for r in running(cfg) if r.name not in before]
    if left:
        stopped = stop_records(cfg, left)
        print(f"  {notebook} left {', '.join(stopped) or 'records of dead processes'} "
              "running: stopped", flush=True)


def run_notebooks(cfg: LabConfig, start: str | None = None, stop: str | None = None,
                  notebooks_dir: str | os.PathLike | None = None,
                  timeout_per_cell: int = 3600) -> list[Path]:
    """Execute the selected notebooks; return the paths of the executed copies."""
    notebooks = find_notebooks(notebooks_dir, start, stop)
    if not notebooks:
        raise LabError(f"no notebooks numbered {start or '00'}..{stop or '99'} found")
    out_dir = cfg.results_dir / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    env_before = os.environ.get("LAB_CONFIG")
    os.environ["LAB_CONFIG"] = str(cfg.source)  # the kernel inherits this environment
    written, times = [], {}
    try:
        for path in notebooks:
            target = out_dir / path.name
            t0 = time.monotonic()
            print(f"running {path.name} ...", flush=True)
            before = {r.name for r in running(cfg)}
            try:
                _execute(path, target, timeout_per_cell)
            finally:
                _stop_leftovers(cfg, before, path.name)
            times[path.name] = round(time.monotonic() - t0, 1)
            atomic_write_text(out_dir / "times.json", json.dumps(times, indent=2) + "\n")
            print(f"  done in {times[path.name]:.0f} s -> {target}", flush=True)
            written.append(target)
        total = sum(times.values())
        print(f"{len(written)} notebook(s) in {total:.0f} s: " + ", ".join(
            f"{name[:2]} {t:.0f} s" for name, t in times.items()), flush=True)
    finally:
        if env_before is None:
            os.environ.pop("LAB_CONFIG", None)
        else:
            os.environ["LAB_CONFIG"] = env_before
    return written
