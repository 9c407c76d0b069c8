"""The alerting and notify config keys: redaction (their validation errors are in test_config.py)."""

from __future__ import annotations

import yaml

from tpuwatch import config as config_module


def test_headers_are_redacted_and_the_shown_config_is_valid() -> None:
    config = config_module.parse("notify: [{name: x, type: webhook, url: 'http://a/', "
                                 "headers: {Authorization: Bearer T0KEN}}]")
    shown = config_module.to_yaml(config)
    assert "T0KEN" not in shown and yaml.safe_load(shown)["notify"][0]["headers"] == "<secret>"
    assert config_module.parse(config_module.to_yaml(config_module.parse(
        "notify: [{name: x, type: webhook, url: 'http://a/'}]"))).notify[0].headers is None
