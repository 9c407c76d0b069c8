"""The runbooks tpuwatch ships, one per alert name, and the pages the endpoint serves them as (/runbooks/NAME).

They are the ``### NAME`` entries under ``## Runbooks`` in docs/alerting.md, which the package carries as
``tpuwatch/alerting/runbooks.md`` (a link to that file in the source tree, a copy in the wheel and the .deb),
so every install serves the runbooks of its own version.  Parsing and rendering are pure; ``shipped()`` reads
the packaged file once.
"""

from __future__ import annotations

import functools
import html
import re
from importlib import resources

from tpuwatch import __version__
from tpuwatch.httpd.protocol import Response

PREFIX = "/runbooks/"
# Pages of text and links: nothing to load, run or submit, and no address of the daemon told to where a link leads.
HEADERS = (("Content-Security-Policy", "default-src 'none'; base-uri 'none'; form-action 'none'; "
                                       "frame-ancestors 'none'"),
           ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"))
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INLINE_RE = re.compile(r"`([^`]*)`|\[([^\]]+)\]\(([^)\s]+)\)")
_NOT_FOUND = Response(404, b"404 Not Found: no runbook of that name (the list: /runbooks/)\n")


def parse(markdown: str) -> dict[str, str]:
    """Alert name -> the Markdown of its entry, from the ``### NAME`` entries under ``## Runbooks``."""
    found: dict[str, str] = {}
    name = None
    inside = False
    for line in markdown.splitlines():
        if line.startswith("## "):
            inside, name = line[3:].strip() == "Runbooks", None
        elif inside and line.startswith("### "):
            title = line[4:].strip()
            name = title if _NAME_RE.fullmatch(title) else None
            if name is not None:
                found[name] = ""
        elif name is not None:
            found[name] += line + "\n"
    return {key: text.strip() for key, text in found.items()}


@functools.cache
def shipped() -> dict[str, str]:
    """The runbooks in this package, by alert name."""
    return parse(resources.files("tpuwatch.alerting").joinpath("runbooks.md").read_text(encoding="utf-8"))


def _inline(text: str, names: dict[str, str]) -> str:
    """One paragraph's Markdown as HTML: code spans, and links to another runbook or to the web kept as links."""
    out, at = [], 0
    for match in _INLINE_RE.finditer(text):
        out.append(html.escape(text[at:match.start()]))
        at = match.end()
        code, label, target = match.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
            continue
        other = names.get(target.rpartition("#")[2].lower()) if target.startswith(("alerting.md#", "#")) else None
        href = other or (target if target.startswith(("https://", "http://")) else None)
        out.append(f'<a href="{html.escape(href)}">{_inline(label, names)}</a>' if href else _inline(label, names))
    out.append(html.escape(text[at:]))
    return "".join(out)


def _html(title: str, body: list[str]) -> bytes:
    return "\n".join([
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title></head><body>", *body,
        f'<p><small>tpuwatch {html.escape(__version__)} &middot; <a href="./">all runbooks</a></small></p>',
        "</body></html>", ""]).encode()


def page(name: str, runbooks: dict[str, str]) -> bytes:
    """The HTML page of one runbook (``name`` must be one of ``runbooks``)."""
    names = {key.lower(): key for key in runbooks}
    body = [f"<h1>{html.escape(name)}</h1>"]
    for block in re.split(r"\n\s*\n", runbooks[name]):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("- ") and all(line.startswith(("- ", "  ")) for line in lines):
            items = re.split(r"\n- ", "\n" + "\n".join(lines))[1:]
            body.append("<ul>" + "".join(f"<li>{_inline(' '.join(i.split()), names)}</li>" for i in items) + "</ul>")
        elif lines:
            body.append(f"<p>{_inline(' '.join(' '.join(lines).split()), names)}</p>")
    return _html(f"{name} - tpuwatch runbook", body)


def index(runbooks: dict[str, str]) -> bytes:
    """The HTML list of every runbook."""
    items = "".join(f'<li><a href="{html.escape(name)}">{html.escape(name)}</a></li>' for name in sorted(runbooks))
    return _html("tpuwatch runbooks", ["<h1>Runbooks</h1>", f"<ul>{items}</ul>"])


def answer(path: str) -> Response:
    """What ``GET path`` answers, for a path under PREFIX: a shipped runbook's page, the list, or 404."""
    runbooks = shipped()
    name = path[len(PREFIX):]
    if name == "":
        return Response(200, index(runbooks), "text/html; charset=utf-8", HEADERS)
    if name not in runbooks:
        return _NOT_FOUND
    return Response(200, page(name, runbooks), "text/html; charset=utf-8", HEADERS)
