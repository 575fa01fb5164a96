"""Run the notebooks headless, in order, on the active profile.

Each notebook is executed by nbclient in a fresh kernel whose environment carries
`LAB_CONFIG`, so `load_config()` inside it finds the same profile as the command line.
Executed copies (with outputs) are written under the profile's results directory; the
notebooks in the repository are never modified. While a notebook runs, the lines its
progress bars log (`lab_utils.util.progress`) are printed on the terminal, and a cell that
runs for a long time without one is named every `HEARTBEAT_S` seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab_utils.cluster import Cluster
from lab_utils.config import LabConfig, checkout_path, jupyter_token
from lab_utils.errors import LabError
from lab_utils.notebook.optional import skip_optional
from lab_utils.notebook.timings import notebook_eta, record_notebook
from lab_utils.util.atomic import atomic_write_text
from lab_utils.util.background import Background
from lab_utils.util.progress import PROGRESS_LOG_ENV


def find_notebooks(notebooks_dir: str | os.PathLike | None = None, start: str | None = None,
                   stop: str | None = None) -> list[Path]:
    folder = Path(notebooks_dir) if notebooks_dir else checkout_path("notebooks")
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in found if (not start or p.name[:2] >= start) and (not stop or p.name[:2] <= stop)]


HEARTBEAT_S = 60.0  # a cell silent for this long is named on the terminal


def _minutes(secs: float) -> str:
    return f"{int(secs // 60)} min {int(secs % 60):02d} s" if secs >= 60 else f"{secs:.0f} s"


class _Relay(Background):
    """Prints the kernel's progress lines as they are logged, and which cell is still
    running when nothing was printed for `HEARTBEAT_S` seconds."""

    def __init__(self, log: Path, cells: int):
        super().__init__("lab-progress")
        self.log, self.cells = log, cells
        self.cell: tuple[int, str, float] | None = None  # index, first line, start time
        self._offset, self._said = 0, time.monotonic()

    def cell_started(self, cell, cell_index: int, **_) -> None:
        if cell.cell_type == "code" and cell.source.strip():
            first = next(line for line in cell.source.splitlines() if line.strip())
            self.cell = (cell_index, first.strip()[:70], time.monotonic())

    def _say(self, text: str) -> None:
        print(f"  {text}", flush=True)
        self._said = time.monotonic()

    def _drain(self) -> None:
        try:
            with open(self.log, encoding="utf-8") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        done = chunk[:chunk.rfind("\n") + 1]  # whole lines only; the rest is read next time
        self._offset += len(done.encode("utf-8"))
        for line in done.splitlines():
            self._say(line)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._drain()
            now = time.monotonic()
            if self.cell and now - self._said >= HEARTBEAT_S:
                index, first, t0 = self.cell
                self._say(f"cell {index + 1}/{self.cells} running for {_minutes(now - t0)}: {first}")

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._drain()  # the lines logged after the last look


def _execute(path: Path, target: Path, timeout_per_cell: int, skip: bool = False):
    """Run one notebook in a fresh kernel (without its optional parts with `skip`); write
    the executed copy even when a cell fails. Returns the executed notebook (nbformat),
    with nbclient's timestamps per cell."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    if skip and (parts := skip_optional(nb)):
        print(f"  left out (--skip-optional): {'; '.join(parts)}", flush=True)
    env_before = os.environ.get(PROGRESS_LOG_ENV)
    with tempfile.TemporaryDirectory(prefix="lab-kernel-") as tmp:
        log = Path(tmp) / "progress.log"
        os.environ[PROGRESS_LOG_ENV] = str(log)  # the kernel inherits this environment
        # IPC sockets in a private directory: the kernel is not reachable over TCP
        km = KernelManager(kernel_name="python3", transport="ipc",
                           connection_file=str(Path(tmp) / "kernel.json"))
        relay = _Relay(log, len(nb.cells))
        client = NotebookClient(nb, km=km, timeout=timeout_per_cell, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}},
                                on_cell_start=relay.cell_started)
        try:
            with relay:
                client.execute()
        except CellExecutionError as e:
            raise LabError(f"{path.name} failed (executed copy with the error: {target}):"
                           f"\n{e}") from None
        finally:
            nbformat.write(nb, target)
            if km.has_kernel:
                km.shutdown_kernel(now=False)
            if env_before is None:
                os.environ.pop(PROGRESS_LOG_ENV, None)
            else:
                os.environ[PROGRESS_LOG_ENV] = env_before
    return nb


def _stop_leftovers(cluster: Cluster, before: set[str], notebook: str) -> None:
    """No server outlives its notebook: stop what it started and left running."""
    left = [r for r in cluster.running() if r.name not in before]
    if left:
        stopped = cluster.stop(left)
        print(f"  {notebook} left {', '.join(stopped) or 'records of dead processes'} "
              "running: stopped", flush=True)


_NO_ETA = "no ETA: nothing measured on this machine yet"


def _eta(cfg: LabConfig, path: Path, series: str, skip: bool):
    """The notebook's ETA (`notebook.timings`), or None, saying why, when it fails."""

    try:
        return notebook_eta(cfg, path, series, skip)
    except Exception as e:  # noqa: BLE001 - an estimate never stops the run
        print(f"  (no ETA: {type(e).__name__}: {e})", flush=True)
        return None


def _against(eta_s: float | None, took: float) -> str:
    """' (ETA 80 s: 4% under)': how far the ETA was from the measured time."""
    if not eta_s:
        return ""
    off = (eta_s - took) / took
    return f" (ETA {eta_s:.0f} s: {abs(off):.0%} {'over' if off > 0 else 'under'})"


def run_notebooks(cfg: LabConfig, start: str | None = None, stop: str | None = None,
                  notebooks_dir: str | os.PathLike | None = None,
                  timeout_per_cell: int = 3600, skip_optional: bool = False) -> list[Path]:
    """Execute the selected notebooks (without their optional parts with `skip_optional`);
    return the paths of the executed copies."""
    notebooks = find_notebooks(notebooks_dir, start, stop)
    if not notebooks:
        raise LabError(f"no notebooks numbered {start or '00'}..{stop or '99'} found")
    out_dir = cfg.results_dir / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    env_before = os.environ.get("LAB_CONFIG")
    os.environ["LAB_CONFIG"] = str(cfg.source)  # the kernel inherits this environment
    written, times, etas = [], {}, {}
    series = time.strftime("%Y%m%dT%H%M%S")  # this run's id in timings.json
    cluster = Cluster(cfg)  # the notebooks' kernels build their own
    try:
        for path in notebooks:
            target = out_dir / path.name
            eta = _eta(cfg, path, series, skip_optional)
            print(f"running {path.name} ... {eta.line() if eta else _NO_ETA}", flush=True)
            t0 = time.monotonic()
            before = {r.name for r in cluster.running()}
            try:
                executed = _execute(path, target, timeout_per_cell, skip_optional)
            finally:
                _stop_leftovers(cluster, before, path.name)
                cluster.close()  # idle while the next notebook runs
            times[path.name] = round(time.monotonic() - t0, 1)
            try:
                record_notebook(cfg, path.name, executed, times[path.name], series)
            except Exception as e:  # noqa: BLE001 - the next run's estimate, not this run
                print(f"  (its cells' times not recorded: {type(e).__name__}: {e})", flush=True)
            atomic_write_text(out_dir / "times.json", json.dumps(times, indent=2) + "\n")
            eta_s = round(eta.seconds, 1) if eta and not eta.missing else None
            etas[path.name] = {"s": times[path.name], "eta_s": eta_s,
                               "eta": eta.line() if eta else _NO_ETA}
            atomic_write_text(out_dir / "etas.json", json.dumps(etas, indent=2) + "\n")
            print(f"  done in {times[path.name]:.0f} s{_against(eta_s, times[path.name])} "
                  f"-> {target}", flush=True)
            written.append(target)
        total = sum(times.values())
        print(f"{len(written)} notebook(s) in {total:.0f} s: " + ", ".join(
            f"{name[:2]} {t:.0f} s" for name, t in times.items()), flush=True)
    finally:
        cluster.close()
        if env_before is None:
            os.environ.pop("LAB_CONFIG", None)
        else:
            os.environ["LAB_CONFIG"] = env_before
    return written


def jupyter_plan(cfg: LabConfig, token: str, notebooks_dir: str | os.PathLike | None = None
                 ) -> tuple[list[str], dict[str, str], str]:
    """JupyterLab for the notebooks on the notebook host: (argv, environment, URL). It
    listens on the host's LAN address (a workshop attendee's browser reaches it without an
    SSH tunnel) and on `jupyter.port`; the token travels in the environment, never on the
    command line, where other users of the machine could read it."""

    host = cfg.notebook_host()
    if host is None:
        raise LabError("no node of this profile is this machine (connection \"local\"): "
                       "JupyterLab runs on the notebook host; run this command there")
    address = cfg.nodes[host].lan_address
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ip={address}",
            f"--port={cfg.jupyter.port}", "--port-retries=0",
            f"--ServerApp.root_dir={notebooks_dir or checkout_path('notebooks')}"]
    if os.geteuid() == 0:  # JupyterLab refuses root without it (a container, a CI machine)
        argv.append("--allow-root")
    env = {"JUPYTER_TOKEN": token, "LAB_CONFIG": str(cfg.source.resolve()) if cfg.source else ""}
    return argv, env, f"http://{address}:{cfg.jupyter.port}/lab?token={token}"


def serve_jupyter(cfg: LabConfig, notebooks_dir: str | os.PathLike | None = None) -> int:
    """Start JupyterLab in the foreground (Ctrl-C stops it) and print how to open it
    (`notebooks_dir`: serve another copy of the notebooks, e.g. in a test)."""

    host = cfg.notebook_host()
    token = jupyter_token(cfg)  # the pair's, kept across restarts (`jupyter.token_file`)
    argv, env, url = jupyter_plan(cfg, token, notebooks_dir)
    if host is not None:
        Cluster(cfg).node(host).ensure_port_free(cfg.nodes[host].lan_address, cfg.jupyter.port,
                                                 "JupyterLab (jupyter.port)")
    public = cfg.jupyter.public_url
    print(f"JupyterLab for profile {cfg.profile}, notebooks in "
          f"{notebooks_dir or checkout_path('notebooks')}\n"
          f"open: {url}\n"
          + (f"attendees open: {public.rstrip('/')}/lab?token=<the same token>\n" if public else "")
          + f"(the token is in {cfg.jupyter_token_path()}, the same at every start; anyone with "
          f"this URL can run code as {os.environ.get('USER', 'you')} on this machine: share it "
          "only with the people at this cluster; Ctrl-C stops it)", flush=True)
    child_env = {**os.environ, **{k: v for k, v in env.items() if v}}
    with subprocess.Popen(argv, env=child_env) as proc:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                return proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
