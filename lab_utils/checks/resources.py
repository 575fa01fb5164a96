"""Resource checks on every node: memory for the instances the topologies start there
(the same plan `serve` refuses when it does not fit: `serve.plan`), and free disk where
the lab writes logs and the model.
"""

from __future__ import annotations

from lab_utils.checks.frame import Context, GiB
from lab_utils.config import TOPOLOGIES
from lab_utils.errors import LabError
from lab_utils.kv.memory import OS_RESERVE
from lab_utils.results.checklist import CheckResult
from lab_utils.serve import make_plan


def _memory_needed(ctx: Context, name: str, total: int) -> tuple[int, str, list[str]]:
    """The most memory the lab's instances on this node need in one topology, by the plan
    `serve` checks (`serve.plan`: weights, KV cache, NIXL host mirror, processes, OS
    reserve), with the fixes when that does not fit in `total`."""

    cfg, need, why, fixes = ctx.cfg, 0, "", []
    machine = cfg.nodes[name].machine(name)
    for topo in TOPOLOGIES:
        if not any(s.node == name for s in cfg.instances(topo)):
            continue
        plan = make_plan(ctx.cluster, topo, mem_total={name: total}, read_nodes=False)
        b = plan.nodes[machine]
        if b.total > need:
            need, why, fixes = b.total, f"{topo}: {', '.join(b.instances)}", b.fixes
    return need, why, fixes


def check_resources(ctx: Context) -> list[CheckResult]:
    out = []
    names, skipped = ctx.split("memory", list(ctx.cfg.nodes))
    for name in names:
        mem = ctx.node(name).meminfo()
        total, avail = mem["MemTotal"], mem.get("MemAvailable", mem["MemFree"])
        seen = f"{avail / GiB:.1f} of {total / GiB:.1f} GiB available (/proc/meminfo)"
        try:
            need, why, fixes = _memory_needed(ctx, name, total)
        except LabError as e:
            out.append(CheckResult("memory", name, "warn", f"no memory plan: {e}", evidence=seen,
                                   fix="run `python -m lab_utils model fetch` first"))
            out.append(_disk(ctx, name))
            continue
        detail = f"plan needs {need / GiB:.1f} GiB of {total / GiB:.1f} GiB MemTotal for {why}"
        if not need:
            out.append(CheckResult("memory", name, "pass",
                                   f"{seen}; no vLLM instance is planned on this node"))
        elif need > total:
            out.append(CheckResult(
                "memory", name, "fail", f"the instances do not fit ({detail})", evidence=seen,
                fix="; or ".join(fixes) + " (python -m lab_utils serve --topology T --dry-run "
                    "shows the plan)"))
        elif avail < need - OS_RESERVE[ctx.cfg.vllm.device]:  # the OS already holds its share
            setting = ("gpu_memory_utilization" if ctx.cfg.vllm.device == "cuda"
                       else "cpu_kvcache_space_gib")
            out.append(CheckResult(
                "memory", name, "warn", f"less memory available than the instances need "
                f"({detail})", evidence=seen,
                fix=f"stop what holds memory on {name} (see the gpu check's processes) or "
                    f"lower vllm.<role>.{setting} in the config"))
        else:
            out.append(CheckResult("memory", name, "pass", f"{seen}; {detail}"))
        out.append(_disk(ctx, name))
    return skipped + out


def _disk(ctx: Context, name: str) -> CheckResult:
    cfg = ctx.cfg
    paths = [cfg.log_dir_on(name)]
    if "serving" in cfg.nodes[name].roles and cfg.model.source != "hub":
        paths.append(cfg.model_path_on(name))
    usage = ctx.facts(name, "disk", *paths)
    floor = (20 if cfg.vllm.device == "cuda" else 1) * GiB
    low = {p: u for p, u in usage.items() if u["free"] < floor}
    seen = "; ".join(f"{u['checked']}: {u['free'] / GiB:.1f} GiB free of {u['total'] / GiB:.0f} "
                     "GiB" for u in usage.values()) + f" (warns under {floor // GiB} GiB)"
    if low:
        return CheckResult("disk", name, "warn", f"under {floor // GiB} GiB free", evidence=seen,
                           fix=f"free space on {name} (old logs under {cfg.log_dir_on(name)}, "
                               "unused models in the Hugging Face cache: `hf cache delete`)")
    return CheckResult("disk", name, "pass", seen)
