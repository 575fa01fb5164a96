"""A plan as text: one block per instance (node, addresses, command line, environment,
memory lines with where each figure comes from), then each node's sum against its
`MemTotal`, marked FITS or DOES NOT FIT with the fixes, then the order the instances start
in. What `serve --dry-run` prints.
"""

from __future__ import annotations

import shlex

from lab_utils.kv.memory import GiB


def _gib(n: int) -> str:
    return f"{n / GiB:6.1f} GiB"


def _argv(argv: list[str]) -> list[str]:
    """The command line, one flag and its value per line."""
    lines, current = [], shlex.join(argv[:3])
    for a in argv[3:]:
        if a.startswith("--"):
            lines.append(current)
            current = a
        else:
            current += " " + shlex.quote(a)
    return [*lines, current]


def _instance(p) -> list[str]:  # a plan.InstancePlan
    m = p.memory
    out = [f"[{p.name}] on {p.node}  ({p.role})",
           f"  HTTP          {p.url or 'none: a headless rank (rank 0 serves the API)'}"]
    if p.side_channel:
        out.append(f"  NIXL side ch. {p.side_channel}   kv_buffer_device {p.kv_buffer_device}")
    out.append("  command")
    out += [f"    {line}" for line in _argv(p.argv)]
    out.append("  environment")
    out += [f"    {k}={v}" for k, v in sorted(p.env.items())]
    out.append("    TMPDIR=<a private directory per instance, made at start>")
    head = (f"  memory (pool {m.pool / GiB:.1f} GiB = vLLM's gpu_memory_utilization share)"
            if m.pool is not None else "  memory (CPU build: no pool)")
    out.append(head)
    for item in m.items:
        where = "pool" if item.in_pool else "host"
        note = f"  [{item.note}]" if item.note else ""
        out.append(f"    {item.what:<40}{_gib(item.bytes)}  {where}{note}")
    out.append(f"    {'KV cache holds':<40}{m.kv_tokens:>10,} tokens")
    out += [f"    note: {n}" for n in m.notes]
    out.append(f"    {'instance total':<40}{_gib(m.total)}")
    return out


def render(plan) -> str:  # a plan.Plan
    out = [f"Plan: profile {plan.profile}, topology {plan.topology} (nothing started)",
           f"Weights: {plan.weights_source}",
           "Lines marked estimate are assumptions; lines marked measured come from the node's",
           "calibration record (results/<profile>/calibration/<node>.json, written by a real start).",
           ""]
    for p in plan.instances:
        out += _instance(p) + [""]
    out.append("Per node")
    for b in plan.nodes.values():
        head = (f"  {b.node}: {', '.join(b.instances)} {(b.total - b.reserve) / GiB:.1f} GiB"
                f" + OS and other processes {b.reserve / GiB:.1f} GiB ({b.reserve_source})"
                f" = {b.total / GiB:.1f} GiB")
        if b.mem_total is None:
            out.append(f"{head}; MemTotal {b.mem_source}")
            continue
        refused = [c.instance for c in b.checks if not c.passes]
        verdict = ("FITS" if b.fits else
                   f"DOES NOT FIT: no room for a KV cache in {', '.join(b.no_kv)}" if b.no_kv
                   else "DOES NOT FIT" if b.total > b.mem_total else
                   f"DOES NOT START: vLLM's start-up check refuses {', '.join(refused)}")
        spare = (b.mem_total - b.total) / GiB
        out.append(f"{head} of {b.mem_total / GiB:.1f} GiB MemTotal ({b.mem_source}):"
                   f" {verdict}" + ("" if b.no_kv else f", {spare:.1f} GiB to spare" if spare >= 0
                                    else f", short by {-spare:.1f} GiB"))
        out += [f"    {c.text()}" for c in b.checks]
        out += [f"    fix: {f}" for f in b.fixes]
    out += _start_order(plan.start_order)
    return "\n".join(out)


def _start_order(waves: list[list[str]]) -> list[str]:
    if len(waves) <= 1:
        return ["", "Start order: all at once" + (f" ({', '.join(waves[0])})" if waves else "")]
    out = ["", "Start order: one at a time on each machine (vLLM sizes its KV cache from the "
           "machine's free memory while it starts)"]
    for i, wave in enumerate(waves, 1):
        after = "" if i == 1 else f", once wave {i - 1} answers /health"
        out.append(f"  wave {i}: {', '.join(wave)}{after}")
    return out
