"""``tpuwatch alerts``: list the running daemon's active alerts from its ``/api/alerts`` endpoint.

The table is sorted by severity (critical first), then by age (oldest first).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from urllib.parse import urlsplit

import requests

from tpuwatch.config import Config
from tpuwatch.logsetup import add_secrets, redact
from tpuwatch.notifiers import inline_secrets
from tpuwatch.schema import ConfigError, Url
from tpuwatch.syntax import parse_listen_address
from tpuwatch.webconfig import load_web_config

_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tpuwatch alerts``."""
    parser.add_argument("--json", action="store_true", help="print the endpoint's JSON")
    add_url_option(parser)
    parser.add_argument("--ca", metavar="FILE", help="CA bundle to verify the daemon's TLS certificate")


def add_url_option(parser: argparse.ArgumentParser) -> None:
    """``--url``: the daemon to ask, instead of the one at the config's listen address."""
    parser.add_argument("--url", type=base_url, metavar="URL",
                        help="the daemon's address, like http://127.0.0.1:9847 (default: the config's listen, "
                             "https when its web_config has TLS)")


def base_url(text: str) -> str:
    """``--url``: an http or https address alone (no credentials, query or fragment), without its trailing slash."""
    try:
        Url().convert(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    parts = urlsplit(text)
    if parts.username is not None:
        raise argparse.ArgumentTypeError("a URL with credentials would show them to every user of this host (ps): "
                                         "give the daemon's address alone")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError("a URL with a query or fragment: give the daemon's address alone, "
                                         "like http://127.0.0.1:9847")
    return text.rstrip("/")


def daemon_url(config: Config, url: str | None = None) -> str:
    """The running daemon's address without a trailing slash: ``url`` (``--url``) if given, else where the daemon
    of ``config`` listens (https when its web config has TLS)."""
    if url is not None:
        return url
    host, port = parse_listen_address(config.listen)
    host = _WILDCARDS.get(host, host)
    scheme = "https" if load_web_config(config.web_config).ssl_context is not None else "http"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


# How ``tpuwatch alerts`` and ``tpuwatch top`` say what is wrong with the daemon they ask, in the same words:
# "the daemon at URL <this>".
UNTRUSTED = "has a TLS certificate not trusted here (--ca FILE)"


def not_answering(exc: BaseException) -> str:
    return f"does not answer ({type(exc).__name__})"


def _order(alert: dict[str, Any]) -> tuple[int, str]:
    return _SEVERITY_ORDER.get(alert["labels"].get("severity", ""), 3), alert.get("activeAt") or ""


def render(alerts: list[dict[str, Any]]) -> str:
    """A table of alerts, most severe and oldest first, or a line saying there are none."""
    if not alerts:
        return "no active alerts"
    rows = [("STATE", "SEVERITY", "ALERT", "DEVICE", "PCI", "SINCE", "SUMMARY")]
    for a in sorted(alerts, key=_order):
        labels = a["labels"]
        state = a["state"] + (" (inhibited)" if a.get("inhibited") else "")
        rows.append((state, labels.get("severity", ""), labels.get("alertname", ""), labels.get("device", "-"),
                     labels.get("pci", "-"), a.get("startsAt") or a["activeAt"], a["annotations"].get("summary", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:6], widths, strict=True)) + "  " + r[6] for r in rows)


def run(args: argparse.Namespace, config: Config) -> int:
    """Print the active alerts; 0 when listed, 1 when the daemon cannot be asked, 2 on config errors."""
    try:
        base = daemon_url(config, args.url)
    except (ConfigError, RuntimeError) as exc:
        print(f"tpuwatch: config error: {exc}", file=sys.stderr)
        return 2
    url = base + "/api/alerts"
    try:
        response = requests.get(url, timeout=10, verify=args.ca or True)
    except requests.exceptions.SSLError:
        print(f"tpuwatch: the daemon at {base} {UNTRUSTED}", file=sys.stderr)
        return 1
    except requests.RequestException as exc:  # as tpuwatch top says it
        print(f"tpuwatch: the daemon at {base} {not_answering(exc)}", file=sys.stderr)
        return 1
    try:
        response.raise_for_status()
        answer = response.json()
        alerts = answer["alerts"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        print(f"tpuwatch: cannot list alerts from {url}: {type(exc).__name__}", file=sys.stderr)
        return 1
    add_secrets(inline_secrets(config.notify))
    print(redact(json.dumps(answer, indent=2) if args.json else render(alerts)))
    return 0
