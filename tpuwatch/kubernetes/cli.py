"""``tpuwatch ack DEVICE...`` and ``tpuwatch set-healthy``: tell the running daemon a repair is done.

The request is a small file in ``STATE_DIR/kubernetes-requests/`` (so only who may write the state
directory, root on a host or ``kubectl exec`` in the pod, can ask); the daemon's Kubernetes agent takes it
on its next round and lists it under ``acks`` in ``/api/kubernetes``, which this command waits for.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import requests

from tpuwatch import statefile
from tpuwatch.alerting.listing import add_url_option, daemon_url
from tpuwatch.config import Config, option_type
from tpuwatch.kubernetes.agent import REQUESTS_DIR
from tpuwatch.schema import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tpuwatch ack`` and ``tpuwatch set-healthy``."""
    if parser.prog.split()[-1] == "ack":
        parser.add_argument("devices", nargs="+", metavar="DEVICE", help="chip index, as in the alerts' device label")
    parser.add_argument("--wait", type=float, default=15.0, metavar="SECONDS",
                        help="how long to wait for the daemon to confirm (default 15)")
    add_url_option(parser)
    parser.add_argument("--state-dir", metavar="DIR", type=option_type("state_dir"),
                        help="the daemon's state directory, where the request is left (default: the config's "
                             "state_dir); for a daemon run with --state-dir, the same")
    parser.add_argument("--ca", metavar="FILE", help="CA bundle to verify the daemon's TLS certificate")


def write_request(state_dir: str, devices: list[str] | None) -> str:
    """Leave a request for the daemon; its id.  OSError if the state directory cannot be written."""
    directory = Path(state_dir) / REQUESTS_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    request_id = f"{time.time_ns()}-{os.getpid()}"
    statefile.write(directory / f"{request_id}.json", {"devices": devices})  # the agent reads *.json only
    return request_id


def run(args: argparse.Namespace, config: Config) -> int:
    """0 once the daemon applied the request, 1 if it did not confirm in time, 2 if it cannot be asked."""
    if not config.kubernetes.node_conditions:
        print("tpuwatch: kubernetes.node_conditions is off: there is nothing to acknowledge", file=sys.stderr)
        return 2
    devices = list(args.devices) if args.command == "ack" else None
    try:
        url = daemon_url(config, args.url) + "/api/kubernetes"
        request_id = write_request(config.state_dir, devices)
    except (ConfigError, RuntimeError) as exc:
        print(f"tpuwatch: config error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tpuwatch: cannot leave the request in {config.state_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    what = f"device(s) {', '.join(devices)}" if devices else "every device"
    deadline = time.monotonic() + args.wait
    while True:
        try:
            answer = requests.get(url, timeout=5, verify=args.ca or True).json()
            done = next((a for a in answer.get("acks", []) if a.get("id") == request_id), None)
        except (requests.RequestException, ValueError, AttributeError):
            done = None
        if done is not None:
            alerts = ", ".join(done.get("alerts") or []) or "no active alert"
            print(f"{what} marked healthy on node {answer.get('node')}: {alerts} acknowledged")
            return 0
        if time.monotonic() >= deadline:
            print(f"tpuwatch: request left for the daemon, which has not confirmed it at {url} within "
                  f"{args.wait:g}s (is it running?); it is applied at its next start", file=sys.stderr)
            return 1
        time.sleep(0.2)
