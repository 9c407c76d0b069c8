"""Secrets never echo back (issue #14 item 7): receivers that repeat the URL, the credentials and the routing
key in error pages and redirects, in every encoding, and every path their answer can take."""

from __future__ import annotations

import base64
import html
import json
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from test_alerting_receivers import firing_alert, send_one

from tpuwatch import config as config_module
from tpuwatch import logsetup
from tpuwatch.notifiers import build_notifiers

from conftest import SIM_FAST, run_cli, wait_until
from http_receiver import ECHO_FORMS

USER = "ops"
PASSWORD = 'p@ss w/rd"+\u00e9'  # a character every encoding changes, and one JSON writes as \u00e9
URL_TOKEN = "B0T-T0KEN-in-the-path"
ROUTING_KEY = "PDR0UTINGKEY42"
API_KEY = "sk-HEADERT0KEN"
HMAC_KEY = "HMACS3CRET"
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
SECRETS = [PASSWORD, URL_TOKEN, ROUTING_KEY, API_KEY, HMAC_KEY, BASIC]


def forms(secret: str) -> list[str]:
    """The secret as a careless receiver, a browser or a JSON writer may repeat it."""
    return [secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret), urllib.parse.quote_plus(secret),
            urllib.parse.quote(secret, safe="").lower(), json.dumps(secret)[1:-1], json.dumps(secret)[1:-1].replace(
                "/", "\\/"), json.dumps(secret, ensure_ascii=False)[1:-1], html.escape(secret)]


def assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        for form in forms(secret):
            assert form not in text, f"{secret!r} as {form!r} in {where}: {text[:2000]}"


def receiver_configs(url: str, directory: Path, tag: str = "") -> list[dict[str, Any]]:
    """A webhook with basic auth in its URL and an API key header, Slack with its secret URL in a file,
    PagerDuty with its routing key in a file, an Alertmanager behind basic auth."""
    directory.mkdir(exist_ok=True)
    (directory / "slack.url").write_text(f"{url}/services/{URL_TOKEN}\n")
    (directory / "pd.key").write_text(ROUTING_KEY + "\n")
    (directory / "hmac.key").write_text(HMAC_KEY + "\n")
    authed = url.replace("http://", f"http://{USER}:{urllib.parse.quote(PASSWORD, safe='')}@")
    return [{"name": f"hook{tag}", "type": "webhook", "url": f"{authed}/hook", "headers": {"X-Api-Key": API_KEY},
             "secret_file": str(directory / "hmac.key")},
            {"name": f"chat{tag}", "type": "slack", "url_file": str(directory / "slack.url")},
            {"name": f"pd{tag}", "type": "pagerduty", "url": f"{url}/v2/enqueue",
             "routing_key_file": str(directory / "pd.key")},
            {"name": f"am{tag}", "type": "alertmanager", "urls": [authed]}]


@pytest.mark.parametrize("form", list(ECHO_FORMS))
def test_redact_finds_a_secret_in_every_encoding(form: str) -> None:
    logsetup.add_secrets(SECRETS)
    echoed = ECHO_FORMS[form](f"denied for {USER}:{PASSWORD} at /services/{URL_TOKEN} key={ROUTING_KEY} "
                              f"auth=Basic {BASIC} x-api-key={API_KEY}")
    cleaned = logsetup.redact(echoed)
    assert_clean(cleaned, form)
    assert cleaned.count(logsetup.PLACEHOLDER) >= 5


def test_short_values_are_not_hidden_everywhere() -> None:
    logsetup.add_secrets(["on", "1", "abc"])
    assert logsetup.redact("device 1 is on, abc") == "device 1 is on, abc"


@pytest.mark.parametrize("status", [400, 401, 403, 500, 503, 302, 307])
def test_no_echo_of_any_receiver_brings_a_secret_into_the_answer(receivers: Any, tmp_path: Path,
                                                                  status: int) -> None:
    echo = receivers("echo")
    echo.echo_status = status
    config = config_module.parse(yaml.safe_dump({"notify": receiver_configs(echo.url(""), tmp_path)}))
    notifiers = build_notifiers(config.notify, 10.0)
    for form in ECHO_FORMS:
        echo.echo_form = form
        for notifier in notifiers:
            answer = send_one(notifier, firing_alert())
            assert not answer.ok and answer.detail.startswith(f"HTTP {status}"), answer.detail
            assert_clean(answer.detail, f"{notifier.name}'s answer ({form})")
            assert logsetup.PLACEHOLDER in answer.detail, answer.detail  # it did echo a secret, hidden here
            if status in (302, 307):
                assert "to https://login.example/?next=" in answer.detail and "not followed" in answer.detail


def test_a_daemon_with_echoing_receivers_keeps_every_secret_out_of_everything(
        start_daemon: Any, receivers: Any, tmp_path: Path) -> None:
    """The real daemon delivering to receivers that echo its credentials in 401, 500 and redirect answers: its log
    (journal-style priority lines included), /api/alerts, `tpuwatch alerts`, `test-alert`, `config show` and the
    outbox stay clean."""
    rejecting, failing, redirecting = receivers("echo"), receivers("echo"), receivers("echo")
    rejecting.echo_status, failing.echo_status, redirecting.echo_status = 401, 500, 302
    failing.echo_form, redirecting.echo_form = "json", "url"
    notify = [receiver for echo, tag in ((rejecting, "-r"), (failing, "-f"), (redirecting, "-d"))
              for receiver in receiver_configs(echo.url(""), tmp_path / tag, tag)]
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: [{alert: PastedKey, metric: tpuwatch_device_up, op: '==', threshold: 1, "
                     f"annotations: {{summary: 'someone pasted {ROUTING_KEY} here'}}}}]\n")
    daemon = start_daemon({**SIM_FAST, "log_level": "debug", "notify": notify,
                           "alerting": {"group_wait": "0s", "group_interval": "1s", "retry_initial": "50ms",
                                        "retry_max": "200ms", "rule_files": [str(rules)]}},
                          args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    wait_until(lambda: daemon.log().count("rejected notification") >= 4 and "delivery failed" in daemon.log()
               and "redirects are not followed" in daemon.log(), 30, "every receiver's answer in the log")
    api = requests.get(f"{daemon.url}/api/alerts", timeout=5).text
    assert "PastedKey" in api and logsetup.PLACEHOLDER in api
    listed = run_cli("alerts", "--config", str(daemon.config_path))
    tested = run_cli("test-alert", "--config", str(daemon.config_path))
    shown = run_cli("config", "show", "--config", str(daemon.config_path))
    assert tested.returncode == 1 and tested.stdout.count("FAILED") == len(notify)
    daemon.stop()
    with sqlite3.connect(tmp_path / "daemon0" / "state" / "simulated" / "alerting.db") as conn:  # sim namespace
        outbox = json.dumps(conn.execute("SELECT body FROM outbox").fetchall())
    for where, text in (("daemon log", daemon.log()), ("/api/alerts", api), ("tpuwatch alerts", listed.stdout),
                        ("test-alert", tested.stdout + tested.stderr), ("config show", shown.stdout),
                        ("outbox", outbox)):
        assert_clean(text, where)


def test_a_url_file_that_holds_no_url_is_refused_without_showing_it(tmp_path: Path) -> None:
    (tmp_path / "slack.url").write_text(f"hooks.slack.example/services/{URL_TOKEN}\n")  # the scheme forgotten
    config = config_module.parse(yaml.safe_dump({"notify": [
        {"name": "chat", "type": "slack", "url_file": str(tmp_path / "slack.url")}]}))
    with pytest.raises(config_module.ConfigError) as caught:
        build_notifiers(config.notify, 10.0)
    assert str(caught.value) == (f"notify.chat.url_file: {tmp_path / 'slack.url'} does not hold an http:// or "
                                 "https:// URL with a host")
