"""RDMA checks of the serving nodes: the data plane's devices (state, MTU, negotiated
speed, both rails and their IPv4 addresses) and the RDMA bandwidth of the link (what NIXL
and its UCX do with them: `lab_utils.checks.nixl`).

They parse the same commands an engineer would type on a DGX Spark (`ibdev2netdev`,
`ibv_devinfo`, `ip link`, `ip addr`, `ethtool`, `ibstat`, `ib_write_bw`), with
the parsers in `lab_utils.checks.parsers`, tested on outputs recorded on GB10 machines. A
stock DGX OS has neither `ib_write_bw` (perftest) nor `ibstat` (infiniband-diags): without
ib_write_bw the link check warns with the install line; without ibstat the rate comes from
`ethtool`. One rail is one PCIe Gen5 x4 half of the ConnectX-7 (~100 Gb/s at most, even when
the port reports 200), and the link check judges it against that. On the CPU profile the
checks say not-applicable, with the reason.
"""

from __future__ import annotations

import re
import time
from pathlib import PurePosixPath

from lab_utils.checks import parsers
from lab_utils.checks.frame import Context
from lab_utils.results.checklist import CheckResult

GOOD_MTU = 4096  # RoCE's largest; needs the netdev at MTU 9000
LINK_FRACTION_WARN = 0.8
HALF_GBPS = 100.0  # one PCIe Gen5 x4 half of GB10's ConnectX-7


# ----- RDMA ---------------------------------------------------------------------------


def port_of(ibdev: str) -> str:
    """Devices of one physical port share their `s<slot>f<function>` ending (a Spark's
    port is two PCIe halves: rocep1s0f1 and roceP2p1s0f1)."""
    found = re.search(r"s\d+f\d+$", ibdev)
    return found.group(0) if found else ibdev


def half_of(device: str) -> str:
    """Which PCIe half of its port an RDMA device is ("rocep1s0f1:1" -> "rocep1"): GB10
    names the halves rocep1s0fN and roceP2p1s0fN (PCI domain and bus before the port)."""
    dev = device.split(":")[0]
    port = port_of(dev)
    return dev[: -len(port)] if port != dev else dev


def configured_devices(ctx: Context, name: str) -> tuple[list[dict], list[dict], list[str]]:
    """(configured devices as ibdev2netdev rows, all rows, entries not found)."""
    rows = parsers.ibdev2netdev(ctx.run(name, ["ibdev2netdev"]).stdout)
    chosen, unknown = [], []
    for entry in (ctx.cfg.nodes[name].data_netdev or "").split(","):
        dev, _, port = entry.strip().partition(":")
        match = [r for r in rows if dev in (r["ibdev"], r["netdev"])
                 and (not port or str(r["port"]) == port)]
        (chosen.extend(match) if match else unknown.append(entry.strip()))
    return chosen, rows, unknown


def _rdma_nodes(ctx: Context, check: str) -> tuple[list[str], list[CheckResult]]:
    def why_not(n: str) -> str | None:
        if ctx.cfg.uses_rdma(n):
            return None
        why = ("no data_netdev configured" if ctx.cfg.nodes[n].data_netdev is None
               else "vllm.device is 'cpu'")
        return f"{why}: NIXL runs over TCP/loopback here"

    return ctx.split(check, ctx.serving(), why_not)


def check_rdma(ctx: Context) -> list[CheckResult]:
    names, out = _rdma_nodes(ctx, "rdma")
    ports: dict[str, set[str]] = {}  # the physical port each node's data_netdev is on
    for name in names:
        chosen, rows, unknown = configured_devices(ctx, name)
        listing = "; ".join(f"{r['ibdev']} port {r['port']} => {r['netdev']} ({r['state']})"
                            for r in rows)
        if unknown or not chosen:
            out.append(CheckResult(
                "rdma", name, "fail", f"data_netdev {', '.join(unknown) or '(empty)'} not found",
                evidence=listing or "ibdev2netdev printed nothing",
                fix=f"set nodes.{name}.data_netdev to the Up devices of the cabled port "
                    "(ibdev2netdev), as device:port"))
            continue
        down = [r for r in chosen if r["state"] != "Up"]
        if down:
            up = ",".join(f"{r['ibdev']}:{r['port']}" for r in rows if r["state"] == "Up")
            other = f'; the Up devices here are "{up}" (data_netdev)' if up else ""
            out.append(CheckResult(
                "rdma", name, "fail", f"{', '.join(r['ibdev'] for r in down)} down",
                evidence=listing, fix=f"check the cable and which port it is in; on {name}: "
                                      f"`sudo ip link set {down[0]['netdev']} up`{other}"))
        else:
            out.append(CheckResult("rdma", name, "pass",
                                   ", ".join(f"{r['ibdev']} => {r['netdev']} Up" for r in chosen)))
        r = ctx.run(name, ["ip", "addr", "show"])
        addrs = parsers.ip_addr(r.stdout) if r.ok else None
        out += [rails_verdict(name, chosen, rows, addrs), _mtu(ctx, name, chosen),
                _speed(ctx, name, chosen)]
        if ctx.cfg.nodes[name].data_ifname:
            out.append(ifname_verdict(name, ctx.cfg.nodes[name], chosen, addrs))
        ports[name] = {port_of(r["ibdev"]) for r in chosen}
    if len({frozenset(v) for v in ports.values()}) > 1:
        seen = "; ".join(f"{n}: {', '.join(sorted(k))}" for n, k in ports.items())
        out.append(CheckResult(
            "rdma", " / ".join(ports), "warn", "the nodes use different physical ports",
            evidence=seen, fix="cable the same port on every node (both halves of it in "
                               "data_netdev), or set each node's data_netdev to its cabled "
                               "port: NCCL pairs the HCAs of the two nodes by their order"))
    return out


def ifname_verdict(name: str, node, chosen: list[dict],
                   addrs: dict[str, dict] | None) -> CheckResult:
    """`data_ifname` (what the split model's NCCL and Gloo bind to) against the node: it
    exists, is up, holds `data_address`, and is the netdev of one half of `data_netdev`
    (`chosen`: those halves' ibdev2netdev rows). `addrs`: `parsers.ip_addr` of `ip addr
    show` (None: it did not run)."""
    ifname, address = node.data_ifname, node.data_address
    if addrs is None:
        return CheckResult("data_ifname", name, "warn", f"{ifname} not checked",
                           evidence="`ip addr show` did not run",
                           fix=f"on {name}: `ip addr show {ifname}` must show it UP with "
                               f"{address}")
    holder = next((n for n, a in addrs.items()
                   if any(ip.split("/")[0] == address for ip in a.get("ipv4", []))), None)
    halves = [r["netdev"] for r in chosen]
    seen = (f"{ifname}: " + (f"{addrs[ifname].get('state')}, IPv4 "
                             f"{' '.join(addrs[ifname].get('ipv4', [])) or 'none'}"
                             if ifname in addrs else "absent")
            + f"; {address} is on {holder or 'no interface'}; data_netdev's netdevs: "
            + ", ".join(halves))
    fix = (f'set nodes.{name}.data_ifname to "{holder}"' if holder in halves else
           f"give one half of data_netdev ({', '.join(halves)}) the address {address} "
           f"and set nodes.{name}.data_ifname to it")
    if ifname not in addrs:
        return CheckResult("data_ifname", name, "fail", f"{ifname} does not exist here",
                           evidence=seen, fix=fix)
    if addrs[ifname].get("state") != "UP":
        return CheckResult("data_ifname", name, "fail", f"{ifname} is not up", evidence=seen,
                           fix=f"on {name}: `sudo ip link set {ifname} up`; check its cable")
    if holder != ifname:
        return CheckResult("data_ifname", name, "fail", f"{ifname} does not hold {address}",
                           evidence=seen, fix=fix)
    if ifname not in halves:
        return CheckResult("data_ifname", name, "fail",
                           f"{ifname} is not a netdev of data_netdev's devices", evidence=seen,
                           fix=fix)
    return CheckResult("data_ifname", name, "pass", f"{ifname} is up and holds {address}",
                       evidence=seen)


def rails_verdict(name: str, chosen: list[dict], rows: list[dict],
                  addrs: dict[str, dict] | None) -> CheckResult:
    """Both halves of the cabled port up, configured, and each with an IPv4 address: RoCE
    v2's IPv4 GID comes from it, so a half without one is a rail UCX cannot use. `addrs`
    is `parsers.ip_addr` of the node's `ip addr show` (None: it did not run)."""
    keys = {port_of(r["ibdev"]) for r in chosen}
    rails = [r for r in rows if port_of(r["ibdev"]) in keys]
    up = [r for r in rails if r["state"] == "Up"]
    unused = [r for r in up if r not in chosen]
    seen = ", ".join(f"{r['ibdev']} ({r['state']})" for r in rails)
    both = ",".join(f"{r['ibdev']}:{r['port']}" for r in up)
    if len(up) < len(rails):
        return CheckResult("rails", name, "warn", f"{len(up)} of {len(rails)} rails up" + (
                           ": at most half the port's rate" if up else ""), evidence=seen,
                           fix=f"bring up {', '.join(r['netdev'] for r in rails if r not in up)} "
                               f"(`sudo ip link set <netdev> up`, check the cable)")
    if unused:
        return CheckResult("rails", name, "warn", "one rail configured, the other unused",
                           evidence=seen, fix=f'set nodes.{name}.data_netdev to "{both}"')
    if addrs is None:
        return CheckResult("rails", name, "pass", f"{len(up)} rails up and configured",
                           evidence=seen + "; IPv4 addresses not checked (`ip addr show` "
                                           "did not run)")
    ipv4 = {r["netdev"]: addrs.get(r["netdev"], {}).get("ipv4", []) for r in chosen}
    seen += "; IPv4: " + ", ".join(f"{n} {' '.join(a) or 'none'}" for n, a in ipv4.items())
    bare = [n for n, a in ipv4.items() if not a]
    if bare:
        return CheckResult(
            "rails", name, "warn", f"no IPv4 address on {', '.join(bare)}: that rail is unused",
            evidence=seen,
            fix=f"on {name}: give {', '.join(bare)} an IPv4 address on a subnet of its own (the "
                "peer's same half on the same subnet), persistently in netplan, e.g. "
                f"`{bare[0]}: {{addresses: [192.168.101.10/24], mtu: 9000}}` in "
                "/etc/netplan/40-cx7.yaml, then `sudo netplan apply`; RoCE v2 over IPv4 "
                "takes its GID from that address")
    return CheckResult("rails", name, "pass",
                       f"{len(up)} rails up and configured, each with an IPv4 address",
                       evidence=seen)


IBVERBS_INSTALL = "sudo apt install ibverbs-utils"


def _mtu(ctx: Context, name: str, chosen: list[dict]) -> CheckResult:
    """RoCE's active MTU (`ibv_devinfo`) and the netdev's MTU (`ip link`) of each configured
    device. A tool that is missing, or a value it does not print, is "not read", never a
    small MTU."""
    res = ctx.run(name, ["ibv_devinfo"])
    if not res.ok:
        return CheckResult("mtu", name, "warn", "RoCE MTU not checked: ibv_devinfo not available",
                           evidence=(res.stderr or res.stdout).strip()[-200:] or f"exit {res.code}",
                           fix=f"on {name}: `{IBVERBS_INSTALL}`, then run the checklist again")
    info = parsers.ibv_devinfo(res.stdout)
    low, unread, seen = [], [], []
    for r in chosen:
        port = info.get(r["ibdev"], {}).get("ports", {}).get(int(r["port"]), {})
        link = parsers.ip_link(ctx.run(name, ["ip", "link", "show", r["netdev"]]).stdout)
        active, mtu = port.get("active_mtu"), link.get(r["netdev"], {}).get("mtu")
        seen.append(f"{r['ibdev']} active_mtu {active or 'not read'}, "
                    f"{r['netdev']} mtu {mtu or 'not read'}")
        if active is None or mtu is None:
            unread.append(r["netdev"])
        elif active < GOOD_MTU or mtu < 9000:
            low.append(r["netdev"])
    if low:  # informational: NVIDIA's two-Spark guides run at 1024
        cmds = "; ".join(f"`sudo ip link set dev {n} mtu 9000`" for n in low)
        return CheckResult("mtu", name, "pass",
                           f"RoCE MTU below 4096 on {', '.join(low)}: about 6% less per rail "
                           "(recorded on a GB10 pair, ib_write_bw: 88 Gb/s at 1024, 93 at 4096)",
                           evidence="; ".join(seen) + f". To raise it, on {name}: {cmds} "
                                    "(persist it in netplan; the peer needs the same)")
    if unread:
        return CheckResult("mtu", name, "warn", f"MTU of {', '.join(unread)} not read",
                           evidence="; ".join(seen),
                           fix=f"on {name}: check `ibv_devinfo` lists the device and `ip link "
                               "show <netdev>` works")
    return CheckResult("mtu", name, "pass", "RoCE MTU 4096 (netdev MTU 9000)",
                       evidence="; ".join(seen))


def negotiated_gbps(ctx: Context, name: str, row: dict) -> tuple[float | None, str]:
    """A device's negotiated rate: `ethtool <netdev>`'s Speed, else ibstat's Rate for its
    port 1 (there is no ibstat without infiniband-diags, not on a stock DGX OS); and which
    of the two said it."""
    mbps = parsers.ethtool_speed_mbps(ctx.run(name, ["ethtool", row["netdev"]]).stdout)
    if mbps:
        return mbps / 1000, "ethtool"
    r = ctx.run(name, ["ibstat"])
    ports = parsers.ibstat(r.stdout).get(row["ibdev"], {}).get("ports", {}) if r.ok else {}
    rate = ports.get(1, {}).get("rate")
    return (rate, "ibstat") if rate else (None, "")


def _speed(ctx: Context, name: str, chosen: list[dict]) -> CheckResult:
    expected = ctx.cfg.nodes[name].data_link_gbps
    speeds = {r["netdev"]: negotiated_gbps(ctx, name, r) for r in chosen}
    seen = ", ".join(f"{n} {g:g} Gb/s" + (f" ({how} Rate; ethtool printed no Speed)"
                                          if how == "ibstat" else "") if g else f"{n} unknown"
                     for n, (g, how) in speeds.items())
    if expected is None:
        return CheckResult("link_speed", name, "pass", seen,
                           evidence="data_link_gbps not set: not compared")
    slow = [n for n, (g, _) in speeds.items() if not g or g < expected]
    if slow:
        return CheckResult("link_speed", name, "warn",
                           f"negotiated below the expected {expected:g} Gb/s", evidence=seen,
                           fix=f"set the switch port (or peer) to {expected:g}G and re-seat the "
                               f"cable; `sudo ethtool {slow[0]}` must show Speed "
                               f"{int(expected * 1000)}Mb/s")
    return CheckResult("link_speed", name, "pass", seen)


PERFTEST_INSTALL = "sudo apt install perftest infiniband-diags"


def missing_tools(ctx: Context, name: str, *tools: str) -> list[str]:
    """Which of `tools` are not on the node's PATH (`command -v`)."""
    r = ctx.run(name, ["sh", "-c", f"command -v {' '.join(tools)}; true"])
    found = {PurePosixPath(line.strip()).name for line in r.stdout.splitlines() if line.strip()}
    return [t for t in tools if t not in found]


def _no_perftest(where: str, absent: list[str], detail: str) -> CheckResult:
    nodes = ", ".join(absent)
    return CheckResult(
        "link", where, "warn", f"not measured: ib_write_bw (perftest) is not installed on {nodes}",
        evidence=f"{detail}. A stock DGX OS has neither perftest nor infiniband-diags (ibstat). "
                 "No TCP stream was timed instead: one stream moves 25-34 Gb/s on a healthy "
                 "GB10 pair (recorded iperf3) and cannot judge a 200G RDMA link",
        fix=f"on {nodes}: `{PERFTEST_INSTALL}`, then run the checklist again; until then "
            "notebook 02's NIXL probe measures what NIXL moves over this link",
        data={"measured_gbps": None, "reported_gbps": None})


IBBW_SECONDS = 5  # each rail's ib_write_bw runs this long, all rails at once


def _ibbw(device: str, port: int, peer: str | None = None) -> list[str]:
    """ib_write_bw for `IBBW_SECONDS`, in Gb/s, past CPU-frequency warnings (-F, as
    NVIDIA's guide runs it); the server without `peer`, the client with it."""
    return ["ib_write_bw", "-d", device, "-p", str(port), "-D", str(IBBW_SECONDS), "-F",
            "--report_gbits", *([peer] if peer else [])]


def rdma_bandwidth(ctx: Context, target: str, initiator: str) -> CheckResult:
    """Every configured rail at once, each to the peer's matching half (the order of
    `data_netdev` on both nodes; the rails check says when they are not on the same
    port), as NVIDIA's two-Spark guide runs it: UCX and NCCL stripe over all of them."""
    cfg = ctx.cfg
    where = f"{initiator} -> {target}"
    absent = [n for n in (initiator, target) if missing_tools(ctx, n, "ib_write_bw")]
    if absent:
        return _no_perftest(where, absent, "`command -v ib_write_bw` found nothing")
    pairs = list(zip(configured_devices(ctx, initiator)[0], configured_devices(ctx, target)[0],
                     strict=False))
    addr, base = cfg.nodes[target].data_address, cfg.kv_transfer.probe_port
    server, client = ctx.node(target), ctx.node(initiator)
    for i in range(len(pairs)):
        server.ensure_port_free(addr, base + i, "the link check")
    servers, clients = [], []
    try:
        for i, (_, tdev) in enumerate(pairs):
            servers.append(server.start_detached(
                f"check-ibbw-{target}-{i}", _ibbw(tdev["ibdev"], base + i),
                log_path=f"{cfg.log_dir_on(target)}/check-ibbw-{i}.log", kind="check"))
        time.sleep(1.0)
        # the other rails' clients in the background, the first in the foreground: all at once
        for i, (dev, _) in enumerate(pairs[1:], start=1):
            clients.append(client.start_detached(
                f"check-ibbw-client-{i}", _ibbw(dev["ibdev"], base + i, addr),
                log_path=f"{cfg.log_dir_on(initiator)}/check-ibbw-client-{i}.log", kind="check"))
        r = ctx.run(initiator, _ibbw(pairs[0][0]["ibdev"], base, addr),
                    timeout=IBBW_SECONDS + 60)
        deadline = time.monotonic() + IBBW_SECONDS + 30
        while any(client.is_alive(c) for c in clients) and time.monotonic() < deadline:
            time.sleep(0.2)
        others = [client.log_tail(c, 200) for c in clients]
    finally:
        for rec in clients:
            client.stop(rec, grace_s=2)
        for rec in servers:
            server.stop(rec, grace_s=2)
    if r.code == 127:
        return _no_perftest(where, [initiator], (r.stderr or r.stdout).strip()[-200:])
    if not r.ok:
        return CheckResult("link", where, "fail", "ib_write_bw failed", evidence=r.stderr[-300:],
                           fix="check the data-plane addresses ping (`ping -c 3 " + addr + "`), "
                               "that both nodes use the same half of the cabled port, and "
                               "ib_write_bw's server log on " + target)
    measured = [parsers.ib_write_bw(text)["bw_avg_Gbps"] for text in (r.stdout, *others)]
    rates = [negotiated_gbps(ctx, initiator, dev) for dev, _ in pairs]
    rails = [{"device": dev["ibdev"], "peer": tdev["ibdev"], "gbps": gbps, "reported_gbps": rate}
             for (dev, tdev), gbps, (rate, _) in zip(pairs, measured, rates, strict=True)]
    mtu = parsers.ib_write_bw(r.stdout).get("mtu")
    seen = "ib_write_bw on " + ("both rails at once: " if len(rails) > 1 else "one rail, ") + \
        ", ".join(f"{x['device']} {x['gbps']:.1f} Gb/s" if x["gbps"] is not None
                  else f"{x['device']} (no result)" for x in rails) + f" (MTU {mtu})"
    seen += "".join(f"; {x['device']} reports {x['reported_gbps']:g} Gb/s ({how})"
                    for x, (_, how) in zip(rails, rates, strict=True) if x["reported_gbps"])
    return link_verdict(where, rails, seen)


def link_verdict(where: str, rails: list[dict], seen: str) -> CheckResult:
    """Each rail is one PCIe Gen5 x4 half of GB10's ConnectX-7, which moves ~100 Gb/s at
    most even when the port reports 200 (92-97 Gb/s per rail recorded with ib_write_bw,
    about 190 with both at once). The link is judged against what its rails can move
    together: per rail the lower of that ceiling and the rail's reported rate. Pass at 80%.
    `rails`: per rail its "gbps" (None: no result) and "reported_gbps" (None: unknown)."""
    if any(x["gbps"] is None for x in rails):
        lost = ", ".join(x.get("device", "?") for x in rails if x["gbps"] is None)
        return CheckResult("link", where, "fail", f"no bandwidth from ib_write_bw on {lost}",
                           evidence=seen, fix="check that rail: its address pings from the "
                           "peer's matching half, and ib_write_bw's logs on both nodes")
    ceilings = [min(HALF_GBPS, x["reported_gbps"]) if x["reported_gbps"] else HALF_GBPS
                for x in rails]
    gbps, ceiling = sum(x["gbps"] for x in rails), sum(ceilings)
    data = {"measured_gbps": gbps, "ceiling_gbps": ceiling, "rails": len(rails),
            "reported_gbps": (sum(x["reported_gbps"] for x in rails)
                              if all(x["reported_gbps"] for x in rails) else None),
            "per_rail": rails}
    halves = "one PCIe x4 half's" if len(rails) == 1 else f"{len(rails)} PCIe x4 halves'"
    basis = (f"{halves} ~{ceiling:g} Gb/s" if all(c == HALF_GBPS for c in ceilings)
             else f"the reported {ceiling:g} Gb/s")
    seen += (f"; a rail is one PCIe Gen5 x4 half of the ConnectX-7 (~{HALF_GBPS:g} Gb/s at "
             f"most, 200 Gb/s needs both halves): compared with {ceiling:g} Gb/s")
    frac = gbps / ceiling
    if frac < LINK_FRACTION_WARN:
        return CheckResult("link", where, "warn", f"moves {frac:.0%} of {basis}",
                           evidence=seen,
                           fix="check MTU 9000 on both ends, the cable, PCIe errors (`dmesg`); "
                               "a rail that negotiates full speed and moves 8-25 Gb/s is the "
                               "degraded ConnectX-7 state reported after cable hot-plugs, "
                               "which a reboot of both nodes has cleared", data=data)
    return CheckResult("link", where, "pass", f"{frac:.0%} of {basis}", evidence=seen, data=data)
