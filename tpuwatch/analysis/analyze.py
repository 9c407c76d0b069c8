"""``tpuwatch analyze``: replay recorded series through the daemon's own online leak detector.

Input is a CSV file (``timestamp,value[,capacity]``), a Prometheus query_range
JSON file, or a live Prometheus (``--prometheus URL --query EXPR --range
DURATION [--step S]``).  Every series is fed sample by sample to the very
``LeakDetector`` the daemon runs, and reported with its verdict, the time the
daemon would first have fired, its slope and its projected exhaustion.

Exit codes: 0 no leak, 1 a leak in at least one series, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests

from tpuwatch.analysis.inputs import InputError, Series, describe, parse_csv, parse_prometheus, series_from_response
from tpuwatch.analysis.leak import LeakDetector, LeakParams
from tpuwatch.config import Config
from tpuwatch.schema import parse_duration

EXIT_OK, EXIT_LEAK, EXIT_USAGE = 0, 1, 2
MAX_POINTS_PER_QUERY = 10_000
HTTP_TIMEOUT_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tpuwatch analyze``."""
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="CSV (timestamp,value[,capacity]) or Prometheus query_range JSON")
    parser.add_argument("--capacity", type=float, metavar="BYTES",
                        help="capacity of every series whose input carries none")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--prometheus", metavar="URL", help="read from this Prometheus server instead of FILE")
    parser.add_argument("--query", metavar="EXPR", help="PromQL expression (with --prometheus)")
    parser.add_argument("--range", metavar="DURATION", help="how far back from now, like 12h (with --prometheus)")
    parser.add_argument("--step", metavar="S", help="resolution, like 10s (default: the config's interval)")


def run(args: argparse.Namespace, config: Config) -> int:
    """Load, replay, report.  Problems are one line on stderr and exit 2."""
    try:
        series = _load(args, config)
        if args.capacity is not None and args.capacity <= 0:
            raise InputError(f"--capacity {args.capacity:g} is not positive")
    except InputError as exc:
        print(f"tpuwatch analyze: {exc}", file=sys.stderr)
        return EXIT_USAGE
    params = LeakParams(critical_eta=config.trend.critical_eta, max_eta=config.trend.max_eta)
    results = [replay(s, params, args.capacity) for s in series]
    print(json.dumps({"series": results}, indent=2) if args.json else render(results))
    return EXIT_LEAK if any(r["verdict"] == "leak" for r in results) else EXIT_OK


def replay(series: Series, params: LeakParams, default_capacity: float | None) -> dict[str, Any]:
    """Feed one series through a fresh detector; the ``analyze --json`` record of it."""
    detector = LeakDetector(params)
    update = detector.update
    for timestamp, value, capacity in zip(series.times, series.values, series.capacities):
        update(timestamp, value, capacity if capacity is not None else default_capacity)
    state = detector.state
    return {
        "labels": series.labels,
        "verdict": "leak" if detector.first_alert_at is not None else "ok",
        "first_alert_at": detector.first_alert_at,
        "slope_bytes_per_second": state.slope if state.firing else detector.slope(),
        "exhaustion_eta_seconds": state.eta if state.firing else None,
    }


def _load(args: argparse.Namespace, config: Config) -> list[Series]:
    if args.prometheus is not None:
        if args.file is not None:
            raise InputError("give FILE or --prometheus, not both")
        if not args.query or not args.range:
            raise InputError("--prometheus needs --query EXPR and --range DURATION")
        step = _duration(args.step, "--step") if args.step else config.interval
        return fetch(args.prometheus, args.query, _duration(args.range, "--range"), step)
    if args.file is None:
        raise InputError("give FILE, or --prometheus URL --query EXPR --range DURATION")
    if args.query or args.range or args.step:
        raise InputError("--query, --range and --step go with --prometheus")
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}") from None
    if text.lstrip().startswith("{"):
        return parse_prometheus(text, args.file)
    return [parse_csv(text, args.file)]


def _duration(text: str, option: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise InputError(f"{option}: {exc}") from None
    if seconds <= 0:
        raise InputError(f"{option}: must be positive")
    return seconds


def fetch(url: str, query: str, span: float, step: float, now: float | None = None) -> list[Series]:
    """Run ``query`` over the last ``span`` seconds at ``step`` via /api/v1/query_range, in chunks.

    Prometheus refuses more than 11,000 points per series, so longer ranges are
    split and the pieces joined per label set.
    """
    end = time.time() if now is None else now
    start = end - span
    merged: dict[tuple[tuple[str, str], ...], Series] = {}
    endpoint = url.rstrip("/") + "/api/v1/query_range"
    while start <= end:
        stop = min(end, start + step * (MAX_POINTS_PER_QUERY - 1))
        params = {"query": query, "start": f"{start:.3f}", "end": f"{stop:.3f}", "step": f"{step:g}"}
        try:
            response = requests.get(endpoint, params=params, timeout=HTTP_TIMEOUT_S)
        except requests.RequestException as exc:
            raise InputError(f"cannot query Prometheus at {url}: {type(exc).__name__}") from None
        try:
            document = response.json()
        except ValueError:
            raise InputError(f"{url}: answered HTTP {response.status_code} without a JSON body "
                             "(is this a Prometheus server?)") from None
        pieces = series_from_response(document, url)
        for piece in pieces:
            key = tuple(sorted(piece.labels.items()))
            target = merged.setdefault(key, Series(piece.labels))
            for t, v, c in zip(piece.times, piece.values, piece.capacities):
                if not target.times or t > target.times[-1]:
                    target.append(t, v, c, f"{url}: series {describe(piece.labels)}")
        start = stop + step
    if not merged:
        raise InputError(f"{url}: the query returned no samples over the last {span:g}s")
    return list(merged.values())


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = int(seconds // 60)
    days, rest = divmod(minutes, 1440)
    return f"{days}d{rest // 60}h" if days else f"{rest // 60}h{rest % 60:02d}m"


def render(results: list[dict[str, Any]]) -> str:
    """The readable table: one line per series."""
    rows = [("SERIES", "VERDICT", "FIRST ALERT (UTC)", "GROWTH", "EXHAUSTED IN")]
    for r in results:
        alert = r["first_alert_at"]
        rows.append((
            describe(r["labels"]), r["verdict"],
            "-" if alert is None else datetime.fromtimestamp(alert, timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            f"{_bytes(r['slope_bytes_per_second'] * 3600)}/h", _eta(r["exhaustion_eta_seconds"]),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    leaks = sum(r["verdict"] == "leak" for r in results)
    lines += ["", f"{leaks} of {len(results)} series leaking" if leaks else f"no leak in {len(results)} series"]
    return "\n".join(lines)
