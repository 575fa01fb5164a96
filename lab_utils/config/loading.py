"""Finding, reading and validating the profile: `--config F`, else `$LAB_CONFIG`, else
`environment_config.json` at the repo root, else the shipped `configs/local-cpu.json`;
JSON comments (keys starting with `_`) dropped; every problem reported at once, each
naming the field, the value and the fix."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from lab_utils.config import values
from lab_utils.config.checks import cross_check
from lab_utils.config.schema import REPO_ROOT, LabConfig, checkout_path
from lab_utils.errors import ConfigError
from lab_utils.util.atomic import read_bounded

DEFAULT_PROFILE = REPO_ROOT / "configs" / "local-cpu.json"
USER_CONFIG = REPO_ROOT / "environment_config.json"
EXAMPLE_NAME = "environment_config.json.example"


def _strip_comments(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_comments(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [_strip_comments(v) for v in value]
    return value


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at `loc` (for key suggestions)."""
    current: Any = LabConfig
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    return tp


def _fmt_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


_FIXES = {
    "lan_address": "use the node's LAN IP address (e.g. 192.168.1.11); SSH host names go in ssh.host",
    "data_address": "use the node's data-plane (ConnectX) IP address, e.g. 192.168.100.10",
    "profile": "use letters, digits, '.', '_' or '-' (it names the results directory)",
}


# Fields whose value may be (or hold) a secret, e.g. a key pasted where its file's path
# goes: their errors name the field, never the value.
_SECRET_BEARING = ("extra_args", "extra_env", "api_key_file", "hf_token_file", "key_file")


def _describe(err: ErrorDetails) -> str:
    loc = tuple(err["loc"])
    where = _fmt_loc(loc)
    etype = err["type"]
    if etype == "extra_forbidden":
        parent = _model_at(loc[:-1])
        key = str(loc[-1])
        known = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(known)}"
        return f"{where}: unknown key {key!r}; {hint}"
    if etype == "missing":
        return f"{where}: required field is missing; add it (see {EXAMPLE_NAME} for an example)"
    value = err.get("input")
    if any(str(part) in _SECRET_BEARING for part in loc):
        shown = "the value (not shown: it may hold a secret)"
    else:
        shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else repr(value)
    msg = err["msg"].removeprefix("Value error, ")
    fix = _FIXES.get(str(loc[-1]) if loc else "", "")
    return f"{where}: {shown} is invalid: {msg}" + (f"; {fix}" if fix else "")



# A profile is a few kilobytes; these bound what a hostile one can make the parser do.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_DEPTH = 32
MAX_INT_DIGITS = 20


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice in one object: JSON keeps only the "
                             "last, which would silently replace the first; remove one")
        seen[key] = value
    return seen


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the config accepts")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:30]} is too large (it reads as infinity)")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits is not a value the "
                         "config accepts")
    return int(text)


def _depth(value: Any, level: int = 1) -> int:
    inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return max([level] + [_depth(v, level + 1) for v in inner])


def parse_config_text(raw: bytes, source: str) -> Any:
    """The JSON in `raw`, read one way for every command: UTF-8 only, at most
    MAX_CONFIG_BYTES and MAX_DEPTH levels, no duplicate keys, no NaN or Infinity, no
    number too large to be one; else a one-line ConfigError naming the place."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: {len(raw)} bytes, more than a profile needs "
                          f"({MAX_CONFIG_BYTES}); is this the right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"{source}: not UTF-8 at line {line} (byte {e.start}): save the "
                          "file as UTF-8") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_float=_finite, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{source}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply (a profile has at most {MAX_DEPTH} "
                          "levels)") from None
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{source}: nested too deeply (a profile has at most {MAX_DEPTH} levels)")
    return data


def find_config_path(explicit: str | os.PathLike | None = None) -> Path:
    """`--config F`, else `$LAB_CONFIG`, else environment_config.json, else local-cpu."""
    if explicit is not None and not str(explicit).strip():
        raise ConfigError("--config is empty: name a config file (or leave --config out "
                          "for the default)")
    chosen = explicit or os.environ.get("LAB_CONFIG")
    if chosen:
        return Path(chosen).expanduser().resolve()
    if USER_CONFIG.exists():
        return USER_CONFIG
    return checkout_path("configs", DEFAULT_PROFILE.name)


def secrets_in(data: Any) -> list[str]:
    """The secret values a not yet validated config can reach: the secret environment
    variables, the files it names for keys and the token (when readable), the values of
    its secret-named `extra_env` entries. An error about any field masks them all
    (a key is sometimes pasted into the wrong field)."""
    found = [os.environ.get(v, "") for v in values.SECRET_ENV_VARS]
    if not isinstance(data, dict):
        return found
    for section in (data, data.get("proxy"), data.get("vllm")):
        for name in ("hf_token_file", "api_key_file"):
            path = section.get(name) if isinstance(section, dict) else None
            if isinstance(path, str) and path:
                p = Path(path).expanduser()
                p = p if p.is_absolute() else REPO_ROOT / p
                with contextlib.suppress(OSError, ValueError):
                    found.append(read_bounded(p, 64 * 1024).decode(errors="replace").strip())
    vllm = data["vllm"] if isinstance(data.get("vllm"), dict) else {}
    for settings in [vllm, *(vllm.get(r) for r in ("baseline", "replica", "prefill", "decode"))]:
        if isinstance(settings, dict):
            found += values.secret_env_values(settings.get("extra_env"))
    return found


def parse_config(data: Any, source: str = "<config>") -> LabConfig:
    """Validate already-parsed JSON; raise ConfigError listing every problem (with any
    secret the config can reach masked: `secrets_in`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a JSON object")
    try:
        cfg = LabConfig.model_validate(_strip_comments(data))
    except ValidationError as e:
        problems = [_describe(err) for err in e.errors()]
    else:
        problems = cross_check(cfg)
    if problems:
        raise ConfigError(values.scrub(f"{source}: invalid config:\n  - " + "\n  - ".join(problems),
                                       secrets_in(data)))
    return cfg


def load_config(path: str | os.PathLike | None = None) -> LabConfig:
    """Find, read and validate the config (see `find_config_path`)."""
    p = find_config_path(path)
    if not p.exists():
        hint = (
            f"copy {EXAMPLE_NAME} to environment_config.json and fill it in"
            if p == USER_CONFIG
            else "check --config / LAB_CONFIG"
        )
        raise ConfigError(f"config file {p} does not exist; {hint}")
    try:
        raw = read_bounded(p, MAX_CONFIG_BYTES)
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror or e}") from None
    data = parse_config_text(raw, str(p))
    cfg = parse_config(data, str(p))
    cfg._source = p
    return cfg


def with_proxy(cfg: LabConfig, *, kind: str | None = None,
               policy: str | None = None) -> LabConfig:
    """This config with another `proxy.kind` and/or `topology.replicated.policy` (None:
    unchanged), checked as if the file said so (same source file, so paths and the profile
    resolve alike)."""
    data = cfg.model_dump(mode="json", exclude_unset=True)
    if kind is not None:
        data["proxy"]["kind"] = kind
    if policy is not None:
        data["topology"]["replicated"]["policy"] = policy
    changed = parse_config(data, str(cfg.source or "config"))
    changed._source = cfg.source
    return changed


def with_model(cfg: LabConfig, name: str) -> LabConfig:
    """This config serving the Hugging Face model `name` instead (for a plan: what another
    model would need), checked as if the file said so."""
    data = cfg.model_dump(mode="json", exclude_unset=True)
    data["model"] = {**{k: v for k, v in data["model"].items() if k == "dtype"},
                     "name": name, "source": "hub"}
    changed = parse_config(data, str(cfg.source or "config"))
    changed._source = cfg.source
    return changed
