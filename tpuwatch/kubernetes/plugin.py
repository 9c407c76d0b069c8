"""The Kubernetes actions' config section (``kubernetes:`` in the file; docs/kubernetes.md).

Declared here, beside the actions that read it, as a plugin declares its
section in its ``plugin.py``: the config, which sits below the actions, builds
the section from these dataclasses and imports nothing else of this folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from tpuwatch.schema import Check, ConfigError, Duration, Range, Url

_CAMEL_CASE = r"[A-Z][A-Za-z0-9]{0,127}"


class NodeCount(Check):
    """``max_unhealthy_nodes``: a count (``2``) or a percentage of the nodes in scope (``10%``)."""

    parses = True

    def convert(self, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError("expected a count like 2 or a percentage like 10%")
        text = str(value).strip()
        number = text[:-1] if text.endswith("%") else text
        if not number.isdigit() or (text.endswith("%") and int(number) > 100):
            raise ValueError(f"invalid node count {text!r} (a count like 2 or a percentage like 10%, at most 100%)")
        return text


@dataclass(frozen=True)
class ConditionAlertConfig:
    """An alert that raises a node condition, and the condition's reason while it does."""

    alert: str
    reason: str
    severity: Literal["critical", "warning", "info"] | None = None

    def validate(self, path: str) -> None:
        if not re.fullmatch(_CAMEL_CASE, self.reason):
            raise ConfigError(f"{path}.reason", f"{self.reason!r} is not CamelCase (like EccUncorrectable)")


@dataclass(frozen=True)
class NodeConditionConfig:
    """One node condition tpuwatch keeps on its Node: the alerts that make it True."""

    type: str
    sources: list[ConditionAlertConfig]
    clear_after: Annotated[float, Duration(maximum=7 * 86400.0)] | None = None

    def validate(self, path: str) -> None:
        if not re.fullmatch(_CAMEL_CASE, self.type):
            raise ConfigError(f"{path}.type", f"{self.type!r} is not CamelCase (like AcceleratorHardwareProblem)")
        if not self.sources:
            raise ConfigError(f"{path}.sources", "needs at least one alert")


@dataclass(frozen=True)
class RemediationActionConfig:
    """One rung of a remediation ladder."""

    type: Literal["exec", "webhook", "taint", "cordon", "drain-request"]
    dry_run: bool = False
    debounce: Annotated[float, Duration(maximum=7 * 86400.0)] = 0.0
    min_interval: Annotated[float, Duration(maximum=30 * 86400.0)] = 3600.0
    daily_cap: Annotated[int, Range(0, 1000)] = 3
    min_repeats: Annotated[int, Range(1, 1000)] = 1
    max_repeats: Annotated[int, Range(1, 1000)] | None = None
    command: list[str] = field(default_factory=list)
    url: Annotated[str, Url()] | None = None
    timeout: Annotated[float, Duration(minimum=0.1, maximum=3600.0)] = 60.0
    effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    manual_release: bool = False
    before_window: Annotated[float, Duration(maximum=30 * 86400.0)] | None = None

    def validate(self, path: str) -> None:
        if (self.type == "exec") != bool(self.command):
            raise ConfigError(f"{path}.command", "exec needs a command (a list: program and arguments); "
                              "other actions take none")
        if (self.type == "webhook") != (self.url is not None):
            raise ConfigError(f"{path}.url", "webhook needs a url; other actions take none")
        if self.max_repeats is not None and self.max_repeats < self.min_repeats:
            raise ConfigError(f"{path}.max_repeats", "must not be below min_repeats")


@dataclass(frozen=True)
class RemediationConfig:
    """The ordered actions taken while a node condition (or a firing alert) is present."""

    trigger: str
    actions: list[RemediationActionConfig]
    repeat_window: Annotated[float, Duration(minimum=60.0, maximum=90 * 86400.0)] = 7 * 86400.0


@dataclass(frozen=True)
class KubernetesConfig:
    """Node conditions, taints and remediation on the Node tpuwatch runs on, within a cluster-wide limit."""

    node_conditions: bool = False
    node_name: str | None = None
    kubeconfig: str | None = None
    conditions: list[NodeConditionConfig] = field(default_factory=list)
    clear_after: Annotated[float, Duration(maximum=7 * 86400.0)] = 300.0
    heartbeat: Annotated[float, Duration(minimum=10.0, maximum=3600.0)] = 300.0
    remediation: list[RemediationConfig] = field(default_factory=list)
    dry_run: bool = False
    max_unhealthy_nodes: Annotated[str, NodeCount()] = "10%"
    node_selector: str = ""
    lease_namespace: str | None = None
    lease_prefix: str = "tpuwatch-slot"
    lease_duration: Annotated[float, Duration(minimum=15.0, maximum=86400.0)] = 600.0
    api_timeout: Annotated[float, Duration(minimum=0.1, maximum=120.0)] = 10.0
    retry_initial: Annotated[float, Duration(minimum=0.01, maximum=600.0)] = 1.0
    retry_max: Annotated[float, Duration(minimum=0.01, maximum=3600.0)] = 60.0

    def validate(self, path: str) -> None:
        if self.retry_max < self.retry_initial:
            raise ConfigError(f"{path}.retry_max", "must not be below retry_initial")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?", self.lease_prefix):
            raise ConfigError(f"{path}.lease_prefix", "must be a lowercase DNS label of at most 42 characters")
        types = [c.type for c in self.conditions]
        for i, name in enumerate(types):
            if name in types[:i]:
                raise ConfigError(f"{path}.conditions[{i}].type", f"duplicate condition {name!r}")
        if self.remediation and not self.node_conditions:
            raise ConfigError(f"{path}.remediation", "needs node_conditions: true")
