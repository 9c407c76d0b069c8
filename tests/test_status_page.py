"""The status page of a real daemon in a real browser (Debian's chromium, headless, tests/browser.py).

For a healthy host and each ``--simulate`` scenario: one row per chip, the faulty chip marked (and no other
critical), three plots per chip with their points, the leak forecast drawn in hbm-leak only, every request to
the daemon itself and no Content-Security-Policy violation; the page refreshes in place; basic auth guards every
route.  Screenshots go to $TPUWATCH_ARTIFACTS (default: the test's tmp dir); with
TPUWATCH_UPDATE_SCREENSHOTS=1 the README's docs/status-page.png is rewritten from the hbm-leak run.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml

from tpuwatch.devices.sim import OVERHEAT_MAX_C

from browser import Browser, Tab
from conftest import SIM_FAST, DaemonProcess, require_tool, wait_until

DOCS = Path(__file__).resolve().parent.parent / "docs"
PASSWORD = "correct horse"
CANARY = {"enabled": True, "every": "1h", "jitter": "0s", "timeout": "60s"}
# scenario -> (config over SIM_FAST, the faulty chip, the words its first reasons must hold, seconds to wait)
SCENARIOS: dict[str, tuple[dict[str, Any], str | None, str, float]] = {
    "healthy": ({}, None, "", 20),
    "hbm-leak": ({"interval": "1s", "collector_timeout": "500ms", "store": {"points_per_series": 3600},
                  "devices": {"backend": "sim", "sim": {"count": 8, "fault_device": 2, "fault_after": "0s"}}},
                 "2", "memory leak suspected", 60),
    "ecc-errors": ({}, "1", "uncorrectable ECC error", 20),
    "overheat": ({}, "1", "temperature", 150),  # 0.5 °C a second from about 65 °C to the 85 °C limit
    "sdc": ({"canary": CANARY}, "1", "canary: wrong result", 120),
    "device-lost": ({"devices": {"backend": "sim", "sim": {"count": 4, "fault_device": 1, "fault_after": "2s"}}},
                    "1", "is down", 30),
}
DOM = """(() => {
  const rows = [...document.querySelectorAll("tr.chip")].map(r => [r.dataset.device, r.dataset.verdict]);
  const plots = [...document.querySelectorAll("article.chip-detail svg.plot")].map(s => [
    s.closest("article").dataset.device, s.dataset.series,
    [...s.querySelectorAll(".s-mem, .s-util, .s-temp")]
      .reduce((n, p) => n + (p.tagName === "circle" ? 1 : p.points.numberOfItems), 0)]);
  const forecasts = [...document.querySelectorAll("polyline.s-forecast")].map(p => [
    p.closest("article").dataset.device, p.points.numberOfItems]);
  const reasons = [...document.querySelectorAll("article.chip-detail")].map(a => [
    a.dataset.device, [...a.querySelectorAll("ul.reasons li")].map(li => li.textContent)]);
  return {rows, plots, forecasts, reasons: Object.fromEntries(reasons),
          status: document.getElementById("status").dataset.status};
})()"""


def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: $TPUWATCH_ARTIFACTS, else the test's tmp dir."""
    folder = Path(os.environ.get("TPUWATCH_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    started = Browser(require_tool("chromium"))
    yield started
    started.close()


def chip_verdicts(daemon: DaemonProcess, **kwargs: Any) -> dict[str, str]:
    status = requests.get(f"{daemon.url}/api/status", timeout=5, **kwargs).json()
    return {chip["device"]: chip["verdict"]["status"] for chip in status["chips"]}


def temperature(daemon: DaemonProcess, device: str) -> float | None:
    status = requests.get(f"{daemon.url}/api/status", timeout=5).json()
    return next(chip["reading"]["temperature_celsius"] for chip in status["chips"] if chip["device"] == device)


def least_points(daemon: DaemonProcess) -> int:
    series = requests.get(f"{daemon.url}/api/series", timeout=5).json()
    return min((len(points) for chip in series["chips"] for points in chip["series"].values()), default=0)


def csp_violations(tab: Tab) -> list[str]:
    return [e["text"] for e in tab.log_entries() if "Content Security Policy" in e.get("text", "")
            or e.get("source") == "security"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_page_shows_which_chip_is_wrong_and_why(scenario: str, browser: Browser, tmp_path: Path,
                                                    start_daemon: Callable[..., DaemonProcess]) -> None:
    overrides, faulty, words, wait = SCENARIOS[scenario]
    if scenario == "sdc" and importlib.util.find_spec("jax") is None:  # find_spec: jax stays out of pytest
        pytest.skip("the canary extra (jax) is not installed")
    config = {**SIM_FAST, "devices": {"backend": "sim", "sim": {"count": 4, "fault_device": 1, "fault_after": "0s"}},
              **overrides}
    daemon = start_daemon(config, args=["--simulate", scenario])
    daemon.wait_ready()
    count = config["devices"]["sim"]["count"]
    if faulty is not None:
        wait_until(lambda: chip_verdicts(daemon).get(faulty) == "critical", timeout=wait,
                   what=f"chip {faulty} critical in {scenario}")
    if scenario == "overheat":  # while rising through the limit the load's swing takes the reading back under it
        wait_until(lambda: temperature(daemon, "1") == OVERHEAT_MAX_C, timeout=wait,
                   what=f"chip 1 at the simulated ceiling ({OVERHEAT_MAX_C:g} °C)")
    wait_until(lambda: len(chip_verdicts(daemon)) == count and least_points(daemon) >= 3, timeout=wait,
               what="every chip with a few points in every series")

    tab = browser.page(width=1280, height=1000)
    tab.navigate(daemon.url + "/")
    seen = tab.evaluate(DOM)
    assert [device for device, _ in seen["rows"]] == [str(k) for k in range(count)]
    marked = {device: verdict for device, verdict in seen["rows"]}
    if faulty is None:
        assert "critical" not in marked.values() and seen["status"] != "critical"
    else:
        assert marked[faulty] == "critical" and seen["status"] == "critical"
        assert [d for d, v in marked.items() if v == "critical"] == [faulty]
        assert any(words in reason for reason in seen["reasons"][faulty]), seen["reasons"][faulty]
    plots = {(device, series): points for device, series, points in seen["plots"]}
    assert len(plots) == 3 * count
    assert all(points >= 2 for points in plots.values()), plots
    assert seen["forecasts"] == ([["2", 2]] if scenario == "hbm-leak" else [])
    assert all(url.startswith(daemon.url + "/") for url in tab.requests()), tab.requests()
    assert {url.removeprefix(daemon.url) for url in tab.requests()} >= {"/", "/status.css", "/status.js"}
    assert csp_violations(tab) == []
    tab.screenshot(artifacts(tmp_path) / f"status-{scenario}.png")
    if scenario == "hbm-leak" and os.environ.get("TPUWATCH_UPDATE_SCREENSHOTS") == "1":
        tab.screenshot(DOCS / "status-page.png", full_page=False)


def test_the_page_refreshes_in_place_and_fits_a_phone(browser: Browser, tmp_path: Path,
                                                     start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon(SIM_FAST, args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    tab = browser.page(width=1280, height=1000)
    tab.navigate(daemon.url + "/")
    first = tab.evaluate("window.tpuwatchMark = 1; document.getElementById('status').dataset.generated")
    # The script fetches the page every max(2 s, interval) and swaps <main id="status">: no reload, no flicker.
    tab.wait(f"document.getElementById('status').dataset.generated !== '{first}'", timeout=20,
             what="the page to refresh itself")
    assert tab.evaluate("window.tpuwatchMark") == 1 and tab.navigations() == 1
    assert tab.evaluate("document.getElementById('stale').hidden") is True
    assert tab.requests().count(daemon.url + "/") >= 2
    assert all(url.startswith(daemon.url + "/") for url in tab.requests()) and csp_violations(tab) == []

    phone = browser.page(width=390, height=844, mobile=True)
    phone.navigate(daemon.url + "/")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the screen
    assert phone.evaluate("document.querySelectorAll('tr.chip').length") == 4
    phone.screenshot(artifacts(tmp_path) / "status-phone.png")


def test_basic_auth_guards_the_page_its_script_and_its_json(browser: Browser, tmp_path: Path,
                                                           start_daemon: Callable[..., DaemonProcess]) -> None:
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {
        "oncall": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}}))
    daemon = start_daemon({**SIM_FAST, "web_config": str(web)})
    daemon.wait_ready()
    for path in ("/", "/status.js", "/status.css", "/api/status", "/api/series"):
        refused = requests.get(daemon.url + path, timeout=5)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic"), path
        assert requests.get(daemon.url + path, auth=("oncall", "wrong"), timeout=5).status_code == 401
        assert requests.get(daemon.url + path, auth=("oncall", PASSWORD), timeout=5).status_code == 200

    stranger = browser.page()
    assert stranger.navigate(daemon.url + "/", refused=True) == "net::ERR_INVALID_AUTH_CREDENTIALS"
    assert stranger.statuses()[daemon.url + "/"] == [401]
    assert stranger.evaluate("document.querySelectorAll('tr.chip').length") == 0

    oncall = browser.page(credentials=("oncall", PASSWORD))
    oncall.navigate(daemon.url + "/")
    assert oncall.evaluate("document.querySelectorAll('tr.chip').length") == 4
    first = oncall.evaluate("document.getElementById('status').dataset.generated")
    oncall.wait(f"document.getElementById('status').dataset.generated !== '{first}'", timeout=20,
                what="the refresh to pass basic auth too")
    assert all(url.startswith(daemon.url + "/") for url in oncall.requests())
    assert PASSWORD not in daemon.log()
