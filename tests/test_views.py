"""The status document (tpuwatch.views.document): verdicts that agree with `check` and the alerts, the leak
detector's floor and forecast, canary history, bounds; and StatusPage's routes, headers and once-per-cycle cost.
"""

from __future__ import annotations

import gc
import gzip
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from tpuwatch.analysis.leak import LeakDetector
from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.canary.judge import CanaryResult, DeviceOutcome
from tpuwatch.config import TrendConfig
from tpuwatch.devices.base import DeviceReading
from tpuwatch.health import device_problems
from tpuwatch.httpd.protocol import Request
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.views.document import MAX_KERNEL_EVENTS, api_series, api_status, build_status, hbm_labels
from tpuwatch.views.page import CONTENT_SECURITY_POLICY, StatusPage
from tpuwatch.views.readers import StatusReaders
from tpuwatch.views.series import decimate

from statusdoc import ECC_ALERT, GIB, T0, SimHost


@pytest.fixture(scope="module")
def leaking() -> SimHost:
    return SimHost("hbm-leak", fault_device=2)


@pytest.fixture(scope="module")
def healthy() -> SimHost:
    return SimHost("healthy")


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {chip["device"]: chip["verdict"]["status"] for chip in doc["chips"]}


def test_a_healthy_host_is_ok_with_an_hour_of_every_series(healthy: SimHost) -> None:
    doc = healthy.document()
    assert verdicts(doc) == {"0": "ok", "1": "ok", "2": "ok", "3": "ok"} and doc["status"] == "ok"
    assert doc["counts"] == {"chips": 4, "ok": 4, "warning": 0, "critical": 0}
    for chip in doc["chips"]:
        for points in chip["series"].values():
            times = [t for t, _ in points]
            assert 100 <= len(points) <= 120  # 360 points in 60 buckets: at most two each
            assert times == sorted(times) and T0 - 3600 <= times[0] < T0 - 3500 and times[-1] >= T0 - 60
        assert chip["leak"]["suspected"] is False and chip["leak"]["forecast"] is None
        assert len(chip["leak"]["floor"]) == 60  # one floor per minute of the hour
        assert chip["reading"]["memory_total_bytes"] == 16 * GIB and chip["holders"] is None
    json.dumps(doc, allow_nan=False)


def test_a_leak_shows_its_floor_its_forecast_to_capacity_and_its_eta(leaking: SimHost) -> None:
    doc = leaking.document()
    chip = doc["chips"][2]
    leak = chip["leak"]
    state = leaking.trend.leak_view(hbm_labels("2"), T0 - 3600)
    assert state is not None and state.state.firing
    assert leak["suspected"] and leak["severity"] == "critical" and leak["eta_seconds"] == state.state.eta
    (t0, v0), (t1, v1) = leak["forecast"]
    assert t0 == T0 and v0 == leak["high_bytes"] and v1 == leak["capacity_bytes"] == 16 * GIB
    assert t1 - t0 == pytest.approx((v1 - v0) / leak["slope_bytes_per_second"])
    floors = [v for _, v in leak["floor"]]
    assert floors[-1] > floors[0] + 0.1 * 16 * GIB  # 15 % of capacity an hour
    assert chip["verdict"]["status"] == "critical"
    assert [r["source"] for r in chip["verdict"]["reasons"]] == ["leak"]
    assert chip["verdict"]["reasons"][0]["text"].startswith("memory leak suspected: +")
    assert verdicts(doc) == {"0": "ok", "1": "ok", "2": "critical", "3": "ok"}
    assert doc["chips"][0]["leak"]["forecast"] is None


def test_check_problems_make_a_chip_critical_with_checks_own_words() -> None:
    readings = [DeviceReading("0", "v5e", "0000:10:00.0", memory_used_bytes=1e9, memory_total_bytes=16e9,
                              ecc_uncorrected_total=0),
                DeviceReading("1", "v5e", "0000:11:00.0", ecc_uncorrected_total=2, temperature_celsius=91.0),
                DeviceReading("2", "v5e", "0000:12:00.0", up=False, problem="NVML: GPU is lost")]
    doc = build_status(StatusReaders(current=list, history=lambda n, labels: [], readings=lambda: readings,
                                     window=lambda: 3600.0, health=lambda: None), T0, "h")
    assert verdicts(doc) == {"0": "ok", "1": "critical", "2": "critical"}
    # Every problem `tpuwatch check` lists is on its chip's row, without the chip's name repeated.
    problems = device_problems(readings)
    shown = [(chip["device"], r["text"]) for chip in doc["chips"] for r in chip["verdict"]["reasons"]]
    assert len(shown) == len(problems) == 3
    assert shown == [("1", "2 uncorrectable ECC error(s) since the driver loaded"),
                     ("1", "temperature 91 °C (limit 85 °C)"), ("2", "is down: NVML: GPU is lost")]
    assert all(p.endswith(text) for p, (_, text) in zip(problems, shown))
    assert [chip["series"] for chip in doc["chips"]][0] == {"memory_used_bytes": [], "utilization_ratio": [],
                                                             "temperature_celsius": []}


def test_alerts_set_the_verdict_of_their_chip_only(healthy: SimHost) -> None:
    pending = {**ECC_ALERT, "state": "pending", "labels": {**ECC_ALERT["labels"], "alertname": "X", "device": "3",
                                                              "severity": "critical"}}
    warning = {**ECC_ALERT, "labels": {**ECC_ALERT["labels"], "alertname": "Y", "severity": "warning",
                                       "device": "2"}}
    host_wide = {**ECC_ALERT, "labels": {"alertname": "CanaryFailing", "severity": "warning"}}
    doc = healthy.document(alerts=lambda: [pending, warning, ECC_ALERT, host_wide])
    assert verdicts(doc) == {"0": "ok", "1": "critical", "2": "warning", "3": "ok"}
    assert doc["chips"][1]["verdict"]["reasons"] == [
        {"severity": "critical", "source": "alert", "text": "AcceleratorEccUncorrectable: "
                                                            "Uncorrectable ECC error(s) on device 1"}]
    assert doc["chips"][3]["verdict"]["reasons"][0]["severity"] == "pending"  # listed, changes nothing yet
    assert [a["labels"]["alertname"] for a in doc["alerts"]] == ["AcceleratorEccUncorrectable", "Y",
                                                                  "CanaryFailing", "X"]  # firing, critical first
    assert doc["status"] == "critical" and doc["alerts_total"] == 4


def test_critical_kernel_events_mark_their_chip_and_the_latest_are_listed_newest_first(healthy: SimHost) -> None:
    events = [KernelEvent("pcie_aer_corrected", "warning", f"corrected error {k}", "0000:10:00.0", "0", time=T0 + k)
              for k in range(30)]
    events.append(KernelEvent("nvidia_xid_devastating", "critical", "NVRM: Xid (PCI:0000:12:00): 79, GPU has "
                                                                    "fallen off the bus.", "0000:12:00.0", "2",
                              xid=79, time=T0 + 40))
    doc = healthy.document(kernel_events=lambda: events)
    assert verdicts(doc) == {"0": "ok", "1": "ok", "2": "critical", "3": "ok"}
    [reason] = doc["chips"][2]["verdict"]["reasons"]
    assert reason["source"] == "kernel" and "fallen off the bus" in reason["text"]
    assert len(doc["kernel_events"]) == MAX_KERNEL_EVENTS and doc["kernel_events"][0]["xid"] == 79


def test_canary_history_per_chip_and_its_latest_verdict(healthy: SimHost) -> None:
    def run(at: float, chip1: str, reason: str | None = None) -> CanaryResult:
        outcomes = tuple(DeviceOutcome(str(d), chip1 if d == 1 else "pass", 1e-7, "f" * 16, 0.004,
                                       reason if d == 1 else None, "peers" if d == 1 and chip1 == "fail" else None)
                         for d in range(4))
        return CanaryResult("fail" if chip1 == "fail" else "pass", reason, outcomes, finished_at=at, wall_seconds=3.0)

    crashed = CanaryResult("error", "the worker crashed (signal 11)", (), finished_at=T0 - 100)
    results = [run(T0 - 300, "pass"), crashed, run(T0 - 10, "fail", "fingerprint differs from 3 of 4 chips")]
    doc = healthy.document(canary=lambda: results)
    assert verdicts(doc) == {"0": "ok", "1": "critical", "2": "ok", "3": "ok"}
    assert [r["status"] for r in doc["chips"][1]["canary"]] == ["fail", "error", "pass"]  # newest first
    assert doc["chips"][1]["verdict"]["reasons"][0]["text"] == \
        "canary: wrong result (fingerprint differs from 3 of 4 chips)"
    assert [r["status"] for r in doc["canary_runs"]] == ["fail", "error", "pass"]
    errored = healthy.document(canary=lambda: results[:2])
    assert verdicts(errored)["0"] == "warning"  # the crash was every chip's latest run


def test_api_routes_split_the_document(leaking: SimHost) -> None:
    doc = leaking.document()
    status, series = api_status(doc), api_series(doc)
    assert all("series" not in chip and "floor" not in chip["leak"] for chip in status["chips"])
    assert status["chips"][2]["leak"]["forecast"] == doc["chips"][2]["leak"]["forecast"]
    assert [c["device"] for c in series["chips"]] == ["0", "1", "2", "3"]
    assert series["chips"][2]["leak_floor"] == doc["chips"][2]["leak"]["floor"]
    assert series["chips"][0]["series"] == doc["chips"][0]["series"] and "chips" in doc  # the document unchanged


def test_decimate_keeps_each_buckets_extremes_in_time_order() -> None:
    points = [(float(t), 1.0) for t in range(1000)]
    points[500] = (500.0, 9.0)  # a spike
    points[501] = (501.0, -3.0)  # and a dip
    out = decimate(points, 100.0, 999.0, 10)
    assert len(out) <= 20 and (500.0, 9.0) in out and (501.0, -3.0) in out
    assert [t for t, _ in out] == sorted(t for t, _ in out) and out[0][0] >= 100.0
    assert decimate([], 0.0, 1.0, 10) == [] and decimate([(5.0, 1.0)], 0.0, 10.0, 10) == [(5.0, 1.0)]


def test_leak_view_reads_without_changing_the_detector() -> None:
    detector = LeakDetector()
    for k in range(600):
        detector.update(T0 + k * 10, 1e9 + (k % 12) * 1e7, 16e9)
    before = detector.snapshot()
    view = detector.view(T0 + 3000)
    assert [t for t, _ in view.floor] == sorted(t for t, _ in view.floor) and view.floor[0][0] >= T0 + 3000
    assert view.capacity == 16e9 and view.high is not None and not view.state.firing
    assert detector.snapshot() == before
    assert TrendAnalyzer(TrendConfig()).leak_view(hbm_labels("0"), T0) is None


def test_non_finite_readings_are_null_in_the_json() -> None:
    readings = [DeviceReading("0", "v5e", power_watts=float("nan"), temperature_celsius=float("inf"))]
    page = StatusPage(StatusReaders(current=list, history=lambda n, labels: [], readings=lambda: readings,
                                    window=lambda: 60.0, health=lambda: None), cycle=lambda: 1.0, host="h")
    body = json.loads(page.routes()["/api/status"].answer(_get("/api/status")).body)
    assert body["chips"][0]["reading"]["power_watts"] is None
    assert body["chips"][0]["reading"]["temperature_celsius"] is None


def _get(path: str, **headers: str) -> Request:
    return Request("GET", path, (1, 1), headers)


def _counting(host: SimHost) -> tuple[StatusReaders, Callable[[], int]]:
    calls = []

    def readings() -> list[DeviceReading]:
        calls.append(1)
        return host.readings

    return host.readers(readings=readings), lambda: len(calls)


def test_the_page_is_built_once_per_cycle_whatever_the_requests(healthy: SimHost) -> None:
    sources, builds = _counting(healthy)
    cycle = [1.0]
    trims: list[float] = []
    page = StatusPage(sources, cycle=lambda: cycle[0], host="host-a", after_build=lambda: trims.append(cycle[0]))
    routes = page.routes()
    assert set(routes) == {"/", "/status.js", "/status.css", "/api/status", "/api/series"}
    first = routes["/"].answer(_get("/"))
    for path in ("/", "/api/status", "/api/series", "/"):
        routes[path].answer(_get(path, **{"accept-encoding": "gzip"}))
    assert builds() == 1 and trims == [1.0]  # the daemon trims malloc's arenas once a build is done
    cycle[0] = 2.0
    routes["/api/status"].answer(_get("/api/status"))
    assert builds() == 2 and trims == [1.0, 2.0]
    headers = dict(first.headers)
    assert first.content_type == "text/html; charset=utf-8" and first.body.startswith(b"<!doctype html>")
    assert headers == {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                       "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY and "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    zipped = routes["/"].answer(_get("/", **{"accept-encoding": "gzip, deflate"}))
    assert dict(zipped.headers)["Content-Encoding"] == "gzip" and len(zipped.body) < len(first.body) / 3
    assert gzip.decompress(zipped.body) == routes["/"].answer(_get("/")).body
    script = routes["/status.js"].answer(_get("/status.js"))
    assert script.content_type.startswith("text/javascript") and b"replaceWith" in script.body
    assert dict(script.headers)["X-Content-Type-Options"] == "nosniff"


def _bytes_held(root: object) -> int:
    """The bytes objects reachable from ``root``, in bytes (each counted once)."""
    seen, stack, total = {id(root)}, [root], 0
    while stack:
        obj = stack.pop()
        if isinstance(obj, bytes):
            total += len(obj)
            continue
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, type) and not inspect.ismodule(ref):
                seen.add(id(ref))
                stack.append(ref)
    return total


def test_a_cycle_s_rendition_holds_its_bodies_compressed_only(healthy: SimHost) -> None:
    """Between cycles the page holds its bodies gzip compressed, a few times smaller than plain; a client without
    gzip gets the same bytes decompressed."""
    page = StatusPage(healthy.readers(), cycle=lambda: 1.0, host="host-a")
    routes = page.routes()
    before = _bytes_held(page)  # the static files
    zipped = routes["/"].answer(_get("/", **{"accept-encoding": "gzip"}))
    held = _bytes_held(page) - before
    assert gzip.decompress(zipped.body) == routes["/"].answer(_get("/")).body
    plain = sum(len(routes[path].answer(_get(path)).body) for path in ("/", "/api/status", "/api/series"))
    assert 0 < held < plain / 2, (held, plain)  # plain and gzip bodies together held more than the plain ones


def test_a_failing_source_keeps_the_last_good_page_and_logs_once(healthy: SimHost,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    broken = [False]

    def alerts() -> list[dict[str, Any]]:
        if broken[0]:
            raise RuntimeError("alert state locked")
        return []

    cycle = [1.0]
    page = StatusPage(healthy.readers(alerts=alerts), cycle=lambda: cycle[0], host="host-a")
    good = page.routes()["/"].answer(_get("/")).body
    broken[0] = True
    with caplog.at_level(logging.ERROR, logger="tpuwatch.views.page"):
        for k in range(3):
            cycle[0] = 2.0 + (k >= 2)
            assert page.routes()["/"].answer(_get("/")).body == good
    assert [r.getMessage() for r in caplog.records] == [
        "building the status page failed, serving the previous one: RuntimeError: alert state locked"] * 2
    first = StatusPage(healthy.readers(alerts=alerts), cycle=lambda: 1.0, host="host-a")
    with pytest.raises(RuntimeError):  # nothing good yet: the endpoint answers 500 for it
        first.routes()["/"].answer(_get("/"))
