"""Runbook links that answer on every install: the endpoint serves the runbooks tpuwatch ships at /runbooks/NAME
(behind the same TLS and basic auth as every route, only names of the shipped set), and alerts link there
unless alerting.runbook_base_url says otherwise."""

from __future__ import annotations

import base64
import http.client
import importlib.util
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tpuwatch import config as config_module
from tpuwatch.alerting import runbooks
from tpuwatch.alerting.rules import load_rules
from tpuwatch.alerting.service import own_url
from tpuwatch.exporter import build_registry
from tpuwatch.samples import sample
from tpuwatch.schema import ConfigError
from tpuwatch.web import Endpoint
from tpuwatch.webconfig import load_web_config

from certs import TlsFiles, make_tls_files
from conftest import SIM_FAST, DaemonProcess, free_port, wait_until
from http_receiver import Receiver
from test_web import PASSWORD, hashed, web_config

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "alerting.md"
T0 = 1_700_000_000.0
TRAVERSALS = ["/runbooks/../../../../etc/passwd", "/runbooks/..%2f..%2f..%2fetc%2fpasswd",
              "/runbooks/AcceleratorLost/../../../../etc/passwd", "/runbooks//etc/passwd",
              "/runbooks/runbooks.md", "/runbooks/../web.py", "/runbooks/%41cceleratorLost",
              "/runbooks/acceleratorlost", "/runbooks/AcceleratorLost%00", "/runbooks/NoSuchAlert"]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def secured(tls: TlsFiles, tmp_path: Path) -> Iterator[Endpoint]:
    """The real endpoint with TLS and basic auth, as the daemon runs it."""
    web = load_web_config(str(web_config(tmp_path / "web.yml", tls, users={"ops": hashed(PASSWORD)})))
    endpoint = Endpoint(f"127.0.0.1:{free_port()}", build_registry(lambda: []), {}, web)
    yield endpoint
    endpoint.close()


def test_the_package_ships_the_runbooks_of_docs_alerting_md_one_per_built_in_alert() -> None:
    shipped = runbooks.shipped()
    assert shipped == runbooks.parse(DOCS.read_text())
    assert {r.alert for r in load_rules(True, [])} <= set(shipped)
    assert "uncorrectable memory errors" in shipped["AcceleratorEccUncorrectable"]


def test_a_pip_install_serves_the_runbooks(tmp_path: Path) -> None:
    # The wheel built from this checkout (offline, with the setuptools at hand), installed on its own: the
    # runbooks are a copy of docs/alerting.md in it, not the source tree's link.
    if importlib.util.find_spec("setuptools") is None and os.environ.get("TPUWATCH_REQUIRE_TOOLS") != "1":
        pytest.skip("setuptools not installed")
    source = tmp_path / "source"  # a copy, links kept as links: the build writes build/ and *.egg-info beside it
    shutil.copytree(REPO / "tpuwatch", source / "tpuwatch", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "docs/alerting.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, timeout=300, cwd=tmp_path, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("tpuwatch-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True,
                   timeout=300, capture_output=True)
    installed = tmp_path / "site" / "tpuwatch" / "alerting" / "runbooks.md"
    assert not installed.is_symlink() and installed.read_bytes() == DOCS.read_bytes()
    probe = ("import tpuwatch.alerting.runbooks as r; a = r.answer('/runbooks/AcceleratorLost');"
             "print(r.__file__); print(a.code, b'no longer answers' in a.body)")
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert out == [str(tmp_path / "site" / "tpuwatch" / "alerting" / "runbooks.py"), "200 True"]


def test_runbooks_are_the_named_entries_of_the_runbooks_section_alone() -> None:
    text = ("## Rules\n\n### NotARunbook\n\nx\n\n## Runbooks\n\nIntro.\n\n### AlertOne\n\nFirst `a`.\n\n"
            "Second.\n\n### Not a name\n\nskipped\n\n### AlertTwo\n\nTwo.\n\n## After\n\n### AlertThree\n\nno\n")
    assert runbooks.parse(text) == {"AlertOne": "First `a`.\n\nSecond.", "AlertTwo": "Two."}


def test_a_runbook_page_escapes_its_text_and_keeps_links_to_runbooks_and_the_web() -> None:
    page = runbooks.page("AlertOne", {
        "AlertOne": "Run `tpuwatch check` <now>; see [AlertTwo](alerting.md#alerttwo), [the wiki](https://w.example/x),"
                    " [devices](devices.md#expected-chips).\n\n- first\n- second",
        "AlertTwo": "Two."}).decode()
    assert "<h1>AlertOne</h1>" in page and "<code>tpuwatch check</code> &lt;now&gt;" in page
    assert '<a href="AlertTwo">AlertTwo</a>' in page and '<a href="https://w.example/x">the wiki</a>' in page
    assert "devices.md" not in page and ", devices." in page
    assert "<ul><li>first</li><li>second</li></ul>" in page


def _get(endpoint: Endpoint, tls: TlsFiles, path: str, auth: bool = True) -> tuple[int, dict[str, str], str]:
    """GET ``path`` as sent, byte for byte (no client normalises it), over TLS."""
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    conn = http.client.HTTPSConnection("127.0.0.1", endpoint.port, context=context, timeout=10)
    headers = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()} if auth else {}
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
    finally:
        conn.close()


def test_the_endpoint_serves_each_shipped_runbook_behind_tls_and_basic_auth(secured: Endpoint, tls: TlsFiles) -> None:
    code, headers, body = _get(secured, tls, "/runbooks/AcceleratorEccUncorrectable")
    assert code == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert "<h1>AcceleratorEccUncorrectable</h1>" in body and "uncorrectable memory errors" in body
    assert "default-src 'none'" in headers["content-security-policy"]
    code, _, body = _get(secured, tls, "/runbooks/")
    assert code == 200 and all(f'<a href="{name}">' in body for name in runbooks.shipped())
    code, _, body = _get(secured, tls, "/")
    assert code == 200 and 'href="/runbooks/"' in body
    for path in ("/runbooks/AcceleratorEccUncorrectable", "/runbooks/", "/runbooks/NoSuchAlert"):
        code, headers, _ = _get(secured, tls, path, auth=False)
        assert code == 401 and headers["www-authenticate"].startswith("Basic"), path
    with pytest.raises(requests.ConnectionError):  # no plain HTTP
        requests.get(f"http://127.0.0.1:{secured.port}/runbooks/AcceleratorLost", timeout=5)


@pytest.mark.parametrize("path", TRAVERSALS)
def test_only_names_of_the_shipped_set_are_served(secured: Endpoint, tls: TlsFiles, path: str) -> None:
    code, _, body = _get(secured, tls, path)
    assert code == 404 and body.startswith("404 Not Found: no runbook of that name"), (path, body[:80])


def _config(**alerting: Any) -> config_module.Config:
    return config_module.parse(yaml.safe_dump({"alerting": alerting} if alerting else {}))


@pytest.mark.parametrize("listen,tls_on,expected", [
    ("127.0.0.1:9847", False, "http://127.0.0.1:9847"),
    ("10.1.2.3:9847", True, "https://10.1.2.3:9847"),
    ("[::1]:9847", False, "http://[::1]:9847"),
    ("gpu-7.example:9000", False, "http://gpu-7.example:9000"),
    ("0.0.0.0:9847", False, f"http://{socket.gethostname()}:9847"),
    ("[::]:9847", True, f"https://{socket.gethostname()}:9847"),
    (":9847", False, f"http://{socket.gethostname()}:9847"),
])
def test_the_daemons_own_url_is_its_listen_address_or_the_hosts_name(listen: str, tls_on: bool,
                                                                      expected: str) -> None:
    assert own_url(config_module.parse(yaml.safe_dump({"listen": listen})), tls_on) == expected


@pytest.mark.parametrize("base,expected", [
    (None, "http://127.0.0.1:9847/runbooks/AcceleratorLost"),  # the default listen address
    ("file:///usr/share/doc/tpuwatch/", "http://127.0.0.1:9847/runbooks/AcceleratorLost"),  # 0.1's default
    ("https://wiki.example/runbooks/", "https://wiki.example/runbooks/AcceleratorLost"),
    ("https://wiki.example/tpuwatch", "https://wiki.example/tpuwatch/AcceleratorLost"),
])
def test_alerts_link_the_daemons_runbook_unless_runbook_base_url_says_otherwise(
        make_alerting: Callable[..., Any], base: str | None, expected: str) -> None:
    alerting = make_alerting([], runbook_base_url=base)
    alerting.evaluate([sample("tpuwatch_device_up", 0, device="0")], T0)
    (alert,) = alerting.active_alerts()
    assert alert["annotations"]["runbook_url"] == expected


@pytest.mark.parametrize("base", ["ftp://wiki.example/", "https://wiki example/", "wiki.example/runbooks", "https://"])
def test_a_bad_runbook_base_url_is_one_line(base: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(runbook_base_url=base)
    assert str(caught.value).startswith("alerting.runbook_base_url: must be an http://, https:// or file:/// URL")
    assert "\n" not in str(caught.value)


def test_the_alerts_runbook_link_answers_from_the_daemon_over_tls_with_auth(
        start_daemon: Callable[..., DaemonProcess], tls: TlsFiles, tmp_path: Path) -> None:
    hook = Receiver("record")
    try:
        web = web_config(tmp_path / "web.yml", tls, users={"ops": hashed(PASSWORD)})
        daemon = start_daemon({**SIM_FAST, "web_config": str(web),
                               "alerting": {"group_wait": "0s", "group_interval": "1s"},
                               "notify": [{"name": "oncall", "type": "webhook", "url": hook.url()}],
                               "devices": {"sim": {"count": 2, "fault_device": 1, "fault_after": "0s"}}},
                              args=["--simulate", "ecc-errors"])
        alert = wait_until(lambda: next((a for body in hook.json() for a in body["alerts"]
                                         if a["labels"]["alertname"] == "AcceleratorEccUncorrectable"), None),
                           timeout=30, what="the ECC alert at the webhook")
        url = alert["annotations"]["runbook_url"]
        assert url == f"https://127.0.0.1:{daemon.port}/runbooks/AcceleratorEccUncorrectable"
        assert alert["annotations"]["summary"] == "Uncorrectable ECC error(s) on chip 1 (0000:11:00.0)"
        assert requests.get(url, verify=str(tls.ca_cert), timeout=5).status_code == 401
        page = requests.get(url, verify=str(tls.ca_cert), auth=("ops", PASSWORD), timeout=5)
        assert page.status_code == 200 and "uncorrectable memory errors" in page.text
    finally:
        hook.close()
