"""What a results file says about where it was written: the versions of the software
behind the results (`software_versions`: also UCX as NIXL loads it, the GPU driver, and
the lab's own git commit and whether its tree was modified) and facts about this machine
(`hardware_facts`: CPU model and cores, memory, OS and kernel, the GPU when there is one);
`store.write_envelope` puts both in every envelope. What cannot be read is None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab_utils.on_node.facts import dist_version, mem_total_bytes, python_facts

LAB_ROOT = Path(__file__).resolve().parents[2]  # the checkout lab_utils was imported from


def _run(argv: list[str], timeout: float = 5.0) -> str | None:
    """A command's stdout, stripped; None when it is missing, fails or hangs."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def lab_commit() -> tuple[str | None, bool | None]:
    """The lab checkout's git commit and whether tracked files differ from it (None, None
    when it is not a git checkout, e.g. an installed copy)."""
    commit = _run(["git", "-C", str(LAB_ROOT), "rev-parse", "HEAD"])
    if commit is None:
        return None, None
    status = _run(["git", "-C", str(LAB_ROOT), "status", "--porcelain", "--untracked-files=no"])
    return commit, bool(status)


def ucx_version() -> str | None:
    """The UCX release NIXL uses: the library bundled in NIXL's wheel, else the system's."""
    candidates = [p for d in sys.path for p in sorted(glob.glob(f"{d}/nixl*.libs/libucp*.so*"))]
    if system := ctypes.util.find_library("ucp"):
        candidates.append(system)
    for path in candidates:
        try:
            fn = ctypes.CDLL(path).ucp_get_version_string
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        got = fn()
        return got.decode() if got else None
    return None


def _nvidia_smi(field: str) -> str | None:
    out = _run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"])
    return "; ".join(dict.fromkeys(line.strip() for line in out.splitlines())) if out else None


def software_versions() -> dict[str, str | None]:
    """Versions of the software behind the results; None for what is not installed."""
    facts = python_facts()  # the same reading the checklist does on every node
    commit, modified = lab_commit()
    return {
        "python": facts["python"],
        "lab_utils": dist_version("spark-disagg-lab") or "unknown",
        "vllm": facts["vllm"],
        "torch": facts["torch"],
        "torch_cuda": facts["torch_cuda"],
        "nixl": facts["nixl"],
        "ucx": ucx_version(),
        "gpu_driver": _nvidia_smi("driver_version"),
        "transformers": dist_version("transformers"),
        "lab_commit": commit,
        "lab_tree_modified": modified,
    }


def hardware_facts() -> dict[str, Any]:
    """Facts about this machine that need no GPU."""
    try:
        memory = mem_total_bytes(Path("/proc/meminfo").read_text())
    except OSError:
        memory = None
    return {
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": memory,
        "os": _os_name(),
        "kernel": platform.release(),
        "gpu": _nvidia_smi("name,memory.total"),
    }


def _cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or None


def _os_name() -> str | None:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return platform.system() or None
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.system() or None
