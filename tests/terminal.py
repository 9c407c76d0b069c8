"""A real terminal for `tpuwatch top`'s tests: tmux on a server of its own (send-keys, capture-pane), and what it
shows as HTML (its colours kept), for a screenshot in the browser."""

from __future__ import annotations

import os
import re
import subprocess
import time
from html import escape

# SGR colours as xterm's default palette draws them.
_COLOURS = {30: "#000", 31: "#cd0000", 32: "#00a000", 33: "#b08800", 34: "#0000ee", 35: "#cd00cd", 36: "#00a0a0",
            37: "#e5e5e5", 90: "#7f7f7f", 91: "#ff0000", 92: "#00c000", 93: "#c0a000", 94: "#5c5cff",
            95: "#ff00ff", 96: "#00c0c0", 97: "#fff"}
_SGR = re.compile(r"\x1b\[([0-9;]*)m")
_OTHER_ESCAPE = re.compile(r"\x1b[()][0-9A-Za-z]|\x1b\[[0-9;?]*[A-Za-ln-z]")


class Tmux:
    """One tmux server (``-L`` a socket of its own) with one session running ``command`` in a shell."""

    def __init__(self, tmux: str, command: str, width: int = 160, height: int = 40,
                 env: dict[str, str] | None = None) -> None:
        self.tmux = tmux
        self.socket = f"tpuwatch-test-{os.getpid()}-{time.monotonic_ns()}"
        environment = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        self.run("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), *environment, command)

    def run(self, *args: str) -> str:
        """A tmux command on this server; its output."""
        proc = subprocess.run([self.tmux, "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, timeout=30)
        if proc.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def capture(self, colours: bool = False) -> str:
        """What the pane shows now (with its SGR escape sequences if ``colours``)."""
        return self.run("capture-pane", "-p", "-t", "t", *(["-e"] if colours else []))

    def keys(self, *keys: str) -> None:
        """Type ``keys`` as tmux names them ("q", "C-c", "Enter")."""
        self.run("send-keys", "-t", "t", *keys)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        """Poll the pane until it shows ``text``; the pane."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.capture()
            if text in shown:
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {text!r}; the pane shows:\n{shown}")
            time.sleep(0.1)

    def close(self) -> None:
        """End this server (and what runs in it)."""
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def pane_html(captured: str, title: str) -> str:
    """A page that draws a captured pane as a terminal would: monospace, dark, its colours and bold kept."""
    out, colour, bold, dim = [], None, False, False
    for line in captured.rstrip("\n").split("\n"):
        position = 0
        text = _OTHER_ESCAPE.sub("", line)
        for match in [*_SGR.finditer(text), None]:
            chunk = text[position:match.start() if match else len(text)]
            if chunk:
                style = ";".join(filter(None, [f"color:{colour}" if colour else "", "font-weight:bold" if bold else "",
                                               "opacity:0.6" if dim else ""]))
                out.append(f'<span style="{style}">{escape(chunk)}</span>' if style else escape(chunk))
            if match is None:
                break
            position = match.end()
            codes = [int(c) for c in match.group(1).split(";") if c] or [0]
            for code in codes:
                if code == 0:
                    colour, bold, dim = None, False, False
                elif code == 1:
                    bold = True
                elif code == 2:
                    dim = True
                elif code == 22:
                    bold = dim = False
                elif code == 39:
                    colour = None
                elif code in _COLOURS:
                    colour = _COLOURS[code]
        out.append("\n")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + escape(title) + "</title></head>"
            "<body style='margin:0;background:#1e1e1e'><pre style='margin:0;padding:12px;color:#e5e5e5;"
            "font:14px/1.25 \"DejaVu Sans Mono\",monospace'>" + "".join(out) + "</pre></body></html>")
