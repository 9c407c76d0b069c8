"""Prometheus exposition: const metric families built from samples, rendered once per sampling cycle."""

from __future__ import annotations

import gzip
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as ExpositionSample

from tpuwatch.catalog import CATALOG, SUMMARY_SUFFIXES, MetricSpec
from tpuwatch.samples import Sample

log = logging.getLogger(__name__)

# generate_latest's format, named here: Debian 12's prometheus_client (0.16) has no name for it, and newer ones
# made CONTENT_TYPE_LATEST the 1.0.0 format.
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"

GZIP_LEVEL = 6
MAX_CACHED_VARIANTS = 8  # (format, gzip) pairs kept per rendition; the Accept header picks among few formats


def families(samples: Iterable[Sample]) -> list[Metric]:
    """Metric families for ``samples``, typed and labelled per the catalogue, in catalogue order."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_name[s.name].append(s)
    out: list[Metric] = []
    for name, spec in CATALOG.items():
        if spec.kind == "summary":
            if any(by_name.get(name + part) for part in ("", *SUMMARY_SUFFIXES)):
                out.append(_summary(spec, by_name))
            continue
        group = by_name.get(name)
        if not group:
            continue
        family: Metric
        if spec.kind == "counter":
            family = CounterMetricFamily(name, spec.help, labels=spec.labels)
        else:
            family = GaugeMetricFamily(name, spec.help, labels=spec.labels)
        for s in group:
            labels = dict(s.labels)
            exposed = {label: labels.get(label, "") for label in spec.labels}
            exposed.update({label: labels[label] for label in spec.optional_labels if labels.get(label)})
            family.samples.append(ExpositionSample(name, exposed, s.value))
        out.append(family)
    return out


def _summary(spec: MetricSpec, by_name: dict[str, list[Sample]]) -> Metric:
    """One summary family from its quantile samples and its NAME_count / NAME_sum samples."""
    family = SummaryMetricFamily(spec.name, spec.help, labels=spec.labels)
    parts: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    for suffix in SUMMARY_SUFFIXES:
        for s in by_name.get(spec.name + suffix, []):
            labels = dict(s.labels)
            parts[tuple(labels.get(label, "") for label in spec.labels)][suffix] = s.value
    for key, values in parts.items():
        if len(values) == len(SUMMARY_SUFFIXES):
            family.add_metric(list(key), int(values["_count"]), values["_sum"])
    for s in by_name.get(spec.name, []):
        labels = dict(s.labels)
        exposed = {label: labels.get(label, "") for label in spec.labels}
        exposed["quantile"] = labels.get("quantile", "")
        family.samples.append(ExpositionSample(spec.name, exposed, s.value))
    return family


class SampleCollector:
    """A prometheus_client collector over functions that return the current samples."""

    def __init__(self, *sources: Callable[[], Iterable[Sample]]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        samples = [s for source in self._sources for s in source()]
        yield from families(samples)

    def describe(self) -> list[Metric]:
        return []


class _Snapshot(Collector):
    """Metric families collected once, encoded as often as asked."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


class _Rendition:
    """One collection of a registry and its encodings, made as they are asked for."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.snapshot = _Snapshot(metrics)
        self.lock = threading.Lock()
        self.bodies: dict[tuple[str, bool], bytes] = {}


def _encoder(accept: str) -> tuple[Callable[[Collector], bytes], str]:
    """The encoder and content type ``accept`` asks for; the text format when it asks for nothing we make."""
    try:
        return choose_encoder(accept)
    except (TypeError, ValueError):  # prometheus_client fails on some malformed version parameters
        return generate_latest, TEXT_FORMAT


class Exposition:
    """What /metrics serves: a registry rendered by ``render()``, encoded once per format and compression.

    Before the first ``render()`` every scrape collects afresh.
    """

    def __init__(self, registry: Collector) -> None:
        self._registry = registry
        self._rendition: _Rendition | None = None

    def render(self) -> None:
        """Collect now, and encode the text format (plain and gzip) for the scrapes until the next render."""
        try:
            rendition = _Rendition(list(self._registry.collect()))
            for compressed in (False, True):
                self._encode(rendition, generate_latest, TEXT_FORMAT, compressed)
        except Exception as exc:  # noqa: BLE001 - scrapes keep the last good rendition
            log.error("rendering /metrics failed, serving the previous rendition: %s", exc)
            return
        self._rendition = rendition

    def body(self, accept: str, compressed: bool) -> tuple[bytes, str]:
        """The body (gzip-compressed if ``compressed``) and content type for a scrape with this Accept header."""
        encoder, content_type = _encoder(accept)
        rendition = self._rendition or _Rendition(list(self._registry.collect()))
        return self._encode(rendition, encoder, content_type, compressed), content_type

    @staticmethod
    def _encode(rendition: _Rendition, encoder: Callable[[Collector], bytes], content_type: str,
                compressed: bool) -> bytes:
        def keep(key: tuple[str, bool], body: bytes) -> bytes:
            if len(rendition.bodies) < MAX_CACHED_VARIANTS:
                rendition.bodies[key] = body
            return body

        with rendition.lock:
            body = rendition.bodies.get((content_type, compressed))
            if body is None:
                plain = rendition.bodies.get((content_type, False)) or keep((content_type, False),
                                                                            encoder(rendition.snapshot))
                body = keep((content_type, True), gzip.compress(plain, GZIP_LEVEL)) if compressed else plain
        return body


class RenderedRegistry(CollectorRegistry):
    """A registry with its exposition: the daemon calls ``render()`` after each sampling cycle."""

    def __init__(self) -> None:
        super().__init__(auto_describe=False)
        self.exposition = Exposition(self)

    def render(self) -> None:
        """Render the exposition now (see ``Exposition.render``)."""
        self.exposition.render()


def build_registry(*sources: Callable[[], Iterable[Sample]]) -> RenderedRegistry:
    """A registry with tpuwatch's families and the standard process_* metrics."""
    registry = RenderedRegistry()
    registry.register(SampleCollector(*sources))
    ProcessCollector(registry=registry)
    return registry
