"""Which device a kernel message is about: DEVICE=/_KERNEL_DEVICE forms, message prefixes, sysfs, and the wiring
into the collector and logscan.  The sysfs trees are built as the kernel lays them out (/sys/dev/char/MAJ:MIN and
/sys/class/<class>/<name> are symlinks into /sys/devices/pci.../<address>/...; drivers/base/core.c)."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
from pathlib import Path

import pytest

from tpuwatch.config import parse
from tpuwatch.devices import DeviceReading
from tpuwatch.kernel_log import logscan
from tpuwatch.kernel_log.attribution import (
    _PREFIX_RE,
    CACHE_SECONDS,
    CACHE_SIZE,
    Attribution,
    SysfsResolver,
    device_key,
    device_lookup,
    kernel_device_key,
    names_a_device,
    prefix_device,
)
from tpuwatch.kernel_log.collector import build_collector
from tpuwatch.kernel_log.events import make_event
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rulefile import load_rules

TESTDATA = Path(__file__).parent / "testdata" / "kernel_log"

RULES = load_rules([])


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _sysfs(root: Path) -> Path:
    """A sysfs with a TPU v4 (accel0 on 0000:00:04.0, accel1 on 0000:00:05.0), a GPU's drm card, a disk, a NIC
    behind a bridge, and a virtual device."""
    devices = root / "devices"
    for pci, index in (("0000:00:04.0", 0), ("0000:00:05.0", 1)):
        accel = devices / "pci0000:00" / pci / "accel" / f"accel{index}"
        accel.mkdir(parents=True)
        _link(accel / "device", f"../../../{pci}")
        _link(root / "class" / "accel" / f"accel{index}", f"../../devices/pci0000:00/{pci}/accel/accel{index}")
        _link(root / "dev" / "char" / f"121:{index}", f"../../devices/pci0000:00/{pci}/accel/accel{index}")
    (devices / "pci0000:00" / "0000:3b:00.0" / "drm" / "card0").mkdir(parents=True)
    _link(root / "class" / "drm" / "card0", "../../devices/pci0000:00/0000:3b:00.0/drm/card0")
    _link(root / "dev" / "char" / "226:0", "../../devices/pci0000:00/0000:3b:00.0/drm/card0")
    disk = "pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda"
    (devices / disk).mkdir(parents=True)
    _link(root / "dev" / "block" / "8:0", f"../../devices/{disk}")
    nic = devices / "pci0000:00" / "0000:00:03.0" / "0000:01:00.0" / "net" / "eth0"
    nic.mkdir(parents=True)
    (nic / "ifindex").write_text("2\n")
    _link(root / "class" / "net" / "eth0", "../../devices/pci0000:00/0000:00:03.0/0000:01:00.0/net/eth0")
    (devices / "virtual" / "net" / "lo").mkdir(parents=True)
    (devices / "virtual" / "net" / "lo" / "ifindex").write_text("1\n")
    _link(root / "class" / "net" / "lo", "../../devices/virtual/net/lo")
    (devices / "virtual" / "misc" / "fuse").mkdir(parents=True)
    _link(root / "dev" / "char" / "10:229", "../../devices/virtual/misc/fuse")
    return root


@pytest.mark.parametrize(("value", "key"), [
    ("+pci:0000:3B:00.0", "0000:3b:00.0"), ("c121:0", "c121:0"), ("b8:0", "b8:0"), ("n2", "n2"),
    ("+usb:1-1", "+usb:1-1"), ("+drm:card0", "+drm:card0"), (None, None), ("", None), ("x/../y", None),
    ("c121", None), ("+pci:junk", "+pci:junk")])
def test_kernel_device_key_decodes_every_device_form(value: str | None, key: str | None) -> None:
    assert kernel_device_key(value) == key


@pytest.mark.parametrize(("message", "expected"), [
    ("nvidia 0000:3B:00.0: PCIe Bus Error: severity=Correctable", ("nvidia", "0000:3b:00.0")),
    ("vfio-pci 0000:00:05.0: not ready 65535ms after FLR; giving up", ("vfio-pci", "0000:00:05.0")),
    ("accel accel0: gasket_reset_nolock: Device reported as dead.", ("accel", "accel0")),
    ("accel accel3: (c1) tpu_common_device_open: Failed to reset device", ("accel", "accel3")),
    ("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT", ("mlx5_core", "0000:ab:00.0")),
    ("Out of memory: Killed process 4242 (python3)", None), ("NVRM: Xid (PCI:0000:3b:00): 79", None),
    ("EDAC MC0: 1 CE memory read error", None), ("python3 invoked oom-killer: gfp_mask=0x100cca", None),
    ("mce: [Hardware Error]: Machine check events logged", None)])
def test_prefix_device_reads_dev_printk_prefixes(message: str, expected: tuple[str, str] | None) -> None:
    assert prefix_device(message) == expected


@pytest.mark.parametrize("seed", range(8))
def test_names_a_device_is_a_search_for_the_prefix_anywhere(seed: int) -> None:
    """Searched backwards from each ": " (a reversed regex over the reversed text), it answers as a forward search for
    a dev_printk prefix anywhere in the line does: on lines built from prefixes' pieces, and on the test logs."""
    rng = random.Random(seed)
    pieces = ["nvidia", "accel", "mlx5_core", "vfio-pci", " ", ": ", "0000:3b:00.0", "00:3b:00.9", "accel0", "eno1",
              "mlx5_5", "Xid", "(PCI:", "9", "a", "-", "_", ".", "Z", ":", "INFO: task python3:4242 blocked"]
    lines = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(4000)]
    lines += [line for path in sorted(p for p in TESTDATA.iterdir() if p.is_file())[seed::8]
              for line in path.read_text(errors="replace").splitlines()]
    forward = re.compile(_PREFIX_RE.pattern)
    answers = [names_a_device(line) for line in lines]
    assert answers == [forward.search(line) is not None for line in lines]
    assert 0 < sum(answers) < len(lines)


def test_device_key_prefers_the_kernel_tag_then_the_prefix() -> None:
    assert device_key(Record("accel accel0: x: y", "c121:0")) == "c121:0"
    assert device_key(Record("accel accel0: x: y")) == "accel/accel0"
    assert device_key(Record("nvidia 0000:3b:00.0: x", "+pci:0000:3b:00.0")) == "0000:3b:00.0"
    assert device_key(Record("plain text")) is None


@pytest.mark.parametrize(("value", "pci"), [
    ("c121:0", "0000:00:04.0"), ("c121:1", "0000:00:05.0"), ("c226:0", "0000:3b:00.0"), ("b8:0", "0000:00:1f.2"),
    ("n2", "0000:01:00.0"), ("n1", None), ("+accel:accel1", "0000:00:05.0"), ("+drm:card0", "0000:3b:00.0"),
    ("+pci:0000:3b:00.0", "0000:3b:00.0"), ("c10:229", None), ("c121:9", None), ("n99", None),
    ("+accel:..", None), ("+x:../../etc", None), ("garbage", None)])
def test_resolver_follows_sysfs_to_the_nearest_pci_function(tmp_path: Path, value: str, pci: str | None) -> None:
    assert SysfsResolver(str(_sysfs(tmp_path))).pci_of_kernel_device(value) == pci


def test_resolver_reads_class_devices_and_never_leaves_sysfs(tmp_path: Path) -> None:
    root = _sysfs(tmp_path / "sys")
    outside = tmp_path / "elsewhere" / "0000:99:00.0" / "accel9"
    outside.mkdir(parents=True)
    _link(root / "class" / "accel" / "accel9", str(outside))
    resolver = SysfsResolver(str(root))
    assert resolver.pci_of_class_device("accel", "accel0") == "0000:00:04.0"
    assert resolver.pci_of_class_device("accel", "accel9") is None  # a link out of sysfs is not followed
    assert resolver.pci_of_class_device("accel", "../accel0") is None
    assert resolver.pci_of_class_device("..", "accel0") is None
    assert SysfsResolver(str(tmp_path / "absent")).pci_of_kernel_device("c121:0") is None


def test_resolver_cache_is_bounded_and_expires(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    now = [0.0]
    resolver = SysfsResolver(str(root), clock=lambda: now[0])
    assert resolver.pci_of_kernel_device("c121:0") == "0000:00:04.0"
    os.remove(root / "dev" / "char" / "121:0")
    _link(root / "dev" / "char" / "121:0", "../../devices/pci0000:00/0000:00:05.0/accel/accel1")
    assert resolver.pci_of_kernel_device("c121:0") == "0000:00:04.0"  # cached
    now[0] += CACHE_SECONDS
    assert resolver.pci_of_kernel_device("c121:0") == "0000:00:05.0"  # a rebound minor is seen again
    for minor in range(CACHE_SIZE + 50):
        resolver.pci_of_kernel_device(f"c121:{minor + 100}")
    assert len(resolver._cache) == CACHE_SIZE


def test_attribution_order_rule_field_then_kernel_tag_then_prefix(tmp_path: Path) -> None:
    attribution = Attribution({"0000:00:04.0": 0, "0000:3b:00.0": "7"}.get, SysfsResolver(str(_sysfs(tmp_path))))
    dead = Record("accel accel0: gasket_reset_nolock: Device reported as dead.")
    [match] = RULES.match(dead.message)
    assert (make_event(match, dead, attribution).pci, make_event(match, dead, attribution).device) == (
        "0000:00:04.0", "0")  # the prefix's class device through /sys/class/accel/accel0
    tagged = Record("accel accel0: gasket_reset_nolock: Device reported as dead.", "c121:1")
    assert make_event(match, tagged, attribution).pci == "0000:00:05.0"  # the kernel's tag wins over the prefix
    xid = Record("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.", "c121:0")
    [match] = RULES.match(xid.message)
    assert (make_event(match, xid, attribution).pci, make_event(match, xid, attribution).device) == (
        "0000:3b:00.0", "7")  # the rule's own field wins over everything
    assert make_event(match, xid, lambda pci: None).device is None
    plain = Attribution(lambda pci: None)  # no sysfs: only what the record says
    assert plain.pci_of(dead) is None and plain.pci_of(Record("x", "+pci:0000:3B:00.0")) == "0000:3b:00.0"


def test_collector_attributes_tpu_driver_lines_through_sysfs(tmp_path: Path) -> None:
    root = _sysfs(tmp_path / "sys")
    log = tmp_path / "kern.log"
    log.write_text("")
    config = parse(f"paths: {{sysfs: '{root}'}}\nstate_dir: '{tmp_path / 'state'}'\n"
                   f"kernel_log: {{source: file, path: '{log}', rules_dirs: []}}")
    readings = [DeviceReading(device="0", chip="v4", pci="0000:00:04.0"),
                DeviceReading(device="1", chip="v4", pci="0000:00:05.0")]
    collector, _ = build_collector(config, device_lookup(lambda: readings), persist=False)
    assert collector is not None
    with open(log, "a") as handle:
        handle.write("Nov 30 04:37:39 tpu-host kernel: [ 14.5] accel accel1: tpuv2_get_status: Chip init register "
                     "value: 0\n")
    collector.collect()
    [event] = collector.recent_events()
    assert (event.rule, event.severity, event.pci, event.device) == ("tpu_driver_error", "critical", "0000:00:05.0",
                                                                    "1")
    collector.close()


def test_logscan_attributes_through_this_hosts_sysfs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "sys"
    (root / "devices" / "pci0000:00" / "0000:11:00.0" / "accel" / "accel0").mkdir(parents=True)  # sim chip 1
    _link(root / "dev" / "char" / "121:0", "../../devices/pci0000:00/0000:11:00.0/accel/accel0")
    log = tmp_path / "kmsg.txt"
    log.write_text("3,5,100,-;accel accel0: gasket_reset_nolock: Device reported as dead.\n SUBSYSTEM=accel\n"
                   " DEVICE=c121:0\n")
    parser = argparse.ArgumentParser()
    logscan.add_arguments(parser)
    config = parse(f"paths: {{sysfs: '{root}'}}\ndevices: {{backend: sim}}\nkernel_log: {{rules_dirs: []}}")
    assert logscan.run(parser.parse_args([str(log), "--json"]), config) == 1
    [event] = json.loads(capsys.readouterr().out)["events"]
    assert (event["pci"], event["device"]) == ("0000:11:00.0", "1")
