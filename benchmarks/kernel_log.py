"""Kernel log throughput: the daemon's path and logscan on two generated logs, beside ``grep -E``.

Usage::

    python benchmarks/kernel_log.py [--lines N] [--seed S] [--quick] [--output BENCHMARKS.md]

Two corpora of ``N`` lines each (default 1,000,000), in several formats
(``[seconds]``, ``-T``, syslog, raw kmsg with continuation lines), with about
1% real error lines of every shipped family:

* **busy host**: everyday kernel noise (links, audit, USB, containers, file
  systems) and 2% near misses;
* **keyword-dense**: 40% hardware-adjacent lines such as the NVRM, AER, EDAC,
  mce, amdgpu and vfio banners and detail lines real hosts print, which share
  words with the rules, and the rest noise.

In the same run it times, on one core (``taskset -c 0`` where available),
best of 5, every kind of run taking turns (single runs on a shared machine
swing by 20%): the daemon's path (a ``FileSource`` following the file from its
start, read to its end through ``LogReader``, the collector's reader: records/s),
``tpuwatch logscan FILE --json`` (the same path writing JSON, Python's start
included: lines/s, peak RSS) and ``grep -E -c`` with every shipped rule's
regex and follow regex (translated to ERE).  It checks that the daemon's path
and logscan give the same events, and rewrites the ``kernel_log`` section of
BENCHMARKS.md.  Targets: the daemon's path >= 250,000 records/s on the busy
log; logscan >= 0.4x grep's speed on both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Measure the tpuwatch of this checkout, whatever else is installed (here and in the timed subprocesses).
sys.path[:0] = [str(Path(__file__).resolve().parent), str(REPO_ROOT)]
from tpuwatch.kernel_log.rulefile import load_rules  # noqa: E402

from common import BENCHMARKS_MD, checkout_env, cpu_model, to_ere, write_section  # noqa: E402

ENV = checkout_env()

NOISE = [
    "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx",
    "audit: type=1400 audit({t}:{n}): apparmor=\"STATUS\" operation=\"profile_load\" name=\"nvidia_modprobe\"",
    "usb 1-1.{n}: new high-speed USB device number {n} using ehci-pci",
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{n}: link becomes ready",
    "docker0: port {n}(veth{n}) entered forwarding state",
    "systemd-journald[{n}]: Received client request to flush runtime journal.",
    "EXT4-fs (nvme0n1p{n}): mounted filesystem with ordered data mode. Quota mode: none.",
    "nvidia-uvm: Loaded the UVM driver, major device number {n}.",
    "TCP: request_sock_TCP: Possible SYN flooding on port {n}. Sending cookies.",
    "process 'python3' launched '/bin/sh' with NULL argv: empty string added",
]
NEAR_MISS = [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
    "pcieport 0000:00:01.{n}: AER: enabled with IRQ {n}",
    "EDAC MC: Ver: 3.0.0",
    "mce: CPU{n}: Thermal monitoring enabled (TM1)",
    "accel accel0: tpu_common_device_open: skipping reset on open",
    "oom_reaper: reaped process {n} (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
]
# Real banner and detail lines of hardware-heavy hosts (see tests/testdata/kernel_log/corpus.yaml), none an error.
ADJACENT = [
    "NVRM: GPU at PCI:0000:{b:02x}:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
    "NVRM: GPU Board Serial Number: 1650124014249",
    "NVRM: GPU{c} RPC history (CPU -> GSP):",
    "NVRM:     -{c}    103  GSP_RM_ALLOC          0x0000000000002080 0x0000000000000004 0x00062ed1a6b51c6f 0x00062ed1a6b51f2a    699us",
    "NVRM: GPU{c} nvAssertFailedNoLog: Assertion failed: 0 @ kernel_gsp.c:1446",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)",
    "nvidia 0000:{b:02x}:00.0: enabling device (0000 -> 0003)",
    "nvidia-nvlink: Nvlink Core is being initialized, major device number {n}",
    "pcieport 0000:00:{c:02x}.0: AER: enabled with IRQ {n}",
    "pcieport 0000:00:{c:02x}.0:   device [8086:2030] error status/mask=00000001/00002000",
    "pcieport 0000:00:{c:02x}.0:    [ 0] RxErr                  (First)",
    "pcieport 0000:00:{c:02x}.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000",
    "pcieport 0000:00:1c.5: can't find device of ID00e5",
    "pcieport 0000:00:07.0: pciehp: Slot({c}): Card not present",
    "acpi PNP0A08:00: _OSC: OS now controls [PCIeHotplug SHPCHotplug PME AER PCIeCapability LTR]",
    "EDAC MC{c}: Giving out device to module skx_edac controller Skylake Socket#0 IMC#0: DEV 0000:3a:0a.0 (INTERRUPT)",
    "EDAC MC: Ver: 3.0.0",
    "EDAC sbridge: Seeking for: PCI ID 8086:3ca0",
    "EDAC amd64: F17h detected (node {c}).",
    "mce: CPU supports {c} MCE banks",
    "mce: CPU{c}: Thermal monitoring enabled (TM1)",
    "mce: [Hardware Error]: TSC 2ac997e3063c3 ",
    "[Hardware Error]: IPID: 0x0000024113409200, Syndrome: 0x0000812d4a000000",
    "{{7}}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: {c}",
    "amdgpu 0000:{b:02x}:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
    "amdgpu 0000:{b:02x}:00.0: amdgpu: SMU is resumed successfully!",
    "[drm] PCIE GART of 512M enabled (table at 0x0000008000300000).",
    "vfio-pci 0000:{b:02x}:00.0: enabling device (0002 -> 0003)",
    "vfio-pci 0000:{b:02x}:00.0: vfio_ecap_init: hiding ecap 0x19@0x270",
    "vfio-pci 0000:{b:02x}:00.0: not ready 1023ms after FLR; waiting",
    "rcu: Hierarchical RCU implementation.",
    "workqueue: drm_fb_helper_damage_work hogged CPU for >10000us 8 times, consider switching to WQ_UNBOUND",
]
ERRORS = [
    "NVRM: Xid (PCI:0000:3b:00): {xid}, pid={n}, name=python3, Ch 00000008",
    ("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus and "
     "is not responding to commands."),
    "NVRM: GPU 0000:{b:02x}:00.0: RmInitAdapter failed! (0x22:0x56:667)",
    "pcieport 0000:00:01.0: AER: Correctable error message received from 0000:{b:02x}:00.0",
    "pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:{b:02x}:00.0",
    "nvidia 0000:{b:02x}:00.0: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)",
    "vfio-pci 0000:{b:02x}:00.0: not ready 65535ms after FLR; giving up",
    "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0x{n:x})",
    "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x{n:x})",
    "mce: [Hardware Error]: CPU {c}: Machine Check: 0 Bank 5: be00000000800400",
    "Memory failure: 0x{n:x}: recovery action for dirty LRU page: Recovered",
    "accel accel{c}: tpuv4common_device_close: non-zero error_status: 0x{n:x}",
    "Out of memory: Killed process {n} (python3) total-vm:83886080kB, anon-rss:8388608kB",
    "INFO: task python3:{n} blocked for more than 120 seconds.",
    "watchdog: BUG: soft lockup - CPU#{c} stuck for 23s! [python3:{n}]",
    "rcu: INFO: rcu_preempt self-detected stall on CPU",
    "amdgpu 0000:{b:02x}:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq={n}, emitted seq={n}",
]
XIDS = [13, 31, 43, 48, 63, 74, 79, 94, 119]


def generate(path: Path, lines: int, seed: int, dense: bool) -> int:
    """Write a corpus; return how many lines are real errors."""
    rng = random.Random(seed)
    errors = 0
    with open(path, "w", encoding="utf-8") as out:
        for i in range(lines):
            roll = rng.random()
            n, c, b = rng.randrange(1, 99999), rng.randrange(0, 64), rng.randrange(0x10, 0xf0)
            if roll < 0.01:
                text = rng.choice(ERRORS).format(n=n, c=c % 8, b=b, xid=rng.choice(XIDS))
                errors += 1
            elif dense and roll < 0.41:
                text = rng.choice(ADJACENT).format(n=n % 256, c=c % 16, b=b)
            elif not dense and roll < 0.03:
                text = rng.choice(NEAR_MISS).format(n=n % 8)
            else:
                text = rng.choice(NOISE).format(n=n % 32, t=1700000000 + i)
            stamp = i * 0.001
            style = i % 4
            if style == 0:
                out.write(f"[{stamp:12.6f}] {text}\n")
            elif style == 1:
                out.write(f"[Mon Nov 30 04:{i // 60000 % 60:02d}:{i // 1000 % 60:02d} 2026] {text}\n")
            elif style == 2:
                out.write(f"Nov 30 04:{i // 60000 % 60:02d}:{i // 1000 % 60:02d} host kernel: [{stamp:12.6f}] {text}\n")
            else:
                out.write(f"6,{i},{int(stamp * 1e6)},-;{text}\n")
                if text.startswith(("nvidia 0000:", "pcieport 0000:", "vfio-pci 0000:", "amdgpu 0000:")):
                    out.write(f" SUBSYSTEM=pci\n DEVICE=+pci:{text.split(' ')[1].rstrip(':')}\n")
    return errors


def timed(command: list[str], capture: bool = False) -> tuple[float, str, str]:
    """Wall seconds, stdout (when ``capture``) and stderr of one run of ``command``."""
    start = time.perf_counter()
    proc = subprocess.run(command, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False, env=ENV)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{shlex.join(command)} failed with exit code {proc.returncode}: {proc.stderr.strip()}")
    return elapsed, proc.stdout or "", proc.stderr


def peak_rss_mib(stderr: str) -> float:
    """The VmHWM the logscan runner printed for itself (its own peak, not the forking parent's)."""
    return int(stderr.rsplit("VmHWM:", 1)[1].split()[0]) / 1024


# `tpuwatch logscan`, then the process's own peak resident memory on stderr.
LOGSCAN = [sys.executable, "-c", ("import argparse, sys\n"
                                  "from tpuwatch.config import Config\nfrom tpuwatch.kernel_log import logscan\n"
                                  "p = argparse.ArgumentParser(); logscan.add_arguments(p)\n"
                                  "code = logscan.run(p.parse_args(sys.argv[1:]), Config())\n"
                                  "sys.stderr.write(open('/proc/self/status').read())\n"
                                  "sys.exit(code)")]
# The daemon's path: the file followed from its start (a saved position at offset 0) and read to its end through
# the collector's reader; prints records, events (rule, severity, pci, xid, message, hashed) and seconds.
DAEMON_PATH = [sys.executable, "-c", (
    "import hashlib, json, os, sys, time, tempfile\n"
    "from tpuwatch.kernel_log.filesource import FileSource\nfrom tpuwatch.kernel_log.reader import LogReader\n"
    "from tpuwatch.kernel_log.rulefile import load_rules\n"
    "path = sys.argv[1]; st = os.stat(path)\n"
    "state = os.path.join(tempfile.mkdtemp(), 'file.json')\n"
    "open(state, 'w').write(json.dumps({'path': path, 'dev': st.st_dev, 'ino': st.st_ino, 'offset': 0}))\n"
    "source = FileSource(path, state); reader = LogReader(source, load_rules([]), lambda pci: None)\n"
    "digest = hashlib.sha256(); events = 0\nstart = time.perf_counter()\n"
    "while True:\n"
    "    for e in reader.read():\n"
    "        events += 1; digest.update(repr((e.rule, e.severity, e.pci, e.xid, e.message)).encode())\n"
    "    if source.caught_up: break\n"
    "print(reader.records, events, time.perf_counter() - start, digest.hexdigest())")]


def logscan_digest(output: str) -> str:
    """The hash of logscan's events as the daemon's path hashes its own."""
    digest = hashlib.sha256()
    for event in json.loads(output)["events"]:
        digest.update(repr((event["rule"], event["severity"], event["pci"], event.get("xid"),
                            event["message"])).encode())
    return digest.hexdigest()


def measure(path: Path, repeats: int, pin: list[str], grep: str, patterns: list[str]) -> dict[str, float]:
    """The daemon's path, logscan and grep on one corpus.  Their runs take turns, so that a slow phase of a shared
    machine slows each of them alike."""
    grep_command = pin + [grep, "-E", "-c", *[a for p in patterns for a in ("-e", p)], str(path)]
    scans, feeds, greps = [], [], []
    for _ in range(repeats):
        scans.append(timed(pin + LOGSCAN + [str(path), "--json"], True))
        feeds.append(timed(pin + DAEMON_PATH + [str(path)], True)[1].split())
        greps.append(timed(grep_command, capture=True))
    records, feed_events, _, feed_digest = feeds[0]
    with open(path, "rb") as file:
        lines = sum(block.count(b"\n") for block in iter(lambda: file.read(1 << 20), b""))
    return {"scan_s": min(s[0] for s in scans), "feed_s": min(float(f[2]) for f in feeds),
            "events": scans[0][1].count('"rule": '), "feed_events": int(feed_events), "records": int(records),
            "agree": logscan_digest(scans[0][1]) == feed_digest, "rss": max(peak_rss_mib(s[2]) for s in scans),
            "logscan_lines": json.loads(scans[0][1])["lines"], "grep_s": min(g[0] for g in greps),
            "grep_lines": int(greps[0][1].strip()), "lines": lines}


def row(name: str, m: dict[str, float], startup: float) -> str:
    """The table rows of one corpus."""
    lines, scan, feed = m["lines"], m["scan_s"], m["feed_s"]
    return "\n".join([
        f"| {name}: the daemon's path (a followed file through `LogReader`) | {feed:.2f} s | "
        f"{m['records'] / feed:,.0f} records/s | {m['grep_s'] / feed:.2f}x | - | {m['feed_events']:,.0f} events |",
        f"| {name}: `tpuwatch logscan --json` | {scan:.2f} s | {lines / scan:,.0f} "
        f"({lines / (scan - startup):,.0f} after startup) | {m['grep_s'] / scan:.2f}x | {m['rss']:.1f} MiB | "
        f"{m['events']:,.0f} events |",
        f"| {name}: `grep -E -c` | {m['grep_s']:.2f} s | {lines / m['grep_s']:,.0f} | 1 | - | "
        f"{m['grep_lines']:,.0f} matching lines |"])


def main() -> int:
    """Generate, measure, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="100,000 lines, one run each: figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args()
    lines = 100_000 if args.quick else args.lines
    repeats = 1 if args.quick else 5
    grep = shutil.which("grep")
    if grep is None:
        raise SystemExit("grep is required")
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    rules = load_rules([]).rules
    patterns = [to_ere(r.regex.pattern) for r in rules] + [to_ere(r.follow.regex.pattern) for r in rules if r.follow]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp, "empty.log")
        empty.write_bytes(b"")
        startup = min(timed(pin + LOGSCAN + [str(empty), "--json"])[0] for _ in range(max(repeats, 3)))
        for name, dense in (("busy host", False), ("keyword-dense", True)):
            path = Path(tmp, f"{'dense' if dense else 'busy'}.log")
            errors = generate(path, lines, args.seed, dense)
            results[name] = measure(path, repeats, pin, grep, patterns)
            results[name]["errors"] = errors
            results[name]["mb"] = path.stat().st_size / 1e6
        busy = Path(tmp, "busy.log")
        triple = Path(tmp, "triple.log")
        with open(triple, "wb") as out:
            for _ in range(3):
                out.write(busy.read_bytes())
        scan_triple = timed(pin + LOGSCAN + [str(triple), "--json"])
    for name, m in results.items():
        print(f"{name}: daemon's path {m['records'] / m['feed_s']:,.0f} records/s; logscan "
              f"{m['lines'] / m['scan_s']:,.0f} lines/s ({m['lines'] / (m['scan_s'] - startup):,.0f} after "
              f"{startup:.2f} s startup); grep -E {m['lines'] / m['grep_s']:,.0f} lines/s; events {m['events']:,.0f} "
              f"(daemon's path {m['feed_events']:,.0f}, the same: {m['agree']}), grep lines {m['grep_lines']:,.0f}, "
              f"error lines {m['errors']:,}", file=sys.stderr)
    command = "python benchmarks/kernel_log.py" + (" --quick" if args.quick else "") + (
        f" --lines {args.lines}" if args.lines != 1_000_000 else "")
    busy_m, dense_m = results["busy host"], results["keyword-dense"]
    path_met = busy_m["records"] / busy_m["feed_s"] >= 250_000
    scan_met = all(m["grep_s"] / m["scan_s"] >= 0.4 for m in results.values())
    report = f"""## Kernel log: the daemon's path and logscan beside grep

{"**Quick run: figures not to quote.**" if args.quick else ""}
`{command}` on {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, {
        subprocess.run([grep, "-V"], capture_output=True, text=True, check=True).stdout.splitlines()[0]},
{datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}, git {_git_head()}. Two generated logs of {lines:,}
records each in dmesg `[seconds]`, `-T`, syslog and raw kmsg forms (kmsg records of PCI devices with their
`SUBSYSTEM=`/`DEVICE=` lines), about 1% real error lines of every family: a busy host ({busy_m['lines']:,} lines,
{busy_m['mb']:.0f} MB: everyday noise, 2% near misses) and a keyword-dense host ({dense_m['lines']:,} lines,
{dense_m['mb']:.0f} MB: 40% NVRM, AER, EDAC, mce, amdgpu and vfio banner and detail lines that share words with
the rules). Each pinned to one core ({"taskset -c 0" if pin else "not pinned: no taskset"}), best of {repeats},
in the same run, the runs of each kind taking turns. The daemon's path: the file followed from its start by the
daemon's `FileSource` and read to its end through `LogReader`, the reader of the daemon's collector (records/s,
timed in the process, Python's start and the imports left out). logscan: the wall time of the whole command,
Python's start and imports included ({startup:.2f} s on an empty file; the rate after it is in brackets), the
same path writing JSON. Pure Python: there is no native code.

| | Time | Lines/s | Speed vs grep | Peak RSS | Found |
|---|---|---|---|---|---|
{row("busy host", busy_m, startup)}
{row("keyword-dense", dense_m, startup)}

grep counts every line that a rule's regex or follow regex matches; the daemon's path and logscan count one
event per fault (an AER message's detail lines, a machine check's notice, a TPU chip's reset chain are not events
again) and give the same events (rule, severity, PCI address, Xid and message, hashed: the script fails
otherwise). Peak RSS of logscan on the busy log written three times over ({3 * busy_m['lines']:,} lines):
{peak_rss_mib(scan_triple[2]):.1f} MiB in {scan_triple[0]:.2f} s (memory does not grow with the file: 256 KiB
blocks, events streamed). Targets: the daemon's path >= 250,000 records/s on the busy log: {"met" if path_met
else "**not met**"}; logscan >= 0.4x grep's speed on both logs: {"met" if scan_met else "**not met**"}.
"""
    write_section("kernel_log", report, args.output)
    agree = all(m["agree"] and m["events"] == m["feed_events"] and m["logscan_lines"] == m["lines"]
                for m in results.values())
    return 0 if agree else 1


def _git_head() -> str:
    """The checkout's short commit, with + when it has changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


if __name__ == "__main__":
    raise SystemExit(main())
