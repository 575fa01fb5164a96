"""NIXL checks of the serving nodes: a smoke test with the nixl package vLLM will load, and
the locked-memory limit NIXL's registrations need.

The smoke test (`lab_utils.on_node.nixl_smoke`) runs on each serving node with its own
Python: two NIXL agents with the UCX backend, as vLLM makes them, register a small host
buffer and move it once with a READ. The nixl wheel carries its own UCX
(nixl_cu13.libs/libucp-*, libuct_ib_mlx5), so this asks the UCX vLLM will use, where the
system's `ucx_info -d` may describe another build or none. It runs with the node's
UCX_NET_DEVICES (data_netdev) and the config's UCX_TLS, shared-memory transports left out
when no UCX_TLS is configured (the two agents share a process, and would otherwise talk
through shared memory instead of the network device), and reads the transport UCX chose
from UCX_PROTO_INFO=y. It runs on the CPU rehearsal too (over TCP there).

Registering memory for RDMA pins it, within the process's `ulimit -l`: NIXL registers the
probe's regions (notebook 02) and, with kv_buffer_device "cpu", vLLM's host copy of the
whole KV cache (notebook 04), so on a CUDA profile with RDMA a limit below that fails.
"""

from __future__ import annotations

import inspect
import json
import re

from lab_utils.checks import parsers
from lab_utils.checks.frame import Context, GiB
from lab_utils.config import TOPOLOGIES
from lab_utils.errors import LabError
from lab_utils.kv import budget, memory
from lab_utils.kv.shapes import kv_shape
from lab_utils.on_node import nixl_smoke
from lab_utils.results.checklist import CheckResult
from lab_utils.serve import make_plan

SMOKE_BYTES = 1 << 20
# Shared-memory transports, left out of the smoke test when the config sets no UCX_TLS. A
# deny list that does not name cuda or cuda_copy keeps CUDA support, which nixl 1.5.1's
# UCX backend requires on a node with a GPU (validateTlsCudaSupport).
NO_SHARED_MEMORY = "^sm,cma"
_SMOKE_SOURCE = inspect.getsource(nixl_smoke)
RDMA_PREFIXES = ("rc_", "dc_", "ud_")


def check_nixl(ctx: Context) -> list[CheckResult]:
    names, out = ctx.split("nixl", ctx.serving())
    for name in names:
        node = ctx.node(name)
        # UCX's environment: what vLLM gets, plus the protocol report
        env = {"UCX_TLS": ctx.cfg.kv_transfer.ucx_tls or NO_SHARED_MEMORY, "UCX_PROTO_INFO": "y"}
        netdev = ctx.cfg.nodes[name].data_netdev
        if netdev:
            env["UCX_NET_DEVICES"] = netdev
        r = node.run([node.python, "-", str(SMOKE_BYTES)], input=_SMOKE_SOURCE, env=env,
                     timeout=180)
        out.append(nixl_verdict(name, r.code, r.stdout + r.stderr, env,
                                rdma=ctx.cfg.uses_rdma(name)))
    return out


def _answer(output: str) -> dict | None:
    # the answer's line, wherever it starts: output that UCX wrote through C's stdio can
    # end mid-line just before it
    found = re.findall(rf"{nixl_smoke.MARK} (\{{.*\}})\s*$", output, re.M)
    return json.loads(found[-1]) if found else None


def nixl_verdict(name: str, code: int, output: str, env: dict[str, str], *,
                 rdma: bool) -> CheckResult:
    """The smoke test's verdict from its exit code and output (stdout and stderr): fail
    when NIXL could not move the buffer; on a node that should use RDMA, warn when UCX
    chose no RDMA transport for the READ."""
    setting = " ".join(f"{k}={v}" for k, v in env.items() if k != "UCX_PROTO_INFO")
    answer = _answer(output)
    tail = output.strip()[-400:]
    if answer is None:
        status = "warn" if code == 127 else "fail"  # 127: no interpreter (python check)
        return CheckResult("nixl", name, status, f"the NIXL smoke test gave no answer (exit {code})",
                           evidence=tail, fix="fix what the output shows; the python check "
                                              "names a missing package")
    if not answer["ok"]:
        return CheckResult(
            "nixl", name, "fail", f"NIXL failed at {answer['stage']}: {answer['error']}",
            evidence=f"{setting}; {tail}",
            fix="see the known failure for NIXL_ERR_BACKEND (UCX_TLS with a CUDA transport on "
                "a GPU node, `ulimit -l` unlimited, UCX_NET_DEVICES naming Up devices); rerun "
                f"on {name} with UCX_LOG_LEVEL=debug")
    tables = parsers.ucx_proto_info(output)
    reads = [t for t in tables if "memory read" in t["operation"]] or tables
    chosen = list(dict.fromkeys(tl for t in reads for tl in t["transports"]))
    moved = (f"moved {answer['bytes'] // 1024} KiB with a NIXL READ in "
             f"{answer['seconds'] * 1e3:.1f} ms (one first READ, opening the connection "
             "included: it shows NIXL works, not its bandwidth, which 02 measures)")
    seen = f"{setting}; UCX chose " + (", ".join(chosen) if chosen else "(not reported)")
    if rdma and not any(t.startswith(RDMA_PREFIXES) for t in chosen):
        return CheckResult(
            "nixl", name, "warn", f"{moved}, but not over RDMA", evidence=seen,
            fix=f"UCX found no RDMA transport on {env.get('UCX_NET_DEVICES')}: check "
                "`ibdev2netdev` shows them Up, /dev/infiniband exists and data_netdev names "
                "device:port (the rdma check); `ucx_info -d` (the system's UCX, not the nixl "
                "wheel's) may hint at what is missing")
    return CheckResult("nixl", name, "pass", moved, evidence=seen)


def memlock_needed(ctx: Context, name: str) -> tuple[int, str]:
    """The most bytes one process on `name` registers with NIXL in the lab's plan, and
    what: the largest instance's host copy of the KV cache (kv_buffer_device "cpu", the
    plan `serve` checks), or notebook 02's probe region (both halves of its largest size,
    the KV of a max_model_len prompt)."""

    cfg = ctx.cfg
    hf, _, _ = memory.model_config(cfg)
    shape = kv_shape(hf, None if cfg.model.dtype == "auto" else cfg.model.dtype)
    need = 2 * shape.transfer_bytes(cfg.vllm.max_model_len, budget.block_size(cfg))
    why = f"notebook 02's probe region ({need / GiB:.2f} GiB)"
    total = ctx.node(name).meminfo()["MemTotal"]
    for topo in TOPOLOGIES:
        if not any(s.node == name for s in cfg.instances(topo)):
            continue
        plan = make_plan(ctx.cluster, topo, mem_total={name: total}, read_nodes=False)
        for p in plan.instances:
            mirror = [i.bytes for i in p.memory.items if "host mirror" in i.what]
            if p.node == name and mirror and mirror[0] > need:
                need = mirror[0]
                why = (f"{p.name}'s host copy of the KV cache ({need / GiB:.1f} GiB, "
                       f'kv_buffer_device "cpu", {topo})')
    return need, why


def memlock_verdict(name: str, answer: str | None, need: int | None = None, why: str = "",
                    user: str | None = None) -> CheckResult:
    """The memory-lock limit of the lab's SSH session (`ulimit -l`, KiB or "unlimited")
    against `need` bytes (`memlock_needed`; None: not known). NIXL registers its buffers
    with the RDMA device, which locks their pages; a limit below what it registers makes
    the registration fail (UCX: "Please set max locked memory (ulimit -l) to 'unlimited'"),
    and NIXL reports NIXL_ERR_BACKEND."""
    who = user or "USER"
    fix = (f"let {who} lock memory: `printf '{who} soft memlock unlimited\\n{who} hard memlock "
           "unlimited\\n' | sudo tee /etc/security/limits.d/90-rdma-memlock.conf`, log in "
           "again and check that `ssh <node> 'ulimit -l'` prints unlimited (limits.d applies "
           "to PAM logins such as SSH; a process started by a systemd unit needs "
           "`LimitMEMLOCK=infinity` in its [Service] section instead)")
    if answer is None:
        return CheckResult("memlock", name, "warn", "could not read the memory-lock limit",
                           evidence="`sh -c 'ulimit -l'` gave no answer", fix=fix)
    value = answer.strip()
    if value == "unlimited":
        return CheckResult("memlock", name, "pass", "ulimit -l: unlimited")
    limit = int(value) * 1024 if value.isdigit() else 0
    needs = (f"NIXL registers up to {need / GiB:.2f} GiB here: {why}" if need is not None
             else f"what NIXL registers here could not be sized ({why})")
    if need is None or limit < need:
        return CheckResult("memlock", name, "fail", f"ulimit -l is {value} KiB: too small for "
                           "NIXL to register its buffers for RDMA",
                           evidence=f"ulimit -l: {value}; {needs}", fix=fix)
    return CheckResult("memlock", name, "pass", f"ulimit -l: {value} KiB", evidence=needs)


def check_memlock(ctx: Context) -> list[CheckResult]:
    def why_not(n: str) -> str | None:
        return None if ctx.cfg.uses_rdma(n) else ("no RDMA here (no data_netdev, or vllm.device "
                                               "'cpu'): NIXL registers nothing with an RDMA device")

    names, out = ctx.split("memlock", ctx.serving(), why_not)
    for name in names:
        r = ctx.run(name, ["sh", "-c", "ulimit -l"])
        answer = r.stdout if r.ok and r.stdout.strip() else None
        need: int | None
        try:
            need, why = memlock_needed(ctx, name)
        except LabError as e:
            need, why = None, str(e)
        ssh = ctx.cfg.nodes[name].ssh
        out.append(memlock_verdict(name, answer, need, why, ssh.user if ssh else None))
    return out
