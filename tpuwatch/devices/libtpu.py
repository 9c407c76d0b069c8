"""libtpu's runtime metric service (gRPC ``tpu.monitoring.runtime.RuntimeMetricService``): the calls.

libtpu serves it at localhost:8431 while a workload runs (a workload set up
with TPU_RUNTIME_METRICS_PORTS serves one port per process); with none,
calls answer UNAVAILABLE, which means "no data".  Each address is asked
``ListSupportedMetrics`` once (again after an error) and then only for the
metrics it offers: older libtpu has no HLO metrics (tpu-info: they need
libtpu >= 0.0.17) and a single-slice workload no megascale ones.  Each read
also asks ``GetTpuRuntimeStatus`` (the cores' sequencers, queued programs and
error messages, as tpu-info's ``get_tpuz_info`` does); a runtime that answers
UNIMPLEMENTED (older libtpu) is not asked again until it is listed again, and
its status is absent, not an error.  The generated stubs come from PyPI's
tpu-info (the ``tpu`` extra); parsing is in ``tpuwatch.devices.runtime`` and
``tpuwatch.devices.tpustatus``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tpuwatch.devices.runtime import KNOWN_METRICS, Entry, MalformedMetric, parse_response
from tpuwatch.devices.tpustatus import CoreStatus, parse_status
from tpuwatch.logsetup import Once

log = logging.getLogger(__name__)

MAX_LOGGED = 256  # distinct (address, metric, problem) warnings remembered, so that each is logged once


@dataclass
class AddressAnswer:
    """What one runtime address said: entries per metric, and a status sentence."""

    address: str
    status: str
    entries: dict[str, list[Entry]] = field(default_factory=dict)
    cores: list[CoreStatus] | None = None  # the runtime status, where the runtime gave it

    @property
    def has_data(self) -> bool:
        """True when at least one metric answered."""
        return bool(self.entries)


_CHANNEL_OPTIONS = [  # reconnect soon after a workload starts, not after gRPC's 2-minute backoff
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
]
_NO_RUNTIME = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
_QUIET = (*_NO_RUNTIME, "NOT_FOUND")  # a metric this runtime does not have now: not worth a warning


class RuntimeClient:
    """Asks every configured address for the metrics it offers, all calls of a read under one deadline."""

    def __init__(self, addresses: list[str], timeout: float) -> None:
        self.addresses = addresses
        self.timeout = timeout
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []
        self._logged = Once(MAX_LOGGED)
        self._offered: dict[str, frozenset[str]] = {}  # address -> known metrics it lists
        self._no_status: set[str] = set()  # addresses whose runtime answered GetTpuRuntimeStatus UNIMPLEMENTED
        try:
            import grpc
            from tpu_info.proto import tpu_metric_service_pb2, tpu_metric_service_pb2_grpc
        except ImportError as exc:
            self.missing: str | None = (f"libtpu's runtime metrics cannot be read: {exc.name} is not installed "
                                        "(pip install 'tpuwatch[tpu]')")
            return
        self.missing = None
        self._grpc, self._pb2, self._pb2_grpc = grpc, tpu_metric_service_pb2, tpu_metric_service_pb2_grpc

    def fetch(self) -> list[AddressAnswer]:
        """One answer per address, in configured order."""
        if self.missing is not None:
            return [AddressAnswer(address, self.missing) for address in self.addresses]
        deadline = time.monotonic() + self.timeout
        answers = self._list_unknown()
        pending = {(address, name): self._stub(address).GetRuntimeMetric.future(
            self._pb2.MetricRequest(metric_name=name), timeout=max(0.05, deadline - time.monotonic()))
            for address in self.addresses if address not in answers for name in sorted(self._offered[address])}
        statuses = {address: self._stub(address).GetTpuRuntimeStatus.future(
            self._pb2.GetTpuRuntimeStatusRequest(include_hlo_info=False),
            timeout=max(0.05, deadline - time.monotonic()))
            for address in self.addresses if address not in answers and address not in self._no_status}
        for address in self.addresses:
            if address not in answers:
                cores = self._status(address, statuses[address]) if address in statuses else None
                answers[address] = self._answer(address, pending)
                answers[address].cores = cores
        return [answers[address] for address in self.addresses]

    def _status(self, address: str, future: Any) -> list[CoreStatus] | None:
        """The runtime status's cores; None where the runtime has none to give (logged once if it failed)."""
        try:
            return parse_status(future.result())
        except self._grpc.RpcError as exc:
            if exc.code() == self._grpc.StatusCode.UNIMPLEMENTED:
                self._no_status.add(address)
                log.info("libtpu runtime at %s has no GetTpuRuntimeStatus (older libtpu): hang detection there "
                         "uses the runtime metrics only", address)
            elif exc.code().name not in _QUIET:
                self._log_once(address, "GetTpuRuntimeStatus", f"{exc.code().name}: {exc.details()}")
        except MalformedMetric as exc:
            self._log_once(address, "GetTpuRuntimeStatus", f"malformed answer: {exc}")
        return None

    def _list_unknown(self) -> dict[str, AddressAnswer]:
        """Ask ListSupportedMetrics where it is not known; the no-data answers of addresses that fail it."""
        listing = {address: self._stub(address).ListSupportedMetrics.future(
            self._pb2.ListSupportedMetricsRequest(), timeout=self.timeout)
            for address in self.addresses if address not in self._offered}
        failed: dict[str, AddressAnswer] = {}
        for address, future in listing.items():
            try:
                names = {m.metric_name for m in future.result().supported_metric}
            except self._grpc.RpcError as exc:
                if exc.code() == self._grpc.StatusCode.UNIMPLEMENTED:  # a runtime that cannot list: ask all
                    self._offered[address] = frozenset(KNOWN_METRICS)
                    continue
                if exc.code().name not in _NO_RUNTIME:
                    self._log_once(address, "ListSupportedMetrics", f"{exc.code().name}: {exc.details()}")
                failed[address] = AddressAnswer(address, _no_data_status([exc.code().name], self.timeout))
                continue
            self._offered[address] = frozenset(names & set(KNOWN_METRICS))
            log.info("libtpu runtime at %s offers %d of the %d metrics tpuwatch reads%s", address,
                     len(self._offered[address]), len(KNOWN_METRICS),
                     "" if self._offered[address] else " (none)")
        return failed

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
        offered = sorted(self._offered[address])
        for name in offered:
            try:
                answer.entries[name] = parse_response(pending[(address, name)].result(), name)
            except self._grpc.RpcError as exc:
                failures.append(exc.code().name)
                if exc.code().name not in _QUIET:
                    self._log_once(address, name, f"{exc.code().name}: {exc.details()}")
            except MalformedMetric as exc:
                failures.append("malformed")
                self._log_once(address, name, f"malformed answer: {exc}")
        if not answer.has_data:  # the runtime went away, or offers nothing yet: list its metrics again next read
            del self._offered[address]
            self._no_status.discard(address)
        if not offered:
            answer.status = "no data (the runtime offers none of the metrics tpuwatch reads)"
        elif not answer.has_data:
            answer.status = _no_data_status(failures, self.timeout)
        elif failures:
            answer.status = f"ok, {len(failures)} of {len(offered)} offered metrics missing"
        return answer

    def log_problem(self, address: str, metric: str, problem: str) -> None:
        """Log a problem found in an answer once (folding errors found by the caller)."""
        self._log_once(address, metric, problem)

    def _log_once(self, address: str, metric: str, problem: str) -> None:
        if self._logged((address, metric, problem)):
            log.warning("libtpu runtime at %s: %s: %s (logged once)", address, metric, problem)


def _no_data_status(failures: list[str], timeout: float) -> str:
    if all(code == "UNAVAILABLE" for code in failures):
        return "no runtime answering (UNAVAILABLE: no workload running libtpu)"
    if "DEADLINE_EXCEEDED" in failures:
        return f"no answer within {timeout:g}s (DEADLINE_EXCEEDED)"
    return "no usable answer (" + ", ".join(sorted(set(failures))) + ")"
