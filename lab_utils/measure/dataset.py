"""Prompts from a file: the two formats the tools people already use read.

- A JSONL file as `vllm bench serve --dataset-name custom` reads it: one JSON object per
  line, `prompt` (text) and optionally `output_tokens` (how many tokens to generate).
- A ShareGPT JSON file: a list of conversations, each `{"conversations": [{"from": ...,
  "value": ...}, ...]}`; the first turn is the prompt and the second (the reply) sets the
  output length, counted in the served model's tokens, as `vllm bench serve
  --dataset-name sharegpt` does. Conversations with fewer than two turns are left out,
  and how many is said.

A file is read whole and checked before anything is sent: a bad line is refused with
its number and the field, so a benchmark never stops half-way on line 900.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from lab_utils.errors import LabError


@dataclass(frozen=True)
class DatasetRow:
    prompt: str
    output_tokens: int | None = None  # None: the workload's output_len
    reply: str | None = None  # ShareGPT: the reply, whose length in tokens is the output's
    line: int = 0  # where it was in the file (JSONL: its line; ShareGPT: its entry, from 1)


def _refuse(path: Path, where: str, what: str) -> LabError:
    return LabError(f"{path}, {where}: {what}. Fix the file (formats: docs/MEASURING.md, "
                    "\"Your own traffic\") and run again; nothing was sent.")


def _jsonl(path: Path, text: str) -> list[DatasetRow]:
    rows = []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _refuse(path, f"line {i}", f"not JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise _refuse(path, f"line {i}", "not a JSON object")
        prompt, out = item.get("prompt"), item.get("output_tokens")
        if not isinstance(prompt, str) or not prompt.strip():
            raise _refuse(path, f"line {i}", "field 'prompt' is missing or not a non-empty string")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise _refuse(path, f"line {i}", f"field 'output_tokens' is {out!r}, not a whole "
                          "number of at least 1")
        rows.append(DatasetRow(prompt, out, line=i))
    return rows


def _sharegpt(path: Path, data: object) -> tuple[list[DatasetRow], int]:
    if not isinstance(data, list):
        raise _refuse(path, "top level", "a ShareGPT file is a JSON list of conversations")
    rows, short = [], 0
    for i, item in enumerate(data, 1):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise _refuse(path, f"entry {i}", "field 'conversations' is missing or not a list")
        if len(turns) < 2:
            short += 1
            continue
        texts = [t.get("value") if isinstance(t, dict) else None for t in turns[:2]]
        bad = next((n for n, v in enumerate(texts, 1) if not isinstance(v, str) or not v.strip()),
                   None)
        if bad:
            raise _refuse(path, f"entry {i}", f"turn {bad}'s field 'value' is missing or not a "
                          "non-empty string")
        rows.append(DatasetRow(str(texts[0]), reply=str(texts[1]), line=i))
    return rows, short


@lru_cache(maxsize=4)
def _read(path: Path, mtime_ns: int) -> tuple[tuple[DatasetRow, ...], int]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LabError(f"cannot read the dataset {path}: {e}") from None
    if path.suffix == ".jsonl":
        rows, short = _jsonl(path, text), 0
    else:
        try:
            rows, short = _sharegpt(path, json.loads(text))
        except json.JSONDecodeError as e:
            raise _refuse(path, f"line {e.lineno}", f"not JSON ({e.msg}); a file of one "
                          "object per line is read as JSONL when its name ends in .jsonl") from None
    if not rows:
        raise _refuse(path, "whole file", "no prompts in it")
    return tuple(rows), short


def read_dataset(path: str | Path) -> tuple[tuple[DatasetRow, ...], int]:
    """The file's rows, checked, and how many ShareGPT conversations were left out for
    having fewer than two turns (0 for JSONL). Read once per version of the file."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise LabError(f"no dataset file at {p} (workload.dataset or --dataset)")
    return _read(p, p.stat().st_mtime_ns)
