"""The typed profile, `LabConfig`: its parts (see `parts`) put together, with what is
derived from them (paths resolved against the checkout, the model and log paths on each
node, the instances of each topology) and the snapshot stored with results."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, field_validator

from lab_utils.config import topology as placement
from lab_utils.config import values
from lab_utils.config.parts import (
    JupyterConfig,
    KVTransferConfig,
    ModelConfig,
    NodeConfig,
    ProxyConfig,
    TopologyConfig,
    VllmConfig,
    WorkloadConfig,
    _Strict,
)
from lab_utils.config.topology import InstanceSpec
from lab_utils.errors import LabError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_DIR.parent  # the checkout, when lab_utils is used from one (editable install)
# NIXL's progress thread on the CPU rehearsal: waits in poll() up to 1 ms instead of
# polling without pause (docs/REHEARSAL.md has the comparison)
CPU_NIXL_PROGRESS_DELAY_US = 1000


def in_checkout() -> bool:
    """Whether lab_utils runs from the lab's checkout (not from a wheel without one)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "notebooks").is_dir()


def checkout_path(*parts: str) -> Path:
    """A path in the lab's checkout (notebooks, shipped profiles); a clear error when
    lab_utils was installed from a wheel, which carries the package and nothing around it."""
    if not in_checkout():
        raise LabError(
            f"{'/'.join(parts)} is part of the lab's checkout, but lab_utils is installed at "
            f"{PACKAGE_DIR} without one (from a wheel): clone the lab and install it with "
            "`pip install -e .` in the clone, or name a config with --config F / $LAB_CONFIG")
    return REPO_ROOT.joinpath(*parts)


class LabConfig(_Strict):
    profile: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
    description: str = ""
    results_root: str = "results"
    hf_token_file: str | None = None
    # a node's name becomes part of file names and log lines: a plain word
    nodes: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")],
                NodeConfig] = Field(min_length=1)
    model: ModelConfig
    vllm: VllmConfig
    kv_transfer: KVTransferConfig = KVTransferConfig()
    topology: TopologyConfig
    proxy: ProxyConfig
    workload: WorkloadConfig = WorkloadConfig()
    jupyter: JupyterConfig = JupyterConfig()

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("results_root")
    @classmethod
    def _results_root(cls, v: str) -> str:
        # judged where it really is (`~`, `..`, `//` and symlinks resolved), as resolve_path
        # finds it
        return values.check_local_dir(v, str(REPO_ROOT if in_checkout() else Path.cwd()))

    # ----- derived values -------------------------------------------------------------

    def notebook_host(self) -> str | None:
        """The node the notebooks run on: the local node with the controller role (else
        the first local node); None when every node is reached over SSH."""
        local = [n for n, node in self.nodes.items() if node.connection == "local"]
        found = [n for n in local if "controller" in self.nodes[n].roles] or local
        return found[0] if found else None

    @property
    def source(self) -> Path | None:
        return self._source

    @property
    def source_name(self) -> str:
        """The config file as a user would type it in a command (relative to the repo)."""
        if self._source is None:
            return "F"
        try:
            return str(self._source.resolve().relative_to(REPO_ROOT))
        except ValueError:
            return str(self._source)

    def resolve_path(self, value: str | os.PathLike) -> Path:
        """A path from the config: `~` expanded, relative paths against the checkout (the
        current directory when lab_utils is installed without one)."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else (REPO_ROOT if in_checkout() else Path.cwd()) / p

    def jupyter_token_path(self) -> Path:
        return self.resolve_path(self.jupyter.token_file
                                 or f"~/.config/spark-disagg-lab/{self.profile}.jupyter-token")

    @property
    def results_dir(self) -> Path:
        return self.resolve_path(self.results_root) / self.profile

    @property
    def model_path(self) -> str:
        """What vLLM's `--model` gets: a local directory or a hub id."""
        if self.model.path:
            return str(self.resolve_path(self.model.path))
        return self.model.name

    def model_path_on(self, node: str) -> str:
        """`--model` on a node. On SSH nodes a generated or pre-placed model is at
        `model.node_path` (the same on every node: vLLM's NIXL handshake compares a hash
        that includes the model path, so prefill and decode must name the same one)."""
        if self.nodes[node].connection == "ssh" and self.model.source != "hub":
            return self.model.node_path or str(self.model.path)
        return self.model_path

    def log_dir_on(self, node: str) -> str:
        """Where processes started on a node write their logs (on that node)."""
        n = self.nodes[node]
        if n.connection == "ssh":
            return f"{n.workdir}/logs/{self.profile}"
        return str(self.results_dir / "logs")

    def uses_rdma(self, node: str) -> bool:
        """Whether KV moves over RDMA from `node`: a GPU profile naming its data devices."""
        return bool(self.nodes[node].data_netdev) and self.vllm.device == "cuda"

    def lower_nixl_threads(self) -> bool:
        """Whether the lab lowers the priority of NIXL's progress threads
        (`kv_transfer.lower_nixl_threads`; unset: on the CPU rehearsal only)."""
        setting = self.kv_transfer.lower_nixl_threads
        return self.vllm.device == "cpu" if setting is None else setting

    def nixl_progress_delay_us(self) -> int:
        """NIXL's progress-thread delay the lab sets in its prefill and decode instances
        (`kv_transfer.nixl_progress_delay_us`; unset: 1000 on the CPU rehearsal, 0, NIXL's
        busy polling as vLLM gets it, on CUDA). 0 means the lab leaves nixl alone."""
        setting = self.kv_transfer.nixl_progress_delay_us
        if setting is None:
            return CPU_NIXL_PROGRESS_DELAY_US if self.vllm.device == "cpu" else 0
        return setting

    def probe_pair(self) -> tuple[str, str]:
        """(target, initiator) of the NIXL probe: as in P/D serving, the decode node reads
        the KV that the prefill node holds."""
        d = self.topology.disaggregated
        return d.prefill[0], d.decode[0]

    def instances(self, topology: str) -> list[InstanceSpec]:
        """The instances of one topology (see `topology.instances`)."""
        return placement.instances(self.topology, self.vllm, topology)

    def snapshot(self) -> dict[str, Any]:
        """The config as plain data for results files. Secrets live in files the config
        only names; in case one was put in the config anyway, `extra_env` values with a
        secret-looking name and any occurrence of a known secret value are redacted. NIXL's
        progress delay is recorded as resolved for the device (what the run used)."""
        data = self.model_dump(mode="json")
        data["kv_transfer"]["nixl_progress_delay_us"] = self.nixl_progress_delay_us()
        return values.redact(data, known_secrets(self))


def known_secrets(cfg: LabConfig) -> tuple[str, ...]:
    """The secret values this config can reach (the files it names, readable or not, the
    secret environment variables and the values of secret-named `extra_env` entries),
    longest first, for redaction by value."""
    found = {os.environ.get(v, "") for v in values.SECRET_ENV_VARS}
    for field in filter(None, (cfg.hf_token_file, cfg.proxy.api_key_file, cfg.vllm.api_key_file)):
        with contextlib.suppress(OSError):
            found.add(cfg.resolve_path(field).read_text().strip())
    for settings in (cfg.vllm, cfg.vllm.baseline, cfg.vllm.replica, cfg.vllm.prefill, cfg.vllm.decode):
        found.update(values.secret_env_values(settings.extra_env))
    return tuple(sorted((v for v in found if len(v) >= values.MIN_SECRET_CHARS), key=len,
                        reverse=True))
