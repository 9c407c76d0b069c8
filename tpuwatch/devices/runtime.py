"""libtpu runtime answers, parsed: pure functions over ``MetricResponse`` messages, no I/O.

What each metric is and how its per-device entries become per-chip values
follows tpu-info (cloud-accelerator-diagnostics ``tpu_info/metrics.py`` and
``cli_helper.py``): memory is answered per TensorCore on every generation and
summed per chip; duty cycle once per chip on v2/v3 (``get_chip_usage``
repeats it per core) and once per core on 7x (``get_chip_usage_new``, the
table shows ``device_id // devices_per_chip``).  The other metrics are keyed
by the same device ids and treated per core likewise (unverified on
hardware: on one-core chips it makes no difference).  Device ids need not
start at 0 (tpu-info's README shows a host answering 8, 9, 12, 13), so an
entry is placed by its *rank* among the ids the address answers, not by its
value.  A distribution with count 0 is the idle answer (tpu-info commit
14fffce), not a malformed one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tpuwatch.devices.base import Summary

QUANTILES = (0.5, 0.9, 0.95, 0.999)  # the percentiles tpu-info shows (p50, p90, p95, p999)
US = 1e-6


def _mean(values: list[float]) -> float:
    """The cores' mean (``statistics.fmean`` without its import's cost)."""
    return math.fsum(values) / len(values)


class MalformedMetric(ValueError):
    """An answer that does not have the shape libtpu gives."""


@dataclass(frozen=True)
class RuntimeMetric:
    """How one libtpu gauge or distribution becomes one DeviceReading field."""

    name: str
    attribute: str
    scale: float                              # raw value -> base unit: percent -> ratio, us -> s
    combine: Callable[[list[float]], float]   # the cores of one chip -> one value (gauges)
    distribution: bool = False


RUNTIME_METRICS = (
    RuntimeMetric("tpu.runtime.hbm.memory.usage.bytes", "memory_used_bytes", 1.0, sum),
    RuntimeMetric("tpu.runtime.hbm.memory.total.bytes", "memory_total_bytes", 1.0, sum),
    RuntimeMetric("tpu.runtime.tensorcore.dutycycle.percent", "utilization_ratio", 0.01, _mean),
    RuntimeMetric("tpu.runtime.hbm.utilization.percent", "memory_bandwidth_utilization_ratio", 0.01,
                  _mean),
    RuntimeMetric("tpu.runtime.tensorcore.idle_duration.seconds", "tensorcore_idle_seconds", 1.0, min),
    RuntimeMetric("hlo.queue.size.gauge", "hlo_queue_size", 1.0, sum),
    RuntimeMetric("hlo.execution.timing.distribution.microseconds", "hlo_execution_seconds", US, sum,
                  distribution=True),
)
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"

# Megascale (multislice DCN) latency distributions, by tpu-info's short name (``LIBTPU_METRIC_MAP``).
# The delivery-rate distribution (Mbps) is not a latency and is not exported.
MEGASCALE_METRICS = {
    f"megascale.{long}.microsecond.cumulative.distribution": short for long, short in (
        ("dcn_transfer_latencies", "buffer_transfer_latency"),
        ("dcn_inbound_transfer_latencies", "inbound_buffer_transfer_latency"),
        ("host_to_device_transfer_latencies", "host_to_device_transfer_latency"),
        ("device_to_host_transfer_latencies", "device_to_host_transfer_latency"),
        ("collective_end_to_end_latencies", "collective_e2e_latency"),
        ("mxla_compute_latencies", "host_compute_latency"),
        ("grpc_tcp_min_rtt", "grpc_tcp_min_rtt"),
    )
}
# DCN health the runtime reports for the host (the names the GKE TPU device plugin reads, ai-on-gke/
# tpu-device-plugin pkg/metrics/metrics.go): the megascale gRPC transport's TCP packet counters, and error
# gauges that are non-zero while a megascale hang (``error_type`` HANG_DETECTED) or a slice error (``type``)
# is detected.  No ICI (chip-to-chip) metric name is published.
HOST_COUNTERS = {"megascale.grpc_tcp_packets_sent.cumulative.count": "sent",
                 "megascale.grpc_tcp_packets_retransmitted.cumulative.count": "retransmitted"}
ERROR_GAUGES = {"megascale.error.detected.gauge": ("megascale", "error_type"),
                "slice.error.detected.gauge": ("slice", "type")}
MAX_ERROR_KINDS = 16  # per error gauge and address
KNOWN_METRICS = (*(spec.name for spec in RUNTIME_METRICS), *MEGASCALE_METRICS, *HOST_COUNTERS, *ERROR_GAUGES)


@dataclass(frozen=True)
class Distribution:
    """A runtime distribution: count, mean, and bucket counts with their upper bounds (raw units)."""

    count: int
    mean: float
    bounds: tuple[float, ...]   # upper bound of bucket i, for every bucket but the last (overflow)
    counts: tuple[int, ...]
    minimum: float = 0.0
    maximum: float = 0.0


@dataclass(frozen=True)
class Entry:
    """One per-device (or per-buffer-size) entry of an answer."""

    ordinal: int | None        # device id or device_ordinal; None when the entry names no device
    value: float | None = None  # gauges
    distribution: Distribution | None = None
    buffer_size: str = ""      # megascale entries
    kind: str = ""             # error gauges: the error's type attribute


def parse_response(response: Any, name: str) -> list[Entry]:
    """The entries of one MetricResponse for metric ``name``; MalformedMetric if it is not libtpu's shape."""
    if response.metric.name and response.metric.name != name:
        raise MalformedMetric(f"answer is for {response.metric.name!r}")
    if name in HOST_COUNTERS or name in ERROR_GAUGES:
        return _host_entries(response, name)
    megascale = name in MEGASCALE_METRICS
    entries = []
    for metric in response.metric.metrics:
        measure = metric.WhichOneof("measure")
        if measure == "gauge" and not megascale:
            entries.append(Entry(_ordinal(metric), value=_gauge(metric.gauge)))
        elif measure == "distribution":
            ordinal = _megascale_ordinal(metric) if megascale else _ordinal(metric)
            entries.append(Entry(ordinal, distribution=_distribution(metric.distribution),
                                 buffer_size=_buffer_size(metric) if megascale else ""))
        else:
            raise MalformedMetric(f"measure is {measure or 'missing'}")
    keys = [(e.ordinal, e.buffer_size) for e in entries]
    if not megascale and len(set(keys)) != len(keys):
        raise MalformedMetric("a device ordinal appears twice")
    return entries


def _host_entries(response: Any, name: str) -> list[Entry]:
    """Entries of a host counter (counter or gauge measure) or an error gauge (its type attribute as kind)."""
    entries = []
    for metric in response.metric.metrics:
        measure = metric.WhichOneof("measure")
        if measure not in ("counter", "gauge"):
            raise MalformedMetric(f"measure is {measure or 'missing'}")
        kind = ""
        if name in ERROR_GAUGES:
            key = ERROR_GAUGES[name][1]
            kind = next((str(a.value.string_attr)[:64] for a in metric.attribute.value.kvlist_attr.attributes
                         if a.key == key and a.value.WhichOneof("attr") == "string_attr"), "")
        entries.append(Entry(None, value=_gauge(getattr(metric, measure)), kind=kind))
    return entries


def _ordinal(metric: Any) -> int:
    """The device of a per-device entry: an int attribute, or device_ordinal in a key-value list."""
    value = metric.attribute.value
    kind = value.WhichOneof("attr")
    if kind == "int_attr":
        return int(value.int_attr)
    if kind == "kvlist_attr":
        ordinal = _kv_ordinal(value.kvlist_attr)
        if ordinal is None:
            raise MalformedMetric("no device_ordinal attribute")
        return ordinal
    raise MalformedMetric(f"device attribute is {kind or 'missing'}")


def _kv_ordinal(kvlist: Any) -> int | None:
    for attr in kvlist.attributes:
        if attr.key == "device_ordinal":
            inner = attr.value.WhichOneof("attr")
            if inner == "int_attr":  # older libtpu
                return int(attr.value.int_attr)
            if inner == "string_attr" and attr.value.string_attr.isdigit():  # newer libtpu
                return int(attr.value.string_attr)
            raise MalformedMetric(f"device_ordinal is {inner} {getattr(attr.value, inner or 'string_attr')!r}")
    return None


def _megascale_ordinal(metric: Any) -> int | None:
    value = metric.attribute.value
    return _kv_ordinal(value.kvlist_attr) if value.WhichOneof("attr") == "kvlist_attr" else None


def _buffer_size(metric: Any) -> str:
    """tpu-info's key: the "buffer-size" attribute, else the first string attribute, else none."""
    attributes = metric.attribute.value.kvlist_attr.attributes
    for attr in attributes:
        if attr.key == "buffer-size":
            return str(attr.value.string_attr)
    strings = [a.value.string_attr for a in attributes if a.value.WhichOneof("attr") == "string_attr"
               and a.key != "device_ordinal"]
    return str(strings[0]) if strings else ""


def _gauge(gauge: Any) -> float:
    kind = gauge.WhichOneof("value")
    if kind in ("as_int", "as_double"):
        return float(getattr(gauge, kind))
    raise MalformedMetric(f"gauge holds {kind or 'nothing'}")


def _distribution(dist: Any) -> Distribution:
    counts = tuple(int(c) for c in dist.bucket_counts)
    options = dist.bucket_options
    kind = options.WhichOneof("options")
    if kind == "exponential_buckets":
        e = options.exponential_buckets
        bounds = tuple(e.scale * e.growth_factor ** i for i in range(e.num_finite_buckets + 1))
    elif kind == "linear_buckets":
        lin = options.linear_buckets
        bounds = tuple(lin.offset + lin.width * i for i in range(lin.num_finite_buckets + 1))
    elif kind == "explicit_buckets":
        bounds = tuple(options.explicit_buckets.bounds)
    elif counts:
        raise MalformedMetric(f"bucket counts without bucket options ({kind or 'none'})")
    else:
        bounds = ()
    if dist.count < 0 or any(c < 0 for c in counts) or len(counts) > len(bounds) + 1:
        raise MalformedMetric(f"{len(counts)} bucket counts for {len(bounds) + 1} buckets")
    return Distribution(int(dist.count), float(dist.mean), bounds, counts, float(dist.min), float(dist.max))


def merge(distributions: Iterable[Distribution]) -> Distribution:
    """Several distributions with the same buckets as one (bucket counts summed, as tpu-info does)."""
    found = list(distributions)
    first = found[0]
    if any(d.bounds != first.bounds for d in found):
        raise MalformedMetric("distributions to merge have different buckets")
    width = max(len(d.counts) for d in found)
    counts = tuple(sum(d.counts[i] for d in found if i < len(d.counts)) for i in range(width))
    count = sum(d.count for d in found)
    mean = sum(d.mean * d.count for d in found) / count if count else 0.0
    occupied = [d for d in found if d.count]
    return Distribution(count, mean, first.bounds, counts, min((d.minimum for d in occupied), default=0.0),
                        max((d.maximum for d in occupied), default=0.0))


def quantile(dist: Distribution, q: float) -> float | None:
    """The q-quantile by linear interpolation within the bucket that holds it; None without buckets."""
    if dist.count == 0 or not any(dist.counts):
        return None
    target = q * sum(dist.counts)
    below = 0
    for i, count in enumerate(dist.counts):
        if count and below + count >= target:
            lower = dist.bounds[i - 1] if i > 0 else min(dist.minimum, dist.bounds[0] if dist.bounds else 0.0)
            upper = dist.bounds[i] if i < len(dist.bounds) else max(dist.maximum, lower)
            value = lower + (upper - lower) * (target - below) / count
            return min(max(value, dist.minimum), dist.maximum) if dist.maximum > 0 else value
        below += count
    return None


def summary(dist: Distribution, scale: float) -> Summary:
    """A Prometheus summary of ``dist`` in base units: count, sum, and the quantiles its buckets allow."""
    found = ((q, quantile(dist, q)) for q in QUANTILES)
    return Summary(count=float(dist.count), total=dist.mean * dist.count * scale,
                   quantiles=tuple((q, v * scale) for q, v in found if v is not None))


@dataclass
class Folded:
    """One address's answers per chip of that address (slot 0, 1, ...), and what belongs to no chip."""

    fields: dict[int, dict[str, Any]]
    host_megascale: dict[tuple[str, str], Distribution]  # (metric, buffer size) -> latencies of no chip
    problems: list[tuple[str, str]]  # (metric, problem): answers dropped while folding
    host_counters: dict[str, float] = field(default_factory=dict)  # kind (sent, retransmitted) -> packets
    errors: dict[tuple[str, str], float] = field(default_factory=dict)  # (source, kind) -> the gauge's value

    @property
    def served(self) -> int:
        """How many chips the address answered for."""
        return max(self.fields, default=-1) + 1


def fold(entries: dict[str, list[Entry]], cores_per_chip: int, duty_cycle_per_chip: bool) -> Folded:
    """Per-device entries of one address folded into per-chip fields, chips numbered by rank of device id."""
    folded = Folded({}, {}, [])
    core_ids = sorted({e.ordinal for spec in RUNTIME_METRICS for e in entries.get(spec.name, ())
                       if e.ordinal is not None and not (spec.name == DUTY_CYCLE and duty_cycle_per_chip)})
    core_rank = {ordinal: i for i, ordinal in enumerate(core_ids)}
    for spec in RUNTIME_METRICS:
        found = entries.get(spec.name)
        if found is None:
            continue
        per_chip = spec.name == DUTY_CYCLE and duty_cycle_per_chip
        slot = _slotter(found, {} if per_chip else core_rank, 1 if per_chip else cores_per_chip)
        groups: dict[int, list[Entry]] = {}
        for entry in found:
            groups.setdefault(slot(entry.ordinal), []).append(entry)
        for chip, group in sorted(groups.items()):
            try:
                value: Any = (summary(merge(e.distribution for e in group if e.distribution), spec.scale)
                              if spec.distribution
                              else spec.combine([e.value * spec.scale for e in group if e.value is not None]))
            except MalformedMetric as exc:
                folded.problems.append((spec.name, str(exc)))
                continue
            folded.fields.setdefault(chip, {})[spec.attribute] = value
    for name, kind in HOST_COUNTERS.items():
        values = [e.value for e in entries.get(name, ()) if e.value is not None]
        if values:
            folded.host_counters[kind] = sum(values)
    for name, (source, _) in ERROR_GAUGES.items():
        for entry in entries.get(name, ()):
            key = (source, entry.kind)
            if entry.value is not None and (key in folded.errors or len(folded.errors) < MAX_ERROR_KINDS):
                folded.errors[key] = max(folded.errors.get(key, 0.0), entry.value)
    for name, short in MEGASCALE_METRICS.items():
        found = entries.get(name, [])
        slot = _slotter([e for e in found if e.ordinal is not None], core_rank, cores_per_chip)
        keyed: dict[tuple[int | None, str], list[Distribution]] = {}
        for entry in found:
            if entry.distribution is not None:
                where = None if entry.ordinal is None else slot(entry.ordinal)
                keyed.setdefault((where, entry.buffer_size), []).append(entry.distribution)
        for (where, buffer_size), dists in sorted(keyed.items(), key=lambda kv: (kv[0][0] is not None, kv[0])):
            try:
                merged = merge(dists)
            except MalformedMetric as exc:
                folded.problems.append((name, str(exc)))
                continue
            if where is None:
                folded.host_megascale[(short, buffer_size)] = merged
            else:
                chip_fields = folded.fields.setdefault(where, {})
                latency = (short, buffer_size, summary(merged, US))
                chip_fields["megascale"] = (*chip_fields.get("megascale", ()), latency)
    return folded


def _slotter(found: list[Entry], rank: dict[int, int], per: int) -> Callable[[int | None], int]:
    """Chip slot of a device id: its rank among the address's core ids (else among its own) // ``per``."""
    own = {ordinal: i for i, ordinal in enumerate(sorted({e.ordinal for e in found if e.ordinal is not None}))}
    return lambda ordinal: (rank[ordinal] if ordinal in rank else own.get(ordinal or 0, 0)) // per
