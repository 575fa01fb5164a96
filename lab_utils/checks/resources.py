"""Resource checks on every node: memory for the instances the topologies start there,
and free disk where the lab writes logs and the model.
"""

from __future__ import annotations

from lab_utils.checks.frame import CheckResult, Context, GiB, meminfo


def _memory_needed(ctx: Context, name: str, total: int) -> tuple[int, str]:
    """The most memory the lab's instances on this node ask for, in one topology."""
    cfg, need, why = ctx.cfg, 0, "nothing serves here"
    for topo in ("baseline", "replicated", "disaggregated"):
        specs = [s for s in cfg.instances(topo) if s.node == name]
        if cfg.vllm.device == "cpu":
            n = sum(((s.settings.cpu_kvcache_space_gib or 4) + 1) * GiB for s in specs)
        else:
            n = sum(int((s.settings.gpu_memory_utilization or 0.9) * total) for s in specs)
        if n > need:
            need, why = n, f"{topo}: {', '.join(s.name for s in specs)}"
    return need, why


def check_resources(ctx: Context) -> list[CheckResult]:
    out = []
    names, skipped = ctx.split("memory", list(ctx.cfg.nodes))
    for name in names:
        mem = meminfo(ctx, name)
        total, avail = mem["MemTotal"], mem.get("MemAvailable", mem["MemFree"])
        need, why = _memory_needed(ctx, name, total)
        seen = f"{avail / GiB:.1f} of {total / GiB:.1f} GiB available (/proc/meminfo)"
        if avail < need:
            setting = ("gpu_memory_utilization" if ctx.cfg.vllm.device == "cuda"
                       else "cpu_kvcache_space_gib")
            out.append(CheckResult(
                "memory", name, "warn", f"less memory available than the instances need "
                f"({need / GiB:.1f} GiB for {why})", evidence=seen,
                fix=f"stop what holds memory on {name} (see the gpu check's processes) or "
                    f"lower vllm.<role>.{setting} in the config"))
        else:
            out.append(CheckResult("memory", name, "pass", seen))
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
    seen = "; ".join(f"{u['checked']}: {u['free'] / GiB:.1f} GiB free of {u['total'] / GiB:.0f}"
                     for u in usage.values())
    if low:
        return CheckResult("disk", name, "warn", f"under {floor // GiB} GiB free", evidence=seen,
                           fix=f"free space on {name} (old logs under {cfg.log_dir_on(name)}, "
                               "unused models in the Hugging Face cache: `hf cache delete`)")
    return CheckResult("disk", name, "pass", seen)
