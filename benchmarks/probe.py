#!/usr/bin/env python3
"""The in-job probe (``tpuwatch.probe``): what it costs a real JAX training job, and the daemon under a report flood.

Usage::

    python benchmarks/probe.py [--seconds S] [--rounds N] [--steps N] [--every S] [--stress-every S]
                               [--reports N] [--flood-seconds S] [--flood-rate R] [--slow N] [--quick]
                               [--output BENCHMARKS.md]

On four host CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``, set before jax is
imported), in one run, beside one ``tpuwatch run`` daemon (4 simulated chips, interval 1 s, the probe socket
with ``reports_per_minute: 600``) whose chips' device files this process holds open, as a job holds its chips:

1. **Job overhead.** A training loop written here: a decoder-only transformer language model (2 layers,
   d_model 128, 4 heads, sequence 64, vocabulary 256), batch 8 per device, data parallel over the 4 devices
   (``jax.jit`` over a ``Mesh``, ``NamedSharding``), Adam written by hand, random tokens from a fixed seed;
   every step blocks on ``float(loss)``, and ``probe.step()`` is called right after the train step is
   dispatched.  ``--rounds`` rounds of interleaved blocks (the order rotated each round, to cancel drift) of
   the same loop, ``--seconds`` in all: without the probe, with it at the default cadence (``--every``, 300 s)
   and at a stressed one (``--stress-every``, 1 s), 1.5 : 2.5 : 1 of each round's time (the default
   cadence's blocks longest, so that it runs several times in them).  Each probe's cadence runs on a clock
   that counts its own blocks only, so it runs as often as in a job that always has it; its compile and
   first run are a start phase before the rounds.  Reported: median and p99 step time, added job time (mean
   step time with / without - 1, per round, and fitted over the blocks with the CPU other processes used
   during each block taken out), the runs, the wall time of every ``probe.step()`` call (p99, max) and how
   many calls found the outputs not ready and moved on.  The default cadence's cost is far inside the noise,
   so it is also scaled from the stressed blocks (their added time per run, times runs per second).
2. **The probe's own cost.** ``step()`` calls by what they did (dispatch, read back and judge, ...); compile
   time from the first ``step()`` to ``probe._compiled``; a synchronous ``Probe.check()`` on a fresh Probe in
   this process and in a fresh one; import time and RSS of ``import tpuwatch.probe`` in fresh interpreters
   beside a bare ``import jax`` (the anchor), and which daemon libraries it loads (none wanted); the device
   memory the probe keeps resident per device (its arrays' nbytes; ``memory_stats()`` where the backend has
   it, None on CPU) and the compiled program's temporaries.
3. **The daemon's side.** Daemon CPU per accepted report (``--reports`` valid reports from this process, the
   chips' holder, less the idle CPU over as long); then ``--flood-seconds`` of hostile reports at
   ``--flood-rate`` a second from child processes (malformed JSON, 70 KB lines, reports about chips the
   sender does not hold, and ``--slow`` connections that send nothing, all as another user, uid 65534, as an
   attacker on the host would be; and valid reports beyond the rate limit from one process of the holder's
   own user), the first three from a new process every 500 reports so that
   the per-process rate limit does not absorb them, while /metrics is scraped every 0.5 s: the rate reached,
   refusals by reason (``tpuwatch_probe_reports_rejected_total``) beside the senders' own tallies, scrape
   latency before and during the flood, sampling cycles completed against expected, daemon CPU, the holder's
   reports during the flood, and that its next report is accepted after it.

Targets: added job time <= 0.1 % at the default cadence; p99 step time unchanged within the run's noise (the
spread of p99 between blocks without the probe); no ``step()`` call waits on the chip; <= 4 MiB of device
memory per device; the sampling cycle keeps running through the flood and the holder is accepted after it.

The default run takes about 8 minutes on 2 CPUs; ``--quick`` (about 2 minutes) is a smoke run whose figures
are not to be quoted.  It prints the Markdown section (``probe``) for BENCHMARKS.md and writes it there only
with ``--output``.  Needs root to run the hostile senders as another user (without root they run as this
user and the not-holder sender is left out).  Every child process is
stopped on exit (and gets SIGTERM if this script dies).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import requests

from common import BENCHMARKS_MD, write_section
from probe_base import (
    FRESH_CHECK_SCRIPT,
    REPORTS_PER_MINUTE,
    BenchmarkError,
    OtherLoad,
    progress,
)
from probe_daemon import Daemon, hold_chips, probe_counts, report_cost, settled, start_daemon, stop_process
from probe_flood import Sender, flood
from probe_job import device_memory, in_process_check, measure_imports, measure_job, run_python
from probe_report import Results, render

# --- the run --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; --quick shortens every window."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=380.0, help="training-loop seconds over all rounds")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of interleaved blocks")
    parser.add_argument("--steps", type=int, help="steps per block without the probe, the others in proportion "
                        "(default: from --seconds and the warm-up's step time)")
    parser.add_argument("--every", type=float, default=300.0, help="the default cadence, seconds")
    parser.add_argument("--stress-every", type=float, default=1.0, help="the stressed cadence, seconds")
    parser.add_argument("--reports", type=int, default=500, help=f"valid reports for the daemon's CPU per report "
                        f"(at most {REPORTS_PER_MINUTE}, one process's burst)")
    parser.add_argument("--idle", type=float, default=5.0, help="shortest idle window for the daemon's idle CPU")
    parser.add_argument("--baseline", type=float, default=10.0, help="seconds of scrapes before the flood")
    parser.add_argument("--flood-seconds", type=float, default=20.0)
    parser.add_argument("--flood-rate", type=float, default=1200.0, help="hostile reports a second, all senders")
    parser.add_argument("--slow", type=int, default=16, help="connections that send nothing; over the daemon's "
                        "max_connections (32) every other connection is refused busy")
    parser.add_argument("--import-runs", type=int, default=3, help="fresh interpreters per import measured")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short windows, figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD, help="where the section is written")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.reports, args.baseline = 40.0, 2, 100, 3.0
        args.flood_seconds, args.import_runs = 5.0, 1
    if not 0 < args.reports <= REPORTS_PER_MINUTE:
        parser.error(f"--reports: 1 to {REPORTS_PER_MINUTE}")
    return args


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C, so every child is stopped on the way out."""
    raise KeyboardInterrupt


def run(args: argparse.Namespace, workdir: Path, senders: list[Sender], daemons: list[Daemon]) -> Results:
    """Every measurement, in order: imports, a fresh process's check, the job, the probe's costs, the daemon."""
    progress("imports in fresh interpreters")
    imports = measure_imports(args.import_runs)
    progress("Probe().check() in a fresh process")
    fresh = run_python(FRESH_CHECK_SCRIPT, str(workdir / "nowhere.sock"))
    daemon = start_daemon(workdir)
    daemons.append(daemon)
    others = OtherLoad()
    others.pids.append(daemon.pid)
    job, arms, step_s = measure_job(args, daemon.socket, others)
    accepted = probe_counts(settled(daemon))["accepted"]
    progress("check() on a fresh probe in this process")
    first, again, report, probe = in_process_check(daemon.socket)
    memory = device_memory(arms[1].probe or probe)
    progress(f"daemon: {args.reports} valid reports from the holder, then as long idle")
    reports = report_cost(daemon, report, args.reports, args.idle)
    flooded = flood(daemon, report, args, senders)
    return Results(job, arms, step_s, imports, fresh, first, again, memory, reports, flooded,
                   accepted, daemon.complaints())


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the section (and write it with --output); 1 on failure, 130 when interrupted."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(UTC)
    command = shlex.join(["python", "benchmarks/probe.py", *(sys.argv[1:] if argv is None else argv)])
    workdir = Path(tempfile.mkdtemp(prefix="tpuwatch-probe-bench-")).resolve()
    workdir.chmod(0o755)  # the uid-65534 sender reaches the socket in it
    held = hold_chips(workdir / "dev")
    senders: list[Sender] = []
    daemons: list[Daemon] = []
    try:
        results = run(args, workdir, senders, daemons)
    except KeyboardInterrupt:
        progress("interrupted: children stopped, no report")
        return 130
    except (BenchmarkError, requests.RequestException, OSError, subprocess.SubprocessError) as exc:
        progress(f"benchmark failed: {exc}")
        return 1
    finally:
        for sender in senders:
            stop_process(sender.process)
        for daemon in daemons:
            stop_process(daemon.process)
            progress(f"stopped the daemon (pid {daemon.pid}); its warnings: {daemon.complaints()}")
        for handle in held:
            handle.close()
        shutil.rmtree(workdir, ignore_errors=True)
    section = render(results, args, started, command)
    if args.output is not None and not args.quick:
        write_section("probe", section, args.output)
        progress(f"wrote the probe section of {args.output}")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
