"""A simulated scenario whose drill cannot run here says so: in the daemon's log, on /healthz and the status page,
as the TpuwatchDrillCannotRun alert, and in ``tpuwatch check``, which exits 1 for it.

jax is installed where these tests run, so the daemon and ``check`` are started with a ``sitecustomize`` first on
PYTHONPATH that blocks it (``sys.modules["jax"] = None``): ``import jax`` fails and ``find_spec`` answers None, as on
a host installed without the canary extra.
"""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml

from tpuwatch import config as config_module
from tpuwatch.canary.needs import canary_unavailable
from tpuwatch.config import SCENARIOS
from tpuwatch.drills import simulate
from tpuwatch.drills.needs import NEEDS, PROBES, BlockedDrill, blocked_drill, blocked_drills, not_checked
from tpuwatch.views.render import render_page

from conftest import SIM_FAST, DaemonProcess, wait_until
from statusdoc import SimHost

GENERIC = "canary: no run kept (off, no accelerator, or not run yet)"
HAS_JAX = importlib.util.find_spec("jax") is not None  # find_spec: jax stays out of pytest
needs_jax = pytest.mark.skipif(not HAS_JAX, reason="the canary extra (jax) is not installed")


@pytest.fixture
def no_jax(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import jax, whatever is installed."""
    shim = tmp_path / "no-jax"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text('import sys\nsys.modules["jax"] = None\n')
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": f"{shim}{os.pathsep}{path}" if path else str(shim)}


def simulated(scenario: str, **settings: object) -> config_module.Config:
    config = config_module.parse(yaml.safe_dump(settings))
    return simulate.simulated(config, scenario)


def run_check(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuwatch", "check", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


# --- the probes --------------------------------------------------------------------------------------------


def test_every_need_a_scenario_declares_has_a_probe() -> None:
    assert set(NEEDS) <= set(SCENARIOS) and NEEDS["sdc"] == ("canary",)
    assert {need for needs in NEEDS.values() for need in needs} <= set(PROBES)


def test_the_sdc_drill_cannot_run_with_the_canary_off() -> None:
    blocked = blocked_drill(simulated("sdc", canary={"enabled": False}))
    assert blocked == BlockedDrill("sdc", "canary", "canary.enabled is false")
    assert blocked.sentence() == "fire drill sdc cannot run: it needs the canary, and canary.enabled is false"


def test_the_probe_sdc_drill_cannot_run_without_probe_reports(no_jax: dict[str, str], tmp_path: Path) -> None:
    blocked = blocked_drill(simulated("probe-sdc", probe={"enabled": False}))
    assert blocked == BlockedDrill("probe-sdc", "probe", "probe.enabled is false")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "kernel_log": {"source": "none"}}))
    text = run_check(config, "--simulate", "probe-sdc", env=no_jax)  # its simulated job needs jax here
    assert text.returncode == 1
    assert "  - fire drill probe-sdc cannot run: it needs the probe, and jax is not installed for" in text.stdout


def test_drills_that_need_nothing_more_and_real_chips_are_never_blocked() -> None:
    off = {"canary": {"enabled": False}}
    assert [s for s in SCENARIOS if blocked_drill(simulated(s, **off)) is not None] == ["sdc"]
    real = config_module.parse(yaml.safe_dump({**off, "devices": {"backend": "none", "sim": {"scenario": "sdc"}}}))
    assert blocked_drill(real) is None


def test_canary_python_is_asked_in_a_subprocess(no_jax: dict[str, str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def reason(python: str, timeout: float = 30.0) -> str | None:
        return canary_unavailable(simulated("sdc", canary={"python": python}), timeout)

    missing = str(tmp_path / "nowhere" / "python3")
    assert reason(missing) == f"canary.python {missing} cannot be started (No such file or directory)"
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert reason(str(broken)) == f"canary.python {broken} cannot run Python (exit status 3)"
    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    assert reason(str(hung), timeout=0.5) == f"canary.python {hung} did not answer within 0.5 s"
    if HAS_JAX:
        assert reason(sys.executable) is None
    monkeypatch.setenv("PYTHONPATH", no_jax["PYTHONPATH"])
    assert reason(sys.executable) == (f"jax is not installed for canary.python {sys.executable} "
                                      f"({sys.executable} -m pip install 'tpuwatch[canary]')")


@needs_jax
def test_with_jax_the_sdc_drill_can_run() -> None:
    assert blocked_drill(simulated("sdc")) is None


# --- the status document and page ---------------------------------------------------------------------------


def test_the_page_says_why_the_drill_cannot_run_instead_of_the_generic_notice() -> None:
    host = SimHost("sdc")
    drill = BlockedDrill("sdc", "canary", "jax is not installed for /usr/bin/python3 (pip install "
                                          "'tpuwatch[canary]', or point canary.python at an interpreter with jax)")
    plain = host.document()
    assert plain["status"] == "ok" and plain["drills"] == [] and GENERIC in render_page(plain)
    doc = host.document(current=lambda: [*host.store.current(), drill.sample()])
    assert doc["status"] == "warning" and doc["counts"] == plain["counts"]  # no chip is to blame
    assert doc["drills"] == [{**dataclasses.asdict(drill), "text": drill.sentence()}]
    page = render_page(doc)
    assert GENERIC not in page
    assert page.count(html.escape(drill.sentence())) == 2  # under the header's summary, and as the canary's line
    assert "<title>tpuwatch: host-a: drill sdc cannot run</title>" in page
    assert 'class="summary v-warning drill" data-scenario="sdc"' in page


def test_samples_read_back_into_the_drills_they_say() -> None:
    drill = BlockedDrill("sdc", "canary", "canary.enabled is false")
    assert blocked_drills([drill.sample(), drill.sample()._replace(value=0.0)]) == [drill]


# --- the daemon and check, as a user runs them ---------------------------------------------------------------


def test_the_daemon_says_the_sdc_drill_cannot_run_without_jax(no_jax: dict[str, str],
                                                              start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon({**SIM_FAST, "canary": {"enabled": True}}, args=["--simulate", "sdc"], env=no_jax)
    daemon.wait_ready()
    line = wait_until(lambda: next((line for line in daemon.log().splitlines() if "fire drill sdc" in line), None),
                      what="the start-up line")
    text = line[line.index("fire drill"):]
    assert "WARNING" in line and "jax is not installed for" in text and "pip install 'tpuwatch[canary]'" in text

    status = requests.get(f"{daemon.url}/api/status", timeout=5).json()
    assert status["status"] == "warning" and {c["verdict"]["status"] for c in status["chips"]} == {"ok"}
    assert [d["text"] for d in status["drills"]] == [text]
    page = requests.get(f"{daemon.url}/", timeout=5).text
    assert html.escape(text) in page and GENERIC not in page
    health = requests.get(f"{daemon.url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert text in health.json()["warnings"]
    assert health.json()["checks"]["drill"]["drills"][0]["needs"] == "canary"

    def drill_alert() -> dict[str, str] | None:
        alerts = requests.get(f"{daemon.url}/api/alerts", timeout=5).json()["alerts"]
        return next((a for a in alerts if a["labels"]["alertname"] == "TpuwatchDrillCannotRun"
                     and a["state"] == "firing"), None)

    alert = wait_until(drill_alert, what="TpuwatchDrillCannotRun firing")
    assert alert["labels"]["severity"] == "warning" and alert["labels"]["scenario"] == "sdc"
    assert "jax is not installed" in alert["annotations"]["description"]
    listed = subprocess.run([sys.executable, "-m", "tpuwatch", "alerts", "--config", str(daemon.config_path)],
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0
    (row,) = [line for line in listed.stdout.splitlines() if "TpuwatchDrillCannotRun" in line]
    assert "warning" in row and "Fire drill sdc cannot run: jax is not installed for" in row


def test_check_exits_1_when_the_simulated_drill_cannot_run(no_jax: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "kernel_log": {"source": "none"}}))
    text = run_check(config, "--simulate", "sdc", env=no_jax)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "UNHEALTHY: 1 problem(s)" in text.stdout
    assert "  - fire drill sdc cannot run: it needs the canary, and jax is not installed for" in text.stdout
    machine = run_check(config, "--simulate", "sdc", "--json", env=no_jax)
    result = json.loads(machine.stdout)
    assert machine.returncode == 1 and result["status"] == "unhealthy"
    assert [p for p in result["problems"] if "pip install 'tpuwatch[canary]'" in p] == result["problems"]
    assert run_check(config, "--simulate", "healthy", env=no_jax).returncode == 0  # it needs nothing more


@needs_jax
def test_check_with_jax_passes_the_sdc_drill(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "kernel_log": {"source": "none"}}))
    result = run_check(config, "--simulate", "sdc", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["problems"] == []


# --- check with the drill's part available ------------------------------------------------------------------


@needs_jax
def test_check_with_jax_says_it_does_not_run_the_canary_and_how_to(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "kernel_log": {"source": "none"}}))
    text = run_check(config, "--simulate", "sdc")
    assert text.returncode == 0, text.stderr  # the readings are healthy: check says what it did not judge
    assert text.stdout.splitlines()[-1] == ("HEALTHY by the readings only: the drill's fault is not among them "
                                            "(see the warning above)")
    assert "warning: `tpuwatch check` does not run the canary" in text.stdout
    assert "`tpuwatch canary --inject scale` runs that drill now" in text.stdout
    report = json.loads(run_check(config, "--simulate", "sdc", "--json").stdout)
    assert report["status"] == "healthy" and any("does not run the canary" in w for w in report["warnings"])
    # A scenario whose fault the readings show, and real chips, get no such line.
    plain = run_check(config, "--simulate", "healthy")
    assert plain.stdout.splitlines()[-1] == "HEALTHY" and "does not run the canary" not in plain.stdout


def test_only_drills_a_reading_cannot_show_are_named_by_check() -> None:
    named = [s for s in SCENARIOS if not_checked(simulated(s))]
    assert named == ["sdc", "probe-sdc"]
    assert not_checked(config_module.parse("{}")) == []


def test_canary_without_jax_names_the_extra_that_installs_it(no_jax: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "kernel_log": {"source": "none"},
                                      "devices": {"backend": "sim"}}))
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "canary", "--config", str(config)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **no_jax})
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr == (f"tpuwatch canary: jax is not installed for {sys.executable} (pip install "
                             "'tpuwatch[canary]', or point canary.python at an interpreter with jax)\n")
