"""The probe benchmark's flood: hostile senders (malformed, oversized, not the holder, beyond the rate limit,
slow connections) in child processes beside the holder's own reports, and what the daemon did through it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from probe_base import (
    FLOOD_SHARES,
    FLOOD_THREADS,
    NOBODY,
    OVERSIZED_BYTES,
    REPORTS_PER_MINUTE,
    ROTATE,
    BenchmarkError,
    progress,
)
from probe_daemon import Daemon, Window, holder_exchange, observe, probe_counts, settled

# One kind of hostile sender (standard library only; drops to the uid it is given, 65534 for the hostile kinds).
FLOODER = r'''
import ctypes, json, os, signal, socket, sys, threading, time
spec = json.loads(sys.argv[1])
payloads = [p.encode("latin-1") for p in json.loads(sys.stdin.read())]
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
def die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
die_with_parent()
def send(data):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(spec["timeout"])
            conn.connect(spec["path"])
            if data:
                try:
                    conn.sendall(data)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # closed by the daemon first (oversized): its answer may be there still
            answer = b""
            while b"\n" not in answer:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                answer += chunk
    except socket.timeout:
        return "no_answer"
    except OSError as exc:
        return type(exc).__name__
    try:
        doc = json.loads(answer.split(b"\n", 1)[0])
    except ValueError:
        return "no_answer"
    return "accepted" if doc.get("accepted") else str(doc.get("reason"))
def run(first, count, start, end):
    counts, lock, index = {}, threading.Lock(), [first]
    def sender():
        while time.monotonic() < end:
            if spec["rate"]:
                with lock:
                    i = index[0]
                    if i >= first + count:
                        return
                    index[0] += 1
                delay = start + i / spec["rate"] - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if time.monotonic() >= end:
                    return
                reason = send(payloads[i % len(payloads)])
            else:
                reason = send(b"")  # slow: connects, sends nothing, waits for the daemon to give up
            with lock:
                counts[reason] = counts.get(reason, 0) + 1
    threads = [threading.Thread(target=sender) for _ in range(spec["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts
start = time.monotonic()
end = start + spec["seconds"]
total, done, pids = {}, 0, 1
limit = int(spec["seconds"] * spec["rate"]) if spec["rate"] else 0
if spec["rotate"]:
    while done < limit and time.monotonic() < end:
        count = min(spec["rotate"], limit - done)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            die_with_parent()
            os.write(write_end, json.dumps(run(done, count, start, end)).encode())
            os._exit(0)
        os.close(write_end)
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
        os.close(read_end)
        os.waitpid(pid, 0)
        for reason, n in json.loads(data or b"{}").items():
            total[reason] = total.get(reason, 0) + n
        done, pids = done + count, pids + 1
else:
    total = run(0, limit, start, end)
print(json.dumps({"counts": total, "seconds": time.monotonic() - start, "pids": pids}))
'''




@dataclass
class Sender:
    """One hostile sender process and what it said at the end."""

    kind: str
    rate: float | None
    process: subprocess.Popen[str]
    result: dict[str, Any] = field(default_factory=dict)


def flood_payloads(report: dict[str, Any]) -> dict[str, list[str]]:
    """The reports each kind of sender sends (latin-1 text, one line each)."""
    line = json.dumps(report, separators=(",", ":"))
    bad_fingerprint = json.dumps({**report, "results": [{**r, "fingerprint": "nothex"} for r in report["results"]]})
    return {
        "malformed": ["{not json\n", "[]\n", '{"version": 2}\n', "[" * 200 + "\n", bad_fingerprint + "\n",
                      line[: len(line) // 2] + "\n", "\x00\xff\xfe garbage\n"],
        "oversized": ['{"version":1,"pad":"' + "x" * OVERSIZED_BYTES + '"}\n'],
        "not_holder": [line + "\n"],
        "beyond_limit": [line + "\n"],
        "slow": [""],
    }


def start_senders(daemon: Daemon, report: dict[str, Any], rate: float, seconds: float, slow: int) -> list[Sender]:
    """Start the hostile senders (from the main thread: their parent-death signal follows this thread)."""
    payloads = flood_payloads(report)
    root = os.geteuid() == 0
    plan: list[tuple[str, float | None, int, int | None, int]] = [
        (kind, rate * share, FLOOD_THREADS, None if kind == "beyond_limit" or not root else NOBODY,
         0 if kind == "beyond_limit" else ROTATE)
        for kind, share in FLOOD_SHARES.items() if root or kind != "not_holder"]
    if slow:
        plan.append(("slow", None, slow, NOBODY if root else None, 0))
    senders = []
    for kind, kind_rate, threads, uid, rotate in plan:
        spec = {"path": daemon.socket, "rate": kind_rate, "seconds": seconds, "threads": threads, "uid": uid,
                "rotate": rotate, "timeout": 10.0}
        process = subprocess.Popen([sys.executable, "-c", FLOODER, json.dumps(spec)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="latin-1")
        senders.append(Sender(kind, kind_rate, process))
    for sender in senders:
        assert sender.process.stdin is not None
        sender.process.stdin.write(json.dumps(payloads[sender.kind]))
        sender.process.stdin.close()
        sender.process.stdin = None  # communicate() later reads the tally only
    return senders


def finish_senders(senders: list[Sender], seconds: float) -> None:
    """Wait for every sender's tally (each stops itself after ``seconds``)."""
    for sender in senders:
        try:
            out, err = sender.process.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            sender.process.kill()
            out, err = sender.process.communicate()
        if sender.process.returncode != 0 or not out.strip():
            raise BenchmarkError(f"the {sender.kind} sender failed ({sender.process.returncode}): {err[-2000:]}")
        sender.result = json.loads(out.strip().splitlines()[-1])


class HolderDuringFlood(threading.Thread):
    """The real holder (this process) sends one valid report a second while the flood runs."""

    def __init__(self, daemon: Daemon, report: dict[str, Any]) -> None:
        super().__init__(name="holder", daemon=True)
        self.daemon_ = daemon
        self.report = report
        self.stop = threading.Event()
        self.answers: Counter[str] = Counter()
        self.latencies: list[float] = []

    def run(self) -> None:
        """Until stopped: a report, then a second's pause."""
        while not self.stop.is_set():
            started = time.perf_counter()
            reason = holder_exchange(self.daemon_, self.report)
            self.latencies.append(time.perf_counter() - started)
            self.answers[reason] += 1
            self.stop.wait(1.0)


@dataclass
class Flood:
    """Figure 3b."""

    seconds: float
    senders: list[Sender]
    before: Window
    during: Window
    server: Counter[str]
    holder: Counter[str]
    holder_latencies: list[float]
    after: str
    after_latency: float
    slow: int

    def attempts(self, sender: Sender) -> int:
        """Connections the sender made."""
        return int(sum(sender.result.get("counts", {}).values()))

    @property
    def rate(self) -> float:
        """Reports a second over all senders."""
        return sum(self.attempts(s) / max(s.result.get("seconds", self.seconds), 1e-9) for s in self.senders)

    @property
    def clients(self) -> Counter[str]:
        """The answers every sender and the holder got, by reason."""
        total: Counter[str] = Counter(self.holder)
        for sender in self.senders:
            total.update(sender.result.get("counts", {}))
        return total


def flood(daemon: Daemon, report: dict[str, Any], args: argparse.Namespace, senders: list[Sender]) -> Flood:
    """Figure 3b: scrapes before the flood, then the flood with scrapes, the holder's reports during and after."""
    progress(f"daemon: {args.baseline:g} s of scrapes before the flood")
    before = observe(daemon, args.baseline)
    samples = settled(daemon, before)
    counts0 = probe_counts(samples)
    progress(f"daemon: flood at {args.flood_rate:g}/s for {args.flood_seconds:g} s, {args.slow} slow connections")
    senders += start_senders(daemon, report, args.flood_rate, args.flood_seconds, args.slow)
    holder = HolderDuringFlood(daemon, report)
    holder.start()
    during = observe(daemon, args.flood_seconds + 30, until=lambda: all(s.process.poll() is not None for s in senders))
    holder.stop.set()
    holder.join(5)
    finish_senders(senders, args.flood_seconds)
    time.sleep(max(0.2, 60 / REPORTS_PER_MINUTE))  # a token back in the holder's bucket
    started = time.perf_counter()
    after_reason = holder_exchange(daemon, report)
    after_latency = time.perf_counter() - started
    daemon.ensure_alive()
    samples = settled(daemon, during)
    progress(f"daemon: cycle gaps during the flood {[round(g, 2) for g in during.gaps()]}, window "
             f"{[round(t - during.unix[0], 2) for t in during.cycles()]} of {during.unix[1] - during.unix[0]:.2f} s")
    server = probe_counts(samples)
    server.subtract(counts0)
    server[after_reason] -= 1  # not the flood's
    return Flood(during.seconds, senders, before, during, +server, holder.answers, holder.latencies, after_reason,
                 after_latency, args.slow)
