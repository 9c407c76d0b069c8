"""A real daemon under a slowloris flood, plain and TLS: scrapes and every route are answered, auth still holds.

The flood keeps 500 idle and 500 trickling connections (one byte a second)
coming, from 127.0.0.1 like the scraper ("shared") or from eight other
loopback addresses ("spread"); the daemon holds at most 128 per address and
512 in all, evicting the longest-waiting one for each new connection, and the
flood opens again what it closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from certs import TlsFiles, make_tls_files
from conftest import SIM_FAST, DaemonProcess, wait_until
from slowloris import Flood, attacker_tls
from test_web import PASSWORD, hashed, web_config

SOURCES = {"shared": ("127.0.0.1",), "spread": tuple(f"127.0.0.{n}" for n in range(2, 10))}
ROUTES = {"/metrics": (200,), "/healthz": (200, 503), "/api/alerts": (200,), "/": (200,), "/nowhere": (404,)}
ROUNDS = 4


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def closed_by_reason(text: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "tpuwatch_http_connections_closed_total"}


@pytest.mark.parametrize("sources", sorted(SOURCES))
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_every_route_answers_under_a_flood(start_daemon: Callable[..., DaemonProcess], tls: TlsFiles,
                                           tmp_path: Path, scheme: str, sources: str) -> None:
    web = web_config(tmp_path / "web.yml", tls if scheme == "https" else None, users={"prometheus": hashed(PASSWORD)})
    started = time.monotonic()
    daemon = start_daemon({**SIM_FAST, "web_config": str(web)})
    verify = str(tls.ca_cert)
    daemon.wait_ready(scheme=scheme, verify=verify)
    url = f"{scheme}://127.0.0.1:{daemon.port}"
    with Flood(daemon.port, idle=500, trickle=500, tls=attacker_tls() if scheme == "https" else None,
               sources=SOURCES[sources]) as flood:
        wait_until(lambda: flood.counts.opened >= 1000 and flood.counts.bytes_sent >= 500, timeout=60,
                   what="the flood to open its 1000 connections and trickle")
        for _ in range(ROUNDS):
            trickled = flood.counts.bytes_sent
            for path, codes in ROUTES.items():  # a new connection each time, as after an eviction
                anonymous = requests.get(url + path, verify=verify, timeout=30)
                assert anonymous.status_code == 401, (path, anonymous.status_code)
                answer = requests.get(url + path, verify=verify, auth=("prometheus", PASSWORD), timeout=30)
                assert answer.status_code in codes, (path, answer.status_code, answer.text[:200])
            wait_until(lambda: flood.counts.bytes_sent >= trickled + 100, timeout=30, what="the flood to go on")
        assert flood.counts.closed_by_server > 0
    metrics = requests.get(url + "/metrics", verify=verify, auth=("prometheus", PASSWORD), timeout=30).text
    assert "tpuwatch_device_up" in metrics
    log = daemon.log()
    assert "Traceback" not in log and daemon.proc.poll() is None
    # What the endpoint closed is counted, and logged at most once a minute per reason.
    wait_until(lambda: sum(closed_by_reason(requests.get(url + "/metrics", verify=verify, timeout=30,
                                                         auth=("prometheus", PASSWORD)).text).values()) > 0,
               timeout=30, what="the counts to be rendered")
    counted = {r: n for r, n in closed_by_reason(requests.get(url + "/metrics", verify=verify, timeout=30,
                                                              auth=("prometheus", PASSWORD)).text).items() if n}
    assert counted.get("evicted_per_client" if sources == "shared" else "evicted_total", 0) > 0, counted
    minutes = int((time.monotonic() - started) // 60)
    for reason in counted:
        assert log.count(f"({reason}): ") <= 1 + minutes, reason
