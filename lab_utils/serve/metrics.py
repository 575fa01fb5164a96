"""Read the Prometheus `/metrics` text of one vLLM instance and pull out the lab's counters.

`fetch_metrics` downloads the text, `parse_prometheus` turns it into a `MetricsSnapshot`
that answers "sum of this sample over the series whose labels match", and `read_counters`
collects the handful of numbers the lab compares between runs into an `InstanceCounters`,
whose difference between two readings is what one request (or one benchmark) cost.
Names follow vLLM 0.32: counters carry the `_total` suffix, every series carries the labels
`model_name` and `engine`, and the NIXL numbers are histograms (`_sum`, `_count`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, fields

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lab_utils.errors import LabError, MetricMissingError

_NIXL_NOTE = (
    "vLLM's NixlConnector. vLLM 0.32 registers the vllm:nixl_* series when an instance "
    "starts with --kv-transfer-config naming NixlConnector (all zero until the first "
    "transfer); an instance started without that connector, or a vLLM release from before "
    "the connector had Prometheus metrics, does not export them. Transfers are counted on "
    "the instance that drives them: the decode instance with NixlConnector (it reads), the "
    "prefill instance with NixlPushConnector"
)
_SOURCE_NOTE = (
    "vLLM's prompt-token accounting by source (labels source=local_compute, "
    "local_cache_hit, external_kv_transfer); older vLLM releases do not export it"
)
_CORE_NOTE = (
    "vLLM's built-in Prometheus stat logger; if no vllm:* metric is present at all, the "
    "server was started with --disable-log-stats"
)


def _feature_of(name: str) -> str:
    if name.startswith("vllm:nixl_"):
        return _NIXL_NOTE
    if name.startswith("vllm:prompt_tokens_by_source"):
        return _SOURCE_NOTE
    return _CORE_NOTE


@dataclass(frozen=True)
class Sample:
    """One exposed sample: its full name (with `_total`, `_sum`, ...), labels and value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class HistogramTotals:
    """The `_sum` and `_count` of a histogram, summed over the matching series."""

    sum: float
    count: float


class MetricsSnapshot:
    """The samples of one `/metrics` reading, looked up by exact sample name and labels."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.samples = tuple(samples)
        self.names = frozenset(s.name for s in self.samples)

    def has(self, name: str) -> bool:
        return name in self.names

    def value(self, name: str, **labels: object) -> float:
        """Sum of the samples called `name` whose labels include all of `labels`."""
        if name not in self.names:
            raise MetricMissingError(self._missing_message(name))
        wanted = {key: str(val) for key, val in labels.items()}
        matching = [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items())
        ]
        if not matching:
            seen = sorted({str(s.labels) for s in self.samples if s.name == name})
            raise MetricMissingError(
                f"Metric {name!r} is exported, but no series has the labels {wanted}. "
                f"Series present: {', '.join(seen)}. It is produced by {_feature_of(name)}."
            )
        return float(sum(matching))

    def histogram(self, name: str, **labels: object) -> HistogramTotals:
        """`_sum` and `_count` of histogram `name` (given without those suffixes)."""
        if not (self.has(name + "_sum") and self.has(name + "_count")):
            raise MetricMissingError(self._missing_message(name))
        return HistogramTotals(
            sum=self.value(name + "_sum", **labels), count=self.value(name + "_count", **labels)
        )

    def _missing_message(self, name: str) -> str:
        hint = ""
        if self.has(name + "_total"):
            hint = f" Counters are exported with a _total suffix: ask for {name + '_total'!r}."
        elif name.endswith("_total") and self.has(name.removesuffix("_total")):
            hint = f" This one is exported without _total: ask for {name.removesuffix('_total')!r}."
        return (
            f"Metric {name!r} is not in this /metrics output.{hint} It is produced by "
            f"{_feature_of(name)}. This vLLM version may not export it under that name; "
            "compare with the names the instance's /metrics page lists."
        )


def parse_prometheus(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition format (as served at `/metrics`)."""
    try:
        samples = [
            Sample(name=s.name, labels=dict(s.labels), value=float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except ValueError as exc:
        raise LabError(
            f"This is not Prometheus text ({exc}). Point at a vLLM instance's /metrics."
        ) from exc
    return MetricsSnapshot(samples)


@dataclass(frozen=True)
class InstanceCounters:
    """The numbers the lab reads from one instance. Gauges are the current value;
    everything else is a counter (since the instance started) until `delta` is taken."""

    prompt_tokens_local_compute: float
    prompt_tokens_local_cache_hit: float
    prompt_tokens_external_kv_transfer: float
    nixl_bytes_transferred: float
    nixl_transfer_count: float
    nixl_transfer_seconds: float
    requests_running: float
    requests_waiting: float
    prompt_tokens: float
    generation_tokens: float

    GAUGES = frozenset({"requests_running", "requests_waiting"})

    def delta(self, before: InstanceCounters) -> InstanceCounters:
        """Counters as `self - before`; gauges as in `self`."""
        values = {}
        for field in fields(InstanceCounters):
            new, old = getattr(self, field.name), getattr(before, field.name)
            gauge = field.name in InstanceCounters.GAUGES
            if not gauge and new < old:
                raise LabError(
                    f"Counter {field.name} went down ({old} -> {new}): the vLLM instance "
                    "restarted between the two readings. Take both readings from one run."
                )
            values[field.name] = new if gauge else new - old
        return InstanceCounters(**values)

    __sub__ = delta

    def __add__(self, other: InstanceCounters) -> InstanceCounters:
        """Summed over instances (gauges too: requests running anywhere)."""
        return InstanceCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                   for f in fields(InstanceCounters)})


def read_counters(snapshot: MetricsSnapshot, *, require_nixl: bool) -> InstanceCounters:
    """Collect `InstanceCounters`, summed over engines. NIXL numbers are 0 when absent
    unless `require_nixl`, in which case their absence raises `MetricMissingError`."""
    by_source = "vllm:prompt_tokens_by_source_total"

    def nixl(name: str) -> HistogramTotals:
        if require_nixl or snapshot.has(name + "_sum"):
            return snapshot.histogram(name)
        return HistogramTotals(sum=0.0, count=0.0)

    transferred = nixl("vllm:nixl_bytes_transferred")
    return InstanceCounters(
        prompt_tokens_local_compute=snapshot.value(by_source, source="local_compute"),
        prompt_tokens_local_cache_hit=snapshot.value(by_source, source="local_cache_hit"),
        prompt_tokens_external_kv_transfer=snapshot.value(by_source, source="external_kv_transfer"),
        nixl_bytes_transferred=transferred.sum,
        nixl_transfer_count=transferred.count,
        nixl_transfer_seconds=nixl("vllm:nixl_xfer_time_seconds").sum,
        requests_running=snapshot.value("vllm:num_requests_running"),
        requests_waiting=snapshot.value("vllm:num_requests_waiting"),
        prompt_tokens=snapshot.value("vllm:prompt_tokens_total"),
        generation_tokens=snapshot.value("vllm:generation_tokens_total"),
    )


def fetch_metrics(
    url: str, client: httpx.Client | None = None, timeout: float = 5.0, attempts: int = 3
) -> MetricsSnapshot:
    """GET `<url>/metrics` from a vLLM instance (url like `http://127.0.0.2:8300`).

    A reading that times out is asked for again, up to `attempts` times: the GET changes
    nothing, and a timeout is most often the machine standing still (lab_utils.measure.stalls),
    not the instance. A refused connection or an HTTP error fails at once."""
    target = url.rstrip("/") + "/metrics"
    t0 = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            if client is None:
                with httpx.Client(timeout=timeout) as own_client:
                    response = own_client.get(target)
            else:
                response = client.get(target, timeout=timeout)
            response.raise_for_status()
            break
        except httpx.TimeoutException as exc:
            if attempt < attempts:
                continue
            raise LabError(
                f"{target} did not answer: {attempts} attempts of {timeout:g} s each timed out "
                f"({time.monotonic() - t0:.0f} s in all; last: {exc!r}). Is the vLLM instance "
                "running and ready? Check its log, and whether the machine is overloaded."
            ) from exc
        except httpx.HTTPStatusError as exc:
            raise LabError(
                f"{target} answered HTTP {exc.response.status_code}. Check that this URL is a "
                "vLLM OpenAI server (it serves /metrics) and not the proxy or another service."
            ) from exc
        except httpx.HTTPError as exc:
            raise LabError(
                f"Could not read {target}: {exc!r}. Is the vLLM instance running and ready? "
                "Check its log, and that host and port match the config."
            ) from exc
    return parse_prometheus(response.text)
