"""``tpuwatch top``'s view as lines of styled text, pure: the status document in, rows of (text, style) out.

Styles are "ok", "warning", "critical" (the verdict colours), "bold", "dim" and "" (plain).  The chip table
comes first, its columns by what matters first: the chip, its verdict, memory, temperature and ECC (these fit an
80-column terminal), then utilization, power, kind, up, the sparklines, when last proven right, PCI and holder.
Given a width, the table keeps as many columns, in that order, as fit whole; without one, all of them.
"""

from __future__ import annotations

from typing import Any

from tpuwatch.units import clock, duration, gib_of, percent, reading_texts
from tpuwatch.views.series import extent, fraction, means

Row = list[tuple[str, str]]
SPARK_WIDTH = 16
_BLOCKS = "▁▂▃▄▅▆▇█"
_ASCII = "_.-=+*#@"
# By priority: the first five always, the others while they fit.
_HEADER = ("DEV", "HEALTH", "MEM", "TEMP", "ECC CE/UE", "UTIL", "POWER", "CHIP", "UP", "MEMORY", "UTILIZATION",
           "PROVEN RIGHT", "PCI", "HELD BY")
_ALWAYS = 5
_GAP = "  "
MAX_REASONS = 3
MAX_LISTED = 5


def sparkline(points: list[list[float]], start: float, end: float, unicode: bool, width: int = SPARK_WIDTH) -> str:
    """The mean of each of ``width`` spans of [start, end] as a block, from the lowest point read in [start, end]
    (the lowest block) to the highest (the full one), so that a small change on a large value shows; a series that
    does not move is a line of lowest blocks, and a span where nothing was read is a space."""
    glyphs = _BLOCKS if unicode else _ASCII
    lo, hi = extent(points, start, end) or (0.0, 0.0)
    top = len(glyphs) - 1
    return "".join(" " if mean is None else glyphs[min(top, int(fraction(mean, lo, hi) * len(glyphs)))]
                   for mean in means(points, start, end, width))


def frame(doc: dict[str, Any], where: str, every: float, unicode: bool, error: str | None,
          width: int | None = None) -> list[Row]:
    """Every row of the view of ``doc``; ``where`` says where it came from, ``error`` why it is stale; ``width``:
    the columns the chip table may take (None: no limit)."""
    counts = doc["counts"]
    firing = sum(a.get("state") == "firing" for a in doc["alerts"])
    pending = sum(a.get("state") == "pending" for a in doc["alerts"])
    monitor = doc["monitor"]["status"]
    rows: list[Row] = [
        [(f"tpuwatch top · {doc['host']} · {where} · every {duration(every)} · {clock(doc['generated_at'])}", "bold")],
        [(f"{counts['chips']} chip(s): ", ""), *_counts(counts),
         (f" · alerts: {firing} firing, {pending} pending", "critical" if firing else ""),
         *([(f" · monitor {monitor}", "" if monitor == "healthy" else "warning")] if monitor else [])],
    ]
    if error:
        rows.append([(f"not updated: {error}", "warning")])
    host = doc["host_resources"]
    total, available = host["memory_total_bytes"], host["memory_available_bytes"]
    used = total - available if total is not None and available is not None else None
    rows.append([(f"host memory {gib_of(used, total)} in use · CPU {percent(host['cpu_utilization_ratio'])}"
                  + (" · host memory leak suspected" if host["memory_leak_suspected"] else ""), "")])
    rows += [[(f"{n.get('headline', '')}: {n.get('text', '')}", "warning")] for n in host.get("notices", [])]
    rows.append([])
    rows += _table(doc, unicode, width)
    rows += _listing("ALERTS", [(_alert(a), "critical" if a.get("labels", {}).get("severity") == "critical"
                                 and a.get("state") == "firing" else "warning" if a.get("state") == "firing" else "")
                                for a in doc["alerts"]])
    rows += _listing("KERNEL EVENTS", [(f"{clock(e.get('time'))} {e['severity']} {e['rule']} chip "
                                        f"{e.get('device') or '-'}: {e['message']}",
                                        "critical" if e["severity"] == "critical" else "")
                                       for e in doc["kernel_events"]])
    return rows


def _counts(counts: dict[str, int]) -> Row:
    out: Row = []
    for level in ("critical", "warning", "ok"):
        out += [(f"{counts[level]} {level}", level if counts[level] else ""), (" · ", "")]
    return out[:-1]


def _table(doc: dict[str, Any], unicode: bool, width: int | None) -> list[Row]:
    now, start = doc["generated_at"], doc["generated_at"] - doc["window_seconds"]
    span = f"({duration(doc['window_seconds'])})"
    header = [f"{h} {span}" if h in ("MEMORY", "UTILIZATION") else h for h in _HEADER]
    health = _HEADER.index("HEALTH")
    table: list[tuple[list[str], str, list[str]]] = []
    for chip in doc["chips"]:
        r, verdict = chip["reading"], chip["verdict"]
        status, texts, series = verdict["status"], reading_texts(r), chip.get("series", {})
        shown = "ok" if status == "ok" else status.upper()
        cells = [chip["device"], shown, texts["memory"], texts["temperature"], texts["ecc"], texts["utilization"],
                 texts["power"], chip["chip"], "yes" if chip["up"] else "NO",
                 sparkline(series.get("memory_used_bytes", []), start, now, unicode),
                 sparkline(series.get("utilization_ratio", []), start, now, unicode),
                 proven_text(chip.get("proven") or {}, now), chip["pci"] or "-",
                 "-" if chip["holders"] is None else ", ".join(chip["holders"]) or "none"]
        reasons = [reason["text"] for reason in verdict["reasons"]]
        table.append((cells, status, reasons[:MAX_REASONS] + ([f"and {len(reasons) - MAX_REASONS} more"]
                                                                if len(reasons) > MAX_REASONS else [])))
    if not table:
        return [[("no accelerator found", "dim")]]
    widths = [max(len(header[i]), *(len(cells[i]) for cells, _, _ in table)) for i in range(len(header))]
    shown_columns = len(header) if width is None else _fitting(widths, width)
    widths = widths[:shown_columns]
    rows: list[Row] = [[(_GAP.join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), "bold")]]
    for cells, status, reasons in table:
        before = _GAP.join(c.ljust(w) for c, w in zip(cells[:health], widths)) + _GAP
        after = "".join(_GAP + c.ljust(w) for c, w in zip(cells[health + 1:], widths[health + 1:]))
        rows.append([(before, ""), (cells[health].ljust(widths[health]), status), (after.rstrip(), "")])
        rows += [[(f"      └ {reason}", status)] for reason in reasons if status != "ok"]
    return rows


def _fitting(widths: list[int], width: int) -> int:
    """How many of the columns, in order, fit ``width`` (never fewer than the ones always shown)."""
    used, count = 0, 0
    for w in widths:
        used += w + (len(_GAP) if count else 0)
        if used > width:
            break
        count += 1
    return max(count, _ALWAYS)


def proven_text(proven: dict[str, float], now: float) -> str:
    """When the chip was last proven right and by which path: "5m ago (job)", "never"."""
    if not proven:
        return "never"
    path, at = max(proven.items(), key=lambda item: item[1])
    return f"{duration(max(0.0, now - at))} ago ({path})"


def _alert(a: dict[str, Any]) -> str:
    labels = a.get("labels", {})
    chip = f" chip {labels['device']}" if labels.get("device") else ""
    return (f"{a.get('state')} {labels.get('severity', '')} {labels.get('alertname', '')}{chip}: "
            f"{a.get('annotations', {}).get('summary', '')}")


def _listing(title: str, items: list[tuple[str, str]]) -> list[Row]:
    if not items:
        return []
    rows: list[Row] = [[], [(title, "bold")]]
    rows += [[(item, style)] for item, style in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        rows.append([(f"and {len(items) - MAX_LISTED} more", "dim")])
    return rows


def plain(rows: list[Row]) -> str:
    """The rows as plain text, no colour or escape codes."""
    return "\n".join("".join(chunk for chunk, _ in row).rstrip() for row in rows)
