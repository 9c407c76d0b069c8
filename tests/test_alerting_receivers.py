"""Real HTTP receivers on 127.0.0.1 (recording, 500, hanging, dropping) and how each notifier copes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path
from typing import Any

from tpuwatch import config as config_module
from tpuwatch.alerting.state import Alert, fingerprint
from tpuwatch.notifiers import build_notifiers
from tpuwatch.notifiers.base import SIGNATURE_HEADER


def firing_alert(device: str = "0", name: str = "AcceleratorEccUncorrectable") -> Alert:
    labels = {"alertname": name, "severity": "critical", "device": device, "host": "h1"}
    return Alert(fingerprint(labels), labels, {"summary": f"ECC on {device}", "runbook_url": "https://rb/x"},
                 "firing", 1_700_000_000.0, fired_at=1_700_000_000.0)


def notifiers_for(receivers_yaml: str, timeout: str = "10s") -> list[Any]:
    config = config_module.parse(f"alerting: {{send_timeout: {timeout}}}\nnotify:\n{receivers_yaml}")
    return build_notifiers(config.notify, config.alerting.send_timeout)


def send_one(notifier: Any, alert: Alert, firing: bool = True) -> Any:
    (body,) = notifier.bodies((alert.labels["alertname"], alert.labels.get("device", "")),
                              [alert.told(firing, None if firing else alert.fired_at)], "http://h1:9847")
    return notifier.send(body, "key-1")


def test_webhook_signs_with_the_secret_and_adds_headers(receivers: Any, tmp_path: Path) -> None:
    hook = receivers()
    (tmp_path / "hmac.key").write_text("s3cr3t-hmac\n")
    (notifier,) = notifiers_for(f"  - {{name: hook, type: webhook, url: '{hook.url()}', "
                                f"secret_file: '{tmp_path / 'hmac.key'}', headers: {{X-Team: ml-infra}}}}\n")
    answer = send_one(notifier, firing_alert())
    assert answer.ok and answer.detail.startswith("HTTP 200")
    (request,) = hook.requests
    expected = hmac.new(b"s3cr3t-hmac", request["body"], hashlib.sha256).hexdigest()
    assert request["headers"][SIGNATURE_HEADER] == f"sha256={expected}"
    assert request["headers"]["X-Team"] == "ml-infra"
    assert request["headers"]["X-Tpuwatch-Notification-Id"] == "key-1"


def test_credentials_in_the_url_become_basic_auth(receivers: Any) -> None:
    hook = receivers()
    url = hook.url("/hook").replace("http://", "http://ops%40team:p%3Ass@")
    (notifier,) = notifiers_for(f"  - {{name: am, type: alertmanager, urls: ['{url}']}}\n")
    assert send_one(notifier, firing_alert()).ok
    (request,) = hook.requests
    assert request["path"] == "/hook/api/v2/alerts"
    assert request["headers"]["Authorization"] == "Basic " + base64.b64encode(b"ops@team:p:ss").decode()
    hook.mode = "error"
    assert "p%3Ass" not in send_one(notifier, firing_alert()).detail


def test_500_is_retryable_and_detail_has_no_url_secret(receivers: Any) -> None:
    broken = receivers("error")
    (notifier,) = notifiers_for(f"  - {{name: h, type: webhook, url: '{broken.url('/hook/TOKEN123')}'}}\n")
    answer = send_one(notifier, firing_alert())
    assert (answer.ok, answer.retry) == (False, True)
    assert answer.detail == "HTTP 500 Internal Server Error: upstream broken"


def test_hanging_receiver_times_out(receivers: Any) -> None:
    hung = receivers("hang")
    (notifier,) = notifiers_for(f"  - {{name: h, type: webhook, url: '{hung.url('/hook/TOKEN123')}'}}\n",
                                timeout="300ms")
    started = time.monotonic()
    answer = send_one(notifier, firing_alert())
    assert time.monotonic() - started < 3
    assert (answer.ok, answer.retry, answer.detail) == (False, True, "no answer within 0.3s")


def test_dropped_connection_is_retryable_without_url(receivers: Any) -> None:
    dropping = receivers("drop")
    (notifier,) = notifiers_for(f"  - {{name: h, type: webhook, url: '{dropping.url('/hook/TOKEN123')}'}}\n")
    answer = send_one(notifier, firing_alert())
    assert (answer.ok, answer.retry) == (False, True)
    assert "TOKEN123" not in answer.detail and "127.0.0.1" not in answer.detail


def test_pagerduty_trigger_and_resolve_share_the_dedup_key(receivers: Any, tmp_path: Path) -> None:
    pd = receivers()
    (tmp_path / "pd.key").write_text("R0UTING-KEY\n")
    (notifier,) = notifiers_for(f"  - {{name: pd, type: pagerduty, url: '{pd.url('/v2/enqueue')}', "
                                f"routing_key_file: '{tmp_path / 'pd.key'}'}}\n")
    alert = firing_alert("3")
    assert send_one(notifier, alert).detail.startswith("HTTP 202")
    assert send_one(notifier, alert, firing=False).ok
    trigger, resolve = pd.json()
    assert trigger["routing_key"] == "R0UTING-KEY" and trigger["event_action"] == "trigger"
    assert resolve["event_action"] == "resolve" and trigger["dedup_key"] == resolve["dedup_key"] == alert.fingerprint
    assert trigger["payload"] == {
        "summary": "ECC on 3", "source": "h1", "severity": "critical", "timestamp": "2023-11-14T22:13:20.000Z",
        "component": "device 3", "group": "AcceleratorEccUncorrectable", "class": "critical",
        "custom_details": {"labels": alert.labels, "annotations": alert.annotations}}
    assert trigger["links"] == [{"href": "https://rb/x", "text": "runbook"}]


def test_slack_gets_text_and_blocks(receivers: Any) -> None:
    slack = receivers()
    (notifier,) = notifiers_for(f"  - {{name: s, type: slack, url: '{slack.url()}'}}\n")
    assert send_one(notifier, firing_alert("1")).ok
    (body,) = slack.json()
    assert body["text"] == "[FIRING:1] AcceleratorEccUncorrectable device 1"
    assert body["blocks"][0]["type"] == "header"
    assert body["blocks"][1]["text"]["text"] == ":red_circle: *ECC on 1*\n<https://rb/x|runbook>"


def test_4xx_is_a_rejection_not_retried(receivers: Any) -> None:
    picky = receivers("reject")
    (notifier,) = notifiers_for(f"  - {{name: h, type: webhook, url: '{picky.url()}'}}\n")
    answer = send_one(notifier, firing_alert())
    assert (answer.ok, answer.retry, answer.detail) == (False, False, 'HTTP 400 Bad Request: {"error":"bad event"}')
