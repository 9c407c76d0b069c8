"""The configuration: one YAML file validated once into typed, frozen dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

import yaml

from tpuwatch import yamlfile
from tpuwatch.backends import BACKENDS
from tpuwatch.kubernetes.plugin import KubernetesConfig
from tpuwatch.notifiers import ReceiverConfig
from tpuwatch.plugins import PLUGINS
from tpuwatch.schema import (
    Check,
    ConfigError,
    Duration,
    FilePath,
    ListenAddress,
    OneOf,
    Range,
    build,
    build_field,
    did_you_mean,
    dump,
    join_key,
)
from tpuwatch.syntax import short

_Section = TypeVar("_Section")
_PLUGIN_KEYS = frozenset(p.name for p in PLUGINS)

DEFAULT_PATH = Path("/etc/tpuwatch/config.yaml")
DEFAULT_PORT = 9847

# devices.sim.scenario's choices: the simulated chips' own scenarios, then the plugins' drills
# (tpuwatch.pluginspec.Drill).  What a drill needs and changes is tpuwatch/drills/'s, which sits above the config.
CHIP_SCENARIOS = ("healthy", "hbm-leak", "ecc-errors", "overheat", "sdc", "device-lost", "hung")
SCENARIOS = CHIP_SCENARIOS + tuple(d.scenario for p in PLUGINS for d in p.drills)
Scenario = Annotated[str, OneOf(SCENARIOS)]
SimChip = Literal["v4", "v5e", "v5p", "v6e", "h100", "h200"]
AbsolutePath = Annotated[str, FilePath()]
# Rule file patterns are expanded with the user's home: ~/alerts/*.yaml.
Glob = Annotated[str, FilePath(home=True)]


@dataclass(frozen=True)
class Paths:
    """Where the host's pseudo-filesystems are mounted (node_exporter's --path.* idea)."""

    sysfs: AbsolutePath = "/sys"
    procfs: AbsolutePath = "/proc"
    dev: AbsolutePath = "/dev"


@dataclass(frozen=True)
class SimConfig:
    """The simulated device backend: the fire-drill mode and the base of tests."""

    count: Annotated[int, Range(1, 64)] = 4
    scenario: Scenario = "healthy"
    chip: SimChip = "v5e"
    seed: int = 0
    fault_device: Annotated[int, Range(0, 63)] = 0
    fault_after: Annotated[float, Duration()] = 30.0
    # Where the simulated chips' device files are (accel0, accel1, ...): a process holding one holds that chip,
    # as the probe-sdc drill's simulated job does.  None: the simulated chips have no device files.
    device_dir: AbsolutePath | None = None

    def validate(self, path: str) -> None:
        if self.fault_device >= self.count:
            raise ConfigError(f"{path}.fault_device", f"{self.fault_device} is not below count {self.count}")


@dataclass(frozen=True)
class TpuConfig:
    """Cloud TPU backend: sysfs discovery plus libtpu's runtime metric service."""

    metrics_addr: list[str] = field(default_factory=lambda: ["localhost:8431"])
    call_timeout: Annotated[float, Duration(minimum=0.05, maximum=60.0)] = 2.0


@dataclass(frozen=True)
class HangConfig:
    """Hang detection: a chip held by a process that makes no progress while work waits (docs/devices.md)."""

    enabled: bool = True
    after: Annotated[float, Duration(minimum=1.0, maximum=7 * 86400.0)] = 600.0
    require_queued: bool = True
    sequencers: bool = True
    duty_cycle: bool = True
    duty_cycle_below: Annotated[float, Range(0.0, 1.0)] = 0.01
    tensorcore_idle: bool = True
    hlo_execution: bool = True

    def validate(self, path: str) -> None:
        if self.enabled and not (self.sequencers or self.duty_cycle or self.tensorcore_idle or self.hlo_execution):
            raise ConfigError(path, "enabled with every signal off: turn one on, or set enabled: false")


@dataclass(frozen=True)
class NvidiaConfig:
    """NVIDIA backend (NVML through nvidia-ml-py)."""

    call_timeout: Annotated[float, Duration(minimum=0.05, maximum=60.0)] = 2.0


class ExpectedDevices(Check):
    """``devices.expected``: a chip count (``8``), ``auto`` or ``off``; kept as text."""

    parses = True

    def convert(self, value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError("expected a chip count like 8, auto or off")
        text = str(value).strip()
        if text in ("auto", "off") or (text.isdigit() and 1 <= int(text) <= 1024):
            return text
        raise ValueError(f"expected a chip count from 1 to 1024, auto or off; got {short(value)}")


@dataclass(frozen=True)
class DevicesConfig:
    """Which device backend samples the accelerators, and how many chips the host should have."""

    backend: Annotated[str, OneOf(("auto", *BACKENDS, "none"))] = "auto"
    expected: Annotated[str, ExpectedDevices()] = "auto"
    sim: SimConfig = field(default_factory=SimConfig)
    tpu: TpuConfig = field(default_factory=TpuConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)


@dataclass(frozen=True)
class KernelLogConfig:
    """Where kernel messages are read and which rules classify them."""

    source: Literal["auto", "kmsg", "journal", "file", "none"] = "auto"
    path: AbsolutePath | None = None
    rules_dirs: list[AbsolutePath] = field(default_factory=lambda: ["/etc/tpuwatch/rules.d"])
    storm_window: Annotated[float, Duration(minimum=1.0, maximum=86400.0)] = 60.0
    previous_boot: bool = True
    pstore_archive: AbsolutePath | None = "/var/lib/systemd/pstore"
    lookback: Annotated[float, Duration(maximum=366 * 86400.0)] = 300.0

    def validate(self, path: str) -> None:
        if self.source == "file" and not self.path:
            raise ConfigError(f"{path}.path", "required when source is file")


@dataclass(frozen=True)
class CanaryConfig:
    """The scheduled reference inference on every idle chip."""

    enabled: bool = True
    every: Annotated[float, Duration(minimum=10.0)] = 3600.0
    jitter: Annotated[float, Duration()] = 300.0
    timeout: Annotated[float, Duration(minimum=1.0, maximum=3600.0)] = 120.0
    python: AbsolutePath | None = None
    lockfile: AbsolutePath = "/tmp/libtpu_lockfile"
    # The suite's checks (docs/canary.md#the-suite): model, gemm, transcendental, bf16, memory, collective.
    checks: list[Literal["model", "gemm", "transcendental", "bf16", "memory", "collective"]] = field(
        default_factory=lambda: ["model", "gemm", "transcendental", "bf16", "memory", "collective"])
    memory_bytes: Annotated[int, Range(4096, 1 << 40)] = 16 << 20  # kept at rest on each idle chip per run
    memory_share: Annotated[float, Range(0.0, 0.5)] = 0.05  # at most this share of the chip's free memory


@dataclass(frozen=True)
class TrendConfig:
    """Leak and drift detection on the stored series."""

    critical_eta: Annotated[float, Duration(minimum=60.0)] = 4 * 3600.0
    max_eta: Annotated[float, Duration(minimum=60.0)] = 7 * 86400.0


@dataclass(frozen=True)
class HostConfig:
    """Host memory/CPU and the processes that hold accelerator device files."""

    device_files: list[str] = field(
        default_factory=lambda: ["accel[0-9]*", "vfio/[0-9]*", "nvidia[0-9]*"]
    )
    holder_scan_interval: Annotated[float, Duration(minimum=1.0)] = 60.0
    # The kubelet's PodResources socket (pod names of chip holders); null: name pods by UID from the cgroup only.
    pod_resources_socket: AbsolutePath | None = "/var/lib/kubelet/pod-resources/kubelet.sock"
    max_processes_per_device: Annotated[int, Range(1, 1024)] = 16


@dataclass(frozen=True)
class StoreConfig:
    """Bounds of the in-memory series store: memory is fixed by these, not by uptime."""

    points_per_series: Annotated[int, Range(2, 100_000)] = 360
    max_series: Annotated[int, Range(16, 1_000_000)] = 10_000


@dataclass(frozen=True)
class AlertingConfig:
    """Alert rules, grouping and durable delivery to the receivers in ``notify``."""

    enabled: bool = True
    default_rules: bool = True
    rule_files: list[Glob] = field(default_factory=lambda: ["/etc/tpuwatch/alerts.d/*.yaml"])
    group_wait: Annotated[float, Duration()] = 30.0
    group_interval: Annotated[float, Duration(minimum=1.0)] = 300.0
    repeat_interval: Annotated[float, Duration(minimum=60.0)] = 4 * 3600.0
    resend_delay: Annotated[float, Duration(minimum=1.0, maximum=3600.0)] = 60.0
    resolved_retention: Annotated[float, Duration(maximum=86400.0)] = 900.0
    send_timeout: Annotated[float, Duration(minimum=0.1, maximum=300.0)] = 10.0
    retry_initial: Annotated[float, Duration(minimum=0.01)] = 1.0
    # A receiver that comes back is noticed within retry_max while its circuit is closed (breaker_trial while open).
    retry_max: Annotated[float, Duration(minimum=0.01)] = 30.0
    max_age: Annotated[float, Duration(minimum=1.0)] = 86400.0
    outbox_max_bytes: Annotated[int, Range(1 << 20, 1 << 40)] = 256 << 20
    breaker_failures: Annotated[int, Range(1, 1000)] = 5
    breaker_reset: Annotated[float, Duration(minimum=0.1)] = 300.0
    # While the circuit is open, one trial (the most urgent message) at most this often (and once per
    # breaker_reset at least): a success closes the circuit and the queue drains, critical first.
    breaker_trial: Annotated[float, Duration(minimum=0.1)] = 30.0
    # The prefix of runbook links (a rule's relative runbook_url, the built-in rules' alert names); None: the
    # daemon's own /runbooks/, which serves the runbooks tpuwatch ships.
    runbook_base_url: str | None = None

    def validate(self, path: str) -> None:
        if self.retry_max < self.retry_initial:
            raise ConfigError(f"{path}.retry_max", "must not be below retry_initial")
        if self.runbook_base_url is not None and not re.match(r"(https?://[^/\s]|file:///)\S*$",
                                                               self.runbook_base_url):
            raise ConfigError(f"{path}.runbook_base_url",
                              "must be an http://, https:// or file:/// URL without blanks (or null)")


@dataclass(frozen=True)
class Config:
    """The whole configuration; every key has a default."""

    listen: Annotated[str, ListenAddress()] = f"127.0.0.1:{DEFAULT_PORT}"
    interval: Annotated[float, Duration(minimum=0.1, maximum=3600.0)] = 10.0
    collector_timeout: Annotated[float, Duration(minimum=0.05, maximum=600.0)] | None = None
    state_dir: AbsolutePath = "/var/lib/tpuwatch"
    web_config: AbsolutePath | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    paths: Paths = field(default_factory=Paths)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    host: HostConfig = field(default_factory=HostConfig)
    kernel_log: KernelLogConfig = field(default_factory=KernelLogConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    trend: TrendConfig = field(default_factory=TrendConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    notify: list[ReceiverConfig] = field(default_factory=list)  # tpuwatch/notifiers: the types and their checks
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    # The registered plugins' sections (tpuwatch/plugins.py), by name: each is a top-level key of the file.
    sections: dict[str, Any] = field(default_factory=lambda: {p.name: p.settings() for p in PLUGINS},
                                     metadata={"key": False})

    def section(self, kind: type[_Section]) -> _Section:
        """The plugin section of type ``kind`` (``config.section(ProbeConfig)``)."""
        found = next(value for value in self.sections.values() if type(value) is kind)
        return cast(_Section, found)

    @property
    def drill(self) -> str | None:
        """The fire drill this config runs: the simulated chips' scenario, None on real chips."""
        return self.devices.sim.scenario if self.devices.backend == "sim" else None

    @property
    def collector_deadline(self) -> float:
        """Seconds one collector run may take: collector_timeout, or half the interval up to 5s."""
        return self.collector_timeout if self.collector_timeout is not None else min(5.0, self.interval / 2)

    def validate(self, path: str) -> None:
        if self.collector_timeout is not None and self.collector_timeout > self.interval:
            raise ConfigError("collector_timeout", "must not exceed interval")
        names = [r.name for r in self.notify]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ConfigError(f"notify[{i}].name", f"duplicate receiver name {short(name)}")
        for plugin in PLUGINS:
            for condition in plugin.conditions:
                if getattr(self.sections[plugin.name], condition.opt_in) and not self.kubernetes.node_conditions:
                    raise ConfigError(f"{plugin.name}.{condition.opt_in}", "needs kubernetes.node_conditions: true")


def parse(text: str, filename: str = "<config>") -> Config:
    """Validate YAML text into a Config; raise ConfigError on any problem.

    YAML-level problems read ``FILENAME: line L, column C: reason`` (yamlfile's bounds);
    bad values ``path.to.key: reason``.
    """
    return _build(yamlfile.load(text, filename), filename)


def load(path: str | os.PathLike[str] | None) -> Config:
    """Load the config file at ``path``; with None, the default file if present, else defaults."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return Config()
        path = DEFAULT_PATH
    return _build(yamlfile.read(path), str(path))


def _build(data: object, filename: str) -> Config:
    try:
        core = data
        sections = {}
        if isinstance(data, dict):
            known = [f.name for f in dataclasses.fields(Config) if f.metadata.get("key", True)] + sorted(_PLUGIN_KEYS)
            for key in data:
                if key not in known:
                    raise ConfigError(join_key("", key), "unknown key" + (
                        did_you_mean(key, known) or f" (known keys: {', '.join(sorted(known))})"))
            core = {key: value for key, value in data.items() if key not in _PLUGIN_KEYS}
            sections = {p.name: build(p.settings, data[p.name], p.name) for p in PLUGINS if p.name in data}
        config: Config = build(Config, core)
        if sections:
            config = dataclasses.replace(config, sections={**config.sections, **sections})
            config.validate("")
    except ConfigError as exc:
        if exc.path:
            raise
        raise ConfigError(filename, exc.reason) from None  # the document itself, not a key: name the file
    return config


def option_type(key: str) -> Callable[[str], Any]:
    """The argparse ``type`` of an option that sets config key ``key`` (``--state-dir`` sets ``state_dir``): the
    value checked and converted as the key's is; a bad one is a usage error naming the option."""
    def convert(text: str) -> Any:
        try:
            return build_field(Config, key, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def plain(config: Config) -> dict[str, Any]:
    """The effective config as plain data in the file's shape (the plugins' sections last), secrets redacted."""
    return {**dump(config), **{name: dump(section) for name, section in config.sections.items()}}


def to_yaml(config: Config) -> str:
    """The effective config as YAML, secrets redacted."""
    return yaml.safe_dump(plain(config), sort_keys=False, default_flow_style=False)
