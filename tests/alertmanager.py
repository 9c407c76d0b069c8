"""Debian's real Alertmanager on a free port of 127.0.0.1, for the tests and benchmarks/alerting.py.

It groups by alertname and device and notifies ``hook_url`` (a webhook receiver), or no one; ``stop()`` kills
it and ``start()`` brings it back on the same port and storage, which is how a receiver outage is played.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from conftest import free_port, require_tool, wait_until

QUICK_ROUTE = {"group_wait": "100ms", "group_interval": "1s", "repeat_interval": "1h"}


class RealAlertmanager:
    """One prometheus-alertmanager process with its config and storage under ``workdir``."""

    def __init__(self, workdir: Path, hook_url: str | None = None, binary: str | None = None,
                 route: dict[str, str] | None = None, send_resolved: bool = False) -> None:
        self.binary = binary or require_tool("prometheus-alertmanager")
        self.workdir, self.port = workdir, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        receiver: dict[str, Any] = {"name": "hook"}
        if hook_url is not None:
            receiver["webhook_configs"] = [{"url": hook_url, "send_resolved": send_resolved}]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "am.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "device"], **(route or QUICK_ROUTE)},
            "receivers": [receiver]}))
        self.proc: subprocess.Popen[bytes] | None = None

    def version(self) -> str:
        """Its --version's first line."""
        return subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.split("\n")[0]

    def start(self, timeout: float = 30) -> float:
        """Start it; when it answered ready."""
        self.proc = subprocess.Popen([self.binary, f"--config.file={self.workdir / 'am.yml'}",
                                      f"--storage.path={self.workdir / 'am'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
                                      "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: requests.get(f"{self.url}/-/ready", timeout=1).ok, timeout, "alertmanager ready")
        return time.time()

    def stop(self) -> None:
        """Kill it (an outage, or the end)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def held(self) -> list[dict[str, Any]]:
        """The alerts it holds (its API v2)."""
        return list(requests.get(f"{self.url}/api/v2/alerts", timeout=5).json())
