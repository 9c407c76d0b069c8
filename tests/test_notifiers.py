"""The registry of receiver types: the config's allowed types and checks come from it, and a type registered
there (one class, one line) is validated, built, dispatched and delivered by the shared code alone."""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import Any

import pytest
from test_alerting_receivers import firing_alert

from tpuwatch import config as config_module
from tpuwatch.alerting.dispatch import Dispatcher
from tpuwatch.config import AlertingConfig
from tpuwatch.notifiers import TYPES, build_notifiers
from tpuwatch.notifiers.base import GroupKey, Notifier, NotifierType, Receiver, Sent
from tpuwatch.schema import ConfigError

T0 = 1_700_000_000.0


class PlainText(NotifierType):
    """A made-up receiver type: one line of text per alert, POSTed under /say; needs a header X-Room."""

    name = "plaintext"

    def validate(self, receiver: Receiver, path: str) -> None:
        if "X-Room" not in (receiver.headers or {}):
            raise ConfigError(f"{path}.headers", "plaintext receivers need an X-Room header")

    def bodies(self, receiver: str, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        return [json.dumps({"text": f"{s.labels['alertname']} {'firing' if s.firing else 'resolved'}"}) for s in sent]

    def request(self, target: Notifier, body: str) -> tuple[str, str]:
        return target.url.rstrip("/") + "/say", body


class Resending(PlainText):
    """The same, on the resend path."""

    name = "resending"
    resend = True


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TYPES, PlainText.name, PlainText())
    monkeypatch.setitem(TYPES, Resending.name, Resending())


def test_every_shipped_type_is_one_module_registered_under_its_name() -> None:
    assert list(TYPES) == ["webhook", "alertmanager", "pagerduty", "slack"]
    for name, kind in TYPES.items():
        assert importlib.import_module(f"tpuwatch.notifiers.{name}").TYPE is kind and kind.name == name


def test_the_config_takes_its_types_and_their_checks_from_the_registry(registered: None) -> None:
    with pytest.raises(ConfigError, match=r"^notify\[0\]\.type: must be one of webhook, alertmanager, pagerduty, "
                                          r"slack, plaintext, resending; got 'sms'$"):
        config_module.parse("notify: [{name: x, type: sms, url: 'http://h/'}]")
    with pytest.raises(ConfigError, match=r"^notify\[0\]\.headers: plaintext receivers need an X-Room header$"):
        config_module.parse("notify: [{name: x, type: plaintext, url: 'http://h/'}]")
    with pytest.raises(ConfigError, match=r"^notify\[0\]\.urls: only alertmanager receivers take a list of urls$"):
        config_module.parse("notify: [{name: x, type: plaintext, urls: ['http://h/'], headers: {X-Room: ops}}]")
    config = config_module.parse("notify: [{name: x, type: plaintext, url: 'http://h/', headers: {X-Room: ops}}]")
    assert config.notify[0].kind is TYPES["plaintext"]


def test_a_registered_type_is_dispatched_and_delivered_by_the_shared_code(registered: None, receivers: Any) -> None:
    room = receivers()
    config = config_module.parse(
        f"notify:\n  - {{name: x, type: plaintext, url: '{room.url()}', headers: {{X-Room: ops}}}}\n"
        f"  - {{name: y, type: resending, url: '{room.url()}', headers: {{X-Room: ops}}}}\n")
    grouped, resent = build_notifiers(config.notify, 5.0)
    out, _ = Dispatcher(AlertingConfig(group_wait=0.0), [grouped, resent], 10.0, "x").due([firing_alert()], T0)
    by_receiver = {n.receiver: n for n in out}
    assert not by_receiver["x"].supersede and by_receiver["y"].supersede  # grouped, then the resend path
    answer = grouped.send(by_receiver["x"].bodies[0], "key-1")
    assert answer.ok, answer.detail
    (request,) = room.requests
    assert request["path"] == "/hook/say" and request["headers"]["X-Room"] == "ops"
    assert json.loads(request["body"]) == {"text": "AcceleratorEccUncorrectable firing"}
