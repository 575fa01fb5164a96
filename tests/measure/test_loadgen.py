"""The load generator against a deterministic streaming server (own process) with known
TTFT and ITL: the metrics match, token counts come from the server's usage, failures are
counted rather than raised, invalid points say so, Poisson arrivals keep to schedule."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
from pathlib import Path

import pytest

from lab_utils.bench.stub_server import spawn_until_up
from lab_utils.config import WorkloadConfig
from lab_utils.measure.benchmark import combine, read_together_share, summarize
from lab_utils.measure.loadgen import RequestSpec, TokenReader, arrival_offsets, run_point
from lab_utils.on_node.proctools import stop_group
from lab_utils.results.sweep import RepeatSummary, RequestRecord

from support.fakes import free_port

ADDR = "127.0.0.6"
TTFT_MS, ITL_MS = 40.0, 15.0


def start_server(ttft_ms: float, itl_ms: float, timing_file: Path | None = None):
    port = free_port(ADDR)
    argv = [sys.executable, "-m", "lab_utils.bench.stub_server", ADDR, str(port),
            str(ttft_ms), str(itl_ms)] + ([str(timing_file)] if timing_file else [])
    url = f"http://{ADDR}:{port}"
    return spawn_until_up(argv, f"{url}/v1/completions"), url


TIMING = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    TIMING["file"] = tmp_path_factory.mktemp("timing") / "server_timing.jsonl"
    (pid, ticks), url = start_server(TTFT_MS, ITL_MS, TIMING["file"])
    yield url
    stop_group(pid, ticks, 5)


def specs(n: int, out: int = 8, first: int = 1) -> list[RequestSpec]:
    rng = random.Random(0)
    return [RequestSpec([first] + [rng.randrange(3, 500) for _ in range(rng.randrange(5, 40))], out)
            for _ in range(n)]


def test_metrics_match_the_server_timing(server):
    reqs = specs(12)
    records, wall = asyncio.run(run_point(server, "m", reqs, concurrency=1, warmup=2,
                                          show_progress=False))
    assert len(records) == 10 and all(r.ok for r in records)
    truth = {}
    for line in TIMING["file"].read_text().splitlines():
        t = json.loads(line)
        truth[tuple(t["prompt"])] = t
    ttft_gaps, itl_gaps = [], []
    for r, spec in zip(records, reqs[2:], strict=True):
        assert r.prompt_tokens == len(spec.prompt_ids) == r.prompt_len
        assert r.completion_tokens == 8 and len(r.itl_ms) == 7
        real = truth[tuple(spec.prompt_ids)]
        ttft_gaps.append(r.ttft_ms - real["ttft_ms"])
        itl_gaps += [mine - theirs for mine, theirs in zip(r.itl_ms, real["itl_ms"], strict=True)]
        assert r.tpot_ms == pytest.approx(sum(r.itl_ms) / 7)  # first token to last
        assert r.e2el_ms > r.ttft_ms + sum(r.itl_ms)  # the stream ends after the last token
    # The client's TTFT is the server's plus one loopback round trip; its inter-token
    # gaps are the server's. Medians, so one scheduling hiccup on a busy machine does
    # not decide the verdict; the spread is printed for the record.
    print(f"TTFT client-server ms: {sorted(round(g, 2) for g in ttft_gaps)}")
    assert 0 <= statistics.median(ttft_gaps) < 1.0
    assert abs(statistics.median(itl_gaps)) < 1.0
    s = summarize(records, wall, WorkloadConfig(max_failed_fraction=0.0))
    assert abs(s.median_ttft_ms - TTFT_MS) < 3.0 and abs(s.median_itl_ms - ITL_MS) < 3.0
    assert s.completed == 10 and s.failed == 0 and s.valid
    assert s.total_output_tokens == 80 and s.total_input_tokens == sum(map(len, (x.prompt_ids for x in reqs[2:])))
    assert s.output_throughput == pytest.approx(80 / wall)
    assert s.request_throughput == pytest.approx(10 / wall)


def test_chat_stream_counts_content_deltas_not_the_role_chunk(server):
    reqs = [RequestSpec([1] * 5, 6, prompt_text="one two three four five") for _ in range(3)]
    records, _ = asyncio.run(run_point(server, "m", reqs, concurrency=1, chat=True, show_progress=False))
    assert all(r.ok for r in records), [r.error for r in records]
    for r in records:
        # the role-only first chunk is not a token: TTFT waits for the first content
        assert r.ttft_ms >= TTFT_MS and len(r.itl_ms) == 5 and r.completion_tokens == 6
        assert r.prompt_tokens == 5
        assert abs(statistics.median(r.itl_ms) - ITL_MS) < 5.0


def test_failures_are_counted_not_raised(server):
    reqs = specs(6) + specs(4, first=13)  # the last four get HTTP 500
    records, wall = asyncio.run(run_point(server, "m", reqs, concurrency=4, show_progress=False))
    assert [r.ok for r in records] == [True] * 6 + [False] * 4
    assert all("HTTP 500" in r.error for r in records[6:])
    s = summarize(records, wall, WorkloadConfig(max_failed_fraction=0.1))
    assert (s.completed, s.failed) == (6, 4)
    assert not s.valid and "4 of 10 requests failed" in s.invalid_reason
    assert s.errors and "injected failure" in s.errors[0]
    assert summarize(records, wall, WorkloadConfig(max_failed_fraction=0.5)).valid


def test_refused_connection_is_an_error_record():
    dead = f"http://{ADDR}:{free_port(ADDR)}"
    records, wall = asyncio.run(run_point(dead, "m", specs(3), concurrency=1, show_progress=False))
    assert len(records) == 3 and not any(r.ok for r in records)
    s = summarize(records, wall, WorkloadConfig())
    assert not s.valid and s.completed == 0


def test_poisson_arrivals_keep_schedule(server):
    offsets = arrival_offsets(2000, rate=50.0, burstiness=1.0, rng=random.Random(1))
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(1 / 50, rel=0.15)  # exponential: sd = mean
    bursty = arrival_offsets(2000, rate=50.0, burstiness=0.25, rng=random.Random(1))
    assert statistics.stdev(b - a for a, b in zip(bursty, bursty[1:], strict=False)) > 1.5 / 50

    records, wall = asyncio.run(run_point(server, "m", specs(20, out=2), rate=40.0, seed=3,
                                          show_progress=False))
    assert all(r.ok for r in records)
    expected = arrival_offsets(20, 40.0, 1.0, random.Random(3))
    assert [r.scheduled_s for r in records] == pytest.approx(expected)
    assert max(r.sent_s - r.scheduled_s for r in records) < 0.05


def test_duration_stops_new_requests(server):
    records, wall = asyncio.run(run_point(server, "m", specs(200), concurrency=2,
                                          duration_s=0.5, show_progress=False))
    assert 2 <= len(records) < 40 and all(r.ok for r in records)
    assert wall < 2.0


def test_combine_reports_median_and_spread():
    runs = [RepeatSummary(median_ttft_ms=v, output_throughput=10 * v) for v in (10, 14, 11)]
    c = combine(runs, "concurrency", 2.0)
    assert c.median_ttft_ms.median == 11 and c.median_ttft_ms.spread == 4
    assert c.output_throughput.min == 100 and c.valid and c.repeats == 3
    assert (c.mode, c.value, c.mixed, c.median_ttft_ms.n) == ("concurrency", 2.0, False, 3)
    assert c.p99_itl_ms is None  # not measured
    assert not combine(runs + [RepeatSummary(valid=False, median_ttft_ms=1)], "rate", 1.0).valid


def sse(msg: dict) -> bytes:
    return b"data: " + json.dumps(msg).encode() + b"\n\n"


def test_tokens_that_arrive_in_one_read_are_counted_as_read_together():
    rec = RequestRecord(0, 5, 4)
    reader = TokenReader(rec, 10.0)  # sent at t = 10 s
    # the first token ends mid-character: its event has no text, and it is the first token
    reader.feed(sse({"choices": [{"text": ""}]}), 10.040)
    # one token, an event without a choice (not a token), and the first part of the next
    third = sse({"choices": [{"text": "c"}]})
    reader.feed(sse({"choices": [{"text": "b"}]}) + sse({"choices": []}) + third[:9], 10.055)
    reader.feed(third[9:] + sse({"choices": [{"text": "d"}]}), 10.070)  # c completes; d came with it
    reader.feed(sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
                + b"data: [DONE]\n\n", 10.071)
    assert rec.ttft_ms == pytest.approx(40.0)
    assert rec.itl_ms == pytest.approx([15.0, 15.0, 0.0]) and rec.read_together == 1
    assert (rec.prompt_tokens, rec.completion_tokens) == (5, 4)
    with pytest.raises(RuntimeError, match="error event"):
        reader.feed(sse({"error": {"message": "decode died"}}), 10.08)

    rec.e2el_ms, rec.tpot_ms = 71.0, 10.3
    assert "ITL  median 15.00 ms, max 15.00 ms (3 gaps; 1 of them 0 ms: tokens the client read" in rec.describe()
    steady = RequestRecord(1, 5, 4, ttft_ms=40.0, itl_ms=[15.0, 15.0, 15.0], e2el_ms=85.0, tpot_ms=15.0,
                           prompt_tokens=5, completion_tokens=4)
    s = summarize([rec, steady], 1.0, WorkloadConfig())
    assert s.itl_read_together_fraction == pytest.approx(1 / 6)
    assert read_together_share(s) == pytest.approx(1 / 6)
    assert summarize([steady], 1.0, WorkloadConfig()).itl_read_together_fraction == 0.0
    assert read_together_share(summarize([steady], 1.0, WorkloadConfig())) is None


def test_a_chat_streams_role_event_is_not_a_token():
    rec = RequestRecord(0, 5, 2)
    reader = TokenReader(rec, 0.0)
    reader.feed(sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 0.030)
    reader.feed(sse({"choices": [{"delta": {"content": ""}}]}), 0.040)  # a byte: still a token
    reader.feed(sse({"choices": [{"delta": {"content": "é"}}]}), 0.052)
    assert rec.ttft_ms == pytest.approx(40.0) and rec.itl_ms == pytest.approx([12.0])


def test_workload_prompts_are_exact_seeded_and_mixed():
    from lab_utils.errors import LabError
    from lab_utils.measure.workload import build_requests

    def tokenize(text: str) -> list[int]:  # one token per character
        return [ord(c) for c in text]

    w = WorkloadConfig(input_len=50, output_len=7, mixed_long_len=300, mixed_long_every=4, seed=5)
    a = build_requests(w, 9, tokenize)
    assert [len(s.prompt_ids) for s in a] == [50] * 9 and {s.max_tokens for s in a} == {7}
    assert [s.prompt_ids for s in build_requests(w, 9, tokenize)] == [s.prompt_ids for s in a]
    assert build_requests(w, 1, tokenize, seed=6)[0].prompt_ids != a[0].prompt_ids
    mixed = build_requests(w, 9, tokenize, mixed=True)
    assert [len(s.prompt_ids) for s in mixed] == [300, 50, 50, 50, 300, 50, 50, 50, 300]
    with pytest.raises(LabError, match="mixed_long_len"):
        build_requests(WorkloadConfig(), 2, tokenize, mixed=True)


def test_the_load_generator_and_the_bench_command_send_the_api_key(test_cfg, tmp_path, monkeypatch):
    """Through a proxy that wants a key: with it (given, from --api-key-file, from
    $OPENAI_API_KEY) every request and the tokenizer's get through; without it, 401."""
    from lab_utils.cli import main
    from lab_utils.serve.proxy import ProxySettings, create_app

    from support.fakes import FakeBackend, ServerThread
    from support.profiles import write_secret

    fake = FakeBackend()
    with ServerThread(fake.app, "127.0.0.5") as backend, \
            ServerThread(create_app(ProxySettings("replicated", backends=[backend.url],
                                                  api_key="k3y")), ADDR) as proxy:
        one = [RequestSpec([1, 2, 3], 2)]
        ok, _ = asyncio.run(run_point(proxy.url, "fake", one, concurrency=1, api_key="k3y",
                                      show_progress=False))
        refused, _ = asyncio.run(run_point(proxy.url, "fake", one, concurrency=1, show_progress=False))
        assert ok[0].ok, ok[0].error
        assert refused[0].error.startswith("HTTP 401")
        bench = ["bench", "--config", str(test_cfg.source), "--url", proxy.url, "--concurrency", "1",
                 "--num-prompts", "2", "--warmup", "0", "--repeats", "1", "--input-len", "6",
                 "--output-len", "2"]
        key = write_secret(tmp_path / "api_key", "k3y")
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        assert main([*bench, "--api-key-file", str(key), "--out", str(tmp_path / "a.json")]) == 0
        assert main([*bench, "--out", str(tmp_path / "b.json")]) != 0
        monkeypatch.setenv("OPENAI_API_KEY", "k3y")
        assert main([*bench, "--out", str(tmp_path / "c.json")]) == 0
    assert (tmp_path / "a.json").exists() and (tmp_path / "c.json").exists()
    assert len(fake.requests) == 1 + 2 + 2  # /tokenize is not a completion: only these


def test_an_itl_slo_counts_a_request_by_its_largest_token_gap():
    from lab_utils.config.parts import SLOConfig
    from lab_utils.results.sweep import RequestRecord

    def rec(i, gaps):
        return RequestRecord(index=i, prompt_len=4, max_tokens=4, sent_s=0.0, ttft_ms=10.0,
                             itl_ms=gaps, e2el_ms=10.0 + sum(gaps), tpot_ms=sum(gaps) / 3,
                             prompt_tokens=4, completion_tokens=4)
    records = [rec(0, [5.0, 5.0, 5.0]), rec(1, [1.0, 40.0, 1.0])]  # same TPOT, one long gap
    by_tpot = summarize(records, 1.0, WorkloadConfig(slo=SLOConfig(tpot_ms=20.0)))
    by_gap = summarize(records, 1.0, WorkloadConfig(slo=SLOConfig(tpot_ms=20.0, itl_ms=20.0)))
    assert by_tpot.request_goodput == pytest.approx(2.0)
    assert by_gap.request_goodput == pytest.approx(1.0)
    assert summarize(records, 1.0, WorkloadConfig(slo=SLOConfig(itl_ms=50.0))).request_goodput == 2.0
