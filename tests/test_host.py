"""Host collector: psutil readings and real processes holding device files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuwatch.devices.inventory import Inventory
from tpuwatch.host.collector import HostCollector, parse_statm_rss
from tpuwatch.hw.procfs import HolderScan, match_device_file, scan_holders

from conftest import wait_until

PATTERNS = ["accel[0-9]*", "vfio/[0-9]*", "nvidia[0-9]*"]


def host_collector(dev: Path, interval: float) -> HostCollector:
    """A host collector with no devices stage: holders from a scan of its own (as the registry builds it)."""
    scan = HolderScan("/proc", str(dev), PATTERNS, interval)
    return HostCollector("/proc", lambda: Inventory(holders=scan.scan()))


def test_parse_statm() -> None:
    assert parse_statm_rss("12345 2048 300 10 0 500 0\n", page_size=4096) == 2048 * 4096


@pytest.mark.parametrize("target,expected", [
    ("/dev/accel0", "accel0"), ("/dev/vfio/12", "vfio/12"), ("/dev/nvidia3", "nvidia3"),
    ("/dev/nvidiactl", None), ("/dev/vfio/vfio", None), ("/dev/null", None), ("/tmp/dev/accel0", None),
    ("socket:[1234]", None), ("/device/accel0", None),
])
def test_match_device_file(target: str, expected: str | None) -> None:
    assert match_device_file(target, "/dev", PATTERNS) == expected


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real process that holds a fake accelerator device file open, with 64 MiB resident."""
    dev = tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    for name in ("accel0", "accel1", "vfio/7", "other"):
        (dev / name).write_text("")
    code = ("import sys; fs=[open(p) for p in sys.argv[1:]]; buf=bytearray(64<<20); "
            "print('ready', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(dev / "accel1"), str(dev / "vfio/7"),
                             str(dev / "other")], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc, dev
    proc.kill()
    proc.wait()


def test_scan_finds_the_real_holder(holder: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, dev = holder
    found = scan_holders("/proc", str(dev), PATTERNS)
    assert list(found) == [proc.pid]
    assert found[proc.pid].device_files == {"accel1", "vfio/7"}
    assert found[proc.pid].command.startswith("python")


def test_host_collector_reports_memory_cpu_and_holders(holder: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, dev = holder
    collector = host_collector(dev, 60.0)
    first = {s.name: s for s in collector.collect()}
    assert first["tpuwatch_host_memory_total_bytes"].value > first["tpuwatch_host_memory_available_bytes"].value > 0
    assert "tpuwatch_host_cpu_utilization_ratio" not in first, "no CPU ratio before there is a previous sample"
    rss = first["tpuwatch_holder_process_resident_memory_bytes"]
    assert dict(rss.labels)["pid"] == str(proc.pid)
    assert rss.value >= 64 << 20
    time.sleep(0.05)  # let some CPU time pass between the two readings
    second = collector.collect()
    assert 0.0 <= next(s.value for s in second if s.name == "tpuwatch_host_cpu_utilization_ratio") <= 1.0
    files = sorted(dict(s.labels)["device_file"] for s in second if s.name == "tpuwatch_device_holder_info")
    assert files == ["accel1", "vfio/7"]


def test_an_exited_holder_disappears(holder: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, dev = holder
    collector = host_collector(dev, 3600.0)
    assert any(s.name == "tpuwatch_holder_process_resident_memory_bytes" for s in collector.collect())
    proc.kill()
    proc.wait()
    wait_until(lambda: not os.path.exists(f"/proc/{proc.pid}"), what="the holder to exit")
    assert not any(s.name.startswith("tpuwatch_holder") or s.name == "tpuwatch_device_holder_info"
                   for s in collector.collect())
