"""Hardware check on a host with NVIDIA GPUs: tpuwatch's readings beside nvidia-smi's.

One command, from the repository root, with tpuwatch and its nvidia extra installed
(``pip install -e '.[nvidia]'``):

    python tests/hardware/nvidia_check.py

It reads every GPU through the nvidia backend, runs ``tpuwatch check --json``
with ``devices.backend: nvidia``, queries nvidia-smi field by field (a field
this driver's nvidia-smi does not know prints as "n/a"), and prints one table
per GPU.  Exit 0 when the values that do not move on their own (name, PCI
address, memory total, ECC and retired-page counts, remapped rows) agree, 1 when
one differs, 2 when it cannot run.  Utilization, power and memory in use move
between the reads: compare them by eye.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tpuwatch.config import Config, DevicesConfig
from tpuwatch.devices.nvidia import NvidiaBackend, pci_bus_id

MIB = float(1 << 20)

# (reading field, nvidia-smi query field, tpuwatch value -> nvidia-smi's unit, must agree exactly)
FIELDS = [
    ("chip", "name", str, True),
    ("pci", "pci.bus_id", str, True),
    ("memory_total_bytes", "memory.total", lambda v: round(v / MIB), True),
    ("memory_used_bytes", "memory.used", lambda v: round(v / MIB), False),
    ("memory_reserved_bytes", "memory.reserved", lambda v: round(v / MIB), False),
    ("utilization_ratio", "utilization.gpu", lambda v: round(v * 100), False),
    ("temperature_celsius", "temperature.gpu", round, False),
    ("power_watts", "power.draw", lambda v: round(v, 1), False),
    ("ecc_corrected_total", "ecc.errors.corrected.volatile.total", int, True),
    ("ecc_uncorrected_total", "ecc.errors.uncorrected.volatile.total", int, True),
    ("ecc_corrected_aggregate_total", "ecc.errors.corrected.aggregate.total", int, True),
    ("ecc_uncorrected_aggregate_total", "ecc.errors.uncorrected.aggregate.total", int, True),
    ("retired_pages_single_bit", "retired_pages.single_bit_ecc.count", int, True),
    ("retired_pages_double_bit", "retired_pages.double_bit.count", int, True),
    ("memory_repair_pending", "retired_pages.pending", str, False),
    ("throttle_reasons", "clocks_throttle_reasons.active", str, False),
]
REMAPPED = [("remapped_rows_corrected", "remapped_rows.correctable"),
            ("remapped_rows_uncorrected", "remapped_rows.uncorrectable"),
            ("row_remap_failed", "remapped_rows.failure")]


REFUSED: list[str] = []  # what this nvidia-smi would not answer, printed once at the end


def smi(args: list[str]) -> list[str]:
    """nvidia-smi's CSV lines (no header, no units), or ["n/a"] when it refuses the query."""
    done = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=60, check=False)
    if done.returncode != 0:
        REFUSED.append(f"{' '.join(args)}: {(done.stdout + done.stderr).strip()}")
        return ["n/a"]
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def smi_by_gpu() -> dict[str, dict[str, str]]:
    """nvidia-smi's value of every field, per GPU PCI address (as sysfs writes it)."""
    addresses = [pci_bus_id(line) for line in smi(["--query-gpu=pci.bus_id"])]
    table: dict[str, dict[str, str]] = {address: {} for address in addresses}
    for _, query, _, _ in FIELDS:
        values = smi([f"--query-gpu={query}"])
        for i, address in enumerate(addresses):
            table[address][query] = values[i] if len(values) == len(addresses) else values[0]
    remapped = smi(["--query-remapped-rows=gpu_bus_id," + ",".join(q for _, q in REMAPPED)])
    for line in remapped if remapped != ["n/a"] else []:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(REMAPPED) + 1 and pci_bus_id(cells[0]) in table:
            table[pci_bus_id(cells[0])].update(zip((q for _, q in REMAPPED), cells[1:]))
    replays = subprocess.run(["nvidia-smi", "-q", "-d", "PCIE"], capture_output=True, text=True, timeout=60,
                             check=False).stdout
    for address, count in zip(addresses, [line.split(":")[-1].strip() for line in replays.splitlines()
                                          if "Replays Since Reset" in line]):
        table[address]["pcie replays (nvidia-smi -q)"] = count
    return table


def check_json() -> dict[str, Any]:
    """``tpuwatch check --json`` with the nvidia backend, run as a user would."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "config.yaml")
        config.write_text(json.dumps({"devices": {"backend": "nvidia"}, "state_dir": tmp}))
        done = subprocess.run([sys.executable, "-m", "tpuwatch", "check", "--json", "--config", str(config)],
                              capture_output=True, text=True, timeout=120, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"tpuwatch check failed ({done.returncode}): {done.stderr.strip()}")
    print(f"tpuwatch check: exit {done.returncode}, status {json.loads(done.stdout)['status']}")
    return json.loads(done.stdout)


def show(value: Any, convert: Any = str) -> str:
    """A value in nvidia-smi's unit, "-" when absent, the active reasons of a throttle mask."""
    if isinstance(value, dict):
        return ",".join(name for name, active in value.items() if active) or "none"
    return "-" if value is None else str(convert(value))


def agrees(attribute: str, ours: str, theirs: str) -> bool:
    """Whether two renderings of an exact value agree (nvidia-smi writes "00000000:3B:00.0" for PCI)."""
    if attribute == "pci":
        return pci_bus_id(theirs) == ours
    return ours.lower() == theirs.lower()


def main() -> int:
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: run this on a host with NVIDIA GPUs and their driver", file=sys.stderr)
        return 2
    readings = NvidiaBackend(Config(devices=DevicesConfig(backend="nvidia"))).read()
    report = check_json()
    checked = {d["pci"]: d for d in report["devices"]}
    table = smi_by_gpu()
    for problem in report["problems"]:
        print(f"check problem: {problem}")
    mismatches = 0
    for reading in readings:
        smi_values = table.get(reading.pci or "", {})
        print(f"\nGPU {reading.device} {reading.pci}: up={reading.up} {reading.problem or ''}")
        print(f"  {'field':36} {'backend':>22} {'check --json':>22} {'nvidia-smi':>22}")
        for attribute, query, convert, exact in [*FIELDS, *((a, q, int, True) for a, q in REMAPPED)]:
            ours = show(getattr(reading, attribute), convert)
            from_check = show(checked.get(reading.pci, {}).get(attribute), convert)
            theirs = smi_values.get(query, "n/a")
            known = ours != "-" and theirs.lower() not in ("n/a", "[n/a]", "[not supported]")
            differs = exact and known and not agrees(attribute, ours, theirs)
            mismatches += differs
            print(f"  {attribute:36} {ours:>22} {from_check:>22} {theirs:>22}{'  MISMATCH' if differs else ''}")
        print(f"  {'pcie_replays_total':36} {show(reading.pcie_replays_total):>22} "
              f"{show(checked.get(reading.pci, {}).get('pcie_replays_total')):>22} "
              f"{smi_values.get('pcie replays (nvidia-smi -q)', 'n/a'):>22}")
        print(f"  sources: {json.dumps(reading.sources)}")
    for refused in REFUSED:
        print(f"nvidia-smi refused {refused}")
    print(f"\n{len(readings)} GPU(s), {mismatches} mismatch(es) in values that should agree exactly")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
