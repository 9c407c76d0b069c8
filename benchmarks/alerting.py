#!/usr/bin/env python3
"""Measure alert delivery beside Debian's prometheus-alertmanager and write the alerting section of BENCHMARKS.md.

Usage::

    python benchmarks/alerting.py [--trials 40] [--outages 10,50,600] [--burst 2000] [--output BENCHMARKS.md]

1. Latency beyond group_wait (1 s on both): tpuwatch, from ``evaluate()``
   seeing a new uncorrectable ECC error to the webhook POST arriving; the
   anchor, Alertmanager, from POST /api/v2/alerts of a fresh alert to its
   webhook POST.  Median and p99 over ``--trials`` new alert groups each.
2. Outbox throughput: ``--burst`` notifications queued in one go, time until a
   recording webhook has them all (and the queueing rate alone).
3. Backlog after an outage, for each of ``--outages`` (10 s, 50 s, 10 min), of the webhook and then of a real
   Alertmanager (killed and restarted; from its restart to it holding every alert):
   the webhook answers 500 while a new alert group fires every 2 s (every
   fifth a critical page, the rest warnings), with the default retry, backoff
   and circuit-breaker settings; then the time from recovery to the first
   delivery and to the first critical one, until the queue is empty, whether
   every alert arrived and whether the pages came first; and how many
   requests the dead receiver got after the circuit opened.

Only the section between ``<!-- alerting:begin -->`` and
``<!-- alerting:end -->`` of the output file is rewritten.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import requests
import yaml

from common import BENCHMARKS_MD, REPO_ROOT, cpu_model, write_section

sys.path.insert(0, str(REPO_ROOT / "tests"))

from alertmanager import RealAlertmanager  # noqa: E402

from tpuwatch import config as config_module  # noqa: E402
from tpuwatch.alerting import Alerting  # noqa: E402
from tpuwatch.alerting.db import Notification  # noqa: E402
from tpuwatch.samples import Sample, sample  # noqa: E402

from conftest import wait_until  # noqa: E402
from http_receiver import Receiver  # noqa: E402

GROUP_WAIT_S = 1.0


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_alerting(workdir: Path, url: str, **alerting: object) -> Alerting:
    config = config_module.parse(yaml.safe_dump({
        "state_dir": str(workdir), "alerting": {"rule_files": [], "group_wait": "1s", **alerting},
        "notify": [{"name": "hook", "type": "webhook", "url": url}]}))
    return Alerting(config, config.state_dir)


def ecc(device: int, value: float, earlier: int = 0) -> list[Sample]:
    """``value`` uncorrectable errors on ``device``, and 1 on each of the ``earlier`` devices."""
    return [sample("tpuwatch_device_ecc_errors_total", value if d == device else 1, device=str(d),
                   kind="uncorrected") for d in range(earlier)] + [
        sample("tpuwatch_device_ecc_errors_total", value, device=str(device), kind="uncorrected")]


def mixed(fired: int, on: bool) -> list[Sample]:
    """Alerts on devices 0..fired: every fifth an uncorrectable ECC error (critical), the rest a pending memory
    repair (warning); ``on``: device ``fired``'s too (else its counter is seen at 0 first)."""
    out = []
    for d in range(fired + 1):
        active = d < fired or on
        critical = d % 5 == 0
        out.append(sample("tpuwatch_device_ecc_errors_total", 1 if active and critical else 0, device=str(d),
                          kind="uncorrected"))
        out.append(sample("tpuwatch_device_memory_repair_pending", 1 if active and not critical else 0,
                          device=str(d)))
    return out


def evaluate_cost(workdir: Path, cycles: int = 2000) -> tuple[float, int]:
    """CPU milliseconds of one evaluate() over 8 healthy simulated chips' samples, all built-in rules."""
    from tpuwatch.registry import build_collectors
    from tpuwatch.sampler import Sampler
    from tpuwatch.store import SeriesStore

    config = config_module.parse(yaml.safe_dump({"state_dir": str(workdir), "alerting": {"rule_files": []},
                                                 "devices": {"backend": "sim", "sim": {"count": 8}},
                                                 "kernel_log": {"source": "none"}, "canary": {"enabled": False}}))
    store = SeriesStore(360, 10_000)
    Sampler([list(build_collectors(config))], store, 5.0).run_once()
    samples = store.current()
    alerting = Alerting(config, config.state_dir)
    now = time.time()
    started = time.process_time()
    for i in range(cycles):
        alerting.evaluate(samples, now + 10 * i)
    return (time.process_time() - started) / cycles * 1000, len(samples)


def tpuwatch_latency(workdir: Path, trials: int) -> list[float]:
    hook = Receiver()
    alerting = make_alerting(workdir, hook.url())
    alerting.start()
    delays = []
    try:
        for i in range(trials):
            alerting.evaluate(ecc(i, 0))
            fired = time.time()
            alerting.evaluate(ecc(i, 1), fired)
            wait_until(lambda n=i + 1: len(hook.requests) == n, 10, "the webhook POST")
            delays.append(hook.requests[i]["at"] - fired - GROUP_WAIT_S)
    finally:
        alerting.stop()
        hook.close()
    return delays


def alertmanager_latency(workdir: Path, trials: int) -> tuple[list[float], str]:
    hook = Receiver()
    am = RealAlertmanager(workdir, hook.url(), binary=alertmanager_binary(),
                          route={"group_wait": "1s", "group_interval": "5m", "repeat_interval": "4h"})
    delays = []
    try:
        am.start(20)
        for i in range(trials):
            fired = time.time()
            stamp = datetime.fromtimestamp(fired, timezone.utc).isoformat()
            requests.post(f"{am.url}/api/v2/alerts", timeout=5, json=[
                {"labels": {"alertname": "AcceleratorEccUncorrectable", "device": str(i)}, "startsAt": stamp}])
            wait_until(lambda n=i + 1: len(hook.requests) == n, 10, "alertmanager's webhook POST")
            delays.append(hook.requests[i]["at"] - fired - GROUP_WAIT_S)
    finally:
        am.stop()
        hook.close()
    return delays, am.version()


def throughput(workdir: Path, burst: int) -> tuple[float, float]:
    hook = Receiver()
    alerting = make_alerting(workdir, hook.url())
    body = '{"version": "4", "alerts": []}'
    started = time.perf_counter()
    for _ in range(burst):
        alerting.db.enqueue([Notification("hook", (body,))], time.time())
    queued = time.perf_counter() - started
    started = time.perf_counter()
    alerting.start()
    wait_until(lambda: len(hook.requests) == burst, 300, "the burst")
    delivered = time.perf_counter() - started
    alerting.stop()
    hook.close()
    return burst / queued, burst / delivered


def outage(workdir: Path, seconds: float) -> dict[str, float]:
    hook = Receiver("error")
    alerting = make_alerting(workdir, hook.url())
    alerting.start()
    fired = 0
    started = time.time()
    end = started + seconds
    opened_at: float | None = None
    attempts_at_open = 0
    try:
        while time.time() < end:
            alerting.evaluate(mixed(fired, False))
            alerting.evaluate(mixed(fired, True))
            fired += 1
            while time.time() < min(end, started + 2.0 * fired):
                if opened_at is None and alerting.delivery.breakers["hook"].is_open:
                    opened_at, attempts_at_open = time.time(), hook.attempts
                time.sleep(0.05)
        wait_until(lambda: alerting.db.queue_stats().get("hook", (0, 0))[0] == fired, 30, "all queued")
        oldest = time.time() - alerting.db.queue_stats()["hook"][1]
        dead_attempts = hook.attempts - attempts_at_open if opened_at is not None else 0
        dead_s = time.time() - opened_at if opened_at is not None else 0.0
        progress(f"outage over: {fired} notifications queued, oldest {oldest:.0f} s; "
                 f"{hook.attempts} attempts, {dead_attempts} in the {dead_s:.0f} s the circuit was open; receiver back")
        hook.mode = "record"
        back = time.time()
        wait_until(lambda: len(hook.requests) >= fired, 3600, "the backlog")
        drained = time.time() - back
        bodies = hook.json()
        told = [(a["labels"]["device"], a["labels"]["severity"]) for body in bodies for a in body["alerts"]]
        first = hook.requests[0]["at"] - back
        first_critical = next(r["at"] for r, b in zip(hook.requests, bodies)
                              if any(a["labels"]["severity"] == "critical" for a in b["alerts"])) - back
        pages = sum(1 for _, severity in told if severity == "critical")
        critical_first = all(severity == "critical" for _, severity in told[:pages])
    finally:
        alerting.stop()
        hook.close()
    return {"seconds": seconds, "queued": fired, "oldest_s": oldest, "first_s": first,
            "first_critical_s": first_critical, "drained_s": drained,
            "delivered_distinct": len({device for device, _ in told}), "pages": pages,
            "critical_first": critical_first, "attempts": hook.attempts, "dead_attempts": dead_attempts,
            "dead_s": dead_s}


def alertmanager_binary() -> str:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        raise SystemExit("prometheus-alertmanager is needed (apt-get install prometheus-alertmanager)")
    return binary


def alertmanager_outage(workdir: Path, seconds: float) -> dict[str, float]:
    """tpuwatch's alertmanager receiver against a real Alertmanager killed for ``seconds`` while an alert group
    fires every 2 s; from its restart (ready) to it holding every alert."""
    am = RealAlertmanager(workdir / "am", binary=alertmanager_binary())
    am.start()
    am.stop()  # down from the first alert on
    config = config_module.parse(yaml.safe_dump({
        "state_dir": str(workdir), "alerting": {"rule_files": [], "group_wait": "1s"},
        "notify": [{"name": "am", "type": "alertmanager", "url": am.url}]}))
    alerting = Alerting(config, config.state_dir)
    alerting.start()
    fired = 0
    started = time.time()
    end = started + seconds
    try:
        while time.time() < end:
            alerting.evaluate(mixed(fired, False))
            alerting.evaluate(mixed(fired, True))
            fired += 1
            time.sleep(max(0.0, min(end, started + 2.0 * fired) - time.time()))
        opened = alerting.delivery.breakers["am"].is_open
        back = am.start()
        progress(f"alertmanager outage over: {fired} alerts, circuit {'open' if opened else 'closed'}; it is back")
        wait_until(lambda: len(am.held()) >= fired, 600, "alertmanager holding every alert")
        held = time.time() - back
        critical = sum(1 for a in am.held() if a["labels"]["severity"] == "critical")
    finally:
        alerting.stop()
        am.stop()
    return {"seconds": seconds, "fired": fired, "held_s": held, "circuit_open": opened, "critical": critical}


def outage_name(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def machine() -> str:
    return f"{os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--outages", default="10,50,600",
                        help="receiver outages in seconds, comma-separated (issue #47: 10, 50 and 600)")
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    parser.add_argument("--no-alertmanager-outages", action="store_true",
                        help="skip the outages of a real Alertmanager (the webhook's are measured still)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run (benchmarks/run.py --quick): 5 trials, one 3 s outage, 200 notifications; "
                             "writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.outages, args.burst = 5, "3", 200
    command = "python benchmarks/alerting.py " + shlex.join(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="tpuwatch-bench-") as tmp:
        work = Path(tmp)
        progress(f"latency: {args.trials} alert groups through tpuwatch")
        ours = tpuwatch_latency(work / "latency", args.trials)
        progress(f"latency: {args.trials} alert groups through Alertmanager (anchor)")
        theirs, am_version = alertmanager_latency(work, args.trials)
        progress(f"throughput: {args.burst} notifications")
        queue_rate, deliver_rate = throughput(work / "burst", args.burst)
        progress("evaluate() cost")
        evaluate_ms, n_samples = evaluate_cost(work / "evaluate")
        outages = []
        for i, seconds in enumerate(float(x) for x in args.outages.split(",")):
            progress(f"outage: {seconds:g} s")
            outages.append(outage(work / f"outage{i}", seconds))
        am_outages = []
        if not args.no_alertmanager_outages:
            for i, seconds in enumerate(float(x) for x in args.outages.split(",")):
                progress(f"alertmanager outage: {seconds:g} s")
                am_outages.append(alertmanager_outage(work / f"am-outage{i}", seconds))
    ms = 1000.0
    outage_rows = "\n".join(
        f"| {outage_name(o['seconds'])} outage: recovery to first delivery / first critical / queue empty "
        f"({o['queued']} queued, {o['pages']} critical) | {o['first_s']:.1f} s / {o['first_critical_s']:.1f} s / "
        f"{o['drained_s']:.1f} s | | | <= 30 s |" for o in outages)
    outage_rows += "\n" + "\n".join(
        f"| {outage_name(o['seconds'])} outage: distinct alerts delivered; critical first | "
        f"{o['delivered_distinct']} of {o['queued']}; {'yes' if o['critical_first'] else 'NO'} | | | all; yes |"
        for o in outages)
    outage_rows += "\n" + "\n".join(
        f"| {outage_name(o['seconds'])} outage: requests while the circuit was open | {o['dead_attempts']} in "
        f"{o['dead_s']:.0f} s | | | <= 1 per 30 s |" for o in outages if o["dead_s"] > 0)
    outage_rows += "".join(
        f"\n| {outage_name(o['seconds'])} Alertmanager outage: its restart to it holding all {o['fired']} alerts "
        f"({o['critical']} critical; circuit {'open' if o['circuit_open'] else 'closed'} when it came back) | "
        f"{o['held_s']:.1f} s | | | <= 30 s |" for o in am_outages)
    outage_notes = " ".join(f"{outage_name(o['seconds'])}: {o['attempts']} HTTP attempts in all." for o in outages)
    med_ours, p99_ours = statistics.median(ours) * ms, percentile(ours, 0.99) * ms
    med_am, p99_am = statistics.median(theirs) * ms, percentile(theirs, 0.99) * ms
    text = f"""## Alert delivery

Machine: {machine()}. Anchor: {am_version} (Debian), same run.
Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. Command: `{command}`.

| Figure | tpuwatch | Alertmanager (anchor) | Ratio | Target |
|---|---|---|---|---|
| Latency beyond group_wait (1 s), median | {med_ours:.1f} ms | {med_am:.1f} ms | {med_ours / med_am:.2f}x \
| <= 1000 ms |
| Latency beyond group_wait (1 s), p99 | {p99_ours:.1f} ms | {p99_am:.1f} ms | {p99_ours / p99_am:.2f}x | <= 1000 ms |
| CPU per `evaluate()` ({n_samples} samples of 8 simulated chips, built-in rules) | {evaluate_ms:.3f} ms | | | |
| Outbox: queueing rate (one SQLite transaction each) | {queue_rate:.0f}/s | | | |
| Outbox: delivery rate to one webhook (in order, one at a time) | {deliver_rate:.0f}/s | | | |
{outage_rows}

tpuwatch latency: `Alerting.evaluate()` sees the error counter rise (rule
AcceleratorEccUncorrectable, `for: 0s`) to the recording webhook on 127.0.0.1
receiving the POST; each trial is a new group (new device).  Alertmanager:
POST /api/v2/alerts of a fresh alert to its webhook POST.  Both use
group_wait 1 s; figures are what is left after it.

Outages: the webhook answers 500 while a new alert group fires every 2 s (every
fifth an uncorrectable ECC error, critical; the rest a pending memory repair,
warning), with the default retry (1 s doubling to 30 s, jitter) and circuit
breaker (open after 5 consecutive failures; while open, one trial, the most
urgent message, every 30 s).  "Recovery to delivery" is from the receiver
answering again to its first POST arriving; the bound is one trial period
(30 s).  "While open" counts the requests the dead receiver got after the
circuit opened: one per 30 s, no flood.  The same outages of a real
Alertmanager (killed, then started again on its port; tpuwatch's
`alertmanager` receiver re-sends every active alert each minute): from its
restart answering ready to it holding every alert tpuwatch had fired.

{outage_notes}
"""
    if args.quick:
        print(text)
        return 0
    write_section("alerting", text, args.output)
    progress(f"wrote the alerting section of {args.output}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
