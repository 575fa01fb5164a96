"""Secrets the config names: the Hugging Face token and the API keys, read from files
only their owner can read (or from the environment), one rule for every command."""

from __future__ import annotations

import os
import secrets
import shlex
from typing import Literal

from lab_utils.config.schema import LabConfig
from lab_utils.errors import LabError
from lab_utils.util.atomic import atomic_write_text, read_bounded

MIN_API_KEY_CHARS = 16  # a shorter API key is refused (one character was accepted)


def hf_token(cfg: LabConfig) -> str | None:
    """The Hugging Face token, for a hub model only (read when needed, not before):
    `hf_token_file` when the config names one, else `$HF_TOKEN`. The same rule for the
    download (`model fetch`), the instances and the checklist."""
    if cfg.model.source != "hub":
        return None
    if cfg.hf_token_file:
        return read_secret_file(cfg, cfg.hf_token_file, "HF token") or None
    return os.environ.get("HF_TOKEN") or None


def secret_file_problem(cfg: LabConfig, path: str, what: str) -> tuple[str, str] | None:
    """(problem, fix) when the secret file at `path` cannot be used, else None: it must
    exist, be readable by its owner only and not be empty. One rule for `serve`, `model
    fetch`, `bench` and the checklist."""
    p = cfg.resolve_path(path)
    quoted = shlex.quote(str(p))
    try:
        mode = p.stat().st_mode
        if mode & 0o077:
            return (f"{what} file {p} is readable by others (mode {mode & 0o777:o})",
                    f"chmod 600 {quoted}")
        if not _read(p):
            return f"{what} file {p} is empty", f"write the {what} into {quoted}"
    except FileNotFoundError:
        # the path is not shown: a missing "file" is often the secret itself, pasted where
        # its file's path goes
        return (f"the {what} file named in the config does not exist (its name is not shown: "
                "it may be the secret itself, pasted where a path goes)",
                f"write the {what} to a file, `chmod 600` it and name that file in the config")
    except OSError as e:
        return (f"{what} file {p} cannot be read: {e.strerror or e}",
                f"name a small regular file in the config ({quoted})")
    return None


MAX_SECRET_BYTES = 64 * 1024  # a key or token file larger than this is not one


def _read(p) -> str:
    return read_bounded(p, MAX_SECRET_BYTES).decode(errors="replace").strip()


def read_secret_file(cfg: LabConfig, path: str | None, what: str) -> str | None:
    """The secret in `path` (None when no file is named); LabError naming the fix when the
    file cannot be used (see `secret_file_problem`)."""
    if not path:
        return None
    problem = secret_file_problem(cfg, path, what)
    if problem:
        raise LabError(f"{problem[0]}: {problem[1]}")
    return _read(cfg.resolve_path(path))


def jupyter_token(cfg: LabConfig) -> str:
    """This pair's JupyterLab token, from `jupyter.token_file` (by default
    ~/.config/spark-disagg-lab/<profile>.jupyter-token); made (random, mode 600) when the
    file does not exist yet, so every later start and the pair's card agree."""
    path = cfg.jupyter_token_path()
    if not path.exists():
        atomic_write_text(path, secrets.token_urlsafe(24) + "\n", private=True)
    return read_secret_file(cfg, str(path), "JupyterLab token (jupyter.token_file)") or ""


def api_key(cfg: LabConfig, service: Literal["proxy", "vllm"]) -> str | None:
    """The API key of the proxy or of the vLLM instances (None: none is set). The
    instances have `vllm.api_key_file`, else the proxy's `proxy.api_key_file`."""
    if service == "proxy":
        field, path = "proxy.api_key_file", cfg.proxy.api_key_file
    else:
        field = "vllm.api_key_file" if cfg.vllm.api_key_file else "proxy.api_key_file"
        path = cfg.vllm.api_key_file or cfg.proxy.api_key_file
    key = read_secret_file(cfg, path, f"API key ({field})")
    if key is not None and len(key) < MIN_API_KEY_CHARS:
        raise LabError(f"the API key in {field} has {len(key)} characters, fewer than "
                       f"{MIN_API_KEY_CHARS}: write a longer random key, e.g. "
                       "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return key
