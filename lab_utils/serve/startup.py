"""What a vLLM instance's log says about its start: where it is now, and the figures it
measured about itself.

`phase` names the last start-up step the log reached, so the wait for /health can show
"compiling" rather than a silent minute that looks like a hang. A first start compiles:
vLLM's torch.compile (its cache is ~/.cache/vllm/torch_compile_cache; a later start logs
"Directly load the compiled graph(s) ... from the cache" instead), and on a GB10 the
attention kernels may be JIT-compiled from PTX by the driver on their first use, in the
memory-profiling run, which logs nothing until "Available KV cache memory". (Whether the
aarch64 vLLM 0.32.0 wheel ships sm_121 code for FlashAttention-2 was not checked: a
public build note for DGX Spark reads vllm-flash-attn's CMakeLists as "8.0+PTX".)

`figures` reads the lines vLLM 0.32.0 logs at start (the same lines as 0.13.0 on a GB10:
the recorded start-up in tests/fixtures/dgx-spark-recorded) into numbers: KV cache bytes
and tokens, weights' memory, load, compile, CUDA graph and engine init times, and whether
the compile cache was used.
"""

from __future__ import annotations

import re

GiB = 2**30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COMPILING = ("a first start compiles kernels and says nothing for minutes; "
              "later starts load them from the cache")
_PROFILING = ("profiling memory (on a GPU the attention kernels' first use: the driver may be "
              "compiling them on a first start)")

# (pattern, what the instance is doing once the log has reached it), in start-up order
PHASES: tuple[tuple[str, str], ...] = (
    (r"Starting to load model", "loading the weights"),
    (r"Model loading took|Loading weights took", _PROFILING),
    (r"Starting torch\.compile|Using cache directory: \S+ for vLLM's torch\.compile"
     r"|Dynamo bytecode transform time", f"torch.compile ({_COMPILING})"),
    (r"Directly load the compiled graph", "loading compiled graphs from the cache"),
    (r"Compiling a graph for compile range", f"compiling graphs ({_COMPILING})"),
    (r"torch\.compile takes [\d.]+ s in total", _PROFILING),
    (r"Available KV cache memory|Explicitly set \(|Auto set \(|KV cache size: [\d,]+ tokens",
     "KV cache sized; warming up"),
    (r"Capturing CUDA graphs", "capturing CUDA graphs"),
    (r"init engine \(profile, create kv cache, warmup model\) took", "starting the API server"),
    (r"Starting vLLM server on|Application startup complete", "API server up"),
)


def clean(log_text: str) -> str:
    return _ANSI.sub("", log_text)


def phase(log_text: str) -> str | None:
    """The last start-up step the log reached (None: none yet)."""
    text = clean(log_text)
    best, where = None, -1
    for pattern, what in PHASES:
        for m in re.finditer(pattern, text):
            if m.start() > where:
                best, where = what, m.start()
    return best


def _last(pattern: str, text: str) -> re.Match | None:
    found = list(re.finditer(pattern, text))
    return found[-1] if found else None


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def figures(log_text: str) -> dict:
    """The start-up figures in a vLLM log (keys absent when the line is not there):
    kv_bytes, kv_tokens, weights_bytes, weights_load_s, compile_s, graphs_s, graphs_bytes,
    init_engine_s, compile_cache ("hit" or "miss")."""
    text = clean(log_text)
    out: dict = {}
    if m := _last(r"Available KV cache memory: (-?[\d.]+) GiB"  # CUDA
                  r"|(?:Explicitly|Auto) set \(([\d.]+)/[\d.]+\) GiB for KV cache", text):  # CPU
        out["kv_bytes"] = int(_num(m[1] or m[2]) * GiB)
    if m := _last(r"KV cache size: ([\d,]+) tokens", text):
        out["kv_tokens"] = int(_num(m[1]))
    if m := _last(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds", text):
        out["weights_bytes"], out["weights_load_s"] = int(_num(m[1]) * GiB), _num(m[2])
    elif m := _last(r"Loading weights took ([\d.]+) seconds", text):
        out["weights_load_s"] = _num(m[1])
    if m := _last(r"torch\.compile takes ([\d.]+) s in total", text):
        out["compile_s"] = _num(m[1])
    if m := _last(r"Graph capturing finished in ([\d.]+) secs, took (-?[\d.]+) GiB", text):
        out["graphs_s"], out["graphs_bytes"] = _num(m[1]), int(_num(m[2]) * GiB)
    if m := _last(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", text):
        out["init_engine_s"] = _num(m[1])
    if re.search(r"Compiling a graph for compile range", text):
        out["compile_cache"] = "miss"
    elif re.search(r"Directly load the compiled graph", text):
        out["compile_cache"] = "hit"
    return out


def collective(log_text: str) -> dict:
    """How a tensor-parallel rank's all-reduces travel, from its log: `backend` ("nccl",
    "gloo" or None: not logged), `net` (NCCL's network: "IB" for RDMA, RoCE included, or
    "Socket"; "TCP" for Gloo; None: not logged), `devices` (NCCL's devices or interfaces,
    in its order) and `line` (the line that says so). NCCL says it only with NCCL_DEBUG=INFO
    (the launcher sets it, with NCCL_DEBUG_SUBSYS=INIT,NET, on a CUDA profile's ranks)."""
    text = clean(log_text)
    out: dict = {"backend": None, "net": None, "devices": [], "line": None}
    if m := _last(r"world_size=\d+ rank=\d+ .*?backend=(\w+)", text):
        out["backend"], out["line"] = m[1].lower(), m[0]
    if out["backend"] == "gloo":  # torch's CPU collectives: TCP on GLOO_SOCKET_IFNAME
        out["net"] = "TCP"
        return out
    using = _last(r"NCCL INFO NET/(IB|Socket) : Using (.*)", text)
    said = _last(r"NCCL INFO Using network (\w+)", text) or using
    if said is not None:
        out["backend"], out["net"], out["line"] = "nccl", said[1], said[0]
        if using is not None and using[1] == out["net"]:
            # "[0]rocep1s0f1:1/RoCE [1]..." or "[0]enp1s0f1np1:192.168.100.10<0>"
            out["devices"] = re.findall(r"\[\d+\](\S+?)(?:/\w+|<\d+>)?(?=\s|$|;)",
                                        using[2].split(";")[0])
    elif re.search(r"NCCL INFO NET/IB : No device found", text):
        out["backend"], out["line"] = "nccl", "NET/IB : No device found"
    return out


class Watch:
    """What each instance still starting is doing, for the wait's progress line: its
    step, how long the wait has lasted, and how long its log has been quiet (a long
    quiet in a compiling step is expected on a first start; a quiet log elsewhere is
    worth a look)."""

    def __init__(self, every_s: float = 5.0):
        self.every_s = every_s
        self._seen: dict[str, tuple[str, float]] = {}  # name: (log tail, when it changed)
        self._text: dict[str, str] = {}
        self._read = -every_s

    def line(self, now: float, waited_s: float, tails: dict) -> str:
        """`tails`: name -> a function returning that instance's log tail (read at most
        every `every_s`)."""
        if now - self._read >= self.every_s:
            self._read = now
            for name, read in tails.items():
                tail = read()
                if name not in self._seen or self._seen[name][0] != tail:
                    self._seen[name] = (tail, now)
                step = phase(tail)
                quiet = now - self._seen[name][1]
                self._text[name] = (f"{name}: {step or 'starting'}"
                                    + (f", log quiet {quiet:.0f} s" if quiet >= 30 else ""))
        return f"{waited_s:.0f} s; " + "; ".join(self._text.get(n, n) for n in tails)
