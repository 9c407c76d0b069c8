"""``tpuwatch analyze``: replay recorded series through the daemon's own online leak detector.

Input is a CSV file (``timestamp,value[,capacity]``, an optional header row),
a Prometheus query_range JSON file, or a live Prometheus (``--prometheus URL
--query EXPR --range DURATION [--step S]``).  Every series is fed sample by
sample to the very ``LeakDetector`` the daemon runs, as it is read (a CSV file
or a live query streams in constant memory), and reported with its verdict:
``leak`` (with the time the daemon would first have fired and the projected
exhaustion), ``ok``, or ``insufficient`` when the series is shorter than the
detector's learning period.  The growth shown is the series' own robust
(Theil-Sen) slope over its whole length.  On a terminal a progress line shows
how far the replay is (not with ``--json`` or when stderr is not a terminal).

Exit codes: 0 no leak, 1 a leak in at least one series, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import IO, Any

import requests

from tpuwatch.analysis.inputs import InputError, Point, csv_points, describe, parse_prometheus, results
from tpuwatch.analysis.leak import LeakDetector, LeakParams
from tpuwatch.analysis.params import FAST_INTERVAL
from tpuwatch.analysis.robust import theil_sen
from tpuwatch.config import Config
from tpuwatch.hw.units import GIB, KIB, MIB
from tpuwatch.syntax import parse_bytes, parse_duration

EXIT_OK, EXIT_LEAK, EXIT_USAGE = 0, 1, 2
MAX_POINTS_PER_QUERY = 10_000
HTTP_TIMEOUT_S = 30.0
MAX_JSON_BYTES = 256 << 20  # a query_range JSON file is decoded whole: larger ones should be CSV or --prometheus
SLOPE_POINTS = 512  # the whole-length slope is fitted to at most this many evenly spaced samples
PROGRESS_EVERY_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tpuwatch analyze``."""
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="CSV (timestamp,value[,capacity], optional header row) or Prometheus query_range "
                             "JSON; - for a CSV on stdin")
    parser.add_argument("--capacity", type=_size, metavar="BYTES",
                        help="capacity of every series whose input carries none: bytes, or like 16GiB, 16Gi, 17GB")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--prometheus", metavar="URL", help="read from this Prometheus server instead of FILE")
    parser.add_argument("--query", metavar="EXPR", help="PromQL expression (with --prometheus)")
    parser.add_argument("--range", metavar="DURATION", help="how far back from now, like 12h (with --prometheus)")
    parser.add_argument("--step", metavar="S", help="resolution, like 10s (default: the config's interval)")


class Replay:
    """One series fed through a fresh detector as its points arrive."""

    def __init__(self, labels: dict[str, str], params: LeakParams, default_capacity: float | None) -> None:
        self.labels = labels
        self.params = params
        self.detector = LeakDetector(params)
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self._default_capacity = default_capacity
        self._sample: list[tuple[float, float]] = []  # every ``_stride``-th point, for the whole-length slope
        self._stride = 1
        self._close = 0  # readings at most FAST_INTERVAL after the one before

    def add(self, timestamp: float, value: float, capacity: float | None) -> None:
        """Feed one point (in time order)."""
        self.detector.update(timestamp, value, capacity if capacity is not None else self._default_capacity)
        if self.last is not None and timestamp - self.last <= FAST_INTERVAL:
            self._close += 1
        if self.first is None:
            self.first = timestamp
        self.last = timestamp
        if self.count % self._stride == 0:
            self._sample.append((timestamp, value))
            if len(self._sample) >= 2 * SLOPE_POINTS:
                del self._sample[1::2]
                self._stride *= 2
        self.count += 1

    def feed(self, points: Iterable[Point]) -> None:
        """Feed every point of ``points``."""
        add = self.add
        for timestamp, value, capacity in points:
            add(timestamp, value, capacity)

    def slope(self) -> float:
        """Theil-Sen slope of the whole series (bytes per second), 0.0 with fewer than two points."""
        if len(self._sample) < 2:
            return 0.0
        import numpy as np

        kept = self._sample[::-(-len(self._sample) // SLOPE_POINTS)]
        times, values = (np.array(column, dtype=float) for column in zip(*kept))
        return theil_sen(times - times[-1], values)

    def result(self) -> dict[str, Any]:
        """The ``analyze --json`` record of the series."""
        span = (self.last or 0.0) - (self.first or 0.0)
        state = self.detector.state
        if self.detector.first_alert_at is not None:
            verdict, reason = "leak", None
        elif span < self.params.min_history:
            verdict, reason = "insufficient", self._short(span)
        else:
            verdict, reason = "ok", None
        return {
            "labels": self.labels,
            "verdict": verdict,
            "reason": reason,
            "samples": self.count,
            "span_seconds": span,
            "first_alert_at": self.detector.first_alert_at,
            "slope_bytes_per_second": self.slope(),
            "leak_slope_bytes_per_second": state.slope if state.firing else None,
            "exhaustion_eta_seconds": state.eta if state.firing else None,
            "note": self._sparse(),
        }

    def _sparse(self) -> str | None:
        """A note when most readings are further apart than the fast check is tuned for, and it judged the series."""
        fast = self.params.fast
        if fast is None or self.detector.capacity is None or self.count < 2 or 2 * self._close >= self.count - 1:
            return None
        return (f"most readings over {FAST_INTERVAL:g} s apart: the fast check (a chip full within "
                f"{_span(fast.horizon)}) pages later there, and more warm-ups (docs/trend.md, Limits)")

    def _short(self, span: float) -> str:
        """Why a series too short for the slow scales has no verdict, and whether the fast check judged it."""
        reason = f"{_span(self.params.min_history)} of data needed for a slow leak, {_span(span)} given"
        fast = self.params.fast
        if fast is None:
            return reason
        if self.detector.capacity is None:
            return f"{reason}; no capacity, so no fast one judged either"
        if span >= (fast.least_reference + fast.young_shortest + 1) * self.params.bucket:
            return f"{reason}; no fast one (filling the chip within {_span(fast.horizon)}) found"
        return reason


def _span(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def run(args: argparse.Namespace, config: Config) -> int:
    """Load, replay, report.  Problems are one line on stderr and exit 2."""
    params = LeakParams(critical_eta=config.trend.critical_eta, max_eta=config.trend.max_eta)
    progress = Progress(enabled=not args.json and sys.stderr.isatty())
    try:
        if args.capacity is not None and args.capacity <= 0:
            raise InputError(f"--capacity {args.capacity:g} is not positive")
        replays = _replay(args, config, params, progress)
    except InputError as exc:
        progress.done()
        print(f"tpuwatch analyze: {exc}", file=sys.stderr)
        return EXIT_USAGE
    progress.done()
    found = [r.result() for r in replays]
    print(json.dumps({"series": found}, indent=2) if args.json else render(found))
    return EXIT_LEAK if any(r["verdict"] == "leak" for r in found) else EXIT_OK


def _replay(args: argparse.Namespace, config: Config, params: LeakParams, progress: Progress) -> list[Replay]:
    if args.prometheus is not None:
        if args.file is not None:
            raise InputError("give FILE or --prometheus, not both")
        if not args.query or not args.range:
            raise InputError("--prometheus needs --query EXPR and --range DURATION")
        step = _duration(args.step, "--step") if args.step else config.interval
        return fetch(args.prometheus, args.query, _duration(args.range, "--range"), step, params, args.capacity,
                     progress=progress)
    if args.file is None:
        raise InputError("give FILE, or --prometheus URL --query EXPR --range DURATION")
    if args.query or args.range or args.step:
        raise InputError("--query, --range and --step go with --prometheus")
    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    with stream:
        return _replay_file(stream, args.file, params, args.capacity, progress)


def _replay_file(stream: IO[bytes], name: str, params: LeakParams, capacity: float | None,
                 progress: Progress) -> list[Replay]:
    try:
        size = os.fstat(stream.fileno()).st_size
        head = stream.peek(64)[:64] if hasattr(stream, "peek") else b""
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    if head.lstrip().startswith(b"{"):
        data = stream.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise InputError(f"{name}: more than {MAX_JSON_BYTES >> 20} MiB of JSON, which is read whole; convert "
                             "it to CSV or read it with --prometheus")
        series = parse_prometheus(_text(data, name), name)
        replays = []
        for labels, points in series:
            replays.append(Replay(labels, params, capacity))
            replays[-1].feed(progress.count(points))
        return replays
    replay = Replay({"source": name}, params, capacity)
    replay.feed(progress.count(csv_points(_lines(stream, name, size, progress), name)))
    return [replay]


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def _lines(stream: IO[bytes], name: str, size: int, progress: Progress) -> Iterator[str]:
    read = 0
    for number, raw in enumerate(stream, start=1):
        read += len(raw)
        if number % 4096 == 0:
            progress.bytes(read, size)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{name}: line {number}: not UTF-8 text") from None


def _size(text: str) -> float:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str, option: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise InputError(f"{option}: {exc}") from None
    if seconds <= 0:
        raise InputError(f"{option}: must be positive")
    return seconds


def fetch(url: str, query: str, span: float, step: float, params: LeakParams, capacity: float | None = None,
          now: float | None = None, progress: Progress | None = None) -> list[Replay]:
    """Replay ``query`` over the last ``span`` seconds at ``step`` from /api/v1/query_range, chunk by chunk.

    Prometheus refuses more than 11,000 points per series, so longer ranges are
    asked in pieces; each piece is fed to its series' detector as it arrives.
    """
    end = time.time() if now is None else now
    start = end - span
    chunks = max(1, int(span / (step * MAX_POINTS_PER_QUERY)) + 1)
    replays: dict[tuple[tuple[str, str], ...], Replay] = {}
    endpoint = url.rstrip("/") + "/api/v1/query_range"
    done = 0
    while start <= end:
        stop = min(end, start + step * (MAX_POINTS_PER_QUERY - 1))
        for labels, points in _query(endpoint, url, query, start, stop, step):
            replay = replays.setdefault(tuple(sorted(labels.items())), Replay(labels, params, capacity))
            replay.feed(p for p in points if replay.last is None or p[0] > replay.last)
        done += 1
        if progress is not None:
            progress.chunks(done, chunks)
        start = stop + step
    if not replays:
        raise InputError(f"{url}: the query returned no samples over the last {span:g}s")
    return list(replays.values())


def _query(endpoint: str, url: str, query: str, start: float, stop: float,
           step: float) -> list[tuple[dict[str, str], Iterator[Point]]]:
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
    return results(document, url)


class Progress:
    """A progress line on stderr, rewritten in place at most every PROGRESS_EVERY_S; nothing when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._samples = 0
        self._shown = 0.0
        self._width = 0
        self._where = ""

    def count(self, points: Iterable[Point]) -> Iterator[Point]:
        """``points``, counted as they pass."""
        if not self.enabled:
            yield from points
            return
        for number, point in enumerate(points, start=1):
            if number % 4096 == 0:
                self._samples += 4096
                self._show()
            yield point

    def bytes(self, done: int, total: int) -> None:
        """How much of a file is read."""
        if self.enabled and total > 0:
            self._where = f"{100 * done / total:3.0f}% of {total / 1e6:.1f} MB"

    def chunks(self, done: int, total: int) -> None:
        """How many query chunks are in."""
        if self.enabled:
            self._where = f"query {done}/{total}"
            self._show(force=True)

    def _show(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < PROGRESS_EVERY_S:
            return
        self._shown = now
        line = f"analyze: {self._where}{', ' if self._where else ''}{self._samples:,} samples"
        sys.stderr.write("\r" + line.ljust(self._width))
        sys.stderr.flush()
        self._width = len(line)

    def done(self) -> None:
        """Erase the line."""
        if self.enabled and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
            self._width = 0


def _bytes(value: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
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
    """The readable table: one line per series, a note per series with too little data or readings too sparse for
    the fast check."""
    rows = [("SERIES", "VERDICT", "FIRST ALERT (UTC)", "GROWTH", "EXHAUSTED IN")]
    for r in results:
        alert = r["first_alert_at"]
        rows.append((
            describe(r["labels"]), r["verdict"],
            "-" if alert is None else datetime.fromtimestamp(alert, timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "-" if r["verdict"] == "insufficient" else f"{_bytes(r['slope_bytes_per_second'] * 3600)}/h",
            _eta(r["exhaustion_eta_seconds"]),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    notes = [f"{describe(r['labels'])}: insufficient: {r['reason']}" for r in results if r["verdict"] == "insufficient"]
    notes += [f"{describe(r['labels'])}: note: {r['note']}" for r in results if r["note"]]
    leaks = sum(r["verdict"] == "leak" for r in results)
    lines += ["", *notes] if notes else [""]
    lines.append(f"{leaks} of {len(results)} series leaking" if leaks else f"no leak in {len(results)} series")
    return "\n".join(lines)
