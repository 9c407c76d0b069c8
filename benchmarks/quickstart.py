#!/usr/bin/env python3
"""The README's quick start as a new user runs it: from the install command to each scenario's first alert.

Usage::

    python benchmarks/quickstart.py [--scenarios NAME ...] [--deadline S] [--healthy-window S] [--quick]
                                    [--output BENCHMARKS.md]

It runs README.md's first command, less its ``apt-get`` steps, once per
``--simulate`` scenario, each in a fresh "container": a ``git archive HEAD``
copy of this checkout (what a clone gives) as the working directory, an empty
``HOME`` (so pip's cache is empty; pip keeps the machine's ``PIP_*`` variables
and ``/etc`` files), Debian's ``PATH`` (``python3`` is ``/usr/bin/python3``)
and a private mount namespace in which ``/opt``, ``/var/lib``, ``/etc`` and
``/run`` are overlays on temporary directories, each ``tpuwatch`` in them an
empty directory hiding whatever the host has or later puts there (someone
installing the Debian package, a daemon running): the venv, the default
``state_dir``, the absent config file and the probe's socket directory are
the container's alone.  The network is the host's, so the daemons
take the default port 9847 one after another.

Each step runs in the container as typed (``nsenter`` into its namespace, as
``docker exec`` does).  Times are from the start of ``python3 -m venv``: the
install done, ``/healthz`` answering (any status), and the first alert as the
user sees it: ``/opt/tpuwatch/bin/tpuwatch alerts --json`` started every
0.5 s until it lists a pending or firing alert, or ``--deadline`` (600 s)
after serving; ``healthy`` is watched for ``--healthy-window`` (120 s).  The
anchor is the bare install in the same run: first alerts are also given after
serving.  Every daemon gets SIGTERM when its scenario ends, on Ctrl-C, on
SIGTERM, and (``PR_SET_PDEATHSIG``) when this script dies.

``--extras`` also runs each of the README's per-host install commands (the
extras: ``pip install '.[tpu,canary,systemd]'`` and the rest) in a fresh
container after the first command's install, and ``tpuwatch check`` after it;
the build tools the README names for the ``systemd`` extra are looked up with
``dpkg-query`` first (they are the machine's: the container shares ``/usr``).

Needs root and util-linux's ``unshare`` and ``nsenter``; rewrites the
``quickstart`` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import requests
from container import Container, container
from servers import BenchmarkError, interrupt, progress

from common import BENCHMARKS_MD, REPO_ROOT, cpu_model, machine_and_command, write_section

SCENARIOS = ("healthy", "hbm-leak", "ecc-errors", "overheat", "sdc", "device-lost")
PORT = 9847
POLL_S = 0.5
SERVING_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass
class Outcome:
    """One scenario's run, times in seconds from the start of ``python3 -m venv``."""

    scenario: str
    venv_s: float | None = None
    install_s: float | None = None
    serving_s: float | None = None
    alert_s: float | None = None
    alerts: list[str] = field(default_factory=list)
    watched_s: float = 0.0
    poll_s: list[float] = field(default_factory=list)
    pip: dict[str, int] = field(default_factory=dict)
    stop_rc: int | None = None
    stop_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


# --- the command, as the README gives it --------------------------------------------------------------------------


def readme_steps(readme: str) -> list[str]:
    """The README's first command as its steps (split at ``&&``), less ``apt-get``: venv, pip install, run."""
    match = re.search(r"```sh\n(.+?)\n", readme)
    if match is None:
        raise BenchmarkError("README.md has no ```sh block")
    steps = [s.strip() for s in match.group(1).split("&&") if not s.strip().startswith("apt-get")]
    shapes = (r"python3 -m venv \S+", r"\S+/pip install \.", r"\S+/tpuwatch run --simulate \S+")
    if len(steps) != len(shapes) or not all(re.fullmatch(p, s) for p, s in zip(shapes, steps, strict=True)):
        raise BenchmarkError(f"README.md's first command is not venv, pip install ., tpuwatch run: {match.group(1)}")
    return steps


def for_scenario(steps: list[str], scenario: str) -> list[str]:
    """``steps`` with the daemon's ``--simulate`` scenario replaced."""
    return [*steps[:-1], re.sub(r"--simulate \S+$", f"--simulate {scenario}", steps[-1])]


def readme_extras(readme: str) -> tuple[list[str], list[str]]:
    """The README's per-host install commands (each once, in its order) and the Debian packages it names for
    building the ``systemd`` extra."""
    commands = list(dict.fromkeys(re.findall(r"`(/opt/tpuwatch/bin/pip install '\.\[[a-z,]+\]')`", readme)))
    tools = re.search(r"`apt-get install -y ([a-z0-9 .+-]+)`", readme)
    if not commands or tools is None:
        raise BenchmarkError("README.md names no per-host install command or no build tools for the systemd extra")
    return commands, tools.group(1).split()


def pip_sources(log: str) -> dict[str, int]:
    """How many distributions pip downloaded and how many it took from its cache."""
    return {"downloaded": len(re.findall(r"^\s*Downloading ", log, re.M)),
            "cached": len(re.findall(r"^\s*Using cached ", log, re.M))}


def listed(answer: str) -> list[str]:
    """The alerts of a ``tpuwatch alerts --json`` answer, as its table lists them (most severe, then oldest,
    first): ``name (severity, state, device N)``."""
    alerts = json.loads(answer)["alerts"]
    alerts.sort(key=lambda a: (SEVERITY_ORDER.get(a["labels"].get("severity", ""), 3), a.get("activeAt") or ""))
    out = []
    for a in alerts:
        labels = a["labels"]
        device = f", device {labels['device']}" if "device" in labels else ""
        out.append(f"{labels.get('alertname', '?')} ({labels.get('severity', '?')}, {a['state']}{device})")
    return out


def log_warnings(log: str) -> list[str]:
    """The distinct WARNING and ERROR lines of the daemon's log, without their timestamps."""
    seen: dict[str, None] = {}
    for line in log.splitlines():
        found = re.search(r"\b(WARNING|ERROR)\b.*", line)
        if found:
            seen.setdefault(found.group(0), None)
    return list(seen)


def stop(daemon: subprocess.Popen[bytes]) -> int:
    """SIGTERM the daemon's process group, SIGKILL if it lingers; its exit status."""
    if daemon.poll() is None:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
    return daemon.returncode


def port_taken() -> bool:
    """Whether something answers on 127.0.0.1:PORT."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", PORT)) == 0


# --- one scenario ----------------------------------------------------------------------------------------------


def run_scenario(steps: list[str], scenario: str, window: float) -> Outcome:
    """Install and run the daemon of ``scenario`` in a fresh container; watch for its first alert."""
    outcome = Outcome(scenario)
    if port_taken():
        raise BenchmarkError(f"127.0.0.1:{PORT} is taken by another process: the quick start needs it")
    venv, pip, daemon_step = for_scenario(steps, scenario)
    with container() as box:
        start = time.monotonic()
        for step, timeout in ((venv, 600), (pip, 1800)):
            done = box.output(step, timeout)
            if done.returncode != 0:
                outcome.error = f"{step} failed: {(done.stdout + done.stderr)[-500:]}"
                return outcome
            if step == venv:
                outcome.venv_s = time.monotonic() - start
        outcome.install_s = time.monotonic() - start
        outcome.pip = pip_sources(done.stdout)
        progress(f"{scenario}: installed in {outcome.install_s:.1f} s ({outcome.pip})")
        daemon = box.start(daemon_step, box.root / "daemon.log")
        try:
            watch(box, daemon, daemon_step, start, window, outcome)
        finally:
            stopping = time.monotonic()
            outcome.stop_rc = stop(daemon)
            outcome.stop_s = time.monotonic() - stopping
            log = (box.root / "daemon.log").read_text(errors="replace")
            outcome.warnings = log_warnings(log)
        if outcome.error is not None:
            outcome.error += f"; daemon log: {log[-800:]}"
    return outcome


def watch(box: Container, daemon: subprocess.Popen[bytes], daemon_step: str, start: float, window: float,
          outcome: Outcome) -> None:
    """Wait for /healthz, then list alerts every POLL_S until one is listed or ``window`` has passed."""
    deadline = time.monotonic() + SERVING_TIMEOUT_S
    while outcome.serving_s is None:
        try:
            requests.get(f"http://127.0.0.1:{PORT}/healthz", timeout=2)
            outcome.serving_s = time.monotonic() - start
        except requests.RequestException:
            if daemon.poll() is not None or time.monotonic() > deadline:
                outcome.error = "the daemon did not serve /healthz"
                return
            time.sleep(0.05)
    progress(f"{outcome.scenario}: serving at {outcome.serving_s:.1f} s")
    alerts = shlex.split(daemon_step)[0] + " alerts --json"
    watch_from = time.monotonic()
    while time.monotonic() - watch_from < window:
        polled = time.monotonic()
        try:
            answer = box.output(alerts)
            outcome.poll_s.append(time.monotonic() - polled)
            alerts_listed = listed(answer.stdout) if answer.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError, KeyError) as exc:
            outcome.error = f"{alerts}: {type(exc).__name__}: {exc}"
            return
        if daemon.poll() is not None:
            outcome.error = f"the daemon exited ({daemon.returncode})"
            return
        if alerts_listed is None:
            outcome.error = f"{alerts} failed: {answer.stderr.strip()}"
            return
        if alerts_listed:
            outcome.alert_s = time.monotonic() - start
            outcome.alerts = alerts_listed
            progress(f"{outcome.scenario}: first alert at {outcome.alert_s:.1f} s: {', '.join(alerts_listed)}")
            return
        time.sleep(max(0.0, POLL_S - (time.monotonic() - polled)))
    outcome.watched_s = time.monotonic() - watch_from
    progress(f"{outcome.scenario}: no alert in {outcome.watched_s:.0f} s")


@dataclass
class Extra:
    """One per-host install command run after the first command's install in a fresh container."""

    command: str
    install_s: float | None = None
    pip: dict[str, int] = field(default_factory=dict)
    check_rc: int | None = None
    error: str | None = None


def run_extra(steps: list[str], command: str) -> Extra:
    """The README's venv and ``pip install .``, then ``command`` timed, then ``tpuwatch check`` (its exit status:
    0 healthy, 1 unhealthy; anything else, or a traceback, is a failure)."""
    extra = Extra(command)
    with container() as box:
        for step in steps[:2]:
            done = box.output(step, 1800)
            if done.returncode != 0:
                extra.error = f"{step} failed: {(done.stdout + done.stderr)[-300:]}"
                return extra
        start = time.monotonic()
        done = box.output(command, 1800)
        extra.install_s = time.monotonic() - start
        extra.pip = pip_sources(done.stdout)
        if done.returncode != 0:
            extra.error = f"failed: {(done.stdout + done.stderr)[-300:]}"
            return extra
        check = box.output(shlex.split(steps[-1])[0] + " check", 300)
        extra.check_rc = check.returncode
        if check.returncode not in (0, 1) or "Traceback" in check.stderr:
            extra.error = f"tpuwatch check exited {check.returncode}: {check.stderr.strip()[-300:]}"
    progress(f"{command}: {'ok' if extra.error is None else extra.error} in {extra.install_s:.1f} s")
    return extra


def installed(packages: list[str]) -> dict[str, str]:
    """package -> its installed version, or "not installed"."""
    out = {}
    for package in packages:
        done = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", package], capture_output=True,
                              text=True, check=False)
        out[package] = done.stdout.split()[-1] if "install ok installed" in done.stdout else "not installed"
    return out


def render_extras(extras: list[Extra], tools: dict[str, str]) -> list[str]:
    """The section's lines on the per-host install commands."""
    lines = ["### The README's per-host install commands", "",
             "Each after the first command's venv and `pip install .`, in a fresh container of its own; then "
             "`tpuwatch check` (exit 0 healthy or 1 unhealthy: no accelerator here). The build tools the README "
             "names for the `systemd` extra, as installed on this machine (the container shares its `/usr`): "
             + ", ".join(f"{p} {v}" for p, v in tools.items()) + ".", "",
             "| Command | result | install (s) | pip: downloaded / from cache | `tpuwatch check` exit |",
             "|---|---|---|---|---|"]
    for e in extras:
        result = "ok" if e.error is None else f"**failed**: {e.error.splitlines()[0][:160]}"
        pip = f"{e.pip.get('downloaded', 0)} / {e.pip.get('cached', 0)}" if e.pip else "-"
        rc = "-" if e.check_rc is None else str(e.check_rc)
        lines.append(f"| `{e.command}` | {result} | {seconds(e.install_s)} | {pip} | {rc} |")
    return [*lines, ""]


# --- the report ------------------------------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    """A time for the table; ``-`` when there is none."""
    return "-" if value is None else f"{value:.1f}"


def render(outcomes: list[Outcome], facts: dict[str, str], started: datetime, command: str,
           extras: list[str] | None = None) -> str:
    """The BENCHMARKS.md section."""
    lines = ["## Quick start: install to first alert", "",
             "README.md's first command, less `apt-get`, run as a new user runs it, once per `--simulate` scenario, "
             "each in a fresh container (a `git archive HEAD` copy as the working directory, an empty HOME so pip's "
             "cache is empty, Debian's PATH, `/opt`, `/var/lib`, `/etc` and `/run` private overlays so that `/opt/tpuwatch`, "
             "the default state directory `/var/lib/tpuwatch`, `/etc/tpuwatch` and `/run/tpuwatch` are new and empty and the host's "
             "untouched, no config file, the default port 9847, one scenario after another). Times are seconds from the start of `python3 -m venv "
             "/opt/tpuwatch`: `pip install .` done, the daemon answering `/healthz`, and the first alert as the user "
             "sees it: `/opt/tpuwatch/bin/tpuwatch alerts --json` started every 0.5 s from the container. The anchor "
             "is the install itself, so the first alert is also given after serving.", "",
             "| Scenario | venv (s) | install done (s) | serving (s) | first alert (s) | after serving (s) "
             "| Listed first (severity, state) | pip: downloaded / from cache |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        if o.error is not None:
            first = f"**failed**: {o.error.splitlines()[0][:160]}"
        elif o.alerts:
            first = "; ".join(o.alerts)
        else:
            first = f"none in {o.watched_s:.0f} s"
        after = None if o.alert_s is None or o.serving_s is None else o.alert_s - o.serving_s
        pip = f"{o.pip.get('downloaded', 0)} / {o.pip.get('cached', 0)}" if o.pip else "-"
        lines.append(f"| {o.scenario} | {seconds(o.venv_s)} | {seconds(o.install_s)} | {seconds(o.serving_s)} | "
                     f"{seconds(o.alert_s)} | {seconds(after)} | {first} | {pip} |")
    installs = [o.install_s for o in outcomes if o.install_s is not None]
    polls = [p for o in outcomes for p in o.poll_s]
    lines.append("")
    if installs:
        cached = sum(o.pip.get("cached", 0) for o in outcomes)
        lines.append(f"Install (venv + `pip install .`): median {statistics.median(installs):.1f} s, "
                     f"{min(installs):.1f}-{max(installs):.1f} s over {len(installs)} installs. pip's cache, under "
                     "each fresh HOME, was empty at the start of every install: "
                     + (f"{cached} distributions came from it." if cached else "every dependency was downloaded."))
    if polls:
        lines.append(f"`tpuwatch alerts --json` took a median {statistics.median(polls):.2f} s (max "
                     f"{max(polls):.2f} s) per poll, {len(polls)} polls: a first alert is seen up to that plus 0.5 s "
                     "after the daemon lists it.")
    stopped = [o for o in outcomes if o.stop_s is not None]
    if stopped:
        codes = ", ".join(sorted({str(o.stop_rc) for o in stopped}))
        lines.append(f"The daemons stopped on SIGTERM with exit status {codes}, in "
                     + ", ".join(f"{o.scenario} {o.stop_s:.1f} s" for o in stopped) + ".")
    for o in outcomes:
        if not o.alerts and o.warnings:
            lines.append(f"{o.scenario}: the daemon's log said: " + "; ".join(f"`{w}`" for w in o.warnings[:4]))
    lines.append("")
    return "\n".join(lines + (extras or []) + machine_and_command(facts, started, command))


def machine_facts(steps: list[str]) -> dict[str, str]:
    """What the figures depend on."""
    python = subprocess.run(["/usr/bin/python3", "--version"], capture_output=True, text=True, check=True)
    debian = Path("/etc/debian_version")
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    return {"nproc": f"{len(os.sched_getaffinity(0))} (shared with other work: figures are not quiet-machine ones)",
            "CPU": cpu_model(), "Kernel": platform.release(),
            "OS": f"Debian {debian.read_text().strip()}" if debian.exists() else platform.platform(),
            "python3": f"/usr/bin/python3, {python.stdout.strip()} (venv's pip is the one ensurepip brings)",
            "pip configuration": "the machine's PIP_* variables and /etc files (the fresh HOME has no user one)",
            "tpuwatch": f"HEAD {commit}",
            "Command run per scenario": f"`{' && '.join(steps)}` (`--simulate` set to each scenario)"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenarios and write the report; exit 1 on failure, 130 when interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), metavar="NAME",
                        help=f"any of {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds after serving to wait for an alert")
    parser.add_argument("--healthy-window", type=float, default=120.0, help="seconds healthy is watched")
    parser.add_argument("--quick", action="store_true", help="ecc-errors only")
    parser.add_argument("--extras", action="store_true", help="also run the README's per-host install commands")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    args = parser.parse_args(argv)
    if args.quick:
        args.scenarios = ["ecc-errors"]
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        parser.exit(2, "quickstart.py: needs root and util-linux's unshare and nsenter for its containers\n")
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(timezone.utc)
    command = shlex.join(["python", "benchmarks/quickstart.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        readme = subprocess.run(["git", "-C", str(REPO_ROOT), "show", "HEAD:README.md"], capture_output=True,
                                text=True, check=True).stdout
        steps = readme_steps(readme)
        facts = machine_facts(steps)
        outcomes = []
        for scenario in args.scenarios:
            progress(f"{scenario}: {' && '.join(for_scenario(steps, scenario))}")
            window = args.healthy_window if scenario == "healthy" else args.deadline
            outcomes.append(run_scenario(steps, scenario, window))
        extras: list[Extra] = []
        if args.extras:
            commands, tools = readme_extras(readme)
            extras = [run_extra(steps, c) for c in commands]
    except KeyboardInterrupt:
        progress("interrupted: daemons stopped, no report written")
        return 130
    except (BenchmarkError, OSError, subprocess.SubprocessError) as exc:
        progress(f"benchmark failed: {exc}")
        return 1
    section = render(outcomes, facts, started, command,
                     render_extras(extras, installed(tools)) if args.extras else None)
    if args.quick:
        section = section.replace("## Quick start:", "## (quick run: ecc-errors only) Quick start:", 1)
    write_section("quickstart", section, args.output)
    progress(f"wrote {args.output}")
    return 1 if any(o.error for o in outcomes) or any(e.error for e in extras) else 0


if __name__ == "__main__":
    sys.exit(main())
