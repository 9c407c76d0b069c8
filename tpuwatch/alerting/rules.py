"""Alert rules: their YAML form, and evaluation of one rule over the current samples.

A rule selects the series of one metric by label regexes, turns each into a
number (``value``, ``increase`` over a window, ``ratio`` to another metric with
the same labels, ``age`` of a timestamp, seconds ``unchanged``), optionally
aggregates by labels, and compares with a threshold.  Every series that passes
becomes an alert candidate.  A series missing from this cycle (its collector
failed or timed out) is still evaluated from what the tracker last saw: for
``increase`` while it was seen within the window (as Prometheus's increase()
over a range), otherwise for ``LOOKBACK_S`` (Prometheus's default lookback).
"""

from __future__ import annotations

import glob
import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Annotated, Literal
from urllib.parse import urljoin, urlsplit

from tpuwatch import yamlfile
from tpuwatch.alerting import runbooks
from tpuwatch.alerting.template import Template, TemplateError
from tpuwatch.alerting.tracker import Kind, Track, Tracker
from tpuwatch.samples import Labels, Sample
from tpuwatch.schema import ConfigError, Duration, Regex, build

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}
_AGGREGATES: dict[str, Callable[[list[float]], float]] = {"sum": math.fsum, "max": max, "min": min, "count": len}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Settings a rule may take its threshold from (``threshold_from``), so that it agrees with the detector it reads.
THRESHOLD_SETTINGS = ("trend.critical_eta", "trend.max_eta")
# How long a series missing from the samples is still evaluated from its last value (rules other than increase).
LOOKBACK_S = 300.0


@dataclass(frozen=True)
class Rule:
    """One alert rule, as written in a rule file (``for`` is spelled ``for`` there)."""

    alert: str
    metric: str
    match: dict[str, Annotated[str, Regex()]] = field(default_factory=dict)
    function: Literal["value", "increase", "ratio", "age", "unchanged"] = "value"
    window: Annotated[float, Duration(minimum=1.0, maximum=30 * 86400.0)] = 300.0
    ratio_to: str | None = None
    aggregate: Literal["sum", "max", "min", "count"] | None = None
    by: list[str] = field(default_factory=list)
    op: Literal[">", ">=", "<", "<=", "==", "!="] = ">"
    threshold: float = 0.0
    threshold_from: str | None = None
    for_: Annotated[float, Duration()] = 0.0
    severity: Literal["critical", "warning", "info"] = "warning"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    runbook_url: str | None = None
    inhibit_when_device_down: bool = True
    counter: Literal["external", "tpuwatch"] = "external"
    count_initial: bool = False

    def validate(self, path: str) -> None:
        for key, name in (("alert", self.alert), ("metric", self.metric)):
            if not _NAME_RE.match(name):
                raise ConfigError(f"{path}.{key}", f"{name!r} is not a valid name")
        if self.function == "ratio" and self.ratio_to is None:
            raise ConfigError(f"{path}.ratio_to", "required when function is ratio")
        if self.by and self.aggregate is None:
            raise ConfigError(f"{path}.by", "needs aggregate")
        if self.count_initial and (self.function != "increase" or self.counter != "external"):
            raise ConfigError(f"{path}.count_initial", "only for increase over an external counter "
                                                       "(tpuwatch's own counters always count their first value)")
        if self.threshold_from is not None and self.threshold_from not in THRESHOLD_SETTINGS:
            raise ConfigError(f"{path}.threshold_from",
                              f"unknown setting {self.threshold_from!r} (known: {', '.join(THRESHOLD_SETTINGS)})")
        templates = {f"annotations.{key}": text for key, text in self.annotations.items()}
        for key, text in {**templates, "runbook_url": self.runbook_url or ""}.items():
            try:
                Template(text)
            except TemplateError as exc:
                raise ConfigError(f"{path}.{key}", str(exc)) from None


@dataclass(frozen=True)
class RuleFile:
    """The top level of a rule file."""

    rules: list[Rule] = field(default_factory=list)


@dataclass(frozen=True)
class Candidate:
    """A series for which a rule's condition holds now."""

    rule: Rule
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float


def parse_rules(text: str, filename: str) -> list[Rule]:
    """Rules from YAML text; ConfigError naming ``filename`` and the key path on any problem."""
    data = yamlfile.load(text, filename)
    if isinstance(data, dict) and isinstance(data.get("rules"), list):
        data = {**data, "rules": [_rename_for(r) for r in data["rules"]]}
    try:
        parsed: RuleFile = build(RuleFile, data)
        return parsed.rules
    except ConfigError as exc:
        raise ConfigError(f"{filename}: {exc.path.replace('.for_', '.for')}", exc.reason) from None


def _rename_for(rule: object) -> object:
    if isinstance(rule, dict) and "for" in rule:
        rule = {("for_" if k == "for" else k): v for k, v in rule.items()}
    return rule


def default_rules_text() -> str:
    """The built-in rule file shipped in the package."""
    return resources.files("tpuwatch.alerting").joinpath("rules/default.yaml").read_text(encoding="utf-8")


def runbook(base: str, url: str) -> str:
    """A rule's ``runbook_url``: absolute as written, or relative to ``alerting.runbook_base_url``."""
    if urlsplit(url).scheme:
        return url
    return urljoin(base if base.endswith("/") else base + "/", url)


def _runbook_url(rule: Rule, base: str) -> str | None:
    """The rule's own runbook_url, else the runbook tpuwatch ships for its name (if any); joined to ``base``."""
    url = rule.runbook_url or (rule.alert if rule.alert in runbooks.shipped() else None)
    return runbook(base, url) if url and base else url


def load_rules(default: bool, patterns: Iterable[str], settings: Mapping[str, float] | None = None,
               runbook_base: str = "") -> list[Rule]:
    """The built-in rules (when ``default``) plus every file matching ``patterns`` (none is fine).

    A rule with ``threshold_from`` takes its threshold from ``settings`` (values of
    THRESHOLD_SETTINGS); without them it keeps the threshold written beside it.
    A rule without a runbook_url links the runbook tpuwatch ships for its alert
    name, if there is one; relative links are joined to ``runbook_base`` when one is given.
    """
    rules = parse_rules(default_rules_text(), "built-in rules") if default else []
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.expanduser(pattern))):
            try:
                text = open(path, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError("", f"cannot read rule file {path}: {getattr(exc, 'strerror', None) or exc}") \
                    from None
            rules += parse_rules(text, path)
    if settings:
        rules = [replace(r, threshold=settings[r.threshold_from]) if r.threshold_from else r for r in rules]
    return [replace(r, runbook_url=_runbook_url(r, runbook_base)) for r in rules]


def tracks(rules: Iterable[Rule]) -> dict[str, Track]:
    """How the tracker follows every metric a rule reads; ConfigError when rules disagree on a counter's kind."""
    found: dict[str, Track] = {}
    for rule in rules:
        counting = rule.function in ("increase", "unchanged")
        kind: Kind = rule.counter if counting else "gauge"
        wanted = [Track(kind, rule.window if counting else 0.0,
                        rule.window if rule.function == "increase" else LOOKBACK_S)]
        names = [rule.metric]
        if rule.ratio_to:
            wanted.append(Track("gauge", 0.0, LOOKBACK_S))
            names.append(rule.ratio_to)
        for metric, track in zip(names, wanted, strict=True):
            have = found.get(metric)
            if have is not None:
                if "gauge" not in (have.kind, track.kind) and have.kind != track.kind:
                    raise ConfigError("", f"rule {rule.alert}: counter: {track.kind} disagrees with another "
                                          f"rule's counter: {have.kind} for {metric}")
                track = Track(track.kind if have.kind == "gauge" else have.kind, max(track.window, have.window),
                              max(track.retention, have.retention))
            found[metric] = track
    return found


def _matches(labels: Labels, match: dict[str, re.Pattern[str]]) -> bool:
    have = dict(labels)
    return all(pattern.fullmatch(have.get(label, "")) for label, pattern in match.items())


class CompiledRule:
    """A rule with its regexes compiled, ready to evaluate."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self._match = {label: re.compile(p) for label, p in rule.match.items()}
        self._annotations = {key: Template(text) for key, text in rule.annotations.items()}
        self._runbook = Template(rule.runbook_url) if rule.runbook_url else None

    def evaluate(self, samples: list[Sample], tracker: Tracker, now: float, external: dict[str, str],
                 held: Iterable[tuple[Sample, float]] = (), pci: Mapping[str, str] | None = None) -> list[Candidate]:
        """Candidates for which the condition holds now.

        ``held`` are the series missing from ``samples`` with when each was last
        seen; ``external`` labels (host) are added to every candidate, and ``pci``
        (device -> PCI address) names the chip of those with a ``device`` label.
        """
        rule = self.rule
        hold = rule.window if rule.function == "increase" else LOOKBACK_S
        present = [*samples, *(s for s, seen in held if now - seen <= hold)]
        values: list[tuple[Labels, float]] = []
        denominators = ({s.labels: s.value for s in (*samples, *(s for s, seen in held if now - seen <= LOOKBACK_S))
                         if s.name == rule.ratio_to} if rule.function == "ratio" else {})
        for s in present:
            if s.name != rule.metric or not _matches(s.labels, self._match):
                continue
            value = self._function(s, tracker, denominators, now)
            if value is not None:
                values.append((s.labels, value))
        if rule.aggregate is not None:
            values = self._aggregate(values)
        compare = _OPS[rule.op]
        out = []
        for labels, value in values:
            if not compare(value, rule.threshold):
                continue
            merged = {**dict(labels), **external}
            chip = (pci or {}).get(merged.get("device", ""))
            if chip and not merged.get("pci"):
                merged["pci"] = chip
            merged = {k: v for k, v in {**merged, **rule.labels, "alertname": rule.alert,
                                        "severity": rule.severity}.items() if v != ""}
            annotations = {key: template.render(merged, value) for key, template in self._annotations.items()}
            if self._runbook is not None:
                annotations["runbook_url"] = self._runbook.render(merged, value)
            out.append(Candidate(rule, merged, annotations, value))
        return out

    def _function(self, s: Sample, tracker: Tracker, denominators: dict[Labels, float],
                  now: float) -> float | None:
        function = self.rule.function
        if function == "value":
            return s.value
        if function == "age":
            return now - s.value
        if function == "ratio":
            total = denominators.get(s.labels)
            return s.value / total if total else None
        if function == "increase":
            return tracker.increase((s.name, s.labels), self.rule.window, now, self.rule.count_initial)
        return tracker.unchanged_for((s.name, s.labels), now)

    def _aggregate(self, values: list[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
        groups: dict[Labels, list[float]] = {}
        for labels, value in values:
            have = dict(labels)
            key = tuple((b, have.get(b, "")) for b in self.rule.by)
            groups.setdefault(key, []).append(value)
        reduce = _AGGREGATES[self.rule.aggregate or "sum"]
        return [(key, float(reduce(vals))) for key, vals in groups.items()]
