"""Prometheus exposition: const metric families built from samples at scrape time."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.samples import Sample as ExpositionSample

from tpuwatch.catalog import CATALOG, SUMMARY_SUFFIXES, MetricSpec
from tpuwatch.samples import Sample


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
            family.add_metric([labels.get(label, "") for label in spec.labels], s.value)
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


def build_registry(*sources: Callable[[], Iterable[Sample]]) -> CollectorRegistry:
    """A registry with tpuwatch's families and the standard process_* metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SampleCollector(*sources))
    ProcessCollector(registry=registry)
    return registry
