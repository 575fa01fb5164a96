"""Pure parsers for the text that diagnostic commands print on DGX Spark (GB10) nodes.

The environment checklist runs `nvidia-smi`, `ibdev2netdev`, `ibv_devinfo`, `ibstat`,
`ip link`, `ip addr`, `ethtool`, `/proc/meminfo` and `ib_write_bw` on the nodes
and hands their stdout here: text in, plain dicts, lists and numbers out, no subprocesses. The formats follow real
GB10 output (the recordings in tests/fixtures/dgx-spark-recorded/), including its oddities:
`Not Supported` / `[N/A]` GPU memory, RDMA `active_mtu` 1024 under an IP MTU of 1500, and
perftest's "MB" meaning MiB. Unparseable input gives empty results or None, never an
exception, so the checklist can report "could not read" instead of crashing.

Over 400 lines on purpose: one small pure function per command, side by side, so that a
new GB10 recording is checked against every parser in one place.
"""

from __future__ import annotations

import re
from typing import Any

# `cat /proc/meminfo`: one parser, in the node-side facts every user may import
from lab_utils.on_node.facts import proc_meminfo as proc_meminfo

NA_VALUES = frozenset({"[N/A]", "N/A", "Not Supported", "[Not Supported]", ""})

_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]\s*$")
_PAREN_CODE = re.compile(r"\s*\(\d+\)\s*$")
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def _na(value: str) -> str | None:
    value = value.strip()
    return None if value in NA_VALUES else value


def _number(value: str | None) -> float | None:
    """Leading number of a value such as "3.74 W" or "10468 MiB"; None for N/A."""
    if value is None:
        return None
    m = _NUMBER.match(value)
    return float(m.group(1)) if m else None


def _slug(label: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", label.strip().lower()).strip("_")


# --------------------------------------------------------------------------- nvidia-smi


def _split_csv(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(",")]


def nvidia_smi_csv(text: str, fields: str | list[str] | None = None) -> list[dict[str, str | None]]:
    """Rows of `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`.

    Keys are the query field names ("memory.total", the printed " [MiB]" unit dropped);
    values stay strings as printed ("3.74 W") with N/A and Not Supported mapped to None.
    Without `fields` the first line is the header; with `fields` (the list passed to
    --query-gpu) a header line is skipped if present, so noheader works.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    if isinstance(fields, str):
        fields = [f.strip() for f in fields.split(",") if f.strip()]
    header = [_UNIT_SUFFIX.sub("", h) for h in _split_csv(lines[0])]
    if fields is None:
        keys, body = header, lines[1:]
    else:
        keys = list(fields)
        body = lines[1:] if header == keys else lines
    rows = []
    for line in body:
        cells = _split_csv(line)
        if len(cells) == len(keys):
            rows.append({k: _na(v) for k, v in zip(keys, cells, strict=True)})
    return rows


def _mib(value: str) -> int | None:
    num = _number(_na(value))
    return int(num) if num is not None else None


def nvidia_smi_compute_apps(text: str) -> list[dict[str, Any]]:
    """Processes from `nvidia-smi --query-compute-apps=pid,process_name,used_memory
    --format=csv` (with or without the header line, with or without units).

    Returns [{"pid": int, "process_name": str, "used_memory_mib": int | None}].
    """
    apps = []
    for line in text.splitlines():
        cells = _split_csv(line)
        if len(cells) < 3 or not cells[0].isdigit():
            continue  # blank, header ("pid, process_name, ...") or "No running processes"
        apps.append(
            {
                "pid": int(cells[0]),
                "process_name": ", ".join(cells[1:-1]),
                "used_memory_mib": _mib(cells[-1]),
            }
        )
    return apps


_SMI_GPU_ROW = re.compile(
    r"^\|\s+(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off)\s+\|"
    r"\s+(?P<bus_id>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.\d)\s+(?:On|Off)\s+\|"
)
_SMI_MEMORY = re.compile(r"(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB")
_SMI_PROCESS_ROW = re.compile(
    r"^\|\s+(?P<gpu>\d+)\s+(?:\S+\s+\S+\s+)?(?P<pid>\d+)\s+(?P<type>C\+G|C|G|M\+C|M)\s+"
    r"(?P<name>.+?)\s+(?P<memory>\d+MiB|N/A|Not Supported)\s*\|$"
)


def _smi_gpu(row: re.Match[str], next_line: str) -> dict[str, Any]:
    cells = next_line.split("|")
    memory = _SMI_MEMORY.search(cells[2]) if len(cells) > 2 else None
    return {
        "index": int(row["index"]),
        "name": row["name"],
        "persistence_mode": row["persistence"],
        "bus_id": row["bus_id"],
        "memory_used_mib": int(memory["used"]) if memory else None,
        "memory_total_mib": int(memory["total"]) if memory else None,
    }


def _smi_process(row: re.Match[str]) -> dict[str, Any]:
    return {
        "gpu": int(row["gpu"]),
        "pid": int(row["pid"]),
        "type": row["type"],
        "name": row["name"],
        "memory_mib": _mib(row["memory"]),
    }


def _search(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1) if m else None


def nvidia_smi_summary(text: str) -> dict[str, Any]:
    """The plain `nvidia-smi` table.

    Returns {"driver_version", "cuda_version", "gpus", "processes"}. The header says
    "Driver Version: ... CUDA Version: ..." up to driver branch 580 (DGX Spark's) and
    "KMD Version: ... CUDA UMD Version: ..." from branch 610 on; both are read. gpus is a list of
    {"index", "name", "persistence_mode", "bus_id", "memory_used_mib", "memory_total_mib"}
    (memory None when the table says "Not Supported", as on GB10); processes is a list of
    {"gpu", "pid", "type", "name", "memory_mib"}, [] for "No running processes found" and
    None when the output has no Processes section (e.g. `| head`). Process names are as
    printed: nvidia-smi cuts long paths to ".../tail".
    """
    lines = text.splitlines()
    gpus = []
    for i, line in enumerate(lines):
        row = _SMI_GPU_ROW.match(line)
        if row:
            gpus.append(_smi_gpu(row, lines[i + 1] if i + 1 < len(lines) else ""))
    processes = None
    if re.search(r"^\|\s*Processes:", text, re.MULTILINE):
        processes = [_smi_process(m) for m in map(_SMI_PROCESS_ROW.match, lines) if m]
    return {
        "driver_version": _search(r"(?:Driver|KMD) Version:\s*(\S+)", text),
        "cuda_version": _search(r"CUDA (?:UMD )?Version:\s*(\S+)", text),
        "gpus": gpus,
        "processes": processes,
    }


# --------------------------------------------------------------------------- CUDA builds


def cuda_major_of_build(version_string: str | None) -> int | None:
    """CUDA major version named by a wheel's local tag, from `pip show` / `torch.__version__`.

    "0.13.0+cu130" -> 13, "2.9.1+cu129" -> 12, "2.1.0+cu118" -> 11. None for "+cpu", for a
    version without a local tag, and for builds whose tag names no CUDA (NGC torch such as
    "2.9.0a0+...nv25.09"): ask torch.version.cuda there.
    """
    if not version_string:
        return None
    m = re.search(r"\+cu(\d{2,3})\b", version_string)
    return int(m.group(1)[:-1]) if m else None


# --------------------------------------------------------------------------- RDMA devices


def ibdev2netdev(text: str) -> list[dict[str, Any]]:
    """`ibdev2netdev` lines "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)".

    Returns [{"ibdev", "port": int, "netdev", "state"}] with state as printed ("Up"/"Down").
    """
    pattern = re.compile(r"^\s*(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)")
    return [
        {"ibdev": m[1], "port": int(m[2]), "netdev": m[3], "state": m[4]}
        for m in map(pattern.match, text.splitlines())
        if m
    ]


def _devinfo_value(key: str, value: str) -> str | int:
    value = _PAREN_CODE.sub("", value.strip())
    return int(value) if key.endswith("_mtu") and value.isdigit() else value


def ibv_devinfo(text: str) -> dict[str, dict[str, Any]]:
    """`ibv_devinfo`: {hca_id: {<device field>: str, "ports": {port: {field: value}}}}.

    The "(n)" enum codes are dropped ("PORT_ACTIVE (4)" -> "PORT_ACTIVE") and MTUs become
    bytes ("active_mtu": 1024 for "1024 (3)"); the rest stays a string ("link_layer":
    "Ethernet").
    """
    devices: dict[str, dict[str, Any]] = {}
    device: dict[str, Any] | None = None
    port: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"^\s*([^:]+?):\s*(.*?)\s*$", line)
        if not m:
            continue
        key, value = m[1].strip(), m[2]
        if key == "hca_id":
            device = devices.setdefault(value, {"ports": {}})
            port = None
        elif device is not None and key == "port" and value.isdigit():
            port = device["ports"].setdefault(int(value), {})
        elif device is not None:
            (port if port is not None else device)[key] = _devinfo_value(key, value)
    return devices


def _rate(value: str) -> int | float | None:
    num = _number(value)
    if num is None:
        return None
    return int(num) if num.is_integer() else num


def ibstat(text: str) -> dict[str, dict[str, Any]]:
    """`ibstat`: {ca_name: {"ca_type", "firmware_version", ..., "ports": {1: {...}}}}.

    Field names are lower-case with underscores ("Physical state" -> "physical_state");
    port "rate" is a number in Gb/s (int when whole: GB10 reports 100 per PCIe half).
    """
    cas: dict[str, dict[str, Any]] = {}
    ca: dict[str, Any] | None = None
    port: dict[str, Any] | None = None
    for line in text.splitlines():
        head = re.match(r"^CA '([^']+)'", line)
        port_head = re.match(r"^\s+Port (\d+):\s*$", line)
        field = re.match(r"^\s+([^:]+):\s*(.*?)\s*$", line)
        if head:
            ca, port = cas.setdefault(head[1], {"ports": {}}), None
        elif ca is not None and port_head:
            port = ca["ports"].setdefault(int(port_head[1]), {})
        elif ca is not None and field:
            key = _slug(field[1])
            value = _rate(field[2]) if key == "rate" and port is not None else field[2]
            (port if port is not None else ca)[key] = value
    return cas


# --------------------------------------------------------------------------- IP links


_IP_HEADER = re.compile(r"^(\d+):\s+([^:@\s]+)(?:@\S+?)?:\s+<([^>]*)>(.*)$")


def _ip_entry(header: re.Match[str]) -> dict[str, Any]:
    rest = header[4]
    mtu = re.search(r"\bmtu (\d+)", rest)
    state = re.search(r"\bstate (\S+)", rest)
    return {
        "index": int(header[1]),
        "mtu": int(mtu[1]) if mtu else None,
        "state": state[1] if state else None,
        "flags": set(filter(None, header[3].split(","))),
        "mac": None,
        "link_type": None,
    }


def _ip_interfaces(text: str) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Interface header entries, their link/ line read, plus their indented continuation
    lines."""
    found: dict[str, tuple[dict[str, Any], list[str]]] = {}
    name = None
    for line in text.splitlines():
        header = _IP_HEADER.match(line)
        if header:
            name = header[2]
            found[name] = (_ip_entry(header), [])
        elif name is not None and line.strip():
            entry, body = found[name]
            body.append(line.strip())
            m = re.match(r"^link/(\S+)(?:\s+(\S+))?", line.strip())
            if m:
                entry["link_type"] = m[1]
                entry["mac"] = m[2] if m[2] and ":" in m[2] else None
    return found


def ip_link(text: str) -> dict[str, dict[str, Any]]:
    """`ip link show` or `ip link show <if>`: {ifname: {"index", "mtu", "state", "flags",
    "mac", "link_type"}}. flags is the set inside <...>; mac is None for "link/none";
    state is the operstate as printed ("UP", "DOWN", "UNKNOWN"); "@peer" suffixes are dropped
    from names."""
    return {name: entry for name, (entry, _) in _ip_interfaces(text).items()}


def ip_addr(text: str) -> dict[str, dict[str, Any]]:
    """`ip addr show` (also `ip -4 addr show [dev IF]`): what `ip_link` gives, plus "ipv4"
    and "ipv6", the addresses with their prefix as printed ("192.168.100.11/24"), [] for an
    interface without one."""
    addrs = {}
    for name, (entry, body) in _ip_interfaces(text).items():
        entry.update(ipv4=[], ipv6=[])
        for line in body:
            m = re.match(r"^inet(6?)\s+(\S+)", line)
            if m:
                entry["ipv6" if m[1] else "ipv4"].append(m[2])
        addrs[name] = entry
    return addrs


def ethtool_speed_mbps(text: str) -> int | None:
    """Link speed from `ethtool <if>` (or `| grep Speed`): "Speed: 200000Mb/s" -> 200000;
    "Speed: Unknown!" or no Speed line -> None."""
    speed = _search(r"^\s*Speed:\s*(\d+)\s*Mb(?:/s|ps)", text)
    return int(speed) if speed else None


# --------------------------------------------------------------------------- UCX


_UCX_LOG_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\[[^\]]*\]\s*")
_TRANSPORT_DEVICE = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:-]+)")


def ucx_proto_info(text: str) -> list[dict[str, Any]]:
    """The tables UCX prints with UCX_PROTO_INFO=y, one per operation a worker prepared:
    [{"title": "a intra-node cfg#1", "operation": "remote memory read by ucp_get*(multi)
    into host memory from host", "rows": [(range, description, config)], "transports":
    ["tcp/lo"]}]. "transports" are the transport/device pairs its Config column names
    ("rc_mlx5/rocep1s0f1:1"), in order, each once. Other lines are ignored."""
    tables: list[dict[str, Any]] = []
    for line in text.splitlines():
        body = _UCX_LOG_PREFIX.sub("", line).strip()
        if not body.startswith("|") or not body.endswith("|"):
            continue
        cells = [c.strip() for c in body[1:-1].split("|")]
        if len(cells) == 1:
            if tables and not tables[-1]["operation"] and not tables[-1]["rows"]:
                tables[-1]["operation"] = cells[0]
            else:
                tables.append({"title": cells[0], "operation": "", "rows": [], "transports": []})
        elif len(cells) == 3 and tables and cells != ["Range", "Description", "Config"]:
            table = tables[-1]
            table["rows"].append(tuple(cells))
            for tl, dev in _TRANSPORT_DEVICE.findall(cells[2]):
                if f"{tl}/{dev}" not in table["transports"]:
                    table["transports"].append(f"{tl}/{dev}")
    return tables


# --------------------------------------------------------------------------- link test


_MIB_PER_S_IN_GBPS = 1024 * 1024 * 8 / 1e9  # perftest's "MB/sec" is MiB/s


def ib_write_bw(text: str) -> dict[str, Any]:
    """Client output of `ib_write_bw` (perftest), also `--report_gbits` / `--run_infinitely`.

    Returns {"device", "mtu", "link_type", "unit", "rows", "bw_avg_MBps", "bw_avg_Gbps"}.
    rows hold {"bytes", "iterations", "bw_peak", "bw_avg", "msg_rate_Mpps"} in the printed
    unit ("MB/sec" or "Gb/sec"). The averages are the mean over the rows of the largest
    message size. perftest's MB is 2**20 bytes (MsgRate x size confirms it), so
    11031.60 MB/sec is 92.5 Gb/s, not 88.3.
    """
    unit = _search(r"BW average\[([^\]]+)\]", text)
    pattern = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
    rows = [
        {
            "bytes": int(m[1]),
            "iterations": int(m[2]),
            "bw_peak": float(m[3]),
            "bw_avg": float(m[4]),
            "msg_rate_Mpps": float(m[5]),
        }
        for m in map(pattern.match, text.splitlines())
        if m
    ]
    mtu = _search(r"Mtu\s*:\s*(\d+)", text)
    avg_mb = avg_gb = None
    if rows:
        largest = max(r["bytes"] for r in rows)
        avgs = [r["bw_avg"] for r in rows if r["bytes"] == largest]
        avg = sum(avgs) / len(avgs)
        gbits = unit is not None and unit.lower().startswith("gb")
        avg_gb = avg if gbits else avg * _MIB_PER_S_IN_GBPS
        avg_mb = avg / _MIB_PER_S_IN_GBPS if gbits else avg
    return {
        "device": _search(r"Device\s*:\s*(\S+)", text),
        "mtu": int(mtu) if mtu else None,
        "link_type": _search(r"Link type\s*:\s*(\S+)", text),
        "unit": unit,
        "rows": rows,
        "bw_avg_MBps": avg_mb,
        "bw_avg_Gbps": avg_gb,
    }


# --------------------------------------------------------------------------- advice


