"""What each config value must be, checked by what it is: the rules behind the config's
field validators, and the redaction of secrets in config snapshots.

Most values end up in a command line, an environment or a path on a node; quoting stays
in place behind these checks (a second wall, not a replacement).
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from collections.abc import Iterable
from typing import Any

from lab_utils.on_node.dirs import SYSTEM_TREES


def check_ip(value: str) -> str:
    """A unicast IP address one host can bind and others can dial: not a host name, not a
    wildcard (binding it listens on every interface, and a peer told to dial it dials
    itself), not multicast, broadcast or reserved."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("not an IP address") from None
    if ip.is_unspecified:
        raise ValueError("a wildcard address listens on every interface and cannot be "
                         "dialled by the other nodes; use the node's own address on that network")
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError("a multicast or broadcast address names a group, not a node; use the "
                         "node's own address")
    if ip.version == 6:
        raise ValueError("IPv6 addresses are not supported: the lab writes host:port without "
                         "brackets in URLs, NIXL and UCX settings; use the node's IPv4 address")
    if ip.version == 4 and ip.is_reserved:
        raise ValueError("a reserved address (240.0.0.0/4) is not routable; use the node's own address")
    return str(ip)


# Files only this host reads (token and key files, results_root) may hold any character
# but a control character (refused everywhere).
_PATH_CHARS = r"[A-Za-z0-9._/+@~=,-]"
_SAFE_PATH = re.compile(rf"^{_PATH_CHARS}+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# vLLM 0.32's --dtype choices (vllm.config.model.ModelDType; a test keeps them equal)
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def check_path(value: str | None, *, absolute: bool = False) -> str | None:
    """A file-system path written as on a POSIX node: letters, digits and . _ / + @ ~ = , -
    (no spaces, quotes, `;`, `$`, backslashes or control characters)."""
    if value is None:
        return value
    if "\\" in value or re.match(r"^[A-Za-z]:", value):
        raise ValueError("a Windows path; write the path as the node sees it "
                         "(e.g. /home/lab/spark-disagg-lab)")
    if not _SAFE_PATH.match(value):
        bad = sorted({c for c in value if not re.match(_PATH_CHARS, c)})
        raise ValueError(f"contains {' '.join(repr(c) for c in bad)}: a path here may hold only "
                         "letters, digits and . _ / + @ ~ = , -; rename the directory or pick "
                         "another")
    if absolute and not value.startswith("/"):
        raise ValueError("must be an absolute path (starting with /)")
    return value


def is_system_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is the root or inside one of the system's own trees (the list the
    nodes apply to a workdir)."""
    p = posixpath.normpath(str(path))
    p = "/" + p.lstrip("/") if p.startswith("//") else p  # POSIX keeps a leading //: it is /
    return p == "/" or any(p == d or p.startswith(d + "/") for d in SYSTEM_TREES)


def check_node_path(value: str | None, *, absolute: bool = False) -> str | None:
    """A path used on a node (where this machine cannot resolve it): as `check_path`, and
    with no `..` or `~` in it, so what is judged here is what the node will use."""
    value = check_path(value, absolute=absolute)
    if value is None:
        return value
    if ".." in value.split("/"):
        raise ValueError("contains '..': write the directory it means, without '..'")
    if "~" in value:
        raise ValueError("contains '~', which is expanded differently on each node: write the "
                         "absolute path (e.g. /home/lab/spark-disagg-lab)")
    return value


def check_local_dir(value: str, base: str) -> str:
    """A directory on this machine (`results_root`), judged where it really is: `~`
    expanded, relative to `base`, `..`, `//` and symlinks resolved; not the root, a system
    tree or a home directory itself."""
    real = os.path.realpath(os.path.join(base, os.path.expanduser(value)))
    if is_system_dir(real):
        raise ValueError(f"is {real}, the root or a system directory; results go in a directory "
                         'of the lab\'s (e.g. "results", inside the checkout)')
    homes = {os.path.realpath(os.path.expanduser("~")), "/home", "/root"}
    if real in homes or os.path.dirname(real) == "/home":
        raise ValueError(f"is {real}, a home directory itself; results go in a directory of the "
                         'lab\'s (e.g. "results", inside the checkout)')
    return value


# What the lab sets in an instance's environment (`serve.launcher.server_env`): an
# extra_env entry would change where NIXL's side channel listens or which devices UCX and
# NCCL use, while the plan shows the lab's values.
LAB_OWNED_ENV = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_TLS",
                 "UCX_NET_DEVICES", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                 "VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
                 "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE",
                 "HF_HUB_OFFLINE", "VLLM_API_KEY", "CUDA_HOME", "PATH", "PYTHONPATH",
                 "LAB_NIXL_PROGRESS_DELAY_US")


def check_env(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if name in LAB_OWNED_ENV:
            raise ValueError(f"{name} is set by the lab from the config (the plan shows its "
                             "value): change the config's own field instead")
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name: use letters, "
                             "digits and _ (not starting with a digit), no '=' or spaces")
    return env


# Flags that would put a secret on a command line (visible in `ps`, kept in state.json
# and in results): refused in extra_args, with where the secret goes instead.
_SECRET_FLAG = re.compile(r"^-+(?!allow-credentials$)(?=[A-Za-z0-9])[A-Za-z0-9_-]*?"
                          r"(api[-_]?key|token|secret|pass[-_]?w|credential)", re.I)


# The flags the lab sets on every instance's command line (`serve.launcher`): an
# extra_args entry that sets one again would override it (argparse keeps the last), e.g.
# --host=0.0.0.0 after the lab's --host. Spelled as vLLM's parser reads them: `_` and `-`
# alike, `--flag=value`, any unambiguous prefix, and `--no-flag` for a boolean.
LAB_OWNED_FLAGS = ("model", "served-model-name", "host", "port", "max-model-len", "dtype",
                   "seed", "revision", "block-size", "gpu-memory-utilization",
                   "enforce-eager", "kv-transfer-config", "middleware", "api-key", "uds",
                   "hf-token", "nnodes", "node-rank", "master-addr", "master-port", "headless",
                   "tensor-parallel-size", "distributed-executor-backend")


# vLLM options that take other options from a file (argparse keeps the last of each)
WHOLE_FILE_FLAGS = ("config",)


def _flag_name(arg: str) -> str | None:
    """The option an argument names as vLLM's parser reads it (lower case, `-` for `_`,
    without its `=value` or the `.field` of vLLM's dotted form for one field of a JSON
    option, `--kv-transfer-config.kv_role=...`); None for a value."""
    if not arg.startswith("-") or arg == "-" or arg.lstrip("-")[:1].isdigit():
        return None
    return arg.split("=", 1)[0].split(".", 1)[0].lstrip("-").replace("_", "-").lower()


def owned_flag(arg: str) -> str | None:
    """The lab-owned flag (`LAB_OWNED_FLAGS`) that `arg` would set, or None."""
    name = _flag_name(arg) or ""
    return next((flag for candidate in (name, name.removeprefix("no-")) if len(candidate) >= 2
                 for flag in LAB_OWNED_FLAGS if flag.startswith(candidate)), None)


def check_args(args: list[str]) -> list[str]:
    """Refuse an argument that puts a secret on the command line or sets a flag the lab
    sets; the message names the flag, never the argument's value."""
    for a in args:
        name = _flag_name(a)
        if name and _SECRET_FLAG.match("--" + name):
            raise ValueError(
                f"--{name} would put a secret on the command line (visible in `ps`, saved in "
                "state.json and results); name a file instead: proxy.api_key_file / "
                "vllm.api_key_file for API keys, hf_token_file (or $HF_TOKEN) for the "
                "Hugging Face token")
        if name and any(f.startswith(name) for f in WHOLE_FILE_FLAGS) and len(name) >= 4:
            raise ValueError(
                f"--{name} reads vLLM options from a file, where any flag the lab sets (and "
                "an API key) could be set again unseen: put each option in extra_args")
        if name and "kv-events-config".startswith(name) and len(name) >= 4:
            raise ValueError(
                f"--{name} publishes KV-cache events (prompt token ids) on an endpoint the "
                "plan does not show; the lab's serving does not use them: remove it")
        owned = owned_flag(a)
        if owned:
            raise ValueError(
                f"--{name} sets --{owned}, which the lab sets from the config (a second one "
                "would override it): change the config's own field instead")
    return args


def control_characters(value: Any, where: str = "") -> list[str]:
    """Strings holding a newline or another control character (such a value would split a
    command, an environment line or a log line on a node) or a lone surrogate (it cannot
    be written as UTF-8 at all), by field."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in control_characters(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in control_characters(v, f"{where}[{i}]")]
    if isinstance(value, str) and any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        return [f"{where}: the value (not shown: it may hold a secret) contains a control "
                "character (a newline?); write the value on one line"]
    if isinstance(value, str) and any(0xD800 <= ord(c) < 0xE000 for c in value):
        # half of a \ud83d\ude00-style pair: no file, command or log line can hold it
        return [f"{where}: the value (not shown: it may hold a secret) contains a lone "
                "surrogate (a \\udXXX escape without its pair); write the character itself"]
    return []


# Environment names that hold secrets, by pattern (TOKEN, SECRET, PASSWORD, API_KEY,
# ACCESS_KEY, AUTH, CREDENTIALS, PRIVATE ...): their values never go into results.
_SECRET_ENV = re.compile(r"(TOKEN|SECRET|PASS_?W|PASSPHRASE|API_?KEY|ACCESS_?KEY|AUTH|CREDENTIAL|PRIVATE"
                         r"|SESSION|COOKIE|SIGNATURE)", re.I)
REDACTED = "<redacted>"


# Key formats known wherever they are pasted (OpenAI-style sk-..., Hugging Face hf_...,
# GitHub, Slack, AWS access key ids): masked in every message and results file, whether
# or not the lab knows the key.
# (Shaped as the keys are, so that field names such as hf_token_file stay readable.)
SECRET_PATTERN = re.compile(r"\bsk-[A-Za-z0-9_-]{16,}|\bhf_[A-Za-z0-9]{20,}|\bghp_[A-Za-z0-9]{20,}"
                            r"|\bgithub_pat_[A-Za-z0-9_]{20,}|\bxox[abp]-[A-Za-z0-9-]{10,}"
                            r"|\bAKIA[A-Z0-9]{16}\b"
                            # the password of a URL's user (scheme://user:password@host)
                            r"|(?<=://)[^/\s:@]*:[^/\s@]+(?=@)")
MIN_SECRET_CHARS = 8  # shorter known values are not replaced (they would hit ordinary text)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret value (`secrets`) and every key-shaped word
    (`SECRET_PATTERN`) replaced by REDACTED."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return SECRET_PATTERN.sub(REDACTED, text)


def secret_env_values(env: Any) -> list[str]:
    """The values of an `extra_env` mapping whose names say they hold secrets."""
    if not isinstance(env, dict):
        return []
    return [v for k, v in env.items() if isinstance(v, str) and _SECRET_ENV.search(str(k))]


def redact(value: Any, secrets: tuple[str, ...] = ()) -> Any:
    """`value` with secret-named `extra_env` values and every occurrence of a known secret
    value (or of a key-shaped word) replaced."""
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str):
        return scrub(value, secrets)
    if not isinstance(value, dict):
        return value
    out = {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(out.get("extra_env"), dict):
        out["extra_env"] = {k: REDACTED if _SECRET_ENV.search(k) else v
                            for k, v in out["extra_env"].items()}
    return out


# Environment variables of this process that may hold the lab's secrets.
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "VLLM_API_KEY",
                   "LAB_PROXY_API_KEY")


def _matching(pattern: str, what: str):
    """A field check: None passes, else the value must match `pattern` ("must be `what`")."""
    regex = re.compile(pattern)

    def check(value: str | None) -> str | None:
        if value is not None and not regex.match(value):
            raise ValueError(f"must be {what}")
        return value
    return check


check_host = _matching(r"^[A-Za-z0-9_][A-Za-z0-9._:-]*$",
                       "a host name, an alias from ~/.ssh/config or an IP address")
check_user = _matching(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$", "a login name (letters, digits, . _ -)")
check_revision = _matching(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
                           "a branch, tag or commit hash (letters, digits, . _ / -)")
check_ucx_tls = _matching(r"^\^?[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$",
                          "UCX transport names, comma-separated, optionally starting with ^ to "
                          "exclude (e.g. rc,cuda_copy or tcp,self)")
def tls_enables_cuda(tls: str) -> bool:
    """Whether a UCX_TLS value keeps CUDA memory support, by nixl 1.5.1's rule for its UCX
    backend (src/plugins/ucx/config.cpp, `tlsEnablesCudaSupport`): "all" (every transport),
    a list naming cuda or cuda_copy, or a "^" deny list naming neither. On a node with a GPU, nixl refuses any
    other value when the UCX context it leaves cannot handle CUDA memory ("Invalid
    UCX_TLS=... does not enable CUDA memory support"), and NIXL_ERR_BACKEND follows."""
    deny = tls.strip().startswith("^")
    names = {t.strip() for t in tls.strip().lstrip("^").split(",")}
    if "all" in names:
        return not deny
    return bool(names & {"cuda", "cuda_copy"}) != deny


check_netdevs = _matching(r"^[A-Za-z0-9_.-]+(:[0-9]+)?(,[A-Za-z0-9_.-]+(:[0-9]+)?)*$",
                          "RDMA or network devices, comma-separated, each optionally with :port "
                          "(e.g. rocep1s0f1:1,roceP2p1s0f1:1)")
# VLLM_CPU_OMP_THREADS_BIND: "auto", "nobind", or CPU ids and ranges, "|" between ranks
_check_bind = _matching(r"^(auto|nobind|[0-9]+(-[0-9]+)?([,|][0-9]+(-[0-9]+)?)*)$",
                        'CPU ids and ranges such as "0", "0-3" or "0-3|4-7", or "auto" / "nobind"')


def check_threads_bind(value: str | dict[str, str] | None) -> str | dict[str, str] | None:
    for bind in (value.values() if isinstance(value, dict) else [value]):
        _check_bind(bind)
    return value


def check_absolute_path(value: str | None) -> str | None:
    return check_node_path(value, absolute=True)


def check_workdir(value: str | None) -> str | None:
    value = check_node_path(value)
    if value is not None and value.startswith("/") and is_system_dir(value):
        raise ValueError("is the root or a system directory; the lab writes its code and logs "
                         "there: use a directory of its own (e.g. /home/lab/spark-disagg-lab)")
    return value
