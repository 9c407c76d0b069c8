"""Config: typed loading, defaults, errors naming the key path, redaction, the example file."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuwatch import config as config_module
from tpuwatch.config import Config, ReceiverConfig
from tpuwatch.plugins import PLUGINS
from tpuwatch.schema import ConfigError
from tpuwatch.syntax import format_duration, parse_duration, parse_listen_address
from tpuwatch.webconfig import load_web_config

from certs import make_tls_files
from conftest import run_cli

EXAMPLE = Path(__file__).parent.parent / "packaging" / "config.example.yaml"


@pytest.mark.parametrize("text,seconds", [("500ms", 0.5), ("10s", 10), ("5m", 300), ("2h", 7200),
                                          ("1d", 86400), ("1.5s", 1.5), ("0", 0)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "ten seconds", "5 min", "-1s", "", "1" * 400 + "d"])
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
    # A bare number is not a duration (Prometheus refuses it too): every Duration key alike.
    ("interval: 10", "interval: 10 has no unit: write 10s"),
    ("interval: '10'", "interval: 10 has no unit: write 10s"),
    ("interval: 2.5", "interval: 2.5 has no unit: write 2.5s"),
    ("canary: {every: 3600}", "canary.every: 3600 has no unit"),
    ("alerting: {group_wait: 30}", "alerting.group_wait: 30 has no unit"),
    ("devices: {sim: {fault_after: 1}}", "devices.sim.fault_after: 1 has no unit"),
    ("interval: 0", "interval: duration 0ms out of range 100ms..1h"),
    ("interval: true", "interval: expected a duration like 10s, got a boolean"),
    ("interval: 2h", "interval: duration 2h out of range"),
    ("listen: 9847", "listen: expected a string, got int"),
    ("listen: 'localhost'", "listen: invalid listen address"),
    ("listen: '127.0.0.1:70000'", "listen: port 70000 out of range"),
    ("devices: {backend: tpu9}", "devices.backend: must be one of auto, tpu, nvidia, sim, amd, none"),
    ("devices: {sim: {count: 'four'}}", "devices.sim.count: expected an integer, got a string"),
    ("devices: {sim: {count: true}}", "devices.sim.count: expected an integer, got a boolean"),
    ("devices: {sim: {count: 0}}", "devices.sim.count: 0 out of range 1..64"),
    ("devices: {sim: {count: 2, fault_device: 2}}", "devices.sim.fault_device: 2 is not below count 2"),
    ("paths: [a, b]", "paths: expected a mapping, got a list"),
    # Paths: absolute where a relative one would depend on the daemon's working directory; never a NUL byte.
    ("state_dir: var/lib/tpuwatch", "state_dir: must be an absolute path (starting with /), got 'var/lib/tpuwatch'"),
    ("state_dir: ''", "state_dir: must not be empty"),
    ('state_dir: "/var/lib/tpu\\0watch"', "state_dir: a NUL byte is not allowed"),
    ("paths: {sysfs: sys}", "paths.sysfs: must be an absolute path"),
    ("web_config: web.yml", "web_config: must be an absolute path"),
    ("kernel_log: {source: file, path: kern.log}", "kernel_log.path: must be an absolute path"),
    ("kernel_log: {rules_dirs: [/etc/a, rules.d]}", "kernel_log.rules_dirs[1]: must be an absolute path"),
    ("canary: {python: python3}", "canary.python: must be an absolute path"),
    ("canary: {lockfile: libtpu_lockfile}", "canary.lockfile: must be an absolute path"),
    ("alerting: {rule_files: ['alerts/*.yaml']}",
     "alerting.rule_files[0]: must be an absolute path (starting with / or ~)"),
    ('notify: [{name: x, type: slack, url_file: "a\\0b"}]', "notify[0].url_file: a NUL byte is not allowed"),
    ("notify: [{name: x, type: slack, url_file: ''}]", "notify[0].url_file: must not be empty"),
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
    ("notify: [{name: x, type: webhook, url: 'http://a/', headers: {'X Y': v}}]",
     'notify[0].headers["X Y"]: not a valid HTTP header name'),
    ('notify: [{name: x, type: webhook, url: "http://a/", headers: {X-Token: "t\\r\\nHost: evil"}}]',
     "notify[0].headers.X-Token: the value must not hold CR, LF or NUL"),
    ("notify: [{name: x, type: webhook, url: 'http://a/', match: {app.kubernetes.io/name: '(x'}}]",
     'notify[0].match["app.kubernetes.io/name"]: invalid regular expression'),
    ("notify: [{name: x, type: webhook, url: 'http://a b/'}]", "notify[0].url: invalid URL"),
    ("notify: [{name: a, type: slack, url: 'http://a/'}, {name: a, type: slack, url: 'http://b/'}]",
     "notify[1].name: duplicate receiver name 'a'"),
    ("notify: [{name: x, type: alertmanager, urls: ['ftp://a/']}]", "notify[0].urls[0]: invalid URL"),
    ("alerting: {retry_initial: 10s, retry_max: 1s}", "alerting.retry_max: must not be below retry_initial"),
    ("alerting: {outbox_max_bytes: 1000}", "alerting.outbox_max_bytes: 1000 out of range"),
    ("alerting: {breaker_failures: 0}", "alerting.breaker_failures: 0 out of range"),
])
def test_errors_name_the_key_path(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.parse(text)
    assert str(caught.value).startswith(message), str(caught.value)


def test_messages_stay_short_and_on_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.parse(f"log_level: '{'x' * 100_000}\\n'\n")
    assert len(str(caught.value)) < 200 and "\n" not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        config_module.parse('paths: {"a\\nb": 1}\n')
    assert str(caught.value).startswith('paths["a\\nb"]: unknown key') and "\n" not in str(caught.value)


def test_one_string_is_a_list_of_one() -> None:
    config = config_module.parse("devices: {tpu: {metrics_addr: 'localhost:8431'}}\n"
                                 "kernel_log: {rules_dirs: /etc/rules}\nhost: {device_files: 'accel*'}\n"
                                 "alerting: {rule_files: /etc/alerts/*.yaml}\n"
                                 "notify: [{name: am, type: alertmanager, urls: 'http://am:9093'}]\n")
    assert config.devices.tpu.metrics_addr == ["localhost:8431"]
    assert config.kernel_log.rules_dirs == ["/etc/rules"] and config.host.device_files == ["accel*"]
    assert config.alerting.rule_files == ["/etc/alerts/*.yaml"] and config.notify[0].urls == ["http://am:9093"]
    with pytest.raises(ConfigError, match=r"^kernel_log\.rules_dirs: must be an absolute path"):
        config_module.parse("kernel_log: {rules_dirs: rules.d}\n")
    with pytest.raises(ConfigError, match=r"^notify: expected a list, got a string"):
        config_module.parse("notify: oncall\n")


def test_yaml_errors_give_file_line_and_column() -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.parse("interval: 10s\ndevices:\n  sim: {count: 4\n  backend: sim\n", "cfg.yaml")
    assert str(caught.value) == "cfg.yaml: line 4, column 10: YAML syntax error: did not find expected ',' or '}'"
    with pytest.raises(ConfigError) as caught:
        config_module.parse("interval: 10s\nlisten: ':1'\ninterval: 20s\n", "cfg.yaml")
    assert str(caught.value) == "cfg.yaml: line 3, column 1: duplicate key 'interval' (first at line 1)"


def test_url_passwords_never_appear_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.parse("notify: [{name: x, type: webhook, url: 'ftp://user:hunter2@h/x'}]")
    assert "hunter2" not in str(caught.value)


def _config_keys(cls: type, prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    if cls is Config:  # the registered plugins' sections are top-level keys too
        for plugin in PLUGINS:
            yield plugin.name
            yield from _config_keys(plugin.settings, f"{plugin.name}.")
    for spec in dataclasses.fields(cls):
        if not spec.metadata.get("key", True):
            continue
        path = f"{prefix}{spec.name}"
        yield path
        if dataclasses.is_dataclass(hints[spec.name]):
            yield from _config_keys(hints[spec.name], f"{path}.")


def _example_keys(node: Any, prefix: str = "") -> Iterator[tuple[str, int]]:
    for key, value in node.value:
        yield f"{prefix}{key.value}", key.start_mark.line
        if isinstance(value, yaml.MappingNode):
            yield from _example_keys(value, f"{prefix}{key.value}.")


def test_example_config_shows_every_key_commented_with_its_default() -> None:
    text = EXAMPLE.read_text()
    lines = text.splitlines()
    keys = dict(_example_keys(yaml.compose(text)))
    assert sorted(keys) == sorted(_config_keys(Config)), "the example must show every key of Config, no other"
    for key, line in keys.items():
        above = next((lines[i] for i in range(line - 1, -1, -1) if lines[i].strip()), "")
        assert " # " in lines[line] or above.lstrip().startswith("#"), f"{key} (line {line + 1}) has no comment"
    # Spelled as `config show` spells the defaults: the same data, key for key.
    assert yaml.safe_load(text) == config_module.plain(Config())
    assert config_module.load(EXAMPLE) == Config()
    # notify is empty by default; its commented-out example names every receiver key.
    commented = "\n".join(line for line in text[text.index("# notify:"):].splitlines() if line.startswith("#"))
    missing = [f.name for f in dataclasses.fields(ReceiverConfig) if not re.search(rf"\b{f.name}:", commented)]
    assert not missing, f"the commented notify example lacks {missing}"


def test_config_check_cli_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("interval: 5s\n")
    bad.write_text("devices:\n  sim:\n    scenario: meltdown\n")
    assert run_cli("config", "check", "--config", str(good)).returncode == 0
    result = run_cli("config", "check", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "tpuwatch: config error: devices.sim.scenario: must be one of healthy, hbm-leak, ecc-errors, overheat, "
        "sdc, device-lost, hung, maintenance, probe-sdc; got 'meltdown'"]
    missing = run_cli("config", "check", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr == f"tpuwatch: config error: {tmp_path}/nope.yaml: cannot read: No such file or directory\n"
    unitless = tmp_path / "unitless.yaml"
    unitless.write_text("interval: 10\n")
    result = run_cli("config", "check", "--config", str(unitless))
    assert (result.returncode, result.stderr) == (
        2, "tpuwatch: config error: interval: 10 has no unit: write 10s (or ms, m, h, d); only 0 needs none\n")


@pytest.mark.parametrize(("interval", "warned"), [("30s", False), ("31s", True), ("1m", True)])
def test_config_check_warns_of_an_interval_too_long_for_the_fast_leak_check(interval: str, warned: bool,
                                                                         tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"interval: {interval}\nkernel_log: {{source: none}}\n")
    result = run_cli("config", "check", "--config", str(path))
    assert (result.returncode, result.stdout) == (0, f"{path}: ok\n")
    seconds = {"30s": "30", "31s": "31", "1m": "60"}[interval]
    assert result.stderr == (f"tpuwatch: config warning: interval: {seconds}s: the fast leak check (a chip full "
                             "within 20 min) is tuned for 30s or less; sampled less often it pages later, and more "
                             "warm-ups (docs/trend.md, Limits)\n" if warned else "")


def test_config_check_reads_what_run_reads(tmp_path: Path) -> None:
    (tmp_path / "bad-rules").mkdir()
    (tmp_path / "bad-rules" / "x.yaml").write_text("rules: [{name: broken}]\n")
    (tmp_path / "alerts.yaml").write_text("rules: [{alert: X}]\n")
    (tmp_path / "web.yaml").write_text("basic_auth_users: {ops: not-a-bcrypt-hash}\n")
    cases = {
        "notify: [{name: a, type: webhook, url: 'http://x/', secret_file: /nonexistent/key}]":
            "notify.a.secret_file: cannot read /nonexistent/key",
        f"alerting: {{rule_files: ['{tmp_path}/alerts.yaml']}}": f"{tmp_path}/alerts.yaml: rules[0].metric",
        f"web_config: {tmp_path}/web.yaml": f"{tmp_path}/web.yaml: basic_auth_users.ops: expected a bcrypt hash",
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


def test_web_config_tls_paths_are_relative_to_its_directory(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir()
    make_tls_files(tmp_path / "tls")
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: tls/server.pem, key_file: tls/server.key}\n")
    assert load_web_config(str(web)).ssl_context is not None
    web.write_text("tls_server_config: {cert_file: tls/absent.pem, key_file: tls/server.key}\n")
    with pytest.raises(ConfigError) as caught:
        load_web_config(str(web))
    assert str(caught.value).startswith(f"{web}: tls_server_config.cert_file: cannot load {tmp_path}/tls/absent.pem")
