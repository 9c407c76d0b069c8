"""Config: typed loading, defaults, errors naming the key path, redaction, the example file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tpuwatch import config as config_module
from tpuwatch.config import Config
from tpuwatch.schema import ConfigError, format_duration, parse_duration, parse_listen_address

from conftest import run_cli

EXAMPLE = Path(__file__).parent.parent / "packaging" / "config.example.yaml"


@pytest.mark.parametrize("text,seconds", [("500ms", 0.5), ("10s", 10), ("5m", 300), ("2h", 7200),
                                          ("1d", 86400), ("1.5s", 1.5)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "ten seconds", "5 min", "-1s", ""])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(0.5, "500ms"), (10, "10s"), (90, "90s"), (300, "5m"), (3600, "1h")])
def test_durations_format_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text,expected", [("127.0.0.1:9847", ("127.0.0.1", 9847)), (":80", ("", 80)),
                                           ("[::1]:9847", ("::1", 9847)), ("localhost:1", ("localhost", 1))])
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(text) == expected


def test_every_key_has_a_default() -> None:
    config = config_module.parse("")
    assert config == Config()
    assert config.interval == 10.0 and config.listen == "127.0.0.1:9847"


def test_values_are_typed() -> None:
    config = config_module.parse("interval: 500ms\ndevices: {backend: sim, sim: {count: 8, scenario: overheat}}\n")
    assert config.interval == 0.5
    assert config.devices.sim.count == 8 and config.devices.sim.scenario == "overheat"


@pytest.mark.parametrize("text,message", [
    ("intervall: 10s", "intervall: unknown key"),
    ("interval: 10 seconds", "interval: invalid duration"),
    ("interval: 2h", "interval: duration 2h out of range"),
    ("listen: 9847", "listen: expected a string, got int"),
    ("listen: 'localhost'", "listen: invalid listen address"),
    ("listen: '127.0.0.1:70000'", "listen: port 70000 out of range"),
    ("devices: {backend: tpu9}", "devices.backend: must be one of auto, tpu, nvidia, sim, none"),
    ("devices: {sim: {count: 'four'}}", "devices.sim.count: expected an integer, got a string"),
    ("devices: {sim: {count: true}}", "devices.sim.count: expected an integer, got a boolean"),
    ("devices: {sim: {count: 0}}", "devices.sim.count: 0 out of range 1..64"),
    ("devices: {sim: {count: 2, fault_device: 2}}", "devices.sim.fault_device: 2 is not below count 2"),
    ("paths: [a, b]", "paths: expected a mapping, got a list"),
    ("notify: [{name: x, type: webhook, url: 'ftp://h/x'}]", "notify[0].url: invalid URL"),
    ("notify: [{name: x, type: webhook, url: 'http:///x'}]", "notify[0].url: invalid URL"),
    ("notify: [{type: webhook, url: 'http://h/x'}]", "notify[0].name: required key missing"),
    ("notify: [{name: x, type: sms, url: 'http://h/'}]", "notify[0].type: must be one of"),
    ("collector_timeout: 20s", "collector_timeout: must not exceed interval"),
    # alerting and notify
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


def test_yaml_syntax_errors_give_the_line() -> None:
    with pytest.raises(ConfigError, match=r"YAML syntax error at line 4"):
        config_module.parse("interval: 10s\ndevices:\n  sim: {count: 4\n  backend: sim\n", "cfg.yaml")


def test_url_passwords_never_appear_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.parse("notify: [{name: x, type: webhook, url: 'ftp://user:hunter2@h/x'}]")
    assert "hunter2" not in str(caught.value)


def test_example_config_validates_and_documents_every_key() -> None:
    config = config_module.load(EXAMPLE)
    data = yaml.safe_load(EXAMPLE.read_text())
    shown = yaml.safe_load(config_module.to_yaml(config))
    assert set(data) == set(shown), "the example should show every top-level key"
    assert config == Config(), "the example should show the defaults"


def test_config_check_cli_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("interval: 5s\n")
    bad.write_text("devices:\n  sim:\n    scenario: meltdown\n")
    assert run_cli("config", "check", "--config", str(good)).returncode == 0
    result = run_cli("config", "check", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "tpuwatch: config error: devices.sim.scenario: must be one of healthy, hbm-leak, ecc-errors, overheat, "
        "sdc, device-lost; got 'meltdown'"]
    missing = run_cli("config", "check", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "No such file" in missing.stderr and "Traceback" not in missing.stderr


def test_config_check_reads_what_run_reads(tmp_path: Path) -> None:
    (tmp_path / "bad-rules").mkdir()
    (tmp_path / "bad-rules" / "x.yaml").write_text("rules: [{name: broken}]\n")
    (tmp_path / "alerts.yaml").write_text("rules: [{alert: X}]\n")
    (tmp_path / "web.yaml").write_text("basic_auth_users: {ops: not-a-bcrypt-hash}\n")
    cases = {
        "notify: [{name: a, type: webhook, url: 'http://x/', secret_file: /nonexistent/key}]":
            "notify.a.secret_file: cannot read /nonexistent/key",
        f"alerting: {{rule_files: ['{tmp_path}/alerts.yaml']}}": f"{tmp_path}/alerts.yaml: rules[0].metric",
        f"web_config: {tmp_path}/web.yaml": f"web_config({tmp_path}/web.yaml)",
        f"kernel_log: {{rules_dirs: ['{tmp_path}/bad-rules']}}": f"{tmp_path}/bad-rules/x.yaml",
    }
    for text, message in cases.items():
        path = tmp_path / "c.yaml"
        path.write_text(text + "\n")
        result = run_cli("config", "check", "--config", str(path))
        assert result.returncode == 2 and result.stdout == "", (text, result.stderr)
        assert result.stderr.startswith("tpuwatch: config error: ") and message in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1


def test_config_show_redacts_secrets(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("notify:\n"
                    "  - {name: hook, type: webhook, url: 'https://bot:s3cret-pw@hooks.example/x'}\n"
                    "  - {name: pd, type: pagerduty, routing_key: R0UTINGKEY123}\n"
                    "  - {name: am, type: alertmanager, urls: ['http://am:l1st-pw@am1:9093', 'http://am2:9093']}\n")
    result = run_cli("config", "show", "--config", str(path))
    assert result.returncode == 0
    assert not {"s3cret-pw", "R0UTINGKEY123", "l1st-pw"} & set(re.findall(r"[\w-]+", result.stdout))
    shown = yaml.safe_load(result.stdout)
    assert shown["notify"][0]["url"] == "https://bot:<secret>@hooks.example/x"
    assert shown["notify"][1]["routing_key"] == "<secret>"
    assert shown["notify"][2]["urls"] == ["http://am:<secret>@am1:9093", "http://am2:9093"]
    assert shown["interval"] == "10s"
    # What config show prints is itself a valid config with the same meaning.
    assert config_module.parse(result.stdout.replace("<secret>", "x")).interval == 10.0


def test_usage_errors_are_one_line() -> None:
    result = run_cli("run", "--simulate", "meltdown")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "invalid choice" in result.stderr
