"""The units `tpuwatch top` and the status page share.

Both views format every quantity through tpuwatch.units, so that one reading reads the same in the
terminal and in the browser: the same literal readings are rendered by both and their cells compared.
"""

from __future__ import annotations

import html
import re
from typing import Any

from tpuwatch.devices.base import DeviceReading
from tpuwatch.samples import sample
from tpuwatch.units import celsius, gib_of, latency
from tpuwatch.views.document import build_status
from tpuwatch.views.lines import frame, plain
from tpuwatch.views.readers import StatusReaders
from tpuwatch.views.render import render_page

GIB, MIB = float(1 << 30), float(1 << 20)
T0 = 1_000_000_000.0


def test_each_unit_reads_as_written_and_absent_is_a_dash() -> None:
    assert [celsius(v) for v in (96.0, 84.6, 84.96, -3.0, None)] == ["96 °C", "84.6 °C", "85 °C", "-3 °C", "-"]
    assert [celsius(v, 0) for v in (90.0, 29.4)] == ["90 °C", "29 °C"]
    assert [gib_of(*v) for v in ((13.4 * GIB, 16 * GIB), (None, 16 * GIB), (512 * MIB, None), (None, None))] == [
        "13.4/16.0 GiB", "-/16.0 GiB", "0.5/- GiB", "-"]
    assert [latency(v) for v in (0.0, 0.00042, 0.00996, 0.4504, 0.9994, 0.9996, 12.345, None)] == [
        "0.0ms", "0.4ms", "10ms", "450ms", "999ms", "1.00s", "12.35s", "-"]


READINGS = [
    DeviceReading("0", "v5e", pci="0000:10:00.0", memory_used_bytes=13.4 * GIB, memory_total_bytes=16 * GIB,
                  utilization_ratio=0.834, temperature_celsius=96.0, power_watts=250.4, ecc_corrected_total=3,
                  ecc_uncorrected_total=1),
    DeviceReading("1", "v5e", pci="0000:11:00.0", memory_total_bytes=16 * GIB, temperature_celsius=84.6),
    DeviceReading("2", "v5e", pci="0000:12:00.0"),
]
HOST = [sample("tpuwatch_host_memory_total_bytes", 64 * GIB), sample("tpuwatch_host_memory_available_bytes", 24 * GIB),
        sample("tpuwatch_host_cpu_utilization_ratio", 0.25)]
# top's column, the page's column, and what each chip's cell must read in both.
EXPECTED = {
    ("MEM", "Memory"): {"0": "13.4/16.0 GiB", "1": "-/16.0 GiB", "2": "-"},
    ("UTIL", "Util"): {"0": "83%", "1": "-", "2": "-"},
    ("TEMP", "Temp"): {"0": "96 °C", "1": "84.6 °C", "2": "-"},
    ("POWER", "Power"): {"0": "250 W", "1": "-", "2": "-"},
    ("ECC CE/UE", "ECC CE/UE"): {"0": "3/1", "1": "-", "2": "-"},
}


def document() -> dict[str, Any]:
    history = [(T0 - 3000.0 + 60 * k, float(k % 5)) for k in range(50)]
    return build_status(StatusReaders(current=lambda: HOST, history=lambda name, labels: history,
                                      readings=lambda: READINGS, window=lambda: 3600.0, health=lambda: None,
                                      interval=lambda: 10.0), T0, "host-a")


def top_cells(text: str) -> dict[str, dict[str, str]]:
    """Per chip, top's cells by column: cut at the header's columns (a sparkline may hold spaces)."""
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("DEV "))
    columns = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", header)]
    bounds = [(name, start, columns[k + 1][1] if k + 1 < len(columns) else None)
              for k, (name, start) in enumerate(columns)]
    rows = [line for line in lines if re.match(r"^\d +(ok|WARNING|CRITICAL) ", line)]
    return {row.split()[0]: {name: row[start:end].strip() for name, start, end in bounds} for row in rows}


def page_cells(page: str) -> dict[str, dict[str, str]]:
    """Per chip, the page's chip table cells by column, as text."""
    rows = re.findall(r'<tr class="chip [^"]*" id="row-[^"]*" data-device="([^"]*)"[^>]*>(.*?)</tr>', page)
    return {device: {label: html.unescape(re.sub(r"<[^>]+>", "", cell))
                     for label, cell in re.findall(r'<td data-label="([^"]*)">(.*?)</td>', row)}
            for device, row in rows}


def test_top_and_the_page_write_every_reading_alike() -> None:
    doc = document()
    top = plain(frame(doc, "from the daemon at http://127.0.0.1:9847", 10.0, True, None))
    page = render_page(doc)
    in_top, on_page = top_cells(top), page_cells(page)
    assert set(in_top) == set(on_page) == {"0", "1", "2"}, (top, on_page)
    for (top_column, page_column), cells in EXPECTED.items():
        for device, text in cells.items():
            assert in_top[device][top_column] == on_page[device][page_column] == text, (device, top_column)
    assert len(in_top["0"]["MEMORY (1h)"].strip()) > 0  # the sparklines' columns were told apart
    host = "40.0/64.0 GiB in use"
    assert f"host memory {host} · CPU 25%" in top
    assert f"memory {host} (24.0 GiB available) · CPU 25%" in html.unescape(page)
    assert "every 10s" in top and "every 10s" in page
    assert "MEMORY (1h)" in top and ">-1h<" in page  # the window, as a duration in both
