"""bench.proxy's load generator: wrk with wrk_requests.lua. The P/D direct path must send each
decode with the kv_transfer_params of its own connection's prefill answer, count one
logical request per prefill+decode pair, and report failures; the verdicts must follow the
figures."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lab_utils.bench.proxy import judge, run_wrk, wrk_argv

HOST = "127.0.0.7"


class Recorder(BaseHTTPRequestHandler):
    """Prefill calls get a unique engine id; decode calls are recorded with the params
    they carried. A prompt starting with 13 gets HTTP 500."""

    protocol_version = "HTTP/1.1"
    issued: list[str] = []
    decodes: list[dict] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status, out = 200, {"choices": [{"text": "t"}]}
        if body["prompt"][0] == 13:
            status = 500
        elif (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            with self.lock:
                engine = f"e{len(self.issued)}"
                self.issued.append(engine)
            assert body["stream"] is False and body["max_tokens"] == 1
            out["kv_transfer_params"] = {"remote_engine_id": engine, "remote_block_ids": [[1, 2]],
                                         "nested": {"a": {"b": 1}}}
        else:
            with self.lock:
                self.decodes.append(body)
        raw = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recorder():
    if not shutil.which("wrk"):
        pytest.skip("wrk is not installed: run bash tests/ensure_sysdeps.sh (it installs wrk)")
    Recorder.issued, Recorder.decodes = [], []
    srv = ThreadingHTTPServer((HOST, 0), Recorder)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://{HOST}:{srv.server_address[1]}/v1/completions"
    srv.shutdown()
    srv.server_close()


def test_direct_pd_sends_each_decode_its_own_prefills_params(recorder):
    res = run_wrk(wrk_argv(recorder, 3, 1, direct_pd=True))
    assert res["errors"] == 0 and res["requests"] > 10
    decodes = Recorder.decodes
    # every completed pair was counted once; up to one pair per connection was cut off
    assert res["requests"] <= len(decodes) <= res["requests"] + 3
    carried = [d["kv_transfer_params"] for d in decodes]
    assert all(p["remote_block_ids"] == [[1, 2]] and p["nested"] == {"a": {"b": 1}} for p in carried)
    engines = [p["remote_engine_id"] for p in carried]
    assert len(set(engines)) == len(engines) and set(engines) <= set(Recorder.issued)
    assert all(d["stream"] is True and d["max_tokens"] == 3 for d in decodes)
    assert res["p50_ms"] > 0 and res["p99_ms"] >= res["p50_ms"] and res["client_cpu_s"] > 0


def test_single_requests_and_failures_are_reported(recorder):
    res = run_wrk(wrk_argv(recorder, 2, 1, direct_pd=False))
    assert res["errors"] == 0 and 0 < res["requests"] <= len(Recorder.decodes) <= res["requests"] + 2
    assert not Recorder.issued  # no prefill calls on the single path
    argv = wrk_argv(recorder, 1, 1, direct_pd=False)
    argv[-1] = argv[-1].replace("[1, 2, 3]", "[13, 2, 3]")
    with pytest.raises(RuntimeError, match=r"failed of .* requests; last: 500"):
        run_wrk(argv, name="failing")


def _row(target: str, conc: int, rps: float, a50: float = 0.0, a99: float = 0.0) -> dict:
    return {"mode": "disaggregated", "concurrency": conc, "target": target, "rps": rps,
            "added_p50_ms": a50, "added_p99_ms": a99}


def test_verdicts_follow_the_figures():
    rows = [_row("direct", 1, 1000), _row("lab proxy", 1, 900, 0.4, 1.5),
            _row("direct", 8, 1000), _row("lab proxy", 8, 850), _row("vLLM toy proxy", 8, 900),
            _row("direct", 64, 500), _row("lab proxy", 64, 600)]
    out = "\n".join(judge(rows))
    assert "c=1: direct is the fastest row" in out
    assert "added p50 0.40 ms (goal < 0.5), added p99 1.50 ms (goal < 2.0): met" in out
    assert "850 req/s = 0.85x direct (goal >= 0.8), toy proxy 900 req/s: MISSED" in out
    assert "c=64: direct is NOT the fastest row (lab proxy served more requests/s)" in out
    assert "600 req/s = 1.20x direct (goal >= 0.8): met" in out
