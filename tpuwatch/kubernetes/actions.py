"""The one-shot remediation actions: run a command, post a webhook.  Each bounded in time and output."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import urllib.error
import urllib.request
from typing import Any

from tpuwatch.kubernetes.plugin import RemediationActionConfig

OUTPUT_MAX = 2000


def event_environment(event: dict[str, Any]) -> dict[str, str]:
    """The event as ``TPUWATCH_*`` variables, plus the whole of it as JSON in ``TPUWATCH_EVENT``."""
    env = {"TPUWATCH_EVENT": json.dumps(event, sort_keys=True)}
    for key, value in event.items():
        text = ",".join(map(str, value)) if isinstance(value, list) else str(int(value) if isinstance(value, bool)
                                                                               else value)
        env[f"TPUWATCH_{key.upper()}"] = text
    return env


def run_exec(action: RemediationActionConfig, event: dict[str, Any]) -> tuple[bool, str]:
    """Run ``action.command`` with the event in its environment; (succeeded, what it said or why not)."""
    try:
        result = subprocess.run(action.command, env={**os.environ, **event_environment(event)},
                                stdin=subprocess.DEVNULL, capture_output=True, timeout=action.timeout, check=False)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {action.timeout:g}s"
    except OSError as exc:
        return False, f"cannot run {action.command[0]}: {exc.strerror or exc}"
    said = (result.stdout[-OUTPUT_MAX:] + result.stderr[-OUTPUT_MAX:]).decode(errors="replace").strip()
    if result.returncode != 0:
        return False, f"exit {result.returncode}: {said[-OUTPUT_MAX:]}"
    return True, said[-OUTPUT_MAX:]


def post_webhook(action: RemediationActionConfig, event: dict[str, Any]) -> tuple[bool, str]:
    """POST the event as JSON to ``action.url``; a 2xx answer is success."""
    assert action.url is not None
    # The standard library, as the notifiers use: requests would cost the daemon about 5 MB of memory.
    request = urllib.request.Request(action.url, data=json.dumps(event).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=action.timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError and timeouts are OSErrors
        return False, f"{type(exc).__name__}: {exc}"[:OUTPUT_MAX]
    return 200 <= status < 300, f"HTTP {status}"
