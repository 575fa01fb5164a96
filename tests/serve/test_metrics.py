"""Tests for lab_utils.serve.metrics against a /metrics fixture shaped like vLLM 0.32's output."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from lab_utils.errors import LabError, MetricMissingError
from lab_utils.serve.metrics import (
    HistogramTotals,
    InstanceCounters,
    fetch_metrics,
    parse_prometheus,
    read_counters,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_metrics_sample.txt"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"


@pytest.fixture()
def sample_text() -> str:
    return FIXTURE.read_text()


@pytest.fixture()
def snapshot(sample_text):
    return parse_prometheus(sample_text)


def without_nixl(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "vllm:nixl_" not in line) + "\n"


def test_counter_values_and_total_suffix(snapshot):
    assert snapshot.value("vllm:prompt_tokens_total") == 256
    assert snapshot.value("vllm:generation_tokens_total") == 64
    assert snapshot.value("vllm:num_requests_running") == 1
    assert snapshot.value("vllm:num_requests_waiting") == 0


def test_label_filtering(snapshot):
    assert snapshot.value(BY_SOURCE, source="external_kv_transfer") == 254
    assert snapshot.value(BY_SOURCE, source="local_compute") == 2
    assert snapshot.value(BY_SOURCE, source="local_cache_hit") == 0
    # No label filter: the sum over every source equals the prompt-token counter.
    assert snapshot.value(BY_SOURCE) == snapshot.value("vllm:prompt_tokens_total")
    assert snapshot.value(BY_SOURCE, model_name="tiny-llama", engine="0") == 256
    assert snapshot.value("vllm:request_success_total", finished_reason="length") == 2


def test_label_values_that_match_nothing_raise(snapshot):
    with pytest.raises(MetricMissingError, match="no series has the labels"):
        snapshot.value(BY_SOURCE, source="disk")


def test_sum_over_engines():
    text = (
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 10.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 5.0\n'
    )
    snap = parse_prometheus(text)
    assert snap.value("vllm:generation_tokens_total") == 15
    assert snap.value("vllm:generation_tokens_total", engine=1) == 5


def test_histograms(snapshot):
    assert snapshot.histogram("vllm:nixl_bytes_transferred") == HistogramTotals(524288, 2)
    xfer = snapshot.histogram("vllm:nixl_xfer_time_seconds")
    assert xfer.count == 2
    assert xfer.sum == pytest.approx(0.0073)
    bucket = snapshot.value("vllm:nixl_xfer_time_seconds_bucket", le="+Inf")
    assert bucket == 2
    # A histogram whose own name ends in _total keeps it before _sum/_count.
    assert snapshot.histogram("vllm:iteration_tokens_total").count == 32


def test_missing_metric_names_metric_and_feature(snapshot):
    with pytest.raises(MetricMissingError) as info:
        snapshot.value("vllm:no_such_metric_total")
    assert "vllm:no_such_metric_total" in str(info.value)
    assert "may not export" in str(info.value)


def test_missing_counter_suffix_is_hinted(snapshot):
    with pytest.raises(MetricMissingError, match="vllm:prompt_tokens_total"):
        snapshot.value("vllm:prompt_tokens")


def test_read_counters(snapshot):
    counters = read_counters(snapshot, require_nixl=True)
    assert counters.prompt_tokens_external_kv_transfer == 254
    assert counters.prompt_tokens_local_compute == 2
    assert counters.prompt_tokens_local_cache_hit == 0
    assert counters.nixl_bytes_transferred == 524288
    assert counters.nixl_transfer_count == 2
    assert counters.nixl_transfer_seconds == pytest.approx(0.0073)
    assert (counters.requests_running, counters.requests_waiting) == (1, 0)
    assert (counters.prompt_tokens, counters.generation_tokens) == (256, 64)


def test_nixl_absent_and_required(sample_text):
    snap = parse_prometheus(without_nixl(sample_text))
    with pytest.raises(MetricMissingError) as info:
        read_counters(snap, require_nixl=True)
    message = str(info.value)
    assert "vllm:nixl_bytes_transferred" in message
    assert "NixlConnector" in message


def test_nixl_absent_not_required_gives_zero(sample_text):
    counters = read_counters(parse_prometheus(without_nixl(sample_text)), require_nixl=False)
    assert counters.nixl_bytes_transferred == 0
    assert counters.nixl_transfer_count == 0
    assert counters.nixl_transfer_seconds == 0
    assert counters.prompt_tokens == 256


def test_delta(snapshot):
    after = read_counters(snapshot, require_nixl=True)
    before = replace(
        after,
        prompt_tokens_external_kv_transfer=127,
        prompt_tokens_local_compute=1,
        nixl_bytes_transferred=262144,
        nixl_transfer_count=1,
        nixl_transfer_seconds=0.0042,
        requests_running=0,
        requests_waiting=3,
        prompt_tokens=128,
        generation_tokens=32,
    )
    d = InstanceCounters.delta(after, before)
    assert d == after - before
    assert d.prompt_tokens_external_kv_transfer == 127
    assert d.prompt_tokens_local_compute == 1
    assert d.prompt_tokens_local_cache_hit == 0
    assert d.nixl_bytes_transferred == 262144
    assert d.nixl_transfer_count == 1
    assert d.nixl_transfer_seconds == pytest.approx(0.0031)
    assert (d.prompt_tokens, d.generation_tokens) == (128, 32)
    # Gauges are not differenced: they come from the later reading.
    assert (d.requests_running, d.requests_waiting) == (1, 0)


def test_delta_rejects_a_restart(snapshot):
    after = read_counters(snapshot, require_nixl=True)
    before = replace(after, generation_tokens=1000)
    with pytest.raises(LabError, match="restarted"):
        after - before


def test_fetch_metrics_with_mock_transport(sample_text):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, text=sample_text)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        snap = fetch_metrics("http://127.0.0.3:8400/", client=client)
    assert seen == ["http://127.0.0.3:8400/metrics"]
    assert snap.value("vllm:generation_tokens_total") == 64


def test_fetch_metrics_connection_failure_names_url():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with client, pytest.raises(LabError, match=r"http://127\.0\.0\.2:8300/metrics"):
        fetch_metrics("http://127.0.0.2:8300", client=client)


def test_fetch_metrics_http_error_names_url():
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(404)))
    with client, pytest.raises(LabError, match="8000/metrics answered HTTP 404"):
        fetch_metrics("http://127.0.0.4:8000", client=client)


def test_not_prometheus_text():
    with pytest.raises(LabError, match="not Prometheus text"):
        parse_prometheus("<html><body>hello</body></html>\n")


def test_fetch_metrics_asks_again_after_a_timeout(sample_text):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.extensions["timeout"]["read"])
        if len(calls) == 1:  # the machine stood still: the first reading timed out
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, text=sample_text)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        snap = fetch_metrics("http://127.0.0.3:8400", client=client, timeout=2.0)
    assert calls == [2.0, 2.0]
    assert snap.value("vllm:generation_tokens_total") == 64


@pytest.mark.parametrize(("error", "attempts", "said"), [
    (httpx.ConnectTimeout, 3, r"8400/metrics did not answer: 3 attempts of 5 s"),
    (httpx.ConnectError, 1, "Could not read"),  # refused: the instance is down, no retry
])
def test_fetch_metrics_gives_up(error, attempts, said):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise error("no", request=request)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with client, pytest.raises(LabError, match=said):
        fetch_metrics("http://127.0.0.3:8400", client=client)
    assert len(calls) == attempts
