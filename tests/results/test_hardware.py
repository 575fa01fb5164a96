"""Unit tests of lab_utils.results.hardware: the software and machine facts of an envelope."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lab_utils.results import hardware


def test_software_versions_light():
    versions = hardware.software_versions()
    assert set(versions) == {
        "python",
        "lab_utils",
        "vllm",
        "torch",
        "torch_cuda",
        "nixl",
        "transformers",
    }
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["lab_utils"] not in (None, "")
    assert hardware.dist_version("surely-not-an-installed-dist") is None
    if versions["torch"] is None:
        assert versions["torch_cuda"] is None


def test_hardware_facts():
    facts = hardware.hardware_facts()
    assert facts["cpu_count"] == os.cpu_count()
    assert facts["hostname"]
    if Path("/proc/meminfo").exists():
        assert facts["memory_total_bytes"] > 1024 * 1024
