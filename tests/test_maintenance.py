"""The cloud's maintenance notices: the parsers on literal answers, and the watchers against a real HTTP
metadata server on 127.0.0.1 (tpuwatch.cloud.standin, shaped after Compute Engine's and EC2's documented
protocols: https://cloud.google.com/compute/docs/metadata/querying-metadata,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tpuwatch.cloud import ec2, events, gce
from tpuwatch.cloud.collector import MaintenanceCollector, read_dmi
from tpuwatch.cloud.events import (
    Garbage,
    Maintenance,
    detect,
    parse_ec2_scheduled,
    parse_gce_event,
    parse_gce_upcoming,
)
from tpuwatch.cloud.plugin import MaintenanceConfig
from tpuwatch.cloud.standin import UNAVAILABLE, MetadataStandIn
from tpuwatch.config import parse
from tpuwatch.kubernetes.conditions import condition_table, offered
from tpuwatch.kubernetes.plugin import KubernetesConfig
from tpuwatch.kubernetes.remediation import Ladders, Trigger
from tpuwatch.schema import ConfigError, build
from tpuwatch.units import from_now

from conftest import free_port, wait_until

START = 1796526000.0  # 2026-12-06T03:00:00Z
# The Compute Engine API's UpcomingMaintenance (google.cloud.compute_v1.types), as the metadata server gives it.
UPCOMING = (b'{"type": "SCHEDULED", "can_reschedule": true, "window_start_time": "2026-12-06T03:00:00Z", '
            b'"window_end_time": "2026-12-06T07:00:00Z", "latest_window_start_time": "2026-12-08T03:00:00Z", '
            b'"maintenance_status": "PENDING"}')
# The Cloud TPU docs' spelling (https://cloud.google.com/tpu/docs/view-maintenance-notifications).
UPCOMING_TPU = (b'{"type":"SCHEDULED","windowStartTime":"2026-12-06T03:00:00Z","canReschedule":true,'
                b'"latestWindowStartTime":"2026-12-06T03:00:01Z","windowEndTime":"2026-12-06T07:00:00Z",'
                b'"maintenanceStatus":"PENDING"}')
# AWS's example (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instances-status-check_sched.html).
EC2_EVENTS = (b'[ {\n  "NotBefore" : "21 Jan 2027 09:00:43 GMT",\n  "Code" : "system-reboot",\n'
              b'  "Description" : "scheduled reboot",\n  "EventId" : "instance-event-0d59937288b749b32",\n'
              b'  "NotAfter" : "21 Jan 2027 09:17:23 GMT",\n  "State" : "active"\n} ]')
FAST = MaintenanceConfig(watch_timeout=30.0, poll_interval=1.0, request_timeout=1.0, retry_max=1.0)


# --- parsing, on literal answers -----------------------------------------------------------------------------

def test_maintenance_event_values() -> None:
    assert parse_gce_event(b"NONE") is None
    assert parse_gce_event(b"MIGRATE_ON_HOST_MAINTENANCE") == Maintenance("gce", "migrate",
                                                                          "MIGRATE_ON_HOST_MAINTENANCE")
    assert parse_gce_event(b"TERMINATE_ON_HOST_MAINTENANCE\n").kind == "terminate"  # type: ignore[union-attr]
    with pytest.raises(Garbage, match="unknown maintenance-event 'REBOOT'"):
        parse_gce_event(b"REBOOT")


@pytest.mark.parametrize("body", [UPCOMING, UPCOMING_TPU])
def test_upcoming_maintenance_in_both_spellings(body: bytes) -> None:
    notice = parse_gce_upcoming(200, body)
    assert notice is not None
    assert (notice.event, notice.start, notice.end, notice.status) == ("SCHEDULED", START, START + 4 * 3600,
                                                                       "PENDING")
    assert notice.can_reschedule is True
    assert notice.window() == "2026-12-06 03:00-07:00 UTC"


@pytest.mark.parametrize("status,body", [(200, b"{ }"), (200, b"{}"), UNAVAILABLE, (404, b"Not Found"),
                                         (200, b'{ "error": "no notifications have been received yet, '
                                                   b'try again later" }')])
def test_every_form_of_nothing_scheduled(status: int, body: bytes) -> None:
    assert parse_gce_upcoming(status, body) is None


@pytest.mark.parametrize("status,body,message", [
    (200, b"\x00\xff{not json", "not JSON"),
    (200, b"[]", "expected an object, got list"),
    (200, b'{"type": "SCHEDULED"}', "without window_start_time"),
    (200, b'{"window_start_time": "tomorrow"}', "is not RFC 3339"),
    (200, b'{"window_start_time": "2026-12-06T03:00:00"}', "has no offset"),
    (500, b"oops", "HTTP 500"),
    (200, b"{" + b" " * 70_000 + b"}", "at most 65536"),
])
def test_garbage_upcoming_maintenance_is_refused_in_one_line(status: int, body: bytes, message: str) -> None:
    with pytest.raises(Garbage, match=message) as caught:
        parse_gce_upcoming(status, body)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_ec2_scheduled_events_skip_completed_and_canceled() -> None:
    (notice,) = parse_ec2_scheduled(EC2_EVENTS)
    assert (notice.cloud, notice.kind, notice.event, notice.event_id) == (
        "ec2", "reboot", "system-reboot", "instance-event-0d59937288b749b32")
    assert notice.window() == "2027-01-21 09:00-09:17 UTC"
    done = (b'[{"NotBefore": "21 Jan 2027 09:00:43 GMT", "Code": "instance-stop", "Description": '
            b'"[Completed] The instance is running on degraded hardware", "State": "completed"},'
            b'{"NotBefore": "21 Jan 2027 09:00:43 GMT", "Code": "system-reboot", "Description": '
            b'"[Canceled] scheduled reboot", "State": "active"}]')
    assert parse_ec2_scheduled(done) == [] and parse_ec2_scheduled(b"[]") == []
    with pytest.raises(Garbage, match="is not like '21 Jan 2019 09:00:43 GMT'"):
        parse_ec2_scheduled(b'[{"Code": "system-reboot", "NotBefore": "2027-01-21T09:00:43Z"}]')
    with pytest.raises(Garbage, match="expected a list"):
        parse_ec2_scheduled(b'{"Code": "system-reboot"}')


def test_a_notice_in_words() -> None:
    notice = Maintenance("gce", "terminate", "TERMINATE_ON_HOST_MAINTENANCE", START, START + 4 * 3600)
    now = START - (13 * 3600 + 20 * 60)
    assert notice.sentence(now) == "terminate on host maintenance, window 2026-12-06 03:00-07:00 UTC, in 13h 20m"
    assert notice.labels() == {"cloud": "gce", "kind": "terminate", "event": "TERMINATE_ON_HOST_MAINTENANCE",
                               "window": "2026-12-06 03:00-07:00 UTC", "start": "1796526000"}
    assert Maintenance("gce", "migrate", "MIGRATE_ON_HOST_MAINTENANCE").sentence(now) == \
        "live migration on host maintenance"
    assert from_now(START, START - 30) == "in under a minute"
    assert from_now(START, START + 2 * 86400 + 300) == "started 2d 5m ago"
    assert from_now(float("inf"), START) == from_now(float("nan"), START) == "-"


# --- which cloud, where -------------------------------------------------------------------------------------

@pytest.mark.parametrize("files,cloud", [
    ({"product_name": "Google Compute Engine\n", "sys_vendor": "Google\n"}, "gce"),
    ({"product_name": "c5.large\n", "product_uuid": "EC2E1916-9099-7CAF-FD21-012345ABCDEF\n"}, "ec2"),
    ({"product_name": "p5.48xlarge\n", "sys_vendor": "Amazon EC2\n"}, "ec2"),
    ({"board_asset_tag": "i-0123456789abcdef0\n"}, "ec2"),
    ({"product_name": "PowerEdge R760xa\n", "sys_vendor": "Dell Inc.\n", "board_asset_tag": "\n"}, None),
    ({}, None),
])
def test_the_cloud_is_told_from_a_dmi_tree(tmp_path: Path, files: dict[str, str], cloud: str | None) -> None:
    dmi = tmp_path / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    for name, text in files.items():
        (dmi / name).write_text(text)
    assert detect(read_dmi(str(tmp_path))) == cloud


def test_endpoints_follow_the_clients_environment() -> None:
    assert gce.endpoint({}) == "metadata.google.internal"
    assert gce.endpoint({"GCE_METADATA_ROOT": "old:80"}) == "old:80"
    assert gce.endpoint({"GCE_METADATA_HOST": "127.0.0.1:8080", "GCE_METADATA_ROOT": "old:80"}) == "127.0.0.1:8080"
    assert ec2.endpoint({}) == "http://169.254.169.254/"
    assert ec2.endpoint({"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}) == "http://[fd00:ec2::254]/"
    assert ec2.endpoint({"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1338/",
                         "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}) == "http://127.0.0.1:1338/"


# --- the stand-in is the documented protocol -----------------------------------------------------------------

@pytest.fixture
def standin() -> Iterator[MetadataStandIn]:
    server = MetadataStandIn()
    yield server
    server.close()


def test_the_standin_refuses_what_the_real_servers_refuse(standin: MetadataStandIn) -> None:
    url = f"http://{standin.host}/computeMetadata/v1/instance/maintenance-event"
    assert requests.get(url, timeout=5).status_code == 403
    answer = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=5)
    assert (answer.status_code, answer.text) == (200, "NONE") and answer.headers["ETag"]
    events = f"{standin.url}latest/meta-data/events/maintenance/scheduled"
    assert requests.get(events, timeout=5).status_code == 401
    assert requests.put(f"{standin.url}latest/api/token", timeout=5).status_code == 400
    token = requests.put(f"{standin.url}latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                         timeout=5).text
    assert requests.get(events, headers={"X-aws-ec2-metadata-token": token}, timeout=5).json() == []


# --- the watchers, against it ---------------------------------------------------------------------------------

def _collector(watch: gce.GceWatch | ec2.Ec2Watch) -> MaintenanceCollector:
    return MaintenanceCollector(watch, first_wait=5.0)


def _scheduled(collector: MaintenanceCollector) -> list[dict[str, str]]:
    return [dict(s.labels) for s in collector.collect() if s.name == "tpuwatch_maintenance_scheduled"]


def test_a_compute_engine_notice_appears_and_clears_through_hanging_watches(standin: MetadataStandIn) -> None:
    standin.set_gce("scheduling/on-host-maintenance", 200, b"TERMINATE")
    collector = _collector(gce.GceWatch(FAST, standin.host))
    try:
        assert _scheduled(collector) == []
        wait_until(lambda: any("upcoming-maintenance?alt=json&wait_for_change=true&last_etag=" in p
                               for _, p, _ in standin.requests), what="a hanging watch with the ETag")
        standin.set_gce("upcoming-maintenance", 200, UPCOMING)
        (labels,) = wait_until(lambda: _scheduled(collector), timeout=10, what="the window to be seen")
        assert labels == {"cloud": "gce", "kind": "terminate", "event": "SCHEDULED",
                          "window": "2026-12-06 03:00-07:00 UTC", "start": "1796526000"}
        starts = [s for s in collector.collect() if s.name == "tpuwatch_maintenance_start_timestamp_seconds"]
        assert [s.value for s in starts] == [START]
        standin.set_gce("maintenance-event", 200, b"TERMINATE_ON_HOST_MAINTENANCE")
        wait_until(lambda: _scheduled(collector)[0]["event"] == "TERMINATE_ON_HOST_MAINTENANCE", timeout=10,
                   what="the imminent event to be merged into the window")
        standin.set_gce("upcoming-maintenance", *UNAVAILABLE)
        standin.set_gce("maintenance-event", 200, b"NONE")
        wait_until(lambda: _scheduled(collector) == [], timeout=10, what="the notice to clear")
        assert all(h.get("metadata-flavor") == "Google" for _, p, h in standin.requests if p.startswith("/compute"))
        assert not any(collector.watch.errors.values())
    finally:
        collector.close()


def test_garbage_is_counted_logged_once_and_survived(standin: MetadataStandIn,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    standin.garbage.add("upcoming-maintenance")
    standin.set_gce("upcoming-maintenance", 200, UPCOMING)
    collector = _collector(gce.GceWatch(FAST, standin.host))
    try:
        wait_until(lambda: collector.watch.errors["garbage"] >= 3, timeout=20, what="garbage counted, retried")
        assert _scheduled(collector) == [] and "garbage: not JSON" in (collector.degraded or "")
        assert sum("upcoming-maintenance failed" in r.message for r in caplog.records) == 1
        errors = {dict(s.labels)["result"]: s.value for s in collector.collect()
                  if s.name == "tpuwatch_maintenance_errors_total"}
        assert errors["garbage"] >= 3 and errors["timeout"] == 0
        standin.garbage.clear()
        wait_until(lambda: _scheduled(collector), timeout=10, what="recovery once the answers are sane")
        assert collector.degraded is None
    finally:
        collector.close()


def test_an_unforeseen_error_in_a_watch_is_counted_and_the_watch_goes_on(standin: MetadataStandIn,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    failures = iter([OverflowError("timestamp out of range"), KeyError("window")])

    def parse(status: int, body: bytes) -> events.Maintenance | None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return events.parse_gce_upcoming(status, body)

    monkeypatch.setattr(gce, "parse_gce_upcoming", parse)
    standin.set_gce("upcoming-maintenance", 200, UPCOMING)
    collector = _collector(gce.GceWatch(FAST, standin.host))
    try:
        wait_until(lambda: _scheduled(collector), timeout=20, what="the notice after two unforeseen errors")
        assert collector.watch.errors["garbage"] == 2 and collector.degraded is None
    finally:
        collector.close()


def test_a_slow_server_never_holds_sampling_and_shutdown_does_not_wait(standin: MetadataStandIn) -> None:
    standin.delay = 3.0  # beyond request_timeout: every request times out
    collector = MaintenanceCollector(gce.GceWatch(FAST, standin.host), first_wait=0.2)
    try:
        for _ in range(5):
            began = time.monotonic()
            collector.collect()
            assert time.monotonic() - began < 0.5
        wait_until(lambda: collector.watch.errors["timeout"] >= 2, timeout=15, what="timeouts counted")
    finally:
        began = time.monotonic()
        collector.close()
        assert time.monotonic() - began < 1.0


def test_stop_ends_an_open_watch_at_once(standin: MetadataStandIn) -> None:
    watch = gce.GceWatch(MaintenanceConfig(watch_timeout=300.0), standin.host)
    watch.start()
    wait_until(lambda: any("maintenance-event?wait_for_change=true" in p for _, p, _ in standin.requests),
               what="the hanging watch (the stand-in holds it for up to 300 s)")
    began = time.monotonic()
    watch.stop()
    assert time.monotonic() - began < 1.0
    assert not any(watch.errors.values())


def test_a_server_that_is_down_is_counted_as_unreachable() -> None:
    port = free_port()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    collector = MaintenanceCollector(ec2.Ec2Watch(FAST, f"http://127.0.0.1:{port}/"), first_wait=5.0)
    try:
        assert _scheduled(collector) == []
        wait_until(lambda: collector.watch.errors["unreachable"] >= 1, what="the refused connection counted")
        assert "ec2 metadata scheduled-events: unreachable" in (collector.degraded or "")
    finally:
        collector.close()


def test_ec2_events_through_imdsv2_with_a_token_renewed_on_401(standin: MetadataStandIn) -> None:
    standin.set_ec2_events(EC2_EVENTS)
    collector = _collector(ec2.Ec2Watch(FAST, standin.url))
    try:
        (labels,) = wait_until(lambda: _scheduled(collector), what="the scheduled event")
        assert labels["kind"] == "reboot" and labels["event_id"] == "instance-event-0d59937288b749b32"
        puts = [h for m, _, h in standin.requests if m == "PUT"]
        assert len(puts) == 1 and puts[0]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
        standin.expire_tokens()
        standin.set_ec2_events(b"[]")
        wait_until(lambda: _scheduled(collector) == [], timeout=10, what="the event cleared after a new token")
        assert len([m for m, _, _ in standin.requests if m == "PUT"]) == 2
        assert not any(collector.watch.errors.values())
    finally:
        collector.close()


# --- the ladder waits for the window ---------------------------------------------------------------------------

def test_a_cordon_before_the_window_waits_until_the_window_is_that_close() -> None:
    kubernetes = build(KubernetesConfig, {"node_conditions": True, "remediation": [
        {"trigger": "MaintenanceScheduled", "actions": [{"type": "cordon", "before_window": "2h"}]}]}, "kubernetes")
    ladders = Ladders(kubernetes, "node-0")
    announced = Trigger("MaintenanceScheduled", True, "MaintenanceScheduled", starts_at=START)
    assert ladders.plan({"MaintenanceScheduled": announced}, START - 6 * 3600).steps == []
    assert ladders.plan({"MaintenanceScheduled": announced}, START - 2 * 3600 - 1).steps == []
    (step,) = ladders.plan({"MaintenanceScheduled": announced}, START - 2 * 3600).steps
    assert step.action.type == "cordon"
    imminent = Trigger("MaintenanceScheduled", True, "MaintenanceScheduled")  # no window known: at once
    assert Ladders(kubernetes, "node-0").plan({"MaintenanceScheduled": imminent}, START).steps


def test_the_maintenance_condition_is_off_by_default_and_added_when_asked() -> None:
    off = parse("kubernetes: {node_conditions: true}")
    assert "HostMaintenanceScheduled" not in [c.type for c in condition_table(off.kubernetes, offered(off))]
    on = parse("kubernetes: {node_conditions: true}\nmaintenance: {node_condition: true}")
    table = condition_table(on.kubernetes, offered(on))
    assert table[-1].type == "HostMaintenanceScheduled"
    assert [(s.alert, s.reason) for s in table[-1].sources] == [("MaintenanceScheduled", "MaintenanceScheduled")]
    named = parse("kubernetes: {node_conditions: true, conditions: [{type: HostMaintenanceScheduled, sources: "
                  "[{alert: MaintenanceScheduled, reason: Announced}]}]}\nmaintenance: {node_condition: true}")
    assert [c.type for c in condition_table(named.kubernetes, offered(named))] == ["HostMaintenanceScheduled"]
    with pytest.raises(ConfigError, match="maintenance.node_condition: needs kubernetes.node_conditions: true"):
        parse("maintenance: {node_condition: true}")
