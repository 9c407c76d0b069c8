"""A real HTTP receiver on 127.0.0.1 for alert deliveries: records POSTs, or answers 500 or 400, hangs,
or drops the connection, switchable live."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Mode = Literal["record", "error", "reject", "hang", "drop"]


class Receiver:
    """An HTTP server that records POSTs, answers 500 or 400, hangs, or drops the connection, switchable live."""

    def __init__(self, mode: Mode = "record") -> None:
        self.mode: Mode = mode
        self.requests: list[dict[str, Any]] = []
        self.attempts = 0
        self.release = threading.Event()
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
