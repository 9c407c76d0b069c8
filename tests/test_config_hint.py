"""A misspelt key or choice is answered with the one it most likely meant, in the same one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuwatch import config as config_module
from tpuwatch.alerting.rules import parse_rules
from tpuwatch.schema import ConfigError, did_you_mean

from conftest import run_cli


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config_module.parse(text)
    return str(caught.value)


@pytest.mark.parametrize("text,message", [
    ("kernel_log:\n  sorce: kmsg\n", "kernel_log.sorce: unknown key; did you mean 'source'?"),
    ("intervall: 10s\n", "intervall: unknown key; did you mean 'interval'?"),
    ("state-dir: /srv/tpuwatch\n", "state-dir: unknown key; did you mean 'state_dir'?"),
    ("Listen: 127.0.0.1:9847\n", "Listen: unknown key; did you mean 'listen'?"),
    ("canary: {enable: false}\n", "canary.enable: unknown key; did you mean 'enabled'?"),
    ("devices: {sim: {cuont: 2}}\n", "devices.sim.cuont: unknown key; did you mean 'count'?"),
    ("devices: {backend: nvida}\n",
     "devices.backend: must be one of auto, tpu, nvidia, sim, amd, none; got 'nvida'; did you mean 'nvidia'?"),
    ("devices: {backend: NVIDIA}\n",
     "devices.backend: must be one of auto, tpu, nvidia, sim, amd, none; got 'NVIDIA'; did you mean 'nvidia'?"),
    ("log_level: warn\n", "log_level: must be one of debug, info, warning, error; got 'warn'; did you mean 'warning'?"),
    ("kernel_log: {source: journald}\n",
     "kernel_log.source: must be one of auto, kmsg, journal, file, none; got 'journald'; did you mean 'journal'?"),
    ("notify: [{name: oncall, type: slak, url: 'https://hooks.slack.com/x'}]\n",
     "notify[0].type: must be one of webhook, alertmanager, pagerduty, slack; got 'slak'; did you mean 'slack'?"),
])
def test_a_misspelling_names_what_it_likely_meant(text: str, message: str) -> None:
    assert _error(text) == message


@pytest.mark.parametrize("text,message", [
    ("colour: red\n", "colour: unknown key (known keys: alerting, canary, collector_timeout, devices, host, "
                      "interval, kernel_log, kubernetes, listen, log_level, maintenance, notify, paths, probe, "
                      "state_dir, store, trend, web_config)"),
    ("store: {size: 5}\n", "store.size: unknown key (known keys: max_series, points_per_series)"),
    ("devices: {backend: gpu}\n", "devices.backend: must be one of auto, tpu, nvidia, sim, amd, none; got 'gpu'"),
    ("devices: {backend: 7}\n", "devices.backend: must be one of auto, tpu, nvidia, sim, amd, none; got 7"),
    ("{1: x}\n", "[\"1\"]: unknown key (known keys: alerting, canary, collector_timeout, devices, host, interval, "
                 "kernel_log, kubernetes, listen, log_level, maintenance, notify, paths, probe, state_dir, store, "
                 "trend, web_config)"),
])
def test_without_a_close_match_the_known_keys_are_listed(text: str, message: str) -> None:
    assert _error(text) == message


def test_a_prefix_is_suggested_only_when_it_names_one_key() -> None:
    assert did_you_mean("retry", ["retry_initial", "retry_max"]) == ""
    assert did_you_mean("ret", ["retry_initial", "timeout"]) == "; did you mean 'retry_initial'?"
    assert did_you_mean("re", ["retry_initial"]) == ""


def test_a_huge_or_odd_key_is_answered_in_one_bounded_line() -> None:
    message = _error(f"? {'sorce' * 20_000}\n: 1\n")
    assert message.startswith('["sorcesorce') and "...\"]: unknown key (known keys: alerting" in message
    assert len(message) < 400
    odd = _error('"sorce\\n": 1\n')
    assert odd.startswith('["sorce\\n"]: unknown key') and "\n" not in odd


def test_other_files_built_from_the_schema_get_the_hint_too() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules("rules:\n  - {alert: X, metrc: m}\n", "test.yaml")
    assert str(caught.value) == "test.yaml: rules[0].metrc: unknown key; did you mean 'metric'?"


def test_config_check_says_it_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("kernel_log:\n  sorce: kmsg\n")
    result = run_cli("config", "check", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "tpuwatch: config error: kernel_log.sorce: unknown key; did you mean 'source'?"]
    assert result.stdout == ""
    path.write_text("devices:\n  backend: nvida\n")
    result = run_cli("config", "check", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["tpuwatch: config error: devices.backend: must be one of auto, tpu, nvidia, "
                                          "sim, amd, none; got 'nvida'; did you mean 'nvidia'?"]
