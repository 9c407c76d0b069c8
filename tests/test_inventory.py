"""One inventory per cycle: every part after the devices stage sees the chips that stage read in the same cycle.

The race test starts the assembled pipeline afresh many times on a simulated 8-chip host whose chips take a
random while to answer, past the deadline in about half of the cycles, and whose later parts (host holders,
kernel-log attribution, the canary's chips, an action's PCI map) each start at a random moment of their stage.
It reads what each part saw from what it produced, so it runs unchanged against any version of the pipeline:
a version whose parts read the devices collector's latest readings while it runs shows some parts one cycle's
chips and others another's.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuwatch import config as config_module
from tpuwatch import registry
from tpuwatch.assembly import Parts, assemble
from tpuwatch.collectors import GuardedCollector
from tpuwatch.config import SimConfig
from tpuwatch.devices.base import DeviceBackend, DeviceReading
from tpuwatch.devices.collector import DeviceCollector
from tpuwatch.devices.inventory import Board
from tpuwatch.devices.sim import SimBackend
from tpuwatch.hw.procfs import Holder
from tpuwatch.samples import Sample

CHIPS = 8
FIRST_READ = 4  # chips the first read of a fresh start shows: each cycle's inventory differs from the last's
STARTS = 12
CYCLES = 2
DEADLINE = 0.3
PARTS = ("host", "kernel_log", "canary")  # the later sources whose start within their stage is made random


class Recorder:
    """An action that keeps the chips of every PCI map it is fed."""

    name = "record"

    def __init__(self) -> None:
        self.fed: list[set[str]] = []

    def feed(self, alerts: list[dict[str, Any]], pci_by_device: dict[str, str]) -> None:
        self.fed.append(set(pci_by_device))

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def samples(self) -> list[Sample]:
        return []

    def api_payload(self) -> dict[str, Any]:
        return {}


class SlowChips:
    """The simulated chips with device files under paths.dev (``accelN``), each read taking a random while: half
    of them on a fresh start's first read, all of them after."""

    name = "sim"

    def __init__(self, inner: DeviceBackend, rng: random.Random) -> None:
        self.inner, self.rng, self.reads = inner, rng, 0

    def read(self) -> list[DeviceReading]:
        time.sleep(self.rng.uniform(0.0, 2 * DEADLINE))  # past the deadline in about half of the reads
        readings = self.inner.read()[:FIRST_READ if self.reads == 0 else CHIPS]
        self.reads += 1
        return [dataclasses.replace(r, device_files=(f"accel{r.device}",)) for r in readings]


def _late(collect: Callable[[], list[Sample]], rng: random.Random) -> Callable[[], list[Sample]]:
    def collect_later() -> list[Sample]:
        time.sleep(rng.uniform(0.0, 0.3 * DEADLINE))
        return collect()
    return collect_later


@pytest.fixture
def held_chips(tmp_path: Path) -> Iterator[Path]:
    """Every chip's device file, held open by this process (the host collector names holders by chip)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    files = [open(dev / f"accel{i}", "w") for i in range(CHIPS)]  # noqa: SIM115 - held for the test
    yield dev
    for f in files:
        f.close()


def _start(tmp_path: Path, dev: Path, start: int) -> tuple[Parts, Path]:
    state, log = tmp_path / f"start{start}", tmp_path / f"kern{start}.log"
    log.write_text("")
    config = config_module.parse(f"""
state_dir: {state}
interval: 1s
collector_timeout: {DEADLINE}s
paths: {{dev: {dev}}}
host: {{pod_resources_socket: null}}
kernel_log: {{source: file, path: {log}, previous_boot: false}}
canary: {{enabled: true}}
probe: {{enabled: false}}
maintenance: {{cloud: "off"}}
devices: {{backend: sim, sim: {{count: {CHIPS}}}}}
""")
    return assemble(config, None, lambda: []), log


def _labels(samples: list[Sample], name: str) -> Counter[str]:
    return Counter({dict(s.labels).get("device", ""): s.value for s in samples if s.name == name})


def test_every_part_of_a_cycle_sees_that_cycles_inventory(tmp_path: Path, held_chips: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    recorders: list[Recorder] = []

    def record(config: config_module.Config) -> Recorder:
        recorders.append(Recorder())
        return recorders[-1]

    monkeypatch.setitem(registry.ACTIONS, "record", registry.ActionFactory(lambda c: None, record, "off"))
    rng = random.Random(44)
    checked, late = 0, 0
    for start in range(STARTS):
        parts, log = _start(tmp_path, held_chips, start)
        devices, canary = parts.collectors.devices, parts.canary
        assert devices is not None and canary is not None
        canary.runnable = None  # its chips' counters are exported as where jax is installed
        devices.backend = SlowChips(devices.backend, rng)
        for part in (parts.collectors.by_name[PARTS[0]], parts.collectors.kernel_log, canary):
            part.collect = _late(part.collect, rng)  # type: ignore[method-assign, union-attr]
        kernel_before: Counter[str] = Counter()
        try:
            for cycle in range(1, CYCLES + 1):
                with log.open("a") as f:  # one Xid per chip, attributed by its PCI address
                    f.writelines(f"NVRM: Xid (PCI:0000:{0x10 + i:02x}:00): 79, pid=1, name=x, GPU has fallen off "
                                 "the bus.\n" for i in range(CHIPS))
                parts.sampler.run_once()
                if not all(guard.status.success for guard in map(parts.sampler.guard, PARTS) if guard):
                    break  # a part past its own deadline (a loaded machine) showed nothing: this start is over
                current = parts.store.current()
                kernel = _labels(current, "tpuwatch_kernel_events_total")
                seen = {
                    "host": {dict(s.labels)["device"] for s in current
                             if s.name == "tpuwatch_device_holder_info" and dict(s.labels)["device"]},
                    "kernel_log": {d for d in kernel if d and kernel[d] > kernel_before[d]},
                    "canary": set(_labels(current, "tpuwatch_canary_device_runs_total")),
                    "actions": recorders[-1].fed[-1],
                }
                kernel_before = kernel
                where = f"fresh start {start}, cycle {cycle}"
                assert all(chips == seen["actions"] for chips in seen.values()), \
                    f"{where}: the parts saw different chips: {seen}"
                guard = parts.sampler.guard("devices")
                if guard is not None and guard.status.success:
                    read = set(_labels(current, "tpuwatch_device_up"))
                    assert seen["host"] == read, f"{where}: the devices read {read}, the later parts saw {seen}"
                else:
                    late += 1
                checked += 1
        finally:
            parts.collectors.close()
    assert checked >= STARTS and late > 0, f"{checked} cycles checked, {late} with the chips past their deadline"


def _reading(device: str) -> DeviceReading:
    return DeviceReading(device=device, chip="v5e", pci=f"0000:1{device}:00.0", device_files=(f"accel{device}",))


def test_a_read_past_its_stage_publishes_nothing() -> None:
    board = Board()
    assert board.current.cycle == 0 and board.current.readings == ()
    board.begin()
    assert board.publish([_reading("0")], {7: Holder(7, "python3", frozenset({"accel0"}))})
    board.seal()
    first = board.current
    assert not board.publish([_reading("0"), _reading("1")], {}), "a late read is refused"
    assert board.current is first and first.cycle == 1
    assert (first.devices, dict(first.pci_by_device), dict(first.chip_files)) == (
        ("0",), {"0": "0000:10:00.0"}, {"accel0": ("0", ())})
    board.begin()
    assert board.current is first, "the last inventory stands until the next is published"
    board.publish([_reading("1")], {})
    assert board.current.cycle == 2 and board.current.devices == ("1",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        board.current.readings = ()  # type: ignore[misc]


def test_a_read_that_finishes_after_its_stage_stores_nothing_the_cycle_did_not_see() -> None:
    """A devices read that ends once the first stage is sealed is refused by the board, and fails: its samples
    would show chips that the cycle's later parts never saw."""
    board = Board()
    collector = DeviceCollector(SimBackend(SimConfig(count=2)), board=board)
    guard = GuardedCollector(collector)
    board.begin()
    guard.start()
    assert guard.finish(time.monotonic() + 30) and [r.device for r in board.current.readings] == ["0", "1"]
    board.seal()
    board.begin()
    board.seal()  # the stage is over before the read
    guard.start()
    assert guard.finish(time.monotonic() + 30) is None and guard.status.errors["error"] == 1
    assert "after its stage" in (guard.status.last_error or "") and board.current.cycle == 1
