"""The status page: HTML with inline SVG plots, rendered from the status document; every text escaped.

The page loads only ``/status.css`` and ``/status.js`` from the daemon itself, so that its Content-Security-Policy
can forbid everything else (tpuwatch.views.page).  ``<main id="status">`` is what the script swaps in place.
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import urlsplit

from tpuwatch.alerting import runbooks
from tpuwatch.health import TEMPERATURE_LIMIT_C
from tpuwatch.units import (
    GIB,
    PATH_WORDS,
    celsius,
    clock,
    duration,
    gib,
    gib_of,
    growth,
    latency,
    number,
    percent,
    reading_texts,
)
from tpuwatch.views.svg import Plot, bars

_COLUMNS = ("Chip", "Kind", "PCI", "Up", "Health", "Memory", "Util", "Temp", "Power", "ECC CE/UE", "Held by")


def _e(value: Any) -> str:
    return escape("-" if value is None else str(value))


def _badge(status: str | None) -> str:
    status = status or "unknown"
    return f'<span class="badge v-{_e(status)}">{_e(status)}</span>'


def render_page(doc: dict[str, Any]) -> str:
    """The whole page for ``doc`` (tpuwatch.views.document.build_status)."""
    counts = doc["counts"]
    title = f"tpuwatch: {doc['host']}: " + (
        ", ".join([*(f"{counts[level]} {level}" for level in ("critical", "warning") if counts[level]),
                   *(f"drill {d['scenario']} cannot run" for d in doc["drills"])]) or "ok")
    refresh = max(2.0, float(doc["interval_seconds"]))
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{_e(title)}</title><link rel="stylesheet" href="/status.css">'
            '<script src="/status.js" defer></script></head>\n'
            f'<body data-refresh="{refresh:g}"><p id="stale" hidden></p>\n{render_main(doc)}\n</body></html>\n')


def render_main(doc: dict[str, Any]) -> str:
    """``<main id="status">``: everything that changes from one cycle to the next."""
    parts = [_header(doc), _chips(doc), _alerts(doc), _details(doc), _kernel(doc), _host(doc), _monitor(doc)]
    return (f'<main id="status" data-generated="{doc["generated_at"]}" data-status="{_e(doc["status"])}">'
            + "\n".join(parts) + "</main>")


def _header(doc: dict[str, Any]) -> str:
    counts = doc["counts"]
    summary = " · ".join(f"{counts[level]} {level}" for level in ("critical", "warning", "ok"))
    links = " · ".join(f'<a href="{path}">{path}</a>' for path in
                       ("/metrics", "/healthz", "/api/status", "/api/series", "/api/alerts"))
    return (f'<header><h1>tpuwatch on {_e(doc["host"])}</h1>'
            f'<p class="summary v-{_e(doc["status"])}">{counts["chips"]} chip(s): {summary}</p>{_drills(doc)}'
            f'<p class="meta">updated {clock(doc["generated_at"])}, every {duration(doc["interval_seconds"])} · '
            f'tpuwatch {_e(doc["tpuwatch"])} · {links}</p></header>')


def _chips(doc: dict[str, Any]) -> str:
    if not doc["chips"]:
        return '<section id="chips"><h2>Chips</h2><p class="muted">no accelerator found</p></section>'
    head = "".join(f"<th>{_e(c)}</th>" for c in _COLUMNS)
    rows = []
    for chip in doc["chips"]:
        r, verdict = chip["reading"], chip["verdict"]
        reason = verdict["reasons"][0]["text"] if verdict["reasons"] and verdict["status"] != "ok" else ""
        texts = reading_texts(r)
        holders = "-" if chip["holders"] is None else ", ".join(chip["holders"]) or "none"
        cells = (f'<a href="#chip-{_e(chip["device"])}">{_e(chip["device"])}</a>', _e(chip["chip"]),
                 _e(chip["pci"]), "yes" if chip["up"] else "<strong>NO</strong>",
                 f'{_badge(verdict["status"])} <span class="reason">{_e(reason)}</span>',
                 texts["memory"], texts["utilization"], texts["temperature"], texts["power"], texts["ecc"],
                 _e(holders))
        tds = "".join(f'<td data-label="{_e(c)}">{cell}</td>' for c, cell in zip(_COLUMNS, cells, strict=True))
        rows.append(f'<tr class="chip v-{_e(verdict["status"])}" id="row-{_e(chip["device"])}" '
                    f'data-device="{_e(chip["device"])}" data-verdict="{_e(verdict["status"])}">{tds}</tr>')
    return (f'<section id="chips"><h2>Chips</h2><table class="chips"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></section>')


def _alerts(doc: dict[str, Any]) -> str:
    alerts = doc["alerts"]
    if not alerts:
        return '<section id="alerts"><h2>Alerts</h2><p class="muted">no firing or pending alert</p></section>'
    rows = []
    for a in alerts:
        labels = a.get("labels", {})
        state = a.get("state", "") + (" (inhibited)" if a.get("inhibited") else "")
        rows.append(f'<tr class="a-{_e(a.get("state"))} s-{_e(labels.get("severity"))}"><td>{_e(state)}</td>'
                    f'<td>{_e(labels.get("severity"))}</td><td>{_e(labels.get("alertname"))}</td>'
                    f'<td>{_e(labels.get("device"))}</td><td>{_e(a.get("startsAt") or a.get("activeAt"))}</td>'
                    f'<td>{_e(a.get("annotations", {}).get("summary", ""))}</td><td>{_runbook_link(a)}</td></tr>')
    more = (f'<p class="muted">and {doc["alerts_total"] - len(alerts)} more (<a href="/api/alerts">/api/alerts</a>)'
            '</p>' if doc["alerts_total"] > len(alerts) else "")
    return ('<section id="alerts"><h2>Alerts</h2><div class="scroll"><table><thead><tr><th>State</th>'
            '<th>Severity</th><th>Alert</th><th>Chip</th><th>Since</th><th>Summary</th><th>Runbook</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>{more}</section>')


def _runbook_link(alert: dict[str, Any]) -> str:
    """The alert's runbook as a link: this daemon's own page by a relative link where the alert points at one it
    serves (the page may be reached by another name than the one in the link, through a tunnel say), else the
    rule's ``runbook_url`` as it is; "-" without one."""
    name = alert.get("labels", {}).get("alertname", "")
    url = alert.get("annotations", {}).get("runbook_url", "")
    served = name in runbooks.shipped()
    if served and (not url or urlsplit(url).path == runbooks.PREFIX + name):
        href = runbooks.PREFIX + name
    elif url.startswith(("http://", "https://", "file:///")):
        href = url
    else:
        return "-"
    return f'<a href="{_e(href)}">runbook</a>'


def _details(doc: dict[str, Any]) -> str:
    order = {"critical": 0, "warning": 1, "ok": 2}
    chips = sorted(doc["chips"], key=lambda c: order.get(c["verdict"]["status"], 3))  # the faulty ones first
    return '<section id="details"><h2>Per chip</h2>' + "".join(_detail(doc, c) for c in chips) + "</section>"


def _detail(doc: dict[str, Any], chip: dict[str, Any]) -> str:
    verdict = chip["verdict"]
    reasons = "".join(f'<li class="r-{_e(r["severity"])}"><span class="src">{_e(r["source"])}</span> '
                      f'{_e(r["text"])}</li>' for r in verdict["reasons"])
    device = _e(chip["device"])
    return (f'<article class="chip-detail v-{_e(verdict["status"])}" id="chip-{device}" data-device="{device}">'
            f'<h3>Chip {device} · {_e(chip["chip"])} · {_e(chip["pci"])} {_badge(verdict["status"])}</h3>'
            f'{f"<ul class=reasons>{reasons}</ul>" if reasons else ""}'
            f'<div class="plots">{_memory_plot(doc, chip)}{_ratio_plot(doc, chip)}{_temperature_plot(doc, chip)}'
            f'</div>{_canary(chip) if doc["canary_runs"] else ""}</article>')


def _span(doc: dict[str, Any]) -> tuple[float, float, float]:
    """Plot start, end (now) and the gap beyond which a line breaks (a few intervals, or a few buckets)."""
    now, window = doc["generated_at"], doc["window_seconds"]
    return now - window, now, max(3 * doc["interval_seconds"], 3 * window / 120)


def _figure(caption: str, svg: str) -> str:
    return f"<figure><figcaption>{_e(caption)}</figcaption>{svg}</figure>"


def _ago(doc: dict[str, Any]) -> tuple[str, str]:
    return f"-{duration(doc['window_seconds'])}", "now"


def _memory_plot(doc: dict[str, Any], chip: dict[str, Any]) -> str:
    start, now, gap = _span(doc)
    points, leak = chip["series"]["memory_used_bytes"], chip["leak"]
    capacity = chip["reading"]["memory_total_bytes"] or (leak or {}).get("capacity_bytes")
    forecast = leak["forecast"] if leak else None
    end = now
    if forecast:  # room on the right for the forecast: up to where it meets the capacity, at most half a window
        end = min(forecast[1][0], now + doc["window_seconds"] / 2) if forecast[1][0] > now else now
    top = capacity or max((v for _, v in points), default=GIB) * 1.1
    plot = Plot("memory", f"chip {chip['device']} memory in use", start, end, 0.0, top)
    if capacity:
        plot.hline(capacity, "cap", f"capacity {gib(capacity)}")
    plot.line(points, "s-mem", gap)
    if leak and leak["floor"]:
        plot.line(leak["floor"], "s-floor", max(gap, 3 * 60.0))
    if forecast and leak is not None:
        (t0, v0), (t1, v1) = forecast
        edge_t = min(t1, end)
        edge_v = v0 + (v1 - v0) * ((edge_t - t0) / (t1 - t0)) if t1 > t0 else v1
        plot.line([[t0, v0], [edge_t, edge_v]], "s-forecast", float("inf"))
        plot.vline(now, "now", "now")
        plot.corner([f"full in {duration(leak['eta_seconds'])}", growth(leak["slope_bytes_per_second"])], "eta")
    caption = "Memory in use" + (", leak floor and forecast" if forecast else ", leak floor" if leak and leak["floor"]
                                 else "")
    x_end = "now" if end == now else f"+{duration(end - now)}"
    return _figure(caption, plot.svg(lambda v: gib(v, 0), (_ago(doc)[0], x_end)))


def _ratio_plot(doc: dict[str, Any], chip: dict[str, Any]) -> str:
    start, now, gap = _span(doc)
    plot = Plot("utilization", f"chip {chip['device']} utilization", start, now, 0.0, 1.0)
    plot.line(chip["series"]["utilization_ratio"], "s-util", gap)
    return _figure("Utilization", plot.svg(percent, _ago(doc)))


def _temperature_plot(doc: dict[str, Any], chip: dict[str, Any]) -> str:
    start, now, gap = _span(doc)
    points = chip["series"]["temperature_celsius"]
    values = [v for _, v in points]
    lo = min(30.0, min(values, default=30.0) - 2)
    hi = max(TEMPERATURE_LIMIT_C + 5, max(values, default=0.0) + 2)
    plot = Plot("temperature", f"chip {chip['device']} temperature", start, now, lo, hi)
    plot.hline(TEMPERATURE_LIMIT_C, "limit", f"limit {celsius(TEMPERATURE_LIMIT_C, 0)}")
    plot.line(points, "s-temp", gap)
    return _figure("Temperature", plot.svg(lambda v: celsius(v, 0), _ago(doc)))


def _canary(chip: dict[str, Any]) -> str:
    runs = list(reversed(chip["canary"]))  # oldest left
    if not runs:
        return '<div class="canary"><h4>Canary</h4><p class="muted">no canary run kept</p></div>'
    tips = [(r["status"], r["duration_seconds"],
             f"{clock(r['finished_at'])} {r['status']} ({r['path']})"
             + (f", {latency(r['duration_seconds'])}" if r["duration_seconds"] is not None else "")
             + (f", max error {r['max_abs_error']:.2g}" if r["max_abs_error"] is not None else "")
             + (f": {r['reason']}" if r["reason"] else "")) for r in runs]
    last = runs[-1]
    counts = ", ".join(f"{sum(r['status'] == s for r in runs)} {s}" for s in ("pass", "fail", "error", "skipped")
                       if any(r["status"] == s for r in runs))
    proven = ", ".join(f"{PATH_WORDS.get(p, p)} at {clock(at)}" for p, at in sorted((chip.get("proven") or {}).items()))
    return (f'<div class="canary"><h4>Canary: last run {_e(last["status"])} ({_e(PATH_WORDS.get(last["path"], ""))}) '
            f'at {clock(last["finished_at"])} ({counts})</h4>'
            f'<p class="proven">last proven right: {_e(proven or "never")}</p>{bars(tips, max(len(runs), 12))}</div>')


def _drills(doc: dict[str, Any], needs: str | None = None) -> str:
    """The simulated scenarios' fire drills that cannot run (those needing ``needs``), as loud as a warning."""
    return "".join(f'<p class="summary v-warning drill" data-scenario="{_e(d["scenario"])}">{_e(d["text"])}</p>'
                   for d in doc["drills"] if needs in (None, d["needs"]))


def _canary_runs(doc: dict[str, Any]) -> str:
    runs = doc["canary_runs"]
    if not runs and (blocked := _drills(doc, "canary")):
        return blocked
    if not runs:
        return '<p class="muted">canary: no run kept (off, no accelerator, or not run yet)</p>'
    last = runs[0]
    why = f": {_e(last['reason'])}" if last["reason"] else ""
    return (f'<p>canary: last run {_e(last["status"])} at {clock(last["finished_at"])} in '
            f'{latency(last["wall_seconds"])}{why} ({len(runs)} kept)</p>')


def _kernel(doc: dict[str, Any]) -> str:
    events = doc["kernel_events"]
    if not events:
        return '<section id="kernel"><h2>Kernel events</h2><p class="muted">none recently</p></section>'
    rows = "".join(f'<tr class="s-{_e(e["severity"])}"><td>{clock(e.get("time"))}</td><td>{_e(e["severity"])}</td>'
                   f'<td>{_e(e["rule"])}</td><td>{_e(e.get("device"))}</td><td>{_e(e.get("pci"))}</td>'
                   f'<td>{_e(e.get("count", 1))}</td><td class="msg">{_e(e["message"])}</td></tr>' for e in events)
    return ('<section id="kernel"><h2>Kernel events</h2><div class="scroll"><table><thead><tr><th>Time</th>'
            '<th>Severity</th><th>Rule</th><th>Chip</th><th>PCI</th><th>Count</th><th>Message</th></tr></thead>'
            f'<tbody>{rows}</tbody></table></div></section>')


def _host(doc: dict[str, Any]) -> str:
    h = doc["host_resources"]
    total, available = h["memory_total_bytes"], h["memory_available_bytes"]
    used = total - available if total is not None and available is not None else None
    leak = " · <strong>memory leak suspected</strong>" if h["memory_leak_suspected"] else ""
    holders = "".join(f"<li>pid {_e(p['pid'])} ({_e(p['command'])}): {gib(p['resident_memory_bytes'], 2)} "
                      f"resident, {_e(', '.join(p['device_files']) or '-')}</li>" for p in h["holders"])
    notices = "".join(f"<p class=warnings><strong>{_e(n['headline'])}</strong>: {_e(n['text'])}</p>"
                      for n in h["notices"])
    return (f'<section id="host"><h2>Host</h2><p>memory {gib_of(used, total)} in use '
            f'({gib(available)} available) · CPU {percent(h["cpu_utilization_ratio"])}{leak}</p>{notices}'
            f'{f"<ul>{holders}</ul>" if holders else ""}</section>')


def _monitor(doc: dict[str, Any]) -> str:
    m = doc["monitor"]
    state = m["state"] or {}
    writable = {True: "yes", False: "<strong>NO</strong>", None: "-"}[state.get("writable")]
    warnings = "".join(f"<li>{_e(w)}</li>" for w in m["warnings"])
    collectors = "".join(f'<tr class="c-{_e(c["status"])}"><td>{_e(c["collector"])}</td><td>{_e(c["status"])}</td>'
                         f'<td>{latency(c["duration_seconds"])}</td>'
                         f'<td>{_e(c["error"] or c["degraded"] or "")}</td></tr>' for c in m["collectors"])
    queue = "".join(f'<tr><td>{_e(q["receiver"])}</td><td>{number(q.get("queued"), 0)}</td>'
                    f'<td>{duration(q.get("oldest_age_seconds"))}</td>'
                    f'<td>{"open" if q.get("circuit_open") else "closed"}</td></tr>' for q in m["notifications"])
    queue_table = ('<div class="scroll"><table><thead><tr><th>Receiver</th><th>Queued</th><th>Oldest</th>'
                   f'<th>Circuit</th></tr></thead><tbody>{queue}</tbody></table></div>' if queue else
                   '<p class="muted">no receiver configured</p>')
    return (f'<section id="monitor"><h2>Monitor</h2><p>{_badge(m["status"])} last cycle '
            f'{duration(m["last_cycle_age_seconds"])} ago · state writable {writable} '
            f'({_e(state.get("dir"))}, alert state in {_e(state.get("alerting_db"))}) · '
            f'up {duration(m["uptime_seconds"])}'
            f'</p>{f"<ul class=warnings>{warnings}</ul>" if warnings else ""}{_canary_runs(doc)}'
            '<div class="scroll"><table><thead><tr><th>Collector</th><th>Status</th><th>Last run</th><th>Error</th>'
            f'</tr></thead><tbody>{collectors}</tbody></table></div><h4>Notification queue</h4>{queue_table}</section>')
