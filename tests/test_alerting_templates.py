"""Alert texts read as sentences whatever labels an alert has: optional parts, $chip and $process, tidying, and
every shipped rule rendered with all its labels and with each one absent."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tpuwatch.alerting.rules import Rule, load_rules, parse_rules
from tpuwatch.alerting.template import Template, TemplateError, render
from tpuwatch.catalog import CATALOG
from tpuwatch.samples import sample
from tpuwatch.schema import ConfigError

T0 = 1_700_000_000.0
ETA = 2665.0  # 44m 25s
# A value for every label a rule's metric may carry, as the collectors write them.
EXAMPLES = {"device": "0", "pci": "0000:00:04.0", "pid": "4101", "command": "python3", "namespace": "ml",
            "pod": "trainer-0", "container": "jax", "link": "2", "rule": "nvidia_xid", "collector": "devices",
            "source": "megascale", "band": "50-75%", "kind": "crc_flit", "series": "canary_latency",
            "memory": "hbm", "result": "fail", "severity": "critical", "scenario": "sdc", "needs": "canary",
            "reason": "jax is not installed", "action": "node_reboot", "state": "completed", "status": "timeout",
            "health": "unhealthy", "clique_id": "7", "cluster_uuid": "0123456789abcdef0123456789abcdef",
            "field": "nvmlDeviceGetPowerUsage", "gpu_instance": "3", "core": "1",
            "message": "TensorCore 1 halted", "sensor": "junction",
            "cloud": "gce", "event": "TERMINATE_ON_HOST_MAINTENANCE",
            "event_id": "instance-event-0d59937288b749b32", "window": "2026-12-06 03:00-07:00 UTC",
            "start": "1796526000", "path": "job"}
# What a tidy text never holds: blanks doubled or at an end, empty or padded brackets, a blank before
# punctuation, a separator at an end, a preposition left without its object, template syntax.
FLAWS = re.compile(r"  |^\s|\s$|\(\s*\)|\(\s|\s[),.;:]|^[,;:]|[,;:]$|\b(?:on|of|in|at|from)\s*(?:[,.;:)]|$)"
                   r"|\[\[|\]\]|\{\{|\}\}")


def test_optional_parts_vanish_when_a_field_directly_in_them_is_empty() -> None:
    text = "Leak[[ on {{ $chip }}]][[ in pod [[{{ $labels.namespace }}/]]{{ $labels.pod }}]]: {{ $value | duration }}"
    assert render(text, {"device": "0", "pci": "0000:00:04.0", "namespace": "ml", "pod": "p"}, ETA) == \
        "Leak on chip 0 (0000:00:04.0) in pod ml/p: 44m 25s"
    assert render(text, {"device": "0", "pod": "p"}, ETA) == "Leak on chip 0 in pod p: 44m 25s"
    assert render(text, {"namespace": "ml"}, ETA) == "Leak: 44m 25s"
    assert render("[[{{ $labels.a }}]]", {}, 0) == "" and render("[[ fixed text ]]", {}, 0) == "fixed text"


def test_chip_and_process_say_as_much_as_the_labels_do() -> None:
    assert render("{{ $chip }}", {"device": "3", "pci": "0000:13:00.0"}, 0) == "chip 3 (0000:13:00.0)"
    assert render("{{ $chip }}", {"device": "3"}, 0) == "chip 3"
    assert render("x{{ $chip }}", {"pci": "0000:13:00.0"}, 0) == "x"
    who = {"pid": "4101", "command": "python3", "namespace": "ml", "pod": "trainer-0"}
    assert render("{{ $process }}", who, 0) == "process 4101 (python3) in pod ml/trainer-0"
    assert render("{{ $process }}", {"pid": "4101", "pod": "trainer-0"}, 0) == "process 4101 in pod trainer-0"
    assert render("x{{ $process }}", {"command": "python3", "pod": "trainer-0"}, 0) == "x"


@pytest.mark.parametrize("template,labels,expected", [
    ("hbm memory {{ $labels.device }}{{ $labels.pid }}   {{ $labels.command }} {{ $labels.pod }} runs out",
     {"device": "0"}, "hbm memory 0 runs out"),
    ("missing ({{ $labels.pci }}) now", {}, "missing now"),
    ("suspected: {{ $labels.memory }} {{ $labels.pod }}", {}, "suspected"),
    ("a {{ $labels.x }}, b ( {{ $labels.y }} ) .", {"y": "1"}, "a, b (1)."),
])
def test_texts_written_without_optional_parts_are_tidied(template: str, labels: dict[str, str],
                                                         expected: str) -> None:
    assert render(template, labels, 1.0) == expected


@pytest.mark.parametrize("text,message", [
    ("{{ humanize $value }}", "unknown template field '{{ humanize $value }}' (known: {{ $labels.NAME }}"),
    ("{{ $value | humanizeDuration }}",
     "unknown filter 'humanizeDuration' (known: number, percent, duration, bytes, fromnow)"),
    ("on [[ chip {{ $chip }}", "'[[' without its ']]'"),
    ("on ]] chip", "']]' without its '[['"),
    ("{{ $labels.device", "unknown template field '{{'"),
])
def test_bad_templates_are_refused_with_the_file_and_key(text: str, message: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(message)):
        Template(text)
    with pytest.raises(ConfigError) as caught:
        parse_rules(f"rules: [{{alert: X, metric: m, annotations: {{summary: {text!r}}}}}]", "mine.yaml")
    assert str(caught.value).startswith("mine.yaml: rules[0].annotations.summary: ") and message in str(caught.value)


def _matching(pattern: str) -> str:
    """A value of the label that the rule's regex matches (the example when it does)."""
    candidates = [*pattern.split("|"), pattern.replace(".*", "latency")]
    return next(c for c in candidates if re.fullmatch(pattern, c))


def _cases(rule: Rule) -> list[tuple[str, dict[str, str]]]:
    """The labels an alert of ``rule`` has as the daemon builds them: every one, then each optional one absent."""
    names = [*CATALOG[rule.metric].labels, *(["pci"] if "device" in CATALOG[rule.metric].labels else [])]
    full = {name: _matching(rule.match[name]) if name in rule.match else EXAMPLES[name] for name in names}
    own = {"host": "gpu-7", **rule.labels, "alertname": rule.alert, "severity": rule.severity}
    cases = [("all labels", {**full, **own})]
    for name in (n for n in names if n not in rule.match):
        # The daemon adds a chip's pci to alerts with a device label, so no device, no pci (but its own metric's).
        gone = {name, "pci"} if name == "device" and "pci" not in CATALOG[rule.metric].labels else {name}
        cases.append((f"no {name}", {**{k: v for k, v in full.items() if k not in gone}, **own}))
    return cases


BUILT_IN = load_rules(True, [])


@pytest.mark.parametrize("rule", BUILT_IN, ids=lambda r: f"{r.alert}-{r.severity}-{'-'.join(r.match.values())}")
def test_every_shipped_alert_reads_cleanly_and_names_its_chip_and_address(rule: Rule) -> None:
    for case, labels in _cases(rule):
        texts = {key: render(text, labels, ETA) for key, text in rule.annotations.items()}
        assert set(texts) == {"summary", "description"}
        for key, text in texts.items():
            assert text and not FLAWS.search(text), f"{case}: {key}: {text!r}"
        summary = texts["summary"]
        if labels.get("device"):
            assert f"chip {labels['device']}" in summary, f"{case}: {summary!r}"
        if labels.get("pci"):
            assert labels["pci"] in summary, f"{case}: {summary!r}"
        if labels.get("pid"):
            assert f"process {labels['pid']}" in summary, f"{case}: {summary!r}"


@pytest.mark.parametrize("series,labels,expected", [
    ("tpuwatch_memory_exhaustion_eta_seconds", {"memory": "hbm", "device": "0"},
     "Memory leak suspected on chip 0 (0000:00:04.0): HBM runs out in 44m 25s"),
    ("tpuwatch_memory_leak_suspected", {"memory": "hbm", "device": "0"},
     "Memory leak suspected on chip 0 (0000:00:04.0): HBM keeps growing"),
    ("tpuwatch_memory_exhaustion_eta_seconds", {"memory": "host"},
     "Memory leak suspected: host memory runs out in 44m 25s"),
    ("tpuwatch_memory_exhaustion_eta_seconds", {"memory": "process", "pid": "4101", "command": "python3"},
     "Memory leak suspected in process 4101 (python3): host memory runs out in 44m 25s"),
])
def test_the_daemons_alerts_name_chip_address_and_process_in_words(make_alerting: Any, series: str,
                                                                    labels: dict[str, str], expected: str) -> None:
    # The real Alerting, with labels the collectors leave empty and the PCI address learned from
    # tpuwatch_device_info, as the daemon runs it.
    alerting = make_alerting([])
    empty = {"device": "", "pid": "", "command": "", "namespace": "", "pod": "", "container": ""}
    value = 1.0 if series == "tpuwatch_memory_leak_suspected" else ETA
    alerting.evaluate([sample("tpuwatch_device_info", 1, device="0", chip="v5e", pci="0000:00:04.0", backend="tpu"),
                       sample(series, value, **{**empty, **labels})], T0)
    (alert,) = alerting.active_alerts()
    assert alert["annotations"]["summary"] == expected
