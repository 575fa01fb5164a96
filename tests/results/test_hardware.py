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
        "ucx",
        "gpu_driver",
        "transformers",
        "lab_commit",
        "lab_tree_modified",
    }
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["lab_utils"] not in (None, "")
    assert hardware.dist_version("surely-not-an-installed-dist") is None
    if versions["torch"] is None:
        assert versions["torch_cuda"] is None
    if versions["nixl"]:  # the UCX NIXL's wheel bundles
        assert versions["ucx"] and versions["ucx"][0].isdigit()


def test_the_labs_commit_and_whether_its_tree_was_modified(tmp_path, monkeypatch):
    commit, modified = hardware.lab_commit()
    if (hardware.LAB_ROOT / ".git").exists():
        assert commit and len(commit) == 40 and isinstance(modified, bool)
    monkeypatch.setattr(hardware, "LAB_ROOT", tmp_path)  # not a git checkout
    assert hardware.lab_commit() == (None, None)


def test_hardware_facts():
    facts = hardware.hardware_facts()
    assert facts["cpu_count"] == os.cpu_count()
    assert facts["hostname"]
    if Path("/proc/meminfo").exists():
        assert facts["memory_total_bytes"] > 1024 * 1024
    assert facts["kernel"] and facts["os"] and facts["cpu_model"]
    assert set(facts) >= {"gpu", "machine"}
