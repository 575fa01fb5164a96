"""Benchmark: how long the lab's proxy keeps connections of clients that send slowly.

A client that sends its request headers one byte per second ("slow header"), or its
headers at once and then its body one byte per second ("slow body"), ties up one
connection (a socket, a file descriptor, memory) for as long as the server lets it. This
starts the lab's proxy as a user does (`python -m lab_utils proxy --mode replicated` on a
profile, in its own process group; its backends need not run), opens `--connections` of
each kind against it, keeps every one dribbling a byte per `--interval` seconds, and
counts at each of `--at` seconds how many the proxy has not closed yet. The proxy's own
limits (`proxy.header_timeout_s`, `proxy.body_timeout_s`) are the profile's; `--set
proxy.header_timeout_s=3` changes one for the run.

    python -m tools.slow_clients [--config F] [--connections 50] [--at 20,40]
        [--set proxy.FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab_utils.config import DEFAULT_PROFILE
from lab_utils.on_node.proctools import port_is_free, start_ticks, stop_group

KINDS = ("slow-header", "slow-body")


class Client:
    """One connection sending its request a byte at a time; `closed_at` when the server
    closed it (seconds after the start)."""

    def __init__(self, kind: str, address: str, port: int):
        self.kind = kind
        self.sock = socket.create_connection((address, port), timeout=5)
        self.sock.setblocking(False)
        self.closed_at: float | None = None
        self.answer = b""
        if kind == "slow-body":  # the headers at once, then a body that never ends
            self.sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
        else:  # a request line, then a header that never ends
            self.sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nX-Slow: ")

    def tick(self, now: float) -> None:
        """Read what the server said (an EOF is its close), then send one more byte."""
        if self.closed_at is not None:
            return
        try:
            while select.select([self.sock], [], [], 0)[0]:
                data = self.sock.recv(4096)
                if not data:
                    raise ConnectionResetError
                self.answer += data
            self.sock.send(b"a")
        except OSError:
            self.closed_at = now
            self.sock.close()

    def close(self) -> None:
        self.sock.close()


def _profile(source: Path, overrides: list[str], tmp: Path) -> Path:
    data = json.loads(source.read_text())
    data["results_root"] = str(tmp / "results")
    for item in overrides:
        dotted, value = item.split("=", 1)
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = json.loads(value)
    path = tmp / "profile.json"
    path.write_text(json.dumps(data))
    return path


def measure(config: Path, connections: int, at: list[float], interval_s: float = 1.0,
            overrides: list[str] | None = None) -> dict:
    """Start the proxy on `config`, open the slow clients, return how many of each kind
    were still open at each time in `at`, and when the closed ones were closed."""
    from lab_utils.config import load_config

    with tempfile.TemporaryDirectory(prefix="lab-slow-clients-") as tmp:
        path = _profile(config, overrides or [], Path(tmp))
        cfg = load_config(path)
        address, port = cfg.nodes[cfg.proxy.node].lan_address, cfg.proxy.port
        if not port_is_free(address, port):
            raise SystemExit(f"{address}:{port} (proxy.port) is in use: stop what holds it "
                             "or give another profile")
        log = open(Path(tmp) / "proxy.log", "wb")  # noqa: SIM115 (closed below)
        proxy = subprocess.Popen([sys.executable, "-m", "lab_utils", "proxy", "--mode", "replicated",
                                  "--config", str(path)], stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        ticks = start_ticks(proxy.pid)
        try:
            t_end = time.monotonic() + 60
            while port_is_free(address, port):
                if proxy.poll() is not None or time.monotonic() > t_end:
                    raise SystemExit("the proxy did not start:\n" +
                                     (Path(tmp) / "proxy.log").read_text()[-2000:])
                time.sleep(0.1)
            clients = [Client(kind, address, port) for kind in KINDS for _ in range(connections)]
            t0 = time.monotonic()
            counts: dict[float, dict[str, int]] = {}
            for checkpoint in sorted(at):
                while (now := time.monotonic() - t0) < checkpoint:
                    for c in clients:
                        c.tick(now)
                    time.sleep(min(interval_s, max(0.0, checkpoint - now)))
                for c in clients:
                    c.tick(now)
                counts[checkpoint] = {k: sum(c.closed_at is None for c in clients if c.kind == k)
                                      for k in KINDS}
            closed = {k: sorted(round(c.closed_at, 1) for c in clients
                                if c.kind == k and c.closed_at is not None) for k in KINDS}
            answers = {k: sorted({c.answer.split(b"\r\n", 1)[0].decode(errors="replace")
                                  for c in clients if c.kind == k}) for k in KINDS}
            for c in clients:
                c.close()
        finally:
            stop_group(proxy.pid, ticks, 5.0)
            proxy.wait(10)
            log.close()
    return {"connections": connections, "open_at": counts, "closed_after_s": closed,
            "status_lines": answers,
            "limits": {"header_timeout_s": getattr(cfg.proxy, "header_timeout_s", None),
                       "body_timeout_s": getattr(cfg.proxy, "body_timeout_s", None)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=DEFAULT_PROFILE)
    ap.add_argument("--connections", type=int, default=50, help="of each kind")
    ap.add_argument("--at", default="20", help="seconds after opening, comma-separated")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between bytes")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                    help="change a profile field for this run, e.g. proxy.header_timeout_s=3")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    at = [float(x) for x in args.at.split(",") if x.strip()]
    r = measure(args.config, args.connections, at, args.interval, args.set)
    print(f"{args.connections} slow-header and {args.connections} slow-body connections "
          f"against the lab's proxy (limits: {r['limits']})")
    for t, open_ in r["open_at"].items():
        print(f"  after {t:g} s still open: " + ", ".join(f"{k} {n}" for k, n in open_.items()))
    for k in KINDS:
        times = r["closed_after_s"][k]
        if times:
            print(f"  {k}: closed after {times[0]:g}-{times[-1]:g} s; first line of the "
                  f"answers: {r['status_lines'][k]}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
