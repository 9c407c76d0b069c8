"""A real HTTP receiver on 127.0.0.1 for alert deliveries: records POSTs, or answers 500 or 400, hangs,
drops the connection, or echoes what it was sent (as careless error pages and login redirects do), switchable
live."""

from __future__ import annotations

import base64
import html
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Mode = Literal["record", "error", "reject", "hang", "drop", "echo"]
# How an echoing receiver writes back what it was sent.
ECHO_FORMS = {
    "raw": lambda text: text,
    "url": lambda text: urllib.parse.quote(text, safe=""),
    "url-lower": lambda text: urllib.parse.quote(text, safe="").lower(),
    "form": urllib.parse.quote_plus,
    "json": lambda text: json.dumps(text)[1:-1],
    "json-ascii": lambda text: "".join(f"\\u{ord(c):04x}" for c in text),
    "json-slashes": lambda text: json.dumps(text)[1:-1].replace("/", "\\/"),
    "html": lambda text: html.escape(text),
    "html-numeric": lambda text: "".join(f"&#{ord(c)};" for c in text),
}


class Receiver:
    """An HTTP server that records POSTs, answers 500 or 400, hangs, or drops the connection, switchable live."""

    def __init__(self, mode: Mode = "record") -> None:
        self.mode: Mode = mode
        self.requests: list[dict[str, Any]] = []
        self.attempts = 0
        self.release = threading.Event()
        self.echo_status = 500
        self.echo_form = "raw"
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.attempts += 1
                mode = receiver.mode
                if mode == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if mode == "hang":
                    receiver.release.wait(30)
                    return
                if mode == "echo":
                    self._echo(body)
                    return
                if mode in ("error", "reject"):
                    self.send_response(500 if mode == "error" else 400)
                    self.end_headers()
                    self.wfile.write(b"upstream broken" if mode == "error" else b'{"error":"bad event"}')
                    return
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                          "at": time.time()})
                self.send_response(202 if "enqueue" in self.path else 200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"status":"success"}')

            def _echo(self, body: bytes) -> None:
                """Answer ``echo_status`` repeating the path, the credentials (decoded too) and any routing key, in
                ``echo_form``, in the body and (for a redirect) in the Location header."""
                sent = json.loads(body) if body.startswith(b"{") else {}
                said = " ".join([self.path, self.headers.get("Authorization", ""), self.headers.get("X-Api-Key", ""),
                                 str(sent.get("routing_key", ""))])
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    said += " " + base64.b64decode(auth[6:]).decode(errors="replace")
                text = ECHO_FORMS[receiver.echo_form](said)
                self.send_response(receiver.echo_status)
                if 300 <= receiver.echo_status < 400:
                    self.send_header("Location", f"https://login.example/?next={text}")
                self.end_headers()
                self.wfile.write(f"denied: {text}".encode())

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def json(self) -> list[Any]:
        return [json.loads(r["body"]) for r in self.requests]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
