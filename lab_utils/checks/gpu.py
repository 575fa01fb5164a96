"""GPU checks of the serving nodes: the GPU and its driver (`nvidia-smi`, including GB10's
unified memory that it reports as Not Supported), processes holding it, and the CUDA build
of torch and vLLM. On the CPU profile they say not-applicable, with the reason. The gpu
check records the GPU's name in its data; `gpu_name` reads it back for notebook 00's record.
"""

from __future__ import annotations

from collections.abc import Iterable

from lab_utils.checks import parsers
from lab_utils.checks.frame import CheckResult, Context, GiB, meminfo


def _gpu_nodes(ctx: Context, check: str) -> tuple[list[str], list[CheckResult]]:
    device = ctx.cfg.vllm.device
    no_gpu = f"vllm.device is {device!r}: no GPU in this profile" if device != "cuda" else None
    return ctx.split(check, ctx.serving(), lambda n: no_gpu)


def _smi(ctx: Context, name: str, *args: str) -> str | None:
    r = ctx.run(name, ["nvidia-smi", *args])
    return r.stdout if r.ok else None


def check_gpu(ctx: Context) -> list[CheckResult]:
    names, out = _gpu_nodes(ctx, "gpu")
    for name in names:
        query = _smi(ctx, name, "--query-gpu=name,driver_version", "--format=csv")
        summary = _smi(ctx, name)
        if query is None or summary is None:
            out.append(CheckResult("gpu", name, "fail", "nvidia-smi does not run",
                                   evidence=ctx.run(name, ["nvidia-smi"]).stderr.strip()[-200:],
                                   fix=f"install the NVIDIA driver on {name} (DGX OS ships it) "
                                       "and reboot"))
            continue
        gpus = parsers.nvidia_smi_csv(query)
        info = parsers.nvidia_smi_summary(summary)
        names_seen = ", ".join(g["name"] for g in gpus)
        seen = f"{names_seen}, driver {gpus[0]['driver_version']}, CUDA {info['cuda_version']}"
        if any(g.get("memory_used_mib") is None for g in info["gpus"]):
            mem = meminfo(ctx, name)
            seen += (f"; memory: nvidia-smi reports Not Supported (unified memory), "
                     f"/proc/meminfo {mem.get('MemAvailable', 0) / GiB:.0f} of "
                     f"{mem['MemTotal'] / GiB:.0f} GiB available")
        out.append(CheckResult("gpu", name, "pass", seen,
                               data={"name": names_seen,
                                     "driver_version": gpus[0]["driver_version"],
                                     "cuda_version": info["cuda_version"]}))
        out.append(_gpu_processes(ctx, name))
    return out


def gpu_name(results: Iterable[CheckResult]) -> str | None:
    """The serving nodes' GPU as the gpu check saw it ("NVIDIA GB10"); the names joined if
    they differ; None without a GPU (CPU profile) or when a node's GPU was not seen."""
    gpus = [r for r in results if r.check == "gpu"]
    names = [r.data.get("name") for r in gpus]
    if not names or not all(names):
        return None
    return ", ".join(dict.fromkeys(names))


def _gpu_processes(ctx: Context, name: str) -> CheckResult:
    text = _smi(ctx, name, "--query-compute-apps=pid,process_name,used_memory",
                "--format=csv,noheader")
    apps = parsers.nvidia_smi_compute_apps(text or "")
    if not apps:
        return CheckResult("gpu_processes", name, "pass", "no compute processes on the GPU")
    listed = "; ".join(f"PID {a['pid']} {a['process_name']}"
                       + (f" {a['used_memory_mib']} MiB" if a.get("used_memory_mib") else "")
                       for a in apps)
    return CheckResult(
        "gpu_processes", name, "warn", f"{len(apps)} process(es) already use the GPU",
        evidence=listed,
        fix=f"if they are the lab's: `python -m lab_utils cleanup --config {ctx.cfg.source_name}`; "
            f"otherwise stop them on {name} (`kill <PID>`) before serving")


def _cuda_major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except (TypeError, ValueError):
        return None


def check_cuda_build(ctx: Context) -> list[CheckResult]:
    names, out = _gpu_nodes(ctx, "cuda_build")
    for name in names:
        info = parsers.nvidia_smi_summary(_smi(ctx, name) or "")
        driver = _cuda_major(info.get("cuda_version"))
        facts = ctx.facts(name, "python")
        torch_major = _cuda_major(facts.get("torch_cuda"))
        vllm_major = parsers.cuda_major_of_build(facts.get("vllm") or "")
        seen = (f"driver CUDA {info.get('cuda_version')}; torch {facts.get('torch')} "
                f"(CUDA {facts.get('torch_cuda')}); vllm {facts.get('vllm')}")
        fix = (f"install the CUDA {driver} builds of torch and vLLM on {name} (README, "
               "'Serving nodes (DGX Spark)'): GB10 (compute capability 12.1) needs cu130 wheels")
        if torch_major is None:
            out.append(CheckResult("cuda_build", name, "fail", "torch has no CUDA (CPU build)",
                                   evidence=seen, fix=fix))
        elif driver and torch_major < driver:
            out.append(CheckResult("cuda_build", name, "fail",
                                   f"torch built for CUDA {torch_major} on a CUDA {driver} machine",
                                   evidence=seen, fix=fix))
        elif driver and vllm_major is not None and vllm_major < driver:
            out.append(CheckResult("cuda_build", name, "fail",
                                   f"vLLM built for CUDA {vllm_major} on a CUDA {driver} machine",
                                   evidence=seen, fix=fix))
        elif vllm_major is None:
            out.append(CheckResult(
                "cuda_build", name, "warn", "vLLM's version does not name its CUDA build",
                evidence=seen, fix=f"on {name}: `python -c 'import vllm, torch; print(torch.version"
                                   ".cuda)'` must print 13.x; otherwise reinstall (README)"))
        else:
            out.append(CheckResult("cuda_build", name, "pass",
                                   f"CUDA {torch_major} builds on a CUDA {driver} driver",
                                   evidence=seen))
    return out
