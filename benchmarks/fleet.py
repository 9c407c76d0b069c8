#!/usr/bin/env python3
"""A fleet rehearsal: simulated hosts as Kubernetes node agents, scraped by Prometheus, paging through Alertmanager.

Usage::

    python benchmarks/fleet.py [--hosts 20] [--chips 8] [--failing 5] [--limit 10%] [--quick] [--output BENCHMARKS.md]

``--hosts`` tpuwatch daemons (``devices.backend: sim``, ``--chips`` chips each) run on loopback, each the
node agent of its own Node in one stand-in API server (tests/k8s_apiserver.py), with a taint ladder on
``AcceleratorHardwareProblem`` behind ``max_unhealthy_nodes: --limit`` over the nodes in scope.  Debian's
Prometheus scrapes them (and one node_exporter, the anchor) with alerts/*.rules.yml loaded and sends to
Debian's Alertmanager, which groups by (instance, device) and posts critical alerts to a recording "pager"
webhook, the rest to a "chat" one.  Host 0 runs the sdc scenario with the canary on (its chip 5 computes
wrong numbers; the canary runs on that host only, for the CPU of this machine); hosts 1..``--failing`` get
an uncorrectable ECC error on chip 0 at the same moment.

Measured: pages per (host, chip) (a page is one Alertmanager group, as PagerDuty deduplicates on its key),
the time from a fault being visible on the daemon's /metrics to the page, to the node condition and to the
taint; how many failing hosts were tainted and how many held back; Prometheus's series per host against
node_exporter's, and its rule-evaluation time per host; API server requests per node; the daemons' CPU and
memory.  Only the ``fleet`` section of the output file is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
import yaml

from common import BENCHMARKS_MD, REPO_ROOT, checkout_env, cpu_model, write_section

sys.path.insert(0, str(REPO_ROOT / "tests"))

from k8s_apiserver import ApiServer  # noqa: E402

from conftest import DaemonProcess, free_port, stop_process, wait_until  # noqa: E402
from http_receiver import Receiver  # noqa: E402

NAMESPACE = "monitoring"


@dataclass
class Spec:
    """The rehearsal's size and pace."""

    hosts: int = 20
    chips: int = 8
    failing: int = 5
    limit: str = "10%"
    interval: str = "10s"
    scrape: str = "15s"
    group_wait: str = "10s"
    fault_after: float = 90.0
    settle: float = 60.0
    timeout: float = 900.0

    @property
    def sdc_chip(self) -> str:
        """The chip that computes wrong numbers: 5, or the last on smaller hosts."""
        return str(min(5, self.chips - 1))


@dataclass
class Event:
    """One fault: where, and when each stage saw it."""

    host: int
    chip: str
    kind: str
    visible: float | None = None
    condition: float | None = None
    taint: float | None = None
    page: float | None = None


@dataclass
class Result:
    """What the rehearsal found."""

    events: list[Event]
    pages: Counter[tuple[str, str]]
    notifications: int
    warnings: int
    tainted: list[str]
    held_back: list[str]
    held_back_alerts: int
    series_per_host: float
    node_exporter_series: int
    rule_seconds: dict[str, float]
    api_requests: int
    cpu_seconds: float
    rss_bytes: list[int]
    wall: float
    notes: list[str] = field(default_factory=list)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _service(args: list[str], log: Path, ready: str) -> subprocess.Popen[bytes]:
    """A service started and ready; if it exits or is not ready in time, the error carries its log's end."""
    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    name = Path(args[0]).name

    def is_ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        return requests.get(ready, timeout=2).status_code == 200

    try:
        wait_until(is_ready, timeout=60, what=f"{name} at {ready}")
    except AssertionError as exc:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{exc}\n{name}'s log ends: {log.read_text(errors='replace')[-2000:]}") from None
    return proc


def _proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    rss = next((int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS")), 0)  # 0: it has exited
    return (int(fields[11]) + int(fields[12])) / ticks, rss


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None


def _daemon_config(spec: Spec, index: int, kubeconfig: Path) -> tuple[dict[str, Any], list[str]]:
    sim: dict[str, Any] = {"count": spec.chips, "seed": index, "fault_after": f"{spec.fault_after:g}s"}
    config: dict[str, Any] = {
        "interval": spec.interval, "kernel_log": {"source": "none"}, "canary": {"enabled": False},
        "devices": {"backend": "sim", "sim": sim},
        "kubernetes": {"node_conditions": True, "kubeconfig": str(kubeconfig), "max_unhealthy_nodes": spec.limit,
                       "node_selector": "pool=accel", "lease_namespace": NAMESPACE, "clear_after": "1h",
                       "remediation": [{"trigger": "AcceleratorHardwareProblem",
                                        "actions": [{"type": "taint", "effect": "NoSchedule"}]}]}}
    if index == 0:
        sim.update(fault_device=int(spec.sdc_chip), fault_after="0s")
        config["canary"] = {"enabled": True, "every": "1h", "jitter": "0s", "timeout": "300s"}
        return config, ["--simulate", "sdc"]
    if index <= spec.failing:
        return config, ["--simulate", "ecc-errors"]
    return config, []


def rehearse(spec: Spec, work: Path) -> Result:
    """Run the whole rehearsal in ``work``; everything started is stopped before it returns."""
    prometheus_bin, alertmanager_bin = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    exporter_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not (prometheus_bin and alertmanager_bin and exporter_bin):
        raise SystemExit("needs prometheus, prometheus-alertmanager and prometheus-node-exporter on PATH")
    pager, chat = Receiver("record"), Receiver("record")
    procs: list[subprocess.Popen[bytes]] = []
    daemons: list[DaemonProcess] = []
    api = ApiServer()
    try:
        for i in range(spec.hosts):
            api.add_node(f"host-{i}", {"pool": "accel"})
        kubeconfig = api.write_kubeconfig(work / "kubeconfig")
        am_port, prom_port, exporter_port = free_port(), free_port(), free_port()
        (work / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "chat", "group_by": ["instance", "device"], "group_wait": spec.group_wait,
                      "group_interval": "10s", "repeat_interval": "4h",
                      "routes": [{"matchers": ['severity="critical"'], "receiver": "pager"}]},
            "receivers": [{"name": "pager", "webhook_configs": [{"url": pager.url()}]},
                          {"name": "chat", "webhook_configs": [{"url": chat.url()}]}]}))
        procs.append(_service([alertmanager_bin, f"--config.file={work / 'alertmanager.yml'}",
                               f"--storage.path={work / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                               "--cluster.listen-address="], work / "alertmanager.log",
                              f"http://127.0.0.1:{am_port}/-/ready"))
        procs.append(_service([exporter_bin, f"--web.listen-address=127.0.0.1:{exporter_port}"],
                              work / "node_exporter.log", f"http://127.0.0.1:{exporter_port}/metrics"))
        progress(f"starting {spec.hosts} daemons with {spec.chips} chips each")
        started = time.time()
        for i in range(spec.hosts):
            (work / f"host-{i}").mkdir()
            config, args = _daemon_config(spec, i, kubeconfig)
            daemons.append(DaemonProcess(work / f"host-{i}", config, args=args, env={"NODE_NAME": f"host-{i}"}))
        for daemon in daemons:
            daemon.wait_ready()
        progress(f"daemons ready after {time.time() - started:.1f}s")
        instance = {i: f"127.0.0.1:{d.port}" for i, d in enumerate(daemons)}
        (work / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": spec.scrape, "evaluation_interval": spec.scrape},
            "rule_files": [str(p) for p in sorted((REPO_ROOT / "alerts").glob("*.rules.yml"))],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "tpuwatch", "static_configs": [{"targets": list(instance.values())}]},
                               {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}]}))
        prometheus = f"http://127.0.0.1:{prom_port}"
        procs.append(_service([prometheus_bin, f"--config.file={work / 'prometheus.yml'}",
                               f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                               f"--web.external-url={prometheus}"], work / "prometheus.log", f"{prometheus}/-/ready"))
        cpu0 = sum(_proc_stats(d.proc.pid)[0] for d in daemons)
        requests0, t0 = len(api.requests), time.time()
        events = [Event(0, spec.sdc_chip, "canary wrong result")] + [
            Event(i, "0", "uncorrectable ECC") for i in range(1, spec.failing + 1)]
        done_at = None
        deadline = time.monotonic() + spec.timeout
        while time.monotonic() < deadline:
            now = time.time()
            for event in events:
                _observe(event, daemons[event.host], api, pager, instance[event.host], now)
            if done_at is None and all(e.page and e.condition for e in events):
                done_at = time.monotonic()
                progress("every fault paged and on its node; settling")
            if done_at is not None and time.monotonic() - done_at >= spec.settle:
                break
            time.sleep(0.5)
        wall = time.time() - t0
        api_requests = len(api.requests) - requests0
        cpu = sum(_proc_stats(d.proc.pid)[0] for d in daemons) - cpu0
        rss = [_proc_stats(d.proc.pid)[1] for d in daemons]
        pages: Counter[tuple[str, str]] = Counter()
        keys: set[str] = set()
        for body in pager.json():
            if body["status"] == "firing" and body["groupKey"] not in keys:
                keys.add(body["groupKey"])
                labels = body["groupLabels"]
                pages[(labels.get("instance", ""), labels.get("device", ""))] += 1
        tainted = [name for name in api.nodes if api.taints(name)]
        held = [f"host-{i}" for i, d in enumerate(daemons)
                if _metric(requests.get(f"{d.url}/metrics", timeout=5).text,
                           "tpuwatch_kubernetes_remediation_held_back") == 1]
        firing = requests.get(f"{prometheus}/api/v1/query", timeout=10, params={
            "query": 'ALERTS{alertname="TpuwatchRemediationHeldBack",alertstate="firing"}'}).json()["data"]["result"]
        series = float(requests.get(f"{prometheus}/api/v1/query", timeout=10, params={
            "query": 'count({job="tpuwatch"})'}).json()["data"]["result"][0]["value"][1])
        node_series = int(float(requests.get(f"{prometheus}/api/v1/query", timeout=10, params={
            "query": 'count({job="node"})'}).json()["data"]["result"][0]["value"][1]))
        own = requests.get(f"{prometheus}/metrics", timeout=10).text
        rules = {line.split('rule_group="')[1].split('"')[0].rsplit(";", 1)[-1]: float(line.rsplit(" ", 1)[1])
                 for line in own.splitlines() if line.startswith("prometheus_rule_group_last_duration_seconds{")}
        by_instance = {v: f"host-{k}" for k, v in instance.items()}
        return Result(events, Counter({(by_instance.get(i, i), d): n for (i, d), n in pages.items()}),
                      len(pager.requests), len(chat.requests), sorted(tainted), held, len(firing),
                      series / spec.hosts, node_series, rules, api_requests, cpu, rss, wall)
    finally:
        for daemon in daemons:
            daemon.stop()
        for proc in reversed(procs):
            stop_process(proc)
        api.close()
        pager.close()
        chat.close()


def _observe(event: Event, daemon: DaemonProcess, api: ApiServer, pager: Receiver, instance: str, now: float) -> None:
    if event.visible is None:
        text = requests.get(f"{daemon.url}/metrics", timeout=5).text
        if event.host == 0:
            seen = _metric(text, "tpuwatch_canary_healthy", device=event.chip) == 0
        else:
            seen = (_metric(text, "tpuwatch_device_ecc_errors_total", device=event.chip, kind="uncorrected") or 0) > 0
        event.visible = now if seen else None
    node = f"host-{event.host}"
    kind = "AcceleratorComputeProblem" if event.host == 0 else "AcceleratorHardwareProblem"
    if event.condition is None and (api.condition(node, kind) or {}).get("status") == "True":
        event.condition = now
    if event.taint is None and api.taints(node):
        event.taint = now
    if event.page is None:
        for request in pager.requests:
            body = json.loads(request["body"])
            labels = body.get("groupLabels", {})
            if labels.get("instance") == instance and labels.get("device") == event.chip:
                event.page = request["at"]
                break


def _delays(events: list[Event], stage: str) -> str:
    values = [getattr(e, stage) - e.visible for e in events if getattr(e, stage) and e.visible]
    if not values:
        return "—"
    return f"median {statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f}, n={len(values)})"


def report(spec: Spec, result: Result, command: str, quick: bool) -> str:
    """The fleet section of BENCHMARKS.md."""
    sdc, ecc = result.events[0], result.events[1:]
    limit_n = len(result.tainted)
    mib = [r / 2**20 for r in result.rss_bytes]
    expected_pages = {(f"host-{e.host}", e.chip) for e in result.events}
    extra = {k: n for k, n in result.pages.items() if k not in expected_pages or n != 1}
    lines = [
        "## Fleet rehearsal: node agents, Prometheus, Alertmanager (`benchmarks/fleet.py`)",
        "",
        *(["**Quick run: do not quote these figures.**", ""] if quick else []),
        f"{spec.hosts} tpuwatch daemons × {spec.chips} simulated chips ({spec.hosts * spec.chips} chips) on loopback, "
        f"each the node agent of its Node in one stand-in API server, a taint ladder on AcceleratorHardwareProblem "
        f"behind `max_unhealthy_nodes: {spec.limit}`; Debian's Prometheus (scrape and rule interval {spec.scrape}, "
        f"alerts/*.rules.yml) and Alertmanager (group_by instance, device; group_wait {spec.group_wait}; critical to a "
        f"pager webhook); daemon interval {spec.interval}. Host 0 runs the sdc scenario with the canary (chip "
        f"{spec.sdc_chip} computes wrong numbers; the canary runs on this host only, for the CPU of this machine); hosts "
        f"1-{spec.failing} get an uncorrectable ECC error on chip 0 {spec.fault_after:g} s after start.",
        "",
        "| Figure | Result |",
        "|---|---|",
        f"| pages for the wrong-result chip (host-0, chip {spec.sdc_chip}) | {result.pages.get(('host-0', spec.sdc_chip), 0)} |",
        f"| pages per ECC host (chip 0) | {', '.join(str(result.pages.get((f'host-{e.host}', '0'), 0)) for e in ecc)} |",
        f"| other pages (any other host or chip, or repeats) | {sum(extra.values())} {dict(extra) if extra else ''} |",
        f"| webhook posts to the pager (group updates included) / to chat | {result.notifications} / {result.warnings} |",
        f"| wrong result visible on /metrics → page | {_delays([sdc], 'page')} |",
        f"| ECC error visible on /metrics → page | {_delays(ecc, 'page')} |",
        f"| fault visible → node condition True | {_delays(result.events, 'condition')} |",
        f"| ECC visible → taint (the hosts that got a slot) | {_delays(ecc, 'taint')} |",
        f"| failing hosts tainted / held back (limit {spec.limit} of {spec.hosts}) | {limit_n} ({', '.join(result.tainted)}) / "
        f"{len(result.held_back)} ({', '.join(result.held_back)}); TpuwatchRemediationHeldBack firing for {result.held_back_alerts} |",
        f"| Prometheus series per tpuwatch host (anchor: node_exporter, same run) | {result.series_per_host:.0f} "
        f"({result.series_per_host / max(1, result.node_exporter_series):.2f}× node_exporter's "
        f"{result.node_exporter_series}) |",
        "| rule evaluation per cycle, all hosts / per host | " + "; ".join(
            f"{g} {1000 * s:.2f} ms / {1000 * s / spec.hosts:.3f} ms" for g, s in sorted(result.rule_seconds.items())) + " |",
        f"| API server requests per node per minute | {result.api_requests / spec.hosts / (result.wall / 60):.1f} "
        f"({result.api_requests} in {result.wall:.0f} s) |",
        f"| daemons' CPU, all {spec.hosts} together | {result.cpu_seconds / result.wall:.2f} cores over {result.wall:.0f} s |",
        f"| daemon resident memory | median {statistics.median(mib):.1f} MiB, max {max(mib):.1f} MiB |",
        "",
        "Times are from the first poll (every 0.5 s) that saw the fault on the daemon's /metrics: a node condition and a taint follow in the same sampling cycle as the alert (0-0.5 s here), a page takes a scrape, a rule evaluation and Alertmanager's group_wait. The canary pages once although two critical rules fire for its chip (CanaryWrongResult, CanaryFleetOutlier): one Alertmanager group per (instance, device). The official client was installed with `python3 -m venv /tmp/k8sclient-venv && /tmp/k8sclient-venv/bin/pip install kubernetes` (37.0.2).",
        "",
        f"Machine: {os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d}. Command: `{command}`.",
    ]
    return "\n".join(lines)


FOOTPRINT = """
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
import json, ssl, requests, yaml
if not {official!r}:
    import tpuwatch.alerting.service, tpuwatch.config  # the daemon has these loaded anyway
before = rss()
if {official!r}:
    from kubernetes import client
    api = client.ApiClient(client.Configuration())
    client.CoreV1Api(api), client.CoordinationV1Api(api)
else:
    import tpuwatch.kubernetes.agent
print(rss() - before)
"""


def import_cost(python: str, official: bool) -> int:
    """Median resident KiB that importing a Kubernetes client adds to ``python`` after requests and yaml."""
    code = FOOTPRINT.format(official=official)
    env = checkout_env()
    runs = [int(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, env=env,
                               timeout=120).stdout) for _ in range(3)]
    return int(statistics.median(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--chips", type=int, default=8)
    parser.add_argument("--failing", type=int, default=5)
    parser.add_argument("--limit", default="10%")
    parser.add_argument("--quick", action="store_true", help="10 hosts of 4 chips, 3 failing; figures not to quote")
    parser.add_argument("--official-client-python", metavar="PYTHON",
                        help="an interpreter with the official kubernetes client installed, to measure its import cost")
    parser.add_argument("--workdir", type=Path, help="keep the daemons' configs and logs here (default: a temp dir)")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    spec = Spec(args.hosts, args.chips, args.failing, args.limit)
    if args.quick:
        spec = Spec(10, 4, 3, args.limit, interval="5s", scrape="5s", group_wait="5s", fault_after=40.0, settle=20.0)
    if args.workdir:
        args.workdir.mkdir(parents=True)
        result = rehearse(spec, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="tpuwatch-fleet-") as work:
            result = rehearse(spec, Path(work))
    command = shlex.join(["python", "benchmarks/fleet.py", *(argv if argv is not None else sys.argv[1:])])
    text = report(spec, result, command, args.quick)
    own = import_cost(sys.executable, official=False)
    text += (f"\n\nImport cost after `import requests, yaml` (median of 3, resident KiB): tpuwatch.kubernetes {own} "
             "(after the daemon's own alerting and config modules)"
             + (f"; the official client (`from kubernetes import client` with CoreV1Api and CoordinationV1Api) "
                f"{import_cost(args.official_client_python, official=True)}"
                if args.official_client_python else "") + ".")
    print(text)
    write_section("fleet", text, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
