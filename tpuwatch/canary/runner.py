"""Start the canary worker in its own process group under a hard deadline, and record what it found.

``run_worker()`` starts ``canary.supervisor`` (which starts the worker) in a new
session, reads the worker's protocol lines as they come, bounded in size and
time, and reports progress; on timeout, on an interrupt (Ctrl-C, SIGTERM
turned into KeyboardInterrupt by the CLI) and after every run it kills the
whole group.  Should this process die without a chance to, the supervisor
kills the group itself.  ``run_canary()`` then judges the lines
(``judge.judge``) and updates the fingerprint history (``history``), except
for fire drills, which never write it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tpuwatch
from tpuwatch.canary.history import FingerprintHistory, history_path
from tpuwatch.canary.judge import CanaryResult, Drill, judge
from tpuwatch.config import Config

SCHEDULE = 24  # entries of the data schedule (canary/checks/gemm.py, transcendental.py)
STDOUT_LIMIT = 1 << 20  # protocol lines are ~200 bytes a chip; more is not the protocol
STDERR_KEPT = 8192
TICK_S = 0.5
DRAIN_S = 2.0  # after the group is killed, how long to wait for its pipes to close
_CHUNK = 65536
_STDERR_TAIL = 300


@dataclass(frozen=True)
class Progress:
    """Where a run is: the chip running now (None while the worker starts) and for how long, the run's age."""

    device: str | None
    device_seconds: float
    run_seconds: float
    timeout: float


def entry_at(now: float, every: float) -> int:
    """The data schedule's entry for a run at ``now`` of a canary run every ``every`` seconds: each run a new one,
    each coming round again after SCHEDULE runs (a day, hourly)."""
    return int(now // max(every, 1.0)) % SCHEDULE


def worker_command(config: Config, inject: str | None, inject_device: int) -> list[str]:
    """The worker's command line under ``canary.python`` (default: this interpreter)."""
    canary = config.canary
    command = [canary.python or sys.executable, "-m", "tpuwatch.canary.worker",
               "--state-dir", config.state_dir, "--lockfile", canary.lockfile,
               "--procfs", config.paths.procfs, "--sysfs", config.paths.sysfs, "--dev", config.paths.dev,
               "--entry", str(entry_at(time.time(), canary.every)), "--checks", ",".join(canary.checks),
               "--memory-bytes", str(canary.memory_bytes), "--memory-share", str(canary.memory_share)]
    if inject is not None:
        command += ["--inject", inject, "--inject-device", str(inject_device)]
    return command


def _worker_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """This environment plus ``extra``, with tpuwatch importable from any interpreter."""
    root = str(Path(tpuwatch.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, **(extra or {}), "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}


class _Output:
    """The worker's stdout as protocol lines (bounded) and the tail of its stderr, fed as it comes."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.stdout_bytes = 0
        self.overflowed = False
        self.running: tuple[str, float] | None = None  # the chip running now, since when (monotonic)
        self._partial = b""
        self._stderr = b""

    def feed_stdout(self, chunk: bytes) -> None:
        self.stdout_bytes += len(chunk)
        if self.stdout_bytes > STDOUT_LIMIT:
            self.overflowed = True
            return
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        for text in complete:
            self._line(text)

    def feed_stderr(self, chunk: bytes) -> None:
        self._stderr = (self._stderr + chunk)[-STDERR_KEPT:]

    def finish(self) -> None:
        if self._partial and not self.overflowed:
            self._line(self._partial)
        self._partial = b""

    @property
    def stderr(self) -> str:
        return self._stderr.decode("utf-8", "replace")

    def _line(self, text: bytes) -> None:
        try:
            line = json.loads(text)
        except ValueError:
            return
        if not isinstance(line, dict) or "event" not in line:
            return
        self.lines.append(line)
        if line["event"] == "running":
            self.running = (str(line.get("device")), time.monotonic())
        elif line["event"] in ("result", "skipped"):
            self.running = None


def _ending(returncode: int, output: _Output, timed_out: float | None) -> str | None:
    if timed_out is not None:
        return f"timed out after {timed_out:g}s (worker process group killed)"
    if output.overflowed:
        return f"the worker wrote over {STDOUT_LIMIT} bytes to stdout, which is not the canary protocol"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-returncode}"
        return f"worker crashed with {name}"
    if returncode != 0:
        tail = (output.stderr.strip().splitlines() or ["no output"])[-1][:_STDERR_TAIL]
        return f"worker exited with status {returncode}: {tail}"
    return None


_running: set[int] = set()  # process groups of the workers running now
_stopped: set[int] = set()  # those of them killed because the daemon is stopping
_running_lock = threading.Lock()
STOPPED = "stopped: the daemon is shutting down"


def kill_running_workers() -> None:
    """Kill every worker process group still running (the daemon is stopping): their runs end ``STOPPED``."""
    with _running_lock:
        groups = list(_running)
        _stopped.update(groups)
    for pgid in groups:
        _kill_group(pgid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _pump(proc: subprocess.Popen[bytes], limit: float, progress: Callable[[Progress], None] | None,
          output: _Output) -> float | None:
    """Read the worker's pipes until they close; the timeout that ended it, if one did."""
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): output.feed_stdout, proc.stderr.fileno(): output.feed_stderr}
    started = time.monotonic()
    timed_out, stop_at = None, None
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if stop_at is None:
                exited = proc.poll() is not None
                if exited or now - started >= limit:
                    # The supervisor has ended (nothing of its group may keep the pipes open), or time is up.
                    timed_out = None if exited else limit
                    _kill_group(proc.pid)
                    stop_at = now + DRAIN_S
            if stop_at is not None and now >= stop_at:
                break  # a process that left the group holds them
            wait = min(TICK_S, max(0.0, (stop_at or started + limit) - now))
            for key, _ in selector.select(wait):
                chunk = os.read(key.fd, _CHUNK)
                if chunk:
                    streams[key.fd](chunk)
                else:
                    selector.unregister(key.fileobj)
            if progress is not None and stop_at is None:
                now = time.monotonic()
                device, since = output.running or (None, now)
                progress(Progress(device, now - since, now - started, limit))
    output.finish()
    return timed_out


def run_worker(config: Config, inject: str | None = None, inject_device: int = 0, timeout: float | None = None,
               env: Mapping[str, str] | None = None, progress: Callable[[Progress], None] | None = None
               ) -> tuple[list[dict[str, Any]], str | None]:
    """Run the worker in a new process group; its protocol lines and why it ended early (None if it did not).

    ``progress`` is called about every TICK_S while it runs.  On timeout or any exception (KeyboardInterrupt
    included) the whole group is killed; after any ending the group is swept.
    """
    limit = timeout if timeout is not None else config.canary.timeout
    tether, held = os.pipe()  # the supervisor's end, and ours: when this process dies, it closes
    command = [sys.executable, "-m", "tpuwatch.canary.supervisor", str(tether), "--",
               *worker_command(config, inject, inject_device)]
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=_worker_env(env), start_new_session=True, pass_fds=(tether,))
    except OSError as exc:
        os.close(held)
        return [], f"cannot start the canary supervisor {sys.executable}: {exc.strerror or exc}"
    finally:
        os.close(tether)
    with _running_lock:
        _running.add(proc.pid)
    output = _Output()
    try:
        timed_out = _pump(proc, limit, progress, output)
    finally:
        _kill_group(proc.pid)
        proc.wait()  # the supervisor dies of SIGKILL at once: it never sits in a driver
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        with _running_lock:
            _running.discard(proc.pid)
            stopped = proc.pid in _stopped
            _stopped.discard(proc.pid)
        os.close(held)
    return output.lines, STOPPED if stopped else _ending(proc.returncode, output, timed_out)


def run_canary(config: Config, inject: str | None = None, inject_device: int = 0,
               timeout: float | None = None, env: Mapping[str, str] | None = None,
               progress: Callable[[Progress], None] | None = None) -> CanaryResult:
    """One canary run exactly as the daemon runs it: worker, checks, fingerprint history updated.

    A fire drill (``inject``) is judged against the history but never writes it.
    """
    started = time.monotonic()
    store = FingerprintHistory(history_path(config.state_dir))
    try:
        store.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return CanaryResult("error", f"cannot create {store.path.parent}: {exc.strerror or exc}", (),
                            finished_at=time.time())
    lines, ended = run_worker(config, inject, inject_device, timeout, env, progress)
    if ended == STOPPED:  # not a measurement: the chips keep their last outcome, the history is not touched
        return CanaryResult("skipped", STOPPED, (), finished_at=time.time(), wall_seconds=time.monotonic() - started)
    drill = Drill(inject, str(inject_device)) if inject is not None else None
    result = store.update(lambda history: judge(lines, ended, history, drill))
    return CanaryResult(**{**result.__dict__, "wall_seconds": time.monotonic() - started})
