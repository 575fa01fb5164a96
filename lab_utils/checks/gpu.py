"""GPU checks of the serving nodes: the GPU and its driver (`nvidia-smi`, including GB10's
unified memory that it reports as Not Supported), processes holding it, and the CUDA build
of torch and vLLM. On the CPU profile they say not-applicable, with the reason. The gpu
check records the GPU's name in its data; `gpu_name` reads it back for notebook 00's record.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

from lab_utils.checks import parsers
from lab_utils.checks.frame import Context, GiB
from lab_utils.results.checklist import CheckResult


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
        names_seen = ", ".join(g["name"] or "?" for g in gpus)
        seen = f"{names_seen}, driver {gpus[0]['driver_version']}, CUDA {info['cuda_version']}"
        if any(g.get("memory_used_mib") is None for g in info["gpus"]):
            mem = ctx.node(name).meminfo()
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
    names = [r.data.get("name", "") for r in gpus]
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


# PyPI's aarch64 wheels of vLLM 0.32.0 and of the torch it pins (2.13.0) are CUDA 13 builds
# with no "+cu130" in their versions; nixl 1.5.1 brings nixl-cu12 and nixl-cu13 and picks by
# the CUDA it finds. A fresh venv keeps an older torch (e.g. 2.13.0+cu129) from satisfying
# the pin.
PACKAGES = "vllm==0.32.0 nixl==1.5.1"


def install_line(python: str) -> str:
    """The install into a cleared venv: the node's own when `python` is a venv's."""
    path = PurePosixPath(python)
    venv = str(path.parents[1]) if path.parent.name == "bin" else ".venv"
    return f"python3 -m venv --clear {venv} && {venv}/bin/pip install {PACKAGES}"


def _vllm_cuda(facts: dict) -> tuple[int | None, str]:
    """vLLM's CUDA major and where it was read: the wheel's local tag ("0.13.0+cu130") or,
    without one (PyPI's 0.32.0 is plain "0.32.0"), the libcudart its extensions link."""
    tagged = parsers.cuda_major_of_build(facts.get("vllm") or "")
    if tagged is not None:
        return tagged, "its version tag"
    cudart = facts.get("vllm_cudart") or ""
    linked = cudart.rpartition(".so.")[2]
    if linked.isdigit():
        return int(linked), f"its extensions link {cudart}"
    return None, ("its version names no CUDA build and no extension links libcudart: "
                  "judged by torch's CUDA, which vLLM's wheel pins")


def check_cuda_build(ctx: Context) -> list[CheckResult]:
    """torch's CUDA (`torch.version.cuda`) and vLLM's against the driver's: a CUDA 12 build
    on GB10's CUDA 13 driver fails. vLLM's CUDA comes from its version tag when it has one,
    otherwise from the libcudart its compiled extensions link."""
    names, out = _gpu_nodes(ctx, "cuda_build")
    for name in names:
        info = parsers.nvidia_smi_summary(_smi(ctx, name) or "")
        driver = _cuda_major(info.get("cuda_version"))
        facts = ctx.facts(name, "python")
        torch_major = _cuda_major(facts.get("torch_cuda"))
        vllm_major, vllm_from = _vllm_cuda(facts)
        seen = (f"driver CUDA {info.get('cuda_version')}; torch {facts.get('torch')} "
                f"(torch.version.cuda {facts.get('torch_cuda')}); vllm {facts.get('vllm')} "
                f"(CUDA {vllm_major if vllm_major is not None else '?'}: {vllm_from})")
        python = ctx.node(name).python
        fix = (f"on {name}: `{install_line(python)}` (PyPI's aarch64 wheels are CUDA 13 builds "
               "with no +cu130 in their versions; GB10, compute capability 12.1, needs CUDA "
               f"13); then `{python} -c 'import torch; print(torch.version.cuda)'` must "
               "print 13.x")
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
        else:
            out.append(CheckResult("cuda_build", name, "pass",
                                   f"torch CUDA {facts.get('torch_cuda')}"
                                   + (f", vLLM CUDA {vllm_major}" if vllm_major is not None else "")
                                   + f" on a CUDA {info.get('cuda_version')} driver",
                                   evidence=seen))
    return out
