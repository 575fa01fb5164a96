"""The lab's configuration: one typed, validated object loaded from a JSON profile.

A profile describes the nodes (how to reach them, their LAN and data-plane addresses),
the model, the vLLM settings per role, the topologies of the serving notebooks, the
proxy and the benchmark workload. The same file is found the same way by the CLI, the
notebooks and headless kernels: `--config F`, else `$LAB_CONFIG`, else
`environment_config.json` at the repo root, else the shipped rehearsal profile
`configs/local-cpu.json`. Errors name the field, the bad value and the fix. Keys starting
with `_` are comments and are ignored, so example files can explain every field.

- parts: the profile's parts (nodes, model, vLLM per role, topologies, proxy, workload)
- topology: what a topology's instances are and where they run (InstanceSpec)
- schema: the typed profile, LabConfig, and the paths derived from it (the checkout's)
- checks: the checks that span fields (node references, addresses, ports per machine)
- loading: finding, reading and validating the file; errors that name the fix
- values: what each value must be (addresses, paths, names), and redaction of secrets
- credentials: the HF token and the API keys, read from owner-only files or the environment
"""

from lab_utils.config.checks import loopback_problems
from lab_utils.config.credentials import (
    api_key,
    hf_token,
    jupyter_token,
    read_secret_file,
    secret_file_problem,
)
from lab_utils.config.loading import (
    DEFAULT_PROFILE,
    EXAMPLE_NAME,
    USER_CONFIG,
    find_config_path,
    load_config,
    parse_config,
    secrets_in,
    with_model,
    with_proxy,
)
from lab_utils.config.parts import InstanceSettings, NodeConfig, WorkloadConfig
from lab_utils.config.schema import (
    PACKAGE_DIR,
    REPO_ROOT,
    LabConfig,
    checkout_path,
    in_checkout,
    known_secrets,
)
from lab_utils.config.topology import TOPOLOGIES, InstanceSpec
from lab_utils.config.values import VLLM_DTYPES, is_system_dir, scrub

__all__ = [
    "DEFAULT_PROFILE", "EXAMPLE_NAME", "PACKAGE_DIR", "REPO_ROOT", "TOPOLOGIES", "USER_CONFIG",
    "VLLM_DTYPES", "InstanceSettings", "InstanceSpec", "LabConfig", "NodeConfig",
    "WorkloadConfig", "api_key", "checkout_path", "find_config_path", "hf_token", "jupyter_token",
    "in_checkout", "is_system_dir", "known_secrets", "load_config", "loopback_problems",
    "parse_config", "read_secret_file", "scrub", "secret_file_problem", "secrets_in", "with_model",
    "with_proxy",
]
