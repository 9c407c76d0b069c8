"""The status page's HTML and SVG, and `tpuwatch top`'s text, rendered from status documents.

The page must work under its Content-Security-Policy (no inline script, style or handler, nothing loaded from
elsewhere) and escape every text it shows; the plots carry their points.  The browser tests
(test_status_page.py) check the same in Chromium.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest

from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.views.lines import frame, plain, sparkline
from tpuwatch.views.render import render_page

from statusdoc import ECC_ALERT, T0, SimHost


class Elements(HTMLParser):
    """Every start tag with its attributes, and whether the document parsed to its end."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Elements()
    parser.feed(html)
    parser.close()
    return parser.tags


@pytest.fixture(scope="module")
def leaking() -> SimHost:
    return SimHost("hbm-leak", fault_device=2)


def test_the_page_loads_nothing_inline_and_nothing_from_elsewhere(leaking: SimHost) -> None:
    html = render_page(leaking.document())
    tags = elements(html)
    assert [(t, a.get("src")) for t, a in tags if t == "script"] == [("script", "/status.js")]
    assert [a.get("href") for t, a in tags if t == "link"] == ["/status.css"]
    assert not any("style" in a or any(name.startswith("on") for name in a) for _, a in tags)
    assert not any(t in ("style", "img", "iframe", "object", "embed", "form") for t, _ in tags)
    for _, attrs in tags:
        for name in ("href", "src"):
            assert attrs.get(name) is None or attrs[name].startswith(("/", "#")), attrs
    assert len(html.encode()) < 300_000


def test_every_text_is_escaped(leaking: SimHost) -> None:
    hostile = "<script>alert(1)</script>\" onmouseover=\"x"
    event = KernelEvent("nvidia_xid_devastating", "critical", hostile, "0000:12:00.0", "2", time=T0)
    alert = {**ECC_ALERT, "annotations": {"summary": hostile}}
    html = render_page(leaking.document(kernel_events=lambda: [event], alerts=lambda: [alert]))
    assert hostile not in html and "&lt;script&gt;alert(1)&lt;/script&gt;&quot; onmouseover=&quot;x" in html
    assert html.count("<script") == 1


def test_one_row_per_chip_the_faulty_one_marked_and_three_plots_each(leaking: SimHost) -> None:
    tags = elements(render_page(leaking.document()))
    rows = [(a["data-device"], a["data-verdict"]) for t, a in tags if t == "tr" and "data-verdict" in a]
    assert rows == [("0", "ok"), ("1", "ok"), ("2", "critical"), ("3", "ok")]
    plots = [(a["data-series"], int(a["data-points"] or 0)) for t, a in tags if t == "svg" and a.get("class") == "plot"]
    assert len(plots) == 12 and all(points > 100 for _, points in plots)
    assert [series for series, _ in plots[:3]] == ["memory", "utilization", "temperature"]
    articles = [a["data-device"] for t, a in tags if t == "article"]
    assert articles[0] == "2"  # the faulty chip's plots first


def test_the_forecast_is_drawn_only_for_the_leaking_chip(leaking: SimHost) -> None:
    html = render_page(leaking.document())
    articles = re.findall(r'<article class="chip-detail [^"]*" id="chip-(\d+)".*?</article>', html, re.S)
    forecasts = {device for device in articles
                 if 'class="s-forecast"' in html.split(f'id="chip-{device}"', 1)[1].split("</article>", 1)[0]}
    assert forecasts == {"2"}
    section = html.split('id="chip-2"', 1)[1].split("</article>", 1)[0]
    assert 'class="s-floor"' in section and "full in " in section and "MiB/h" in section


def test_a_host_without_chips_or_history_says_so() -> None:
    from tpuwatch.views.document import build_status
    from tpuwatch.views.readers import StatusReaders

    doc = build_status(StatusReaders(current=list, history=lambda n, labels: [], readings=list,
                                     window=lambda: 3600.0, health=lambda: None), T0, "bare")
    html = render_page(doc)
    assert "no accelerator found" in html and "no firing or pending alert" in html
    assert "no accelerator found" in plain(frame(doc, "from the daemon", 10.0, True, None))


def test_top_shows_the_table_the_verdicts_and_their_reasons(leaking: SimHost) -> None:
    doc = leaking.document(alerts=lambda: [ECC_ALERT])
    text = plain(frame(doc, "from the daemon at http://127.0.0.1:9847", 10.0, True, None))
    lines = text.splitlines()
    assert lines[0].startswith("tpuwatch top · host-a · from the daemon at http://127.0.0.1:9847 · every 10s")
    assert lines[1].startswith("4 chip(s): 2 critical · 0 warning · 2 ok · alerts: 1 firing, 0 pending")
    header = next(line for line in lines if line.startswith("DEV"))
    assert header.split()[:6] == ["DEV", "HEALTH", "MEM", "TEMP", "ECC", "CE/UE"]  # what matters first
    assert header.split()[6:] == ["UTIL", "POWER", "CHIP", "UP", "MEMORY", "(1h)", "UTILIZATION", "(1h)", "PROVEN",
                                  "RIGHT", "PCI", "HELD", "BY"]  # without a width, every column
    rows = {line.split()[0]: line for line in lines if re.match(r"^\d +(ok|CRITICAL|WARNING) ", line)}
    assert set(rows) == {"0", "1", "2", "3"}
    assert rows["2"].split()[1] == "CRITICAL" and rows["1"].split()[1] == "CRITICAL" and rows["0"].split()[1] == "ok"
    assert "      └ AcceleratorEccUncorrectable: Uncorrectable ECC error(s) on device 1" in lines
    assert any(line.startswith("      └ memory leak suspected: +") for line in lines)
    assert "\x1b" not in text
    styled = frame(doc, "x", 10.0, True, None)
    assert ("CRITICAL", "critical") in [(chunk.strip(), style) for row in styled for chunk, style in row]


def test_sparklines_scale_from_lowest_to_highest_and_leave_gaps_blank() -> None:
    points: list[Any] = [[float(t), t / 100] for t in range(0, 50)] + [[float(t), 1.0] for t in range(80, 100)]
    line = sparkline(points, 0.0, 100.0, True, width=10)
    assert len(line) == 10 and line[0] == "▁" and line[5:8] == "   " and line[-1] == "█"
    assert sparkline(points, 0.0, 100.0, False, width=10)[-1] == "@"
    assert sparkline([], 0.0, 1.0, True, width=4) == "    "


def test_the_alert_table_links_each_alert_to_its_runbook(leaking: SimHost) -> None:
    own = {**ECC_ALERT, "annotations": {"summary": "s", "runbook_url":
                                        "http://gpu-7:9847/runbooks/AcceleratorEccUncorrectable"}}
    wiki = {**ECC_ALERT, "labels": {**ECC_ALERT["labels"], "alertname": "SiteRule"},
            "annotations": {"summary": "s", "runbook_url": "https://wiki.example/SiteRule"}}
    bare = {**ECC_ALERT, "labels": {**ECC_ALERT["labels"], "alertname": "AcceleratorLost"}, "annotations": {}}
    none = {**ECC_ALERT, "labels": {**ECC_ALERT["labels"], "alertname": "SiteRuleWithout"}, "annotations": {}}
    html = render_page(leaking.document(alerts=lambda: [own, wiki, bare, none]))
    table = html.split('<section id="alerts">', 1)[1].split("</section>", 1)[0]
    assert "<th>Runbook</th>" in table
    links = [a["href"] for t, a in elements(table) if t == "a" and a.get("href") != "/api/alerts"]
    # The daemon's own runbooks by a relative link (the page may be reached through a tunnel, by another name);
    # a rule's own runbook_url as it is; none where there is none.
    assert links == ["/runbooks/AcceleratorEccUncorrectable", "https://wiki.example/SiteRule",
                     "/runbooks/AcceleratorLost"]
    assert table.count("<tr class=") == 4


@pytest.mark.parametrize("width", [80, 100, 120])
def test_top_in_a_narrow_terminal_keeps_state_memory_temperature_and_ecc_and_wider_adds_the_rest(
        leaking: SimHost, width: int) -> None:
    doc = leaking.document(alerts=lambda: [ECC_ALERT])
    full = plain(frame(doc, "x", 10.0, True, None)).splitlines()
    lines = plain(frame(doc, "x", 10.0, True, None, width - 1)).splitlines()
    header = next(line for line in lines if line.startswith("DEV"))
    table = [header, *(line for line in lines if re.match(r"^\d +(ok|CRITICAL|WARNING) ", line))]
    assert len(table) == 5 and all(len(line) <= width - 1 for line in table), table
    assert header.startswith("DEV  HEALTH") and "MEM" in header and "TEMP" in header and "ECC CE/UE" in header
    for line in table[1:]:  # every chip: its state, memory ("GiB"), temperature ("°C") and ECC counts
        assert "GiB" in line and "°C" in line and re.search(r"\d+/\d+", line), line
    full_header = next(line for line in full if line.startswith("DEV"))
    assert full_header.startswith(header.rstrip()) and len(full_header) > width  # wider shows more of the same
    if width >= 100:
        assert "UTIL" in header and "POWER" in header


def test_the_hung_drills_holder_is_in_the_held_by_column_as_in_its_row() -> None:
    doc = SimHost("hung", fault_device=1).document()
    assert [chip["holders"] for chip in doc["chips"]] == [[f"{4100 + d} (python3)"] for d in range(4)]
    lines = plain(frame(doc, "x", 10.0, True, None)).splitlines()
    rows = {line.split()[0]: line for line in lines if re.match(r"^\d +(ok|CRITICAL|WARNING) ", line)}
    assert all(rows[str(d)].rstrip().endswith(f"{4100 + d} (python3)") for d in range(4)), rows
