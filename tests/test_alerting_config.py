"""The alerting and notify config keys: validation errors by key path, and redaction."""

from __future__ import annotations

import pytest
import yaml

from tpuwatch import config as config_module
from tpuwatch.schema import ConfigError


@pytest.mark.parametrize("text,message", [
    ("notify: [{name: x, type: webhook, urls: ['http://a/']}]", "notify[0].urls: only alertmanager receivers"),
    ("notify: [{name: x, type: alertmanager}]", "notify[0]: receiver 'x' needs exactly one of url, url_file, urls"),
    ("notify: [{name: x, type: slack, url: 'http://a/', secret_file: /k}]",
     "notify[0].secret_file: only webhook receivers sign"),
    ("notify: [{name: x, type: webhook, url: 'http://a/', match: {severity: '(crit'}}]",
     "notify[0].match.severity: invalid regular expression"),
    ("notify: [{name: x, type: webhook, url: 'http://a/', headers: [a]}]", "notify[0].headers: expected a mapping"),
    ("notify: [{name: x, type: alertmanager, urls: ['ftp://a/']}]", "notify[0].urls[0]: invalid URL"),
    ("alerting: {retry_initial: 10s, retry_max: 1s}", "alerting.retry_max: must not be below retry_initial"),
    ("alerting: {outbox_max_bytes: 1000}", "alerting.outbox_max_bytes: 1000 out of range"),
    ("alerting: {breaker_failures: 0}", "alerting.breaker_failures: 0 out of range"),
])
def test_errors_name_the_key_path(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.parse(text)
    assert str(caught.value).startswith(message), str(caught.value)


def test_headers_are_redacted_and_the_shown_config_is_valid() -> None:
    config = config_module.parse("notify: [{name: x, type: webhook, url: 'http://a/', "
                                 "headers: {Authorization: Bearer T0KEN}}]")
    shown = config_module.to_yaml(config)
    assert "T0KEN" not in shown and yaml.safe_load(shown)["notify"][0]["headers"] == "<secret>"
    assert config_module.parse(config_module.to_yaml(config_module.parse(
        "notify: [{name: x, type: webhook, url: 'http://a/'}]"))).notify[0].headers is None
