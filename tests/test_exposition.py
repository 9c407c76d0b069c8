"""The pre-rendered exposition: collected once per render, encoded once per format, served as bytes."""

from __future__ import annotations

import gzip
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tpuwatch.exporter import build_registry
from tpuwatch.samples import Sample, sample

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class Source:
    """A sample source that counts its calls and can be told to fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.value = 1.0
        self.fail = False

    def __call__(self) -> list[Sample]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("store unreadable")
        return [sample("tpuwatch_store_series", self.value)]


def series(body: bytes) -> float:
    return next(s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
                if s.name == "tpuwatch_store_series")


def test_before_the_first_render_every_scrape_collects() -> None:
    source = Source()
    exposition = build_registry(source).exposition
    assert series(exposition.body("", False)[0]) == 1.0
    source.value = 2.0
    assert series(exposition.body("", False)[0]) == 2.0
    assert source.calls == 2


def test_scrapes_serve_the_last_render_without_collecting() -> None:
    source = Source()
    registry = build_registry(source)
    registry.render()
    source.value = 5.0
    plain, content_type = registry.exposition.body("", False)
    compressed, _ = registry.exposition.body("", True)
    for _ in range(10):
        assert registry.exposition.body("", True)[0] is compressed
        openmetrics, om_type = registry.exposition.body(OPENMETRICS, False)
    assert source.calls == 1
    assert content_type == "text/plain; version=0.0.4; charset=utf-8" and series(plain) == 1.0
    assert gzip.decompress(compressed) == plain
    assert om_type.startswith("application/openmetrics-text") and openmetrics.endswith(b"# EOF\n")
    registry.render()
    assert series(registry.exposition.body("", False)[0]) == 5.0


@pytest.mark.parametrize("accept", ["application/openmetrics-text; version=abc", "text/plain;version=x.y",
                                    "application/openmetrics-text; version=1.0.0; escaping=\xff", ",;=,;",
                                    "*/*;q=0.1"])
def test_odd_accept_headers_get_an_exposition(accept: str) -> None:
    registry = build_registry(Source())
    registry.render()
    body, content_type = registry.exposition.body(accept, False)
    assert series(body) == 1.0 and content_type.startswith(("text/plain", "application/openmetrics-text"))


def test_the_cache_of_formats_is_bounded() -> None:
    source = Source()
    registry = build_registry(source)
    registry.render()
    for n in range(100):
        body, content_type = registry.exposition.body(f"application/openmetrics-text; version=1.0.{n}", True)
        assert f"version=1.0.{n}" in content_type and gzip.decompress(body).endswith(b"# EOF\n")
    assert len(registry.exposition._rendition.bodies) <= 8  # type: ignore[union-attr]
    assert source.calls == 1


def test_a_failed_render_keeps_the_previous_one(caplog: pytest.LogCaptureFixture) -> None:
    source = Source()
    registry = build_registry(source)
    registry.render()
    source.fail, source.value = True, 7.0
    with caplog.at_level(logging.ERROR):
        registry.render()
    assert series(registry.exposition.body("", False)[0]) == 1.0
    assert "rendering /metrics failed, serving the previous rendition: store unreadable" in caplog.text
    assert "Traceback" not in caplog.text
