"""A plugin is one folder plus one registration line: nothing else in tpuwatch names it, and a new one shows up
in the config, /metrics, ``check``, /healthz, the status page and the drills without another file changed.

The new plugin is written into a copy of the package (``tpuwatch/uptime/``: a config section, a metric, a
check, a page line and a drill), registered by one line in the copy's ``tpuwatch/plugins.py``, and run there:
``config check``, ``check --json``, the layers test and a real daemon with ``--simulate uptime``.  A new device
backend is likewise one module (``tpuwatch/devices/toy.py``) plus one line in ``tpuwatch/backends.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
import test_layers
import yaml
from test_layers import PACKAGE, imports

from tpuwatch.plugins import PLUGINS

from conftest import SIM_FAST, DaemonProcess, wait_until

DECLARATION = '''
from dataclasses import dataclass
from typing import Annotated

from tpuwatch.metricspec import MetricSpec
from tpuwatch.pluginspec import Drill, Plugin
from tpuwatch.schema import Duration


@dataclass(frozen=True)
class UptimeConfig:
    warn_after: Annotated[float, Duration()] = 30 * 86400.0


PLUGIN = Plugin(
    name="uptime", settings=UptimeConfig, hooks="tpuwatch.uptime.hooks",
    metrics=(MetricSpec("tpuwatch_uptime_seconds", "gauge", "Seconds since the host booted."),),
    drills=(Drill("uptime", "uptime source", lambda section: None),),
)
'''

HOOKS = '''
from tpuwatch.samples import sample
from tpuwatch.uptime.plugin import UptimeConfig


class Uptime:
    name = "uptime"

    def __init__(self, procfs, warn_after, drill):
        self.procfs, self.warn_after, self.drill = procfs, warn_after, drill

    def seconds(self):
        return 10 * self.warn_after if self.drill else float(open(f"{self.procfs}/uptime").read().split()[0])

    def collect(self):
        return [sample("tpuwatch_uptime_seconds", self.seconds())]


def build(config, context):
    section = config.section(UptimeConfig)
    drill = config.devices.backend == "sim" and config.devices.sim.scenario == "uptime"
    return Uptime(config.paths.procfs, section.warn_after, drill), "uptime: from /proc/uptime"


def healthz(collector, now):
    return {"status": "long" if collector.seconds() > collector.warn_after else "ok"}


def report(collector, now):
    long = collector.seconds() > collector.warn_after
    return {"seconds": collector.seconds()}, (["up longer than uptime.warn_after"] if long else [])


def notices(current, now):
    return [("long uptime", f"{s.value:.0f} s") for s in current if s.name == "tpuwatch_uptime_seconds"
            and s.value > 1e6]
'''


def _importers(folder: str) -> list[str]:
    """Where a module outside tpuwatch/FOLDER imports it: ``file:line module``."""
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if path.parent.name != folder
               and PACKAGE / folder not in path.parents]
    return [f"{path.relative_to(PACKAGE.parent)}:{line} {module}" for path in outside
            for module, line in imports(path) if module == f"tpuwatch.{folder}"
            or module.startswith(f"tpuwatch.{folder}.")]


def test_no_module_outside_a_plugin_folder_names_it_but_the_registration_line() -> None:
    assert PLUGINS
    for plugin in PLUGINS:
        folder = plugin.hooks.split(".")[1]
        assert _importers(folder) == [f"tpuwatch/plugins.py:{_registration_line(folder)} tpuwatch.{folder}.plugin"]


def _registration_line(folder: str) -> int:
    lines = (PACKAGE / "plugins.py").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if f'"tpuwatch.{folder}.plugin"' in line)


def _copy_with_plugin(tmp_path: Path) -> Path:
    """A copy of the package with tpuwatch/uptime/ and one line more in plugins.py, and nothing else changed."""
    root = tmp_path / "tree"
    shutil.copytree(PACKAGE, root / "tpuwatch", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tpuwatch" / "uptime").mkdir()
    (root / "tpuwatch" / "uptime" / "__init__.py").write_text('"""Host uptime (a test plugin)."""\n')
    (root / "tpuwatch" / "uptime" / "plugin.py").write_text(DECLARATION)
    (root / "tpuwatch" / "uptime" / "hooks.py").write_text(HOOKS)
    registry = root / "tpuwatch" / "plugins.py"
    text = registry.read_text()
    anchor = '    "tpuwatch.jobreports.plugin",\n'
    assert anchor in text
    registry.write_text(text.replace(anchor, anchor + '    "tpuwatch.uptime.plugin",\n'))
    changed = [line for line in registry.read_text().splitlines() if line not in text.splitlines()]
    assert changed == ['    "tpuwatch.uptime.plugin",']
    return root


def test_the_copy_with_a_new_plugin_keeps_the_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy_with_plugin(tmp_path)
    monkeypatch.setattr(test_layers, "PACKAGE", root / "tpuwatch")
    test_layers.test_every_part_imports_only_its_layer_and_below()
    test_layers.test_no_import_cycle_between(test_layers._part)
    assert test_layers.RANK["uptime.plugin"] < test_layers.RANK["config"] < test_layers.RANK["uptime"]


BACKEND = '''
import os

from tpuwatch.devices.base import DeviceReading


def chips(sysfs):
    return [f"0000:7{i}:00.0" for i in range(int(open(os.path.join(sysfs, "toy")).read()))] \\
        if os.path.exists(os.path.join(sysfs, "toy")) else []


class ToyBackend:
    name = "toy"

    def __init__(self, sysfs):
        self.sysfs = sysfs

    def read(self):
        return [DeviceReading(device=str(i), chip="toy", pci=pci, memory_used_bytes=1e9, memory_total_bytes=2e9)
                for i, pci in enumerate(chips(self.sysfs))]


def build(config):
    return ToyBackend(config.paths.sysfs)
'''


def test_a_new_backend_is_one_module_and_one_line(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(PACKAGE, root / "tpuwatch", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tpuwatch" / "devices" / "toy.py").write_text(BACKEND)
    backends = root / "tpuwatch" / "backends.py"
    anchor = '    "amd": "tpuwatch.devices.amd",\n'
    assert anchor in backends.read_text()
    backends.write_text(backends.read_text().replace(anchor, anchor + '    "toy": "tpuwatch.devices.toy",\n'))
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    (sysfs / "toy").write_text("3")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "paths": {"sysfs": str(sysfs)},
                                      "kernel_log": {"source": "none"}, "canary": {"enabled": False},
                                      "maintenance": {"cloud": "off"}}))
    result = json.loads(_cli(root, "check", "--json", "--config", str(config)).stdout)
    assert result["backend"] == "toy" and [d["pci"] for d in result["devices"]] == [
        "0000:70:00.0", "0000:71:00.0", "0000:72:00.0"]
    assert result["status"] == "healthy", result["problems"]


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)


def test_a_new_plugin_is_one_folder_and_one_line(tmp_path: Path) -> None:
    root = _copy_with_plugin(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "devices": {"backend": "none"},
                                      "kernel_log": {"source": "none"}, "canary": {"enabled": False},
                                      "maintenance": {"cloud": "off"}, "uptime": {"warn_after": "1s"}}))
    assert _cli(root, "config", "check", "--config", str(config)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("uptime: {warn_after: soon}\n")
    refused = _cli(root, "config", "check", "--config", str(bad))
    assert refused.returncode == 2 and refused.stderr.startswith("tpuwatch: config error: uptime.warn_after: ")
    shown = yaml.safe_load(_cli(root, "config", "show", "--config", str(config)).stdout)
    assert shown["uptime"] == {"warn_after": "1s"}
    checked = _cli(root, "check", "--json", "--config", str(config))
    result = json.loads(checked.stdout)
    assert result["uptime"]["seconds"] > 1 and "up longer than uptime.warn_after" in result["warnings"]
    assert "uptime: from /proc/uptime" in result["notes"]
    # The same tree without the line knows no uptime section.
    (root / "tpuwatch" / "plugins.py").write_text((PACKAGE / "plugins.py").read_text())
    unknown = _cli(root, "config", "check", "--config", str(config))
    assert unknown.returncode == 2 and "uptime: unknown key" in unknown.stderr


def test_a_new_plugin_runs_in_the_daemon_with_its_drill(tmp_path: Path) -> None:
    root = _copy_with_plugin(tmp_path)
    workdir = tmp_path / "daemon"
    workdir.mkdir()
    daemon = DaemonProcess(workdir, {**SIM_FAST, "devices": {"backend": "sim", "sim": {"count": 2}}},
                           args=["--simulate", "uptime"], env={"PYTHONPATH": str(root)}, cwd=root)
    try:
        daemon.wait_ready()
        health = requests.get(f"{daemon.url}/healthz", timeout=5).json()
        assert health["checks"]["uptime"] == {"status": "long"}
        assert "tpuwatch_uptime_seconds 2.592e+07" in requests.get(f"{daemon.url}/metrics", timeout=5).text

        def page() -> dict[str, Any]:
            return dict(requests.get(f"{daemon.url}/api/status", timeout=5).json())

        wait_until(lambda: page()["host_resources"]["notices"], timeout=20, what="the plugin's line on the page")
        assert page()["host_resources"]["notices"] == [{"headline": "long uptime", "text": "25920000 s"}]
        assert "<strong>long uptime</strong>: 25920000 s" in requests.get(f"{daemon.url}/", timeout=5).text
    finally:
        daemon.stop()
