"""libtpu's runtime metric service (gRPC ``tpu.monitoring.runtime.RuntimeMetricService``).

libtpu serves it at localhost:8431 (one port per process, 8431-8434) while a
workload runs; with none, calls answer UNAVAILABLE, which means "no data".
The generated stubs come from PyPI's tpu-info (the ``tpu`` extra).  Parsing
(``parse_metric``) is pure and separate from the calls (``RuntimeClient``).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeMetric:
    """How one libtpu metric becomes one DeviceReading field."""

    name: str
    attribute: str
    scale: float                       # multiply the raw value by this: percent -> ratio, us -> s
    per_core: bool                     # ordinals are TensorCores (else chips)
    combine: Callable[[list[float]], float]  # the cores of one chip -> one value


RUNTIME_METRICS = (
    RuntimeMetric("tpu.runtime.hbm.memory.usage.bytes", "memory_used_bytes", 1.0, True, sum),
    RuntimeMetric("tpu.runtime.hbm.memory.total.bytes", "memory_total_bytes", 1.0, True, sum),
    RuntimeMetric("tpu.runtime.tensorcore.dutycycle.percent", "utilization_ratio", 0.01, False, statistics.fmean),
    RuntimeMetric("tpu.runtime.hbm.utilization.percent", "memory_bandwidth_utilization_ratio", 0.01, True,
                  statistics.fmean),
    RuntimeMetric("tpu.runtime.tensorcore.idle_duration.seconds", "tensorcore_idle_seconds", 1.0, True, min),
    RuntimeMetric("hlo.queue.size.gauge", "hlo_queue_size", 1.0, True, sum),
    RuntimeMetric("hlo.execution.timing.distribution.microseconds", "hlo_execution_mean_seconds", 1e-6, True,
                  statistics.fmean),
)


class MalformedMetric(ValueError):
    """An answer that does not have the shape libtpu gives."""


def _ordinal(metric: Any) -> int:
    """The device ordinal of one per-device entry: an int attribute, or device_ordinal in a key-value list."""
    value = metric.attribute.value
    kind = value.WhichOneof("attr")
    if kind == "int_attr":
        return int(value.int_attr)
    if kind == "kvlist_attr":
        for attr in value.kvlist_attr.attributes:
            if attr.key == "device_ordinal":
                inner = attr.value.WhichOneof("attr")
                if inner == "int_attr":
                    return int(attr.value.int_attr)
                if inner == "string_attr" and attr.value.string_attr.isdigit():
                    return int(attr.value.string_attr)
                raise MalformedMetric(f"device_ordinal is {inner} {getattr(attr.value, inner or 'string_attr')!r}")
        raise MalformedMetric("no device_ordinal attribute")
    raise MalformedMetric(f"device attribute is {kind or 'missing'}")


def _value(metric: Any) -> float:
    measure = metric.WhichOneof("measure")
    if measure == "gauge":
        kind = metric.gauge.WhichOneof("value")
        if kind in ("as_int", "as_double"):
            return float(getattr(metric.gauge, kind))
        raise MalformedMetric(f"gauge holds {kind or 'nothing'}")
    if measure == "distribution":
        if metric.distribution.count == 0:
            raise MalformedMetric("empty distribution")
        return float(metric.distribution.mean)
    raise MalformedMetric(f"measure is {measure or 'missing'}")


def parse_metric(response: Any, spec: RuntimeMetric) -> dict[int, float]:
    """Scaled values by device ordinal from one MetricResponse; MalformedMetric if it is not libtpu's shape."""
    if response.metric.name and response.metric.name != spec.name:
        raise MalformedMetric(f"answer is for {response.metric.name!r}")
    values: dict[int, float] = {}
    for metric in response.metric.metrics:
        ordinal = _ordinal(metric)
        if ordinal in values:
            raise MalformedMetric(f"device ordinal {ordinal} appears twice")
        values[ordinal] = _value(metric) * spec.scale
    return values


def values_by_chip(values: dict[int, float], spec: RuntimeMetric, cores_per_chip: int) -> dict[int, float]:
    """Per-ordinal values folded into per-chip values (chip = core ordinal // cores per chip)."""
    per_chip: dict[int, list[float]] = {}
    for ordinal, value in sorted(values.items()):
        per_chip.setdefault(ordinal // cores_per_chip if spec.per_core else ordinal, []).append(value)
    return {chip: spec.combine(found) for chip, found in per_chip.items()}


@dataclass
class AddressAnswer:
    """What one runtime address said: values per metric (by ordinal), and a status sentence."""

    address: str
    status: str
    values: dict[str, dict[int, float]] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        """True when at least one metric answered."""
        return bool(self.values)


_CHANNEL_OPTIONS = [  # reconnect soon after a workload starts, not after gRPC's 2-minute backoff
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
]


class RuntimeClient:
    """Asks every configured address for every runtime metric, each call with a deadline."""

    def __init__(self, addresses: list[str], timeout: float) -> None:
        self.addresses = addresses
        self.timeout = timeout
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []
        self._logged: set[tuple[str, str, str]] = set()
        try:
            import grpc
            from tpu_info.proto import tpu_metric_service_pb2, tpu_metric_service_pb2_grpc
        except ImportError as exc:
            self.missing: str | None = f"runtime metrics client not installed ({exc.name}): pip install tpuwatch[tpu]"
            return
        self.missing = None
        self._grpc, self._pb2, self._pb2_grpc = grpc, tpu_metric_service_pb2, tpu_metric_service_pb2_grpc

    def fetch(self) -> list[AddressAnswer]:
        """One answer per address; every metric of every address is asked at once and waited for together."""
        if self.missing is not None:
            return [AddressAnswer(address, self.missing) for address in self.addresses]
        pending = {(address, spec.name): self._stub(address).GetRuntimeMetric.future(
            self._pb2.MetricRequest(metric_name=spec.name), timeout=self.timeout)
            for address in self.addresses for spec in RUNTIME_METRICS}
        return [self._answer(address, pending) for address in self.addresses]

    def _stub(self, address: str) -> Any:
        if address not in self._stubs:
            channel = self._grpc.secure_channel(address, self._grpc.local_channel_credentials(),
                                                options=_CHANNEL_OPTIONS)
            self._channels.append(channel)
            self._stubs[address] = self._pb2_grpc.RuntimeMetricServiceStub(channel)
        return self._stubs[address]

    def close(self) -> None:
        """Close the kept channels."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _answer(self, address: str, pending: dict[tuple[str, str], Any]) -> AddressAnswer:
        answer = AddressAnswer(address, "ok")
        failures: list[str] = []
        for spec in RUNTIME_METRICS:
            try:
                answer.values[spec.name] = parse_metric(pending[(address, spec.name)].result(), spec)
            except self._grpc.RpcError as exc:
                failures.append(exc.code().name)
                if exc.code() not in (self._grpc.StatusCode.UNAVAILABLE, self._grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._log_once(address, spec.name, f"{exc.code().name}: {exc.details()}")
            except MalformedMetric as exc:
                failures.append("malformed")
                self._log_once(address, spec.name, f"malformed answer: {exc}")
        if not answer.has_data:
            answer.status = _no_data_status(failures, self.timeout)
        elif failures:
            answer.status = f"ok, {len(failures)} of {len(RUNTIME_METRICS)} metrics missing"
        return answer

    def _log_once(self, address: str, metric: str, problem: str) -> None:
        if (address, metric, problem) not in self._logged:
            self._logged.add((address, metric, problem))
            log.warning("libtpu runtime at %s: %s: %s (logged once)", address, metric, problem)


def _no_data_status(failures: list[str], timeout: float) -> str:
    if all(code == "UNAVAILABLE" for code in failures):
        return "no runtime answering (UNAVAILABLE: no workload running libtpu)"
    if "DEADLINE_EXCEEDED" in failures:
        return f"no answer within {timeout:g}s (DEADLINE_EXCEEDED)"
    return "no usable answer (" + ", ".join(sorted(set(failures))) + ")"
