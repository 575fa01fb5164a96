"""No secret in any message: canary secrets (an API key in the key files, a value of a
secret-named `extra_env` entry, the Hugging Face token in $HF_TOKEN and in hf_token_file)
sent through every way the config can be refused, and through every CLI command.

The config's error paths are enumerated from the schema, not listed by hand: every field
of every model `LabConfig` is made of gets each canary in turn (as the value, as a list
item, as a mapping's value and as its key), on each shipped profile, so a field added
later is covered without anyone remembering to add it here (`test_every_field_was_tried`
fails otherwise). The commands are taken from the CLI's own parser, likewise.
"""

from __future__ import annotations

import copy
import json
import subprocess
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from lab_utils import cli
from lab_utils.config import REPO_ROOT, LabConfig, parse_config
from lab_utils.errors import ConfigError

from support.profiles import CANARY_API_KEY, CANARY_HF_TOKEN, write_secret

# a value with no key-like shape: only knowing it (extra_env) can mask it
CANARY_ENV = "xenvCanaryOpaque5b8d0c2a7f41"
CANARIES = (CANARY_API_KEY, CANARY_HF_TOKEN, CANARY_ENV)
BASES = ("configs/local-cpu.json", "configs/simcluster.json", "environment_config.json.example")


def _models_in(tp: Any) -> list[tuple[str, type[BaseModel]]]:
    """("model", M) for a field of model type M, ("map", M) for dict[str, M], inside
    Optional/Union/Annotated."""
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [("model", tp)]
    if origin is dict:
        return [("map", m) for kind, m in _models_in(typing.get_args(tp)[1]) if kind == "model"]
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [x for a in typing.get_args(tp) for x in _models_in(a)]
    return []


def all_fields(model: type[BaseModel] = LabConfig, seen=None) -> set[tuple[str, str]]:
    seen = set() if seen is None else seen
    for name, field in model.model_fields.items():
        seen.add((model.__name__, name))
        for _, sub in _models_in(field.annotation):
            if not any(m == sub.__name__ for m, _ in seen):
                all_fields(sub, seen)
    return seen


def field_paths(data: dict, model: type[BaseModel] = LabConfig, path: tuple = ()):
    """(path, (model name, field name)) of every field, nested models' fields included;
    a mapping of models (`nodes`) through each of its keys in `data`."""
    for name, field in model.model_fields.items():
        here = path + (name,)
        yield here, (model.__name__, name)
        sub_data = data.get(name) if isinstance(data, dict) else None
        for kind, sub in _models_in(field.annotation):
            if kind == "model":
                yield from field_paths(sub_data if isinstance(sub_data, dict) else {}, sub, here)
            else:
                keys = list(sub_data) if isinstance(sub_data, dict) and sub_data else ["n1"]
                for key in keys:
                    yield from field_paths(sub_data.get(key, {}) if sub_data else {}, sub, here + (key,))


def _set(data: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(data.get(key), dict):
            data[key] = {}
        data = data[key]
    data[path[-1]] = value


@pytest.fixture(scope="module")
def keyed_bases(tmp_path_factory) -> list[tuple[str, dict]]:
    """Each shipped profile with the canaries where secrets go: both API key files, the
    HF token file, a secret-named extra_env entry."""
    root = tmp_path_factory.mktemp("canaries")
    key = write_secret(root / "api_key", CANARY_API_KEY)
    token = write_secret(root / "hf_token", CANARY_HF_TOKEN)
    out = []
    for base in BASES:
        data = json.loads((REPO_ROOT / base).read_text())
        data["results_root"] = str(root / "results")
        data["proxy"]["api_key_file"] = data["vllm"]["api_key_file"] = str(key)
        data["hf_token_file"] = str(token)
        data["vllm"].setdefault("extra_env", {})["LAB_TEST_TOKEN"] = CANARY_ENV
        out.append((base, data))
    return out


def _variants(canary: str) -> list[Any]:
    return [canary, [canary], {"LAB_X": canary}, {canary: "1"}]


tried: set[tuple[str, str]] = set()


def test_no_config_error_shows_a_secret(keyed_bases, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", CANARY_HF_TOKEN)
    leaks, refused = [], 0
    for base, data in keyed_bases:
        for path, field in field_paths(data):
            tried.add(field)
            for canary in CANARIES:
                if canary == CANARY_ENV and path == ("vllm",):
                    continue  # it replaces the extra_env that made the value a secret
                for value in _variants(canary):
                    case = copy.deepcopy(data)
                    _set(case, path, value)
                    try:
                        parse_config(case, "cfg.json")
                    except ConfigError as e:
                        refused += 1
                        if canary in str(e):
                            leaks.append(f"{base}: {'.'.join(map(str, path))} = {json.dumps(value)}: "
                                         f"{str(e)[-300:]}")
    assert refused > 1000  # the refusals that could have shown a canary
    assert leaks == [], f"{len(leaks)} messages show a secret:\n" + "\n".join(leaks[:20])


def test_every_field_was_tried(keyed_bases):
    if not tried:
        test_no_config_error_shows_a_secret(keyed_bases, pytest.MonkeyPatch())
    missing = all_fields() - tried
    assert missing == set(), f"fields no shipped profile reaches: {sorted(missing)}"
    assert len(tried) > 100


# ----- every CLI command --------------------------------------------------------------

# What each command needs besides --config; a command missing here fails the test below.
ARGS = {
    "serve": [["--topology", "disaggregated", "--dry-run", "--offline"],
              ["--topology", "disaggregated"]],
    "proxy": [["--mode", "disaggregated"]],
    "report": [[]], "check": [[]], "status": [[]], "cleanup": [[]], "deploy": [[]],
    "model": [["fetch"]], "demo": [[]], "run": [[]], "eta": [[]], "jupyter": [[]],
    "lab": [[]], "card": [[]], "triage": [[]], "audit": [["{tmp}"]], "timetable": [["{tmp}"]],
    "bench": [["--url", "http://127.0.0.1:9", "--out", "{tmp}/bench.json"]],
    "reference": [["{tmp}/no-such-run"]],
    "tiny-model": [["{tmp}/tiny"]],
}


def commands() -> list[str]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return sorted(sub.choices)


def test_every_command_has_its_arguments_here():
    assert sorted(ARGS) == commands()


@pytest.mark.parametrize("base", BASES[:1])
def test_no_command_shows_a_secret(base, keyed_bases, tmp_path):
    """Each command on a valid keyed profile, and with the canaries also pasted where the
    key files' paths go and into the description, run in a process that starts and
    connects to nothing (tests/support/cli_guarded.py): none of their output, log records
    or files written shows one."""
    import os
    import sys

    data = copy.deepcopy(dict(keyed_bases)[base])
    data["results_root"] = str(tmp_path / "results")
    pasted = copy.deepcopy(data)
    pasted["proxy"]["api_key_file"] = CANARY_API_KEY
    pasted["vllm"]["api_key_file"] = CANARY_ENV
    pasted["description"] = f"token {CANARY_HF_TOKEN}"
    argvs = []
    for name, profile in (("keyed", data), ("pasted", pasted)):
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps(profile))
        for command, variants in ARGS.items():
            for extra in variants:
                argvs.append([command, *(a.format(tmp=tmp_path) for a in extra),
                              *([] if command == "tiny-model" else ["--config", str(config)])])
    env = {**os.environ, "HF_TOKEN": CANARY_HF_TOKEN, "OPENAI_API_KEY": CANARY_API_KEY,
           "HOME": str(tmp_path / "home")}  # where `card` and `jupyter` keep a pair's token
    p = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "support" / "cli_guarded.py"),
                        json.dumps(argvs)], capture_output=True, text=True, timeout=900, env=env,
                       cwd=tmp_path)
    said = p.stdout + p.stderr
    assert said.count("DONE [") == len(argvs), said[-3000:]
    leaks = [c for c in CANARIES if c in said]
    assert leaks == [], [said[max(0, said.index(c) - 300):said.index(c) + 50] for c in leaks]
    hits = [str(q) for q in Path(tmp_path / "results").rglob("*") if q.is_file()
            and any(c.encode() in q.read_bytes() for c in CANARIES)]
    assert hits == []
