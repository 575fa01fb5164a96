"""Software checks that hold on every profile: SSH, deployed code, Python and package
versions, the model on every serving node, clock skew, the HF token, known failures in logs.
"""

from __future__ import annotations

import json
import shlex
import time

from lab_utils.checks.frame import Context
from lab_utils.checks.rdma import missing_tools
from lab_utils.cluster import provision
from lab_utils.config import hf_token, secret_file_problem
from lab_utils.errors import LabError
from lab_utils.known_failures import match_failures
from lab_utils.results.checklist import CheckResult


def check_ssh(ctx: Context) -> list[CheckResult]:
    out = []
    for name, node_cfg in ctx.cfg.nodes.items():
        if node_cfg.connection == "local":
            out.append(CheckResult("ssh", name, "n/a", "local node: no SSH needed"))
            continue
        ssh = node_cfg.ssh
        assert ssh is not None  # the config requires it of SSH nodes
        where = f"{ssh.user + '@' if ssh.user else ''}{ssh.host}:{ssh.port}"
        try:
            r = ctx.run(name, ["true"], timeout=ssh.connect_timeout_s + 20)
        except LabError as e:
            ctx.unreachable[name] = "SSH failed (see the ssh check)"
            seen, fix = _ssh_fix(str(e), where, ssh_command(ssh))
            out.append(CheckResult("ssh", name, "fail", f"cannot reach {where}", evidence=seen,
                                   fix=fix))
            continue
        if not r.ok:
            ctx.unreachable[name] = "commands fail there (see the ssh check)"
            out.append(CheckResult("ssh", name, "fail", f"`true` failed on {where}",
                                   evidence=r.stderr.strip()[-300:],
                                   fix=f"log in with `{ssh_command(ssh)}` "
                                       "and fix the shell start-up error shown"))
            continue
        policy = "accept-new" if ssh.accept_new_host_key else "known_hosts only"
        out.append(CheckResult("ssh", name, "pass", f"connected to {where}",
                               evidence=f"host key verified ({policy})"))
    return out


def ssh_command(ssh) -> str:
    """The `ssh` command a user types to reach the node as the lab does: the configured
    port, user and key."""
    login = f"{ssh.user}@{ssh.host}" if ssh.user else ssh.host
    key = f" -i {shlex.quote(ssh.key_file)}" if ssh.key_file else ""
    return f"ssh -p {ssh.port}{key} {shlex.quote(login)}"


def _ssh_fix(error: str, where: str, command: str) -> tuple[str, str]:
    """(what was seen, the fix) for an SSH failure; a changed host key's error carries
    its own fix, which is then not repeated as evidence."""
    if "ssh-keygen -R" in error and "If the node" in error:
        at = error.index("If the node")
        return error[:at].strip(), error[at:]
    if "ssh-keygen -R" in error:
        return error, error
    if "host key" in error.lower():
        return error, (f"ssh to {where} once to check and record its host key in known_hosts, "
                       "or set ssh.accept_new_host_key: true in the config")
    return error, (f"check that {where} is up and the SSH user/key are right: "
                   f"`{command} true` must work without a "
                   "password")


def check_code(ctx: Context) -> list[CheckResult]:
    digest = provision.code_digest()
    out = []
    names, skipped = ctx.split("code", list(ctx.cfg.nodes))
    for name in names:
        node_cfg = ctx.cfg.nodes[name]
        if node_cfg.connection == "local":
            out.append(CheckResult("code", name, "n/a", "local node: runs this checkout"))
            continue
        r = ctx.run(name, ["cat", f"{node_cfg.workdir}/lab_utils/{provision.DEPLOYED_STAMP}"])
        have = r.stdout.strip() if r.ok else None
        if have == digest:
            out.append(CheckResult("code", name, "pass", f"lab_utils {digest[:12]} deployed"))
        else:
            seen = f"node has {have[:12]}" if have else "never deployed"
            out.append(CheckResult(
                "code", name, "warn", f"lab code on the node is not current ({seen})",
                evidence=f"here {digest[:12]}; {seen}",
                fix=f"python -m lab_utils deploy --config {ctx.cfg.source_name}"))
    return skipped + out


def _needs(ctx: Context, name: str) -> list[str]:
    roles = ctx.cfg.nodes[name].roles
    return (["vllm", "torch", "nixl"] if "serving" in roles else []) + (
        ["huggingface_hub"] if "serving" in roles and ctx.cfg.model.source == "hub" else [])


def check_python(ctx: Context) -> list[CheckResult]:
    out = []
    names, skipped = ctx.split("python", list(ctx.cfg.nodes))
    facts = {}
    for name in names:
        f = facts[name] = ctx.facts(name, "python")
        missing = [k for k in _needs(ctx, name) if not f.get(k)]
        seen = ", ".join(f"{k} {f[k]}" for k in ("python", "vllm", "torch", "nixl") if f.get(k))
        if f.get("torch"):
            seen += f" (torch CUDA {f['torch_cuda'] or 'none: CPU build'})"
        if missing:
            out.append(CheckResult(
                "python", name, "fail", f"{', '.join(missing)} missing in {f['executable']}",
                evidence=seen, fix=_install_fix(ctx, name, missing)))
        else:
            out.append(CheckResult("python", name, "pass", seen, evidence=f["executable"]))
    serving = [n for n in names if "serving" in ctx.cfg.nodes[n].roles]
    if len(serving) > 1:
        out.append(_same_versions(facts, serving))
    return skipped + out


def _install_fix(ctx: Context, name: str, missing: list[str]) -> str:
    py = ctx.node(name).python
    if ctx.cfg.vllm.device == "cpu":
        return (f"on {name}: `{py} -m pip install -r requirements-rehearsal.txt` "
                "(see docs/RUNNING.md)")
    return (f"on {name}: install the CUDA 13 builds into {py}'s environment as in "
            f"docs/CLUSTER.md, section 'Serving nodes (DGX Spark)'; missing: {', '.join(missing)}")


def _same_versions(facts: dict, serving: list[str]) -> CheckResult:
    differ = []
    for key in ("vllm", "torch", "torch_cuda", "nixl"):
        values = {n: facts[n].get(key) for n in serving}
        if len(set(values.values())) > 1:
            differ.append(f"{key}: " + ", ".join(f"{n} {v}" for n, v in values.items()))
    if differ:
        return CheckResult("versions_match", "cluster", "fail",
                           "serving nodes run different software", evidence="; ".join(differ),
                           fix="install the same vLLM, torch and nixl versions on every serving "
                               "node (NIXL's handshake refuses mismatched vLLM versions)")
    v = facts[serving[0]]
    return CheckResult("versions_match", "cluster", "pass",
                       f"same vllm {v.get('vllm')}, torch {v.get('torch')}, nixl {v.get('nixl')} "
                       f"on {', '.join(serving)}")


OS_PACKAGES = "sudo apt install build-essential python3-dev python3-venv ibverbs-utils"


def check_os_packages(ctx: Context) -> list[CheckResult]:
    """What a CUDA serving node needs from the OS besides the venv: a C compiler and the
    Python headers (Triton builds a small C launcher against Python.h on first use:
    triton/runtime/build.py) and, on a node with RDMA, `ibv_devinfo` (the mtu check).
    Something missing is a fail for the compiler and headers, a warning for the tool."""
    no_triton = None if ctx.cfg.vllm.device == "cuda" else "vllm.device is 'cpu': no Triton"
    names, out = ctx.split("os_packages", ctx.serving(), lambda n: no_triton)
    for name in names:
        rdma = bool(ctx.cfg.nodes[name].data_netdev)
        tools = ["gcc"] + (["ibv_devinfo"] if rdma else [])
        absent = missing_tools(ctx, name, *tools)
        header = ctx.facts(name, "python").get("python_h")
        seen = "; ".join([f"{t}: {'not found' if t in absent else 'found'}" for t in tools]
                         + [f"Python.h: {header or 'not found'}"])
        missing = absent + ([] if header else ["Python.h"])
        fix = f"on {name}: `{OS_PACKAGES}` (docs/CLUSTER.md, 'Serving nodes')"
        if set(missing) & {"gcc", "Python.h"}:
            out.append(CheckResult("os_packages", name, "fail",
                                   f"{', '.join(missing)} missing: Triton cannot build its "
                                   "launcher when vLLM starts", evidence=seen, fix=fix))
        elif missing:
            out.append(CheckResult("os_packages", name, "warn", "ibv_devinfo missing: the mtu "
                                   "check cannot read the RoCE MTU", evidence=seen, fix=fix))
        else:
            out.append(CheckResult("os_packages", name, "pass", seen))
    return out


def check_model(ctx: Context) -> list[CheckResult]:
    cfg = ctx.cfg
    names, skipped = ctx.split("model", ctx.serving())
    snaps = {n: _hub_snapshot(ctx, n) if cfg.model.source == "hub"
             else provision.model_snapshot(ctx.node(n), cfg.model_path_on(n), full=False)
             for n in names}
    out = []
    fetch = f"python -m lab_utils model fetch --config {cfg.source_name}"
    for name, snap in snaps.items():
        if snap is None:
            out.append(CheckResult("model", name, "fail", f"{cfg.model.name} not found on the node",
                                   evidence=f"looked in {cfg.model_path_on(name)}", fix=fetch))
    present = {n: s for n, s in snaps.items() if s}
    if len(set(present.values())) > 1:
        out.append(CheckResult(
            "model", "cluster", "fail", "serving nodes hold different snapshots of the model",
            evidence=", ".join(f"{n} {s[:12]}" for n, s in present.items()),
            fix=f"pin model.revision in the config, then {fetch}"))
    elif present and len(present) == len(snaps):
        snap = next(iter(present.values()))
        what = ("hub snapshot" if cfg.model.source == "hub"
                else "same files (a digest of the files' names and sizes, not the deploy's "
                     "snapshot id)")
        out.append(CheckResult("model", "cluster", "pass",
                               f"{cfg.model.name}: {what} {snap[:12]} on {', '.join(present)}"))
    return skipped + out


_HUB_SNAPSHOT = """
import json, sys, os
from huggingface_hub import snapshot_download
try:
    p = snapshot_download(sys.argv[1], revision=sys.argv[2] or None, local_files_only=True)
    print(json.dumps(os.path.basename(p)))
except Exception:
    print(json.dumps(None))
"""


def _hub_snapshot(ctx: Context, name: str) -> str | None:
    node = ctx.node(name)
    r = ctx.run(name, [node.python, "-c", _HUB_SNAPSHOT, ctx.cfg.model.name,
                       ctx.cfg.model.revision or ""], timeout=120)
    if not r.ok:
        raise LabError(f"node {name}: cannot look up the model cache: {r.why}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_clock(ctx: Context) -> list[CheckResult]:
    out = []
    names, skipped = ctx.split("clock", list(ctx.cfg.nodes))
    for name in names:
        if ctx.cfg.nodes[name].connection == "local":
            out.append(CheckResult("clock", name, "n/a", "local node: this machine's clock"))
            continue
        before = time.time()
        remote = ctx.facts(name, "clock")["time"]
        after = time.time()
        skew = remote - (before + after) / 2
        seen = f"{skew:+.3f} s against this machine (round trip {after - before:.3f} s)"
        if abs(skew) > max(1.0, after - before):
            out.append(CheckResult("clock", name, "warn", f"clock off by {skew:+.1f} s",
                                   evidence=seen, fix=f"on {name}: `sudo timedatectl set-ntp true` "
                                                      "(and the same here), then re-check"))
        else:
            out.append(CheckResult("clock", name, "pass", seen))
    return skipped + out


GATED_PREFIXES = ("meta-llama/", "mistralai/", "google/gemma")


def check_hf_token(ctx: Context) -> list[CheckResult]:
    cfg = ctx.cfg
    if cfg.model.source != "hub":
        return [CheckResult("hf_token", "cluster", "n/a",
                            f"model source is {cfg.model.source!r}: no download")]
    gated = cfg.model.name.startswith(GATED_PREFIXES)
    if cfg.hf_token_file:  # the rule `serve` and `model fetch` apply
        problem = secret_file_problem(cfg, cfg.hf_token_file, "HF token")
        if problem:
            return [CheckResult("hf_token", "cluster", "fail", problem[0], fix=problem[1])]
    token = hf_token(cfg)
    if token:
        where = (f"token file {cfg.resolve_path(cfg.hf_token_file)}, mode 600" if cfg.hf_token_file
                 else "HF_TOKEN set in this environment")
        return [CheckResult("hf_token", "cluster", "pass",
                            f"{where}, {len(token)} characters (not shown)")]
    if gated:
        return [CheckResult("hf_token", "cluster", "fail", f"{cfg.model.name} is gated; no token",
                            fix="accept the licence on huggingface.co, save a read token to a "
                                "file, `chmod 600` it and name it in hf_token_file")]
    return [CheckResult("hf_token", "cluster", "pass",
                        f"no token configured; {cfg.model.name} is not a known gated model")]


def check_logs(ctx: Context) -> list[CheckResult]:
    out = []
    names, skipped = ctx.split("logs", list(ctx.cfg.nodes))
    seen = set()
    for name in names:
        log_dir = ctx.cfg.log_dir_on(name)
        place = (ctx.cfg.nodes[name].machine(name), log_dir)
        if place in seen:
            out.append(CheckResult("logs", name, "n/a", f"{log_dir} already read for another node"))
            continue
        seen.add(place)
        tails = ctx.facts(name, "logs", log_dir)
        if not tails:
            out.append(CheckResult("logs", name, "n/a", f"no lab logs yet in {log_dir}"))
            continue
        found = [(path, f) for path, text in tails.items()
                 for f in match_failures(text, include_warnings=False)]
        for path, failure in found:
            out.append(CheckResult("logs", name, "fail", f"{failure.name} in {path}",
                                   evidence=failure.explanation, fix=failure.fix))
        if not found:
            out.append(CheckResult("logs", name, "pass",
                                   f"no known failure in {len(tails)} log(s) under {log_dir}"))
    return skipped + out


