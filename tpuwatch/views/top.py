"""``tpuwatch top``: the chips live in a terminal, from the running daemon or, when none answers, the hardware.

Each interval the view is redrawn from the status document (tpuwatch.views.document): the daemon's
``/api/status`` and ``/api/series`` when it answers, else one pass of every collector, as ``tpuwatch check``
makes, built into the same document (the first line says which, and why).  On a terminal it is drawn with
curses (stdlib) and quits on q or Ctrl-C, restoring the terminal; otherwise it prints plain text.  Fetching runs
in a thread of its own, so that a slow daemon or driver never delays the keys.
"""

from __future__ import annotations

import argparse
import curses
import io
import locale
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any

import requests

from tpuwatch import logsetup
from tpuwatch.alerting.listing import UNTRUSTED, base_url, daemon_url, not_answering
from tpuwatch.config import Config
from tpuwatch.schema import ConfigError
from tpuwatch.units import duration
from tpuwatch.views import lines as text
from tpuwatch.views.document import build_status
from tpuwatch.views.readers import StatusReaders

FETCH_TIMEOUT_S = 3.0
LOCAL_POINTS = 360
KEY_POLL_MS = 100
_STYLES = {"ok": 1, "warning": 2, "critical": 3}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tpuwatch top``."""
    parser.add_argument("--interval", type=float, metavar="SECONDS",
                        help="refresh period (default: the sampling interval)")
    parser.add_argument("--once", action="store_true", help="print the view once as plain text and exit")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--local", action="store_true", help="read the hardware directly, do not ask the daemon")
    source.add_argument("--url", type=base_url, metavar="URL",
                        help="the daemon's address, like http://127.0.0.1:9847 (default: the config's listen, https "
                             "when its web_config has TLS); when it does not answer, top says so and does not read "
                             "this host's hardware instead")
    parser.add_argument("--user", metavar="NAME", help="basic auth user, for a daemon whose web config has users")
    parser.add_argument("--password-file", metavar="FILE", help="file holding that user's password")
    parser.add_argument("--ca", metavar="FILE", help="CA bundle to verify the daemon's TLS certificate")


class Unreachable(Exception):
    """The daemon named by ``--url`` cannot be asked; the message says why."""


class Feed:
    """Where the view comes from: the daemon when it answers, else a local pass over the hardware; only the daemon
    with ``--url``."""

    def __init__(self, config: Config, args: argparse.Namespace, password: str | None) -> None:
        self.config = config
        self._local_only = args.local
        self._named = args.url is not None
        self._auth = (args.user, password or "") if args.user else None
        self._verify: str | bool = args.ca or True
        self._url = daemon_url(config, args.url)
        self._local: _Local | None = None

    def fetch(self) -> tuple[dict[str, Any], str]:
        """The status document and a line saying where it came from; ``Unreachable`` when the daemon named by
        ``--url`` does not answer."""
        if self._local_only:
            return self._hardware().document(), "reading the hardware directly (--local)"
        try:
            return self._daemon(), f"from the daemon at {self._url}"
        except requests.exceptions.SSLError:
            why = UNTRUSTED
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            why = ("asks for credentials (--user, --password-file)" if status == 401 else f"answered HTTP {status}")
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            why = not_answering(exc)
        if self._named:
            raise Unreachable(f"the daemon at {self._url} {why}")
        return self._hardware().document(), f"reading the hardware directly: the daemon at {self._url} {why}"

    def _daemon(self) -> dict[str, Any]:
        answers = []
        for route in ("/api/status", "/api/series"):
            response = requests.get(self._url + route, timeout=FETCH_TIMEOUT_S, auth=self._auth, verify=self._verify)
            response.raise_for_status()
            answers.append(response.json())
        status, series = answers
        by_device = {chip["device"]: chip for chip in series["chips"]}
        for chip in status["chips"]:
            chip["series"] = by_device.get(chip["device"], {}).get("series", {})
        return status

    def _hardware(self) -> _Local:
        if self._local is None:
            self._local = _Local(self.config)
        return self._local


class _Local:
    """One pass of every collector per refresh, into a store of its own (so that sparklines fill up)."""

    def __init__(self, config: Config) -> None:
        from tpuwatch.registry import build_collectors
        from tpuwatch.sampler import Sampler
        from tpuwatch.store import SeriesStore

        collectors = build_collectors(config, persist=False)
        self.store = SeriesStore(LOCAL_POINTS, config.store.max_series)
        self.sampler = Sampler(collectors.stages(), self.store, config.collector_deadline, collectors.inventory)
        kernel_log = collectors.kernel_log
        self.readers = StatusReaders(
            current=self.store.current, history=self.store.history, readings=collectors.device_readings,
            window=lambda: LOCAL_POINTS * config.interval, health=lambda: None,
            kernel_events=kernel_log.recent_events if kernel_log else list, interval=lambda: config.interval)

    def document(self) -> dict[str, Any]:
        self.sampler.run_once()
        return build_status(self.readers, time.time(), socket.gethostname())


class _Latest:
    """The latest view, handed from the fetching thread to the drawing one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.value: tuple[dict[str, Any], str] | None = None
        self.error: str | None = None

    def fetch_forever(self, feed: Feed, every: float, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                value, error = feed.fetch(), None
            except Unreachable as exc:
                value, error = None, str(exc)
            except Exception as exc:  # noqa: BLE001 - shown in the view; the next refresh tries again
                value, error = None, f"{type(exc).__name__}: {exc}"
            with self.lock:
                self.value, self.error = value or self.value, error
            self.changed.set()
            stop.wait(every)


def run(args: argparse.Namespace, config: Config) -> int:
    """Show the view; 0 when quit (q, Ctrl-C) or, with --once, every chip ok; 1 with --once and a chip not ok or
    the daemon of --url not answering."""
    try:
        password = _password(args.password_file)
        feed = Feed(config, args, password)
    except (ConfigError, RuntimeError, OSError) as exc:
        print(f"tpuwatch: config error: {exc}", file=sys.stderr)
        return 2
    every = args.interval if args.interval and args.interval > 0 else config.interval
    logsetup.configure("error")
    unicode = (sys.stdout.encoding or "").lower().replace("-", "") == "utf8"
    if not unicode and isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="replace")  # "·", "└", "°C" as "?" where the terminal cannot show them
    if args.once:
        try:
            document, where = feed.fetch()
        except Unreachable as exc:
            print(f"tpuwatch: {exc}", file=sys.stderr)
            return 1
        # On a terminal, the columns that fit it (the chip's state, memory, temperature and ECC at least); into a
        # pipe or file, all of them.
        width = shutil.get_terminal_size().columns - 1 if sys.stdout.isatty() else None
        print(text.plain(text.frame(document, where, every, unicode, None, width)))
        return 0 if document["status"] == "ok" else 1
    # Ctrl-C and SIGTERM quit, also where the shell started us with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _quit)
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        return _plain_loop(feed, every, unicode)
    locale.setlocale(locale.LC_ALL, "")
    logging.disable(logging.CRITICAL)  # a log line would scribble over the screen; the view shows what failed
    for name in ("LINES", "COLUMNS"):  # ncurses prefers these to the terminal's own size, also after a resize
        os.environ.pop(name, None)
    try:
        curses.wrapper(_screen, feed, every, unicode)
    except KeyboardInterrupt:
        pass
    return 0


def _password(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read().rstrip("\r\n")


def _quit(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _plain_loop(feed: Feed, every: float, unicode: bool) -> int:
    """Not a terminal: a plain-text view every interval, until interrupted."""
    try:
        while True:
            try:
                document, where = feed.fetch()
                print(text.plain(text.frame(document, where, every, unicode, None)) + "\n", flush=True)
            except Unreachable as exc:
                print(f"tpuwatch top: {exc}; trying again in {duration(every)}", flush=True)
            time.sleep(every)
    except KeyboardInterrupt:
        return 0


def _screen(screen: Any, feed: Feed, every: float, unicode: bool) -> None:
    """The curses loop: redraw when a new view arrives or the terminal is resized; q quits."""
    try:
        curses.curs_set(0)
    except curses.error:
        pass
    if curses.has_colors():
        curses.use_default_colors()
        for name, pair in _STYLES.items():
            curses.init_pair(pair, {"ok": curses.COLOR_GREEN, "warning": curses.COLOR_YELLOW,
                                    "critical": curses.COLOR_RED}[name], -1)
    screen.timeout(KEY_POLL_MS)
    latest, stop = _Latest(), threading.Event()
    threading.Thread(target=latest.fetch_forever, args=(feed, every, stop), name="top-fetch", daemon=True).start()
    try:
        while True:
            if latest.changed.is_set():
                latest.changed.clear()
                _draw(screen, latest, every, unicode)
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return
            if key == curses.KEY_RESIZE:
                _draw(screen, latest, every, unicode)
    finally:
        stop.set()


def _draw(screen: Any, latest: _Latest, every: float, unicode: bool) -> None:
    with latest.lock:
        value, error = latest.value, latest.error
    height, width = screen.getmaxyx()
    screen.erase()
    if value is None:
        rows = [[(f"tpuwatch top: {error or 'reading...'}", "")]]
    else:
        rows = text.frame(value[0], value[1], every, unicode, error, width - 1)
        rows[0].append((" · q quits", "dim"))
    for y, row in enumerate(rows[:height]):
        x = 0
        for chunk, style in row:
            if x >= width - 1:
                break
            attr = curses.color_pair(_STYLES[style]) | curses.A_BOLD if style in _STYLES else (
                curses.A_BOLD if style == "bold" else curses.A_DIM if style == "dim" else 0)
            shown = chunk[:width - 1 - x].encode(screen.encoding, "replace").decode(screen.encoding)
            try:
                screen.addstr(y, x, shown, attr)
            except curses.error:  # the bottom-right cell
                pass
            x += len(chunk)
    screen.refresh()
