"""What a results file says about where it was written: the versions of the software
behind the results (`software_versions`) and facts about this machine that need no GPU
(`hardware_facts`); `store.write_envelope` puts both in every envelope.
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

from lab_utils.on_node.facts import dist_version, mem_total_bytes, python_facts


def software_versions() -> dict[str, str | None]:
    """Versions of the software behind the results; None for what is not installed."""
    facts = python_facts()  # the same reading the checklist does on every node
    return {
        "python": facts["python"],
        "lab_utils": dist_version("spark-disagg-lab") or "unknown",
        "vllm": facts["vllm"],
        "torch": facts["torch"],
        "torch_cuda": facts["torch_cuda"],
        "nixl": facts["nixl"],
        "transformers": dist_version("transformers"),
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
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": memory,
    }
