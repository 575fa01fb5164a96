"""Readers of recorded command output that only the tests use.

`pip show` and vLLM's `collect_env` answer `ReplayNode`'s `nodefacts python` (the lab
itself asks the node's Python for versions), and `nixlbench` turns the recorded GB10
bandwidths into the numbers `recommend_kv_buffer_device` is tested with. Same rules as
`lab_utils.checks.parsers`: text in, plain values out, never an exception.
"""

from __future__ import annotations

import re
from typing import Any

from lab_utils.checks.parsers import _NUMBER, NA_VALUES, _search, _slug


def pip_show_version(text: str) -> str | None:
    """The "Version:" field of `pip show <pkg>` (also found inside a wrapped line such as
    "  spark-01: Version: 0.13.0+cu130 (CUDA 13 build)"; the first one wins)."""
    return _search(r"(?:^|\s)Version:\s*(\S+)", text)


_COLLECT_ENV_KEYS = {
    "pytorch version": "torch_version",
    "cuda used to build pytorch": "cuda_used_to_build",
    "is cuda available": "cuda_available",
    "cuda runtime version": "cuda_runtime_version",
    "gpu models and configuration": "gpu_models",
    "nvidia driver version": "driver_version",
    "vllm version": "vllm_version",
    "python version": "python_version",
    "os": "os",
}


_COLLECT_ENV_LINE = re.compile(r"^(?P<label>[A-Za-z][^:]*?)\s+:\s?(?P<value>.*)$")


def collect_env(text: str) -> dict[str, str | None]:
    """The "Label : value" lines of vLLM's `python collect_env.py` (also `vllm collect-env`).

    Well-known labels get short keys ("torch_version", "cuda_used_to_build" e.g. "12.9",
    "cuda_available", "cuda_runtime_version", "gpu_models", "driver_version",
    "vllm_version", "python_version", "os"); other labels are slugged ("Is debug build" ->
    "is_debug_build"). "N/A" and "Could not collect" become None.
    """
    info: dict[str, str | None] = {}
    for line in text.splitlines():
        m = _COLLECT_ENV_LINE.match(line)
        if not m:
            continue
        label = m["label"].strip()
        key = _COLLECT_ENV_KEYS.get(label.lower(), _slug(label))
        value = m["value"].strip()
        info.setdefault(key, None if value in NA_VALUES or value == "Could not collect" else value)
    return info


_NIXLBENCH_COLUMNS = {
    "block size (b)": "block_size",
    "batch size": "batch_size",
    "b/w (gb/sec)": "bw_GBps",
    "b/w (gib/sec)": "bw_GiBps",
    "b/w (mib/sec)": "bw_MiBps",
    "avg lat. (us)": "avg_lat_us",
    "avg prep (us)": "avg_prep_us",
    "p99 prep (us)": "p99_prep_us",
    "avg post (us)": "avg_post_us",
    "p99 post (us)": "p99_post_us",
    "avg tx (us)": "avg_tx_us",
    "p99 tx (us)": "p99_tx_us",
}


def _nixlbench_config(lines: list[str]) -> dict[str, str]:
    config = {}
    pattern = re.compile(r"^(?P<label>[^(:]+?)\s*(?:\(--(?P<flag>\w+)[^)]*\))?\s*:\s(?P<value>.*)$")
    inside = False
    for line in lines:
        if line.startswith("NIXLBench Configuration"):
            inside = True
        elif inside and line.startswith("---"):
            break
        elif inside and (m := pattern.match(line)):
            config[m["flag"] or _slug(m["label"])] = m["value"].strip()
    return config


def _nixlbench_row(keys: list[str], line: str) -> dict[str, float | int] | None:
    cells = line.split()
    if len(cells) != len(keys) or not all(_NUMBER.match(c) for c in cells):
        return None
    row: dict[str, float | int] = {}
    for key, cell in zip(keys, cells, strict=True):
        row[key] = int(cell) if key in ("block_size", "batch_size") else float(cell)
    return row


def nixlbench(text: str) -> dict[str, Any]:
    """The initiator's output of `nixlbench` (stdout and stderr).

    Returns {"config", "rows", "peak_bw_GBps"}: config maps each "--flag" of the
    configuration block to its printed value ("initiator_seg_type": "VRAM", "device_list":
    "rocep1s0f0"; lines without a flag get a slug such as "etcd_endpoint"); rows are
    {"block_size", "batch_size", "bw_GBps", "avg_lat_us", "avg_prep_us", "p99_prep_us",
    "avg_post_us", "p99_post_us", "avg_tx_us", "p99_tx_us"} (GB = 1e9 bytes; unknown
    columns get slugged keys); peak_bw_GBps is the highest bw_GBps or None without rows.
    """
    lines = text.splitlines()
    rows: list[dict[str, float | int]] = []
    keys: list[str] | None = None
    for line in lines:
        if line.startswith("Block Size"):
            labels = re.split(r"\s{2,}", line.strip())
            keys = [_NIXLBENCH_COLUMNS.get(lb.lower(), _slug(lb)) for lb in labels]
        elif keys and (row := _nixlbench_row(keys, line)):
            rows.append(row)
    bws = [r["bw_GBps"] for r in rows if "bw_GBps" in r]
    return {
        "config": _nixlbench_config(lines),
        "rows": rows,
        "peak_bw_GBps": max(bws) if bws else None,
    }
