"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` carries the protocol's JSON messages, each ended by a NUL byte, on file descriptors
3 (to the browser) and 4 (from it): no debugging port is opened, and no client library is needed.  Each page
records every network request it makes (``Network.requestWillBeSent``) and every console or security message
(``Log.entryAdded``), and answers basic auth challenges with the credentials it was given (``Fetch.authRequired``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Without the background-networking flags Chromium's own connections (updates, field trials, safe browsing) are
# attempted, and refused by a closed network; with them the page's requests are the only ones.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")
CALL_TIMEOUT_S = 30.0


class BrowserError(AssertionError):
    """The browser answered a command with an error, died, or did not answer in time."""


class Browser:
    """One headless Chromium with a fresh profile in a temporary directory; ``close()`` ends it."""

    def __init__(self, executable: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="tpuwatch-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def descriptors() -> None:  # in the child, before exec: the pipe's ends on 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self._log = open(Path(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
                                      "about:blank"], pass_fds=(3, 4), preexec_fn=descriptors,
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._lock = threading.Condition()
        self._next_id = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="chromium-pipe", daemon=True)
        self._reader.start()
        self.version = self.call("Browser.getVersion")["product"]

    # --- the protocol ---------------------------------------------------------

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._closed = True
                    self._lock.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                handler = self._handlers.get(f"{message.get('sessionId')}:{message.get('method')}")
                if handler is not None:
                    handler(message)
                with self._lock:
                    if "id" in message:
                        self._answers[message["id"]] = message
                    else:
                        self._events.append(message)
                    self._lock.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        """Send a command without waiting for its answer; its id."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return ident

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        """Send a command and return its result; BrowserError on an error answer."""
        ident = self.send(method, params, session)
        with self._lock:
            if not self._lock.wait_for(lambda: ident in self._answers or self._closed, timeout):
                raise BrowserError(f"{method}: no answer within {timeout:g}s")
            if ident not in self._answers:
                raise BrowserError(f"{method}: the browser exited ({self.log_tail()})")
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def wait_event(self, method: str, session: str, after: int = 0, timeout: float = CALL_TIMEOUT_S,
                   match: Callable[[dict[str, Any]], bool] = lambda params: True) -> dict[str, Any]:
        """The first event ``method`` of ``session`` at index ``after`` or later whose params ``match``."""
        def found() -> dict[str, Any] | None:
            return next((e for e in self._events[after:] if e.get("sessionId") == session
                         and e.get("method") == method and match(e.get("params", {}))), None)

        with self._lock:
            if not self._lock.wait_for(lambda: found() is not None or self._closed, timeout):
                raise BrowserError(f"no {method} within {timeout:g}s")
            event = found()
        if event is None:
            raise BrowserError(f"the browser exited waiting for {method} ({self.log_tail()})")
        return event["params"]

    def events(self, method: str, session: str) -> list[dict[str, Any]]:
        """Every event ``method`` of ``session`` so far."""
        with self._lock:
            return [e["params"] for e in self._events if e.get("sessionId") == session and e.get("method") == method]

    def event_count(self) -> int:
        """How many events came so far (for ``wait_event(after=...)``)."""
        with self._lock:
            return len(self._events)

    def on(self, session: str, method: str, handler: Callable[[dict[str, Any]], None]) -> None:
        """Call ``handler(message)`` in the reader thread for each event ``method`` of ``session``."""
        self._handlers[f"{session}:{method}"] = handler

    # --- pages ----------------------------------------------------------------

    def page(self, credentials: tuple[str, str] | None = None, width: int = 1280, height: int = 900,
             mobile: bool = False) -> Tab:
        """A new tab, its network and log recorded; ``credentials`` answer basic auth challenges."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self, session)
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        tab.viewport(width, height, mobile)
        if credentials is not None:
            user, password = credentials
            self.on(session, "Fetch.requestPaused", lambda m: self.send(
                "Fetch.continueRequest", {"requestId": m["params"]["requestId"]}, session))
            self.on(session, "Fetch.authRequired", lambda m: self.send("Fetch.continueWithAuth", {
                "requestId": m["params"]["requestId"],
                "authChallengeResponse": {"response": "ProvideCredentials", "username": user, "password": password}},
                session))
            self.call("Fetch.enable", {"handleAuthRequests": True, "patterns": [{"urlPattern": "*"}]}, session)
        return tab

    def log_tail(self) -> str:
        """The last lines Chromium wrote."""
        try:
            return " | ".join(Path(self.profile, "chromium.log").read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return ""

    def close(self) -> None:
        """End the browser (its whole process group: renderers, GPU process) and remove its profile."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


class Tab:
    """One page of the browser, attached in flat mode (commands carry its session id)."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = CALL_TIMEOUT_S
             ) -> dict[str, Any]:
        return self.browser.call(method, params, self.session, timeout)

    def viewport(self, width: int, height: int, mobile: bool = False) -> None:
        """Emulate a screen of ``width`` x ``height`` CSS pixels (a phone's with ``mobile``)."""
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1, "mobile": mobile})

    def navigate(self, url: str, timeout: float = CALL_TIMEOUT_S, refused: bool = False) -> str | None:
        """Load ``url`` and wait for its load event; with ``refused``, return the error instead (a 401 that no
        credentials answered is ``net::ERR_INVALID_AUTH_CREDENTIALS``)."""
        after = self.browser.event_count()
        answer = self.call("Page.navigate", {"url": url})
        error = answer.get("errorText")
        if error and not refused:
            raise BrowserError(f"navigating to {url}: {error}")
        if not error:
            self.browser.wait_event("Page.loadEventFired", self.session, after, timeout)
        return error

    def show_html(self, html: str) -> None:
        """Show ``html`` in the tab without any request (about:blank, its document replaced)."""
        self.navigate("about:blank")
        frame = self.call("Page.getFrameTree")["frameTree"]["frame"]["id"]
        self.call("Page.setDocumentContent", {"frameId": frame, "html": html})

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page (promises awaited)."""
        answer = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression[:60]}...: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait(self, expression: str, timeout: float = CALL_TIMEOUT_S, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout:g}s waiting for {what or expression}")
            time.sleep(0.1)

    def requests(self) -> list[str]:
        """The URL of every request the page made so far (the document, scripts, fetches), in order."""
        return [e["request"]["url"] for e in self.browser.events("Network.requestWillBeSent", self.session)]

    def statuses(self) -> dict[str, list[int]]:
        """The HTTP statuses received so far, per URL."""
        out: dict[str, list[int]] = {}
        for e in self.browser.events("Network.responseReceived", self.session):
            out.setdefault(e["response"]["url"], []).append(e["response"]["status"])
        return out

    def log_entries(self) -> list[dict[str, Any]]:
        """Console and browser messages (CSP violations come as source "security" or "other" with level error)."""
        return [e["entry"] for e in self.browser.events("Log.entryAdded", self.session)]

    def navigations(self) -> int:
        """How many times the main frame navigated (a reload counts)."""
        return sum(1 for e in self.browser.events("Page.frameNavigated", self.session)
                   if "parentId" not in e["frame"])

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (the whole page, or the viewport), written to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}}
        data = self.call("Page.captureScreenshot", params, timeout=60)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
