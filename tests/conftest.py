"""Shared test helpers: free ports, deadline polling, and a real `tpuwatch run` subprocess."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

import fakenvml
from http_receiver import Mode, Receiver


def saved_state(path: Path) -> Any:
    """The state tpuwatch saved at ``path``, out of its sealed envelope (``statefile.seal``) when it has one."""
    from tpuwatch import statefile

    return statefile.unseal(json.loads(path.read_bytes()))[0]


_HANDED_OUT: set[int] = set()
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]) % _WORKERS


def _unassigned_ports() -> range:
    """Ports below the kernel's ephemeral range (``ip_local_port_range``), which it never gives a socket on its own."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(10000, low))


_PORTS = _unassigned_ports()
_PICK = random.Random(os.getpid())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has not handed out before.

    A port handed to a child that has not bound it yet is free again to the kernel; without the memory, two
    daemons started in a row can be given the same port, and the second one's readiness check is answered by
    the first.  It is drawn below the kernel's ephemeral range: a port from that range could meanwhile become the
    local end of any connection made on the machine (a test's own requests), and the child's bind then fails
    with "address already in use" (seen under load).  Under pytest-xdist each worker keeps to its own residue of
    half the port number, so two workers never hand out the same port."""
    while True:
        if len(_PORTS) >= 1000:
            port = _PICK.randrange(_PORTS.start, _PORTS.stop)
        else:  # no room below the ephemeral range on this machine: any free port
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        if port in _HANDED_OUT or (port >> 1) % _WORKERS != _WORKER:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def waited_seconds(problem: str | None, prefix: str) -> float:
    """The seconds a ``PREFIX: no answer within N.Ns`` problem says its call was waited for.

    That is what was left of the read's one deadline when the call began, so under load it may be a little less
    than the timeout configured; any other text fails the test."""
    found = re.fullmatch(rf"{re.escape(prefix)}: no answer within (\d+\.\d)s", problem or "")
    assert found is not None, problem
    return float(found.group(1))


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (requests.RequestException, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def require_tool(name: str) -> str:
    """Path of an external tool; skip without it, except in CI (TPUWATCH_REQUIRE_TOOLS=1) where it fails."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{name} is required in CI but not installed")
        pytest.skip(f"{name} not installed")
    return path


def write_selftest_rule(directory: Path, tag: str) -> str:
    """A kernel-log rules dir whose one critical rule, ``selftest``, matches ``<tag>: device <pci> failed``.

    Tests write such lines, not real driver errors, into the host's /dev/kmsg: an Xid written there would be
    reported by ``tpuwatch check`` and by any tpuwatch daemon on the machine for the rest of the boot.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "selftest.yaml").write_text(
        f"rules: [{{name: selftest, keywords: ['{tag}'], severity: critical,\n"
        f"          regex: '{tag}: device (?P<pci>[0-9a-f:.]+) failed'}}]\n")
    return str(directory)


class DaemonProcess:
    """`tpuwatch run` as a real subprocess, with its config file and stderr log."""

    def __init__(self, workdir: Path, config: dict[str, Any], args: list[str] | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.workdir = workdir
        self.config_path = workdir / "config.yaml"
        self.log_path = workdir / "stderr.log"
        self.port = free_port()
        config = {"listen": f"127.0.0.1:{self.port}", "state_dir": str(workdir / "state"),
                  "probe": {"socket": str(workdir / "probe.sock")}, **config}
        self.write_config(config)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tpuwatch", "run", "--config", str(self.config_path), *(args or [])],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd,
        )

    def write_config(self, config: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, scheme: str = "http", **request_kwargs: Any) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            response = requests.get(f"{scheme}://127.0.0.1:{self.port}/healthz", timeout=2, **request_kwargs)
            if response.status_code == 401:
                return True
            sampled = response.json()["checks"]["sampling"]["last_sample_age_seconds"] is not None
            return response.status_code in (200, 503) and sampled
        wait_until(ready, timeout=20, what="the daemon's first sampling cycle")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> int:
        stop_process(self.proc)
        self._log.close()
        return self.proc.returncode


KMSG_RING_LOCK = Path(tempfile.gettempdir()) / "tpuwatch-tests-kmsg-ring.lock"


def _hold_kmsg_ring(mode: int) -> Iterator[None]:
    fd = os.open(KMSG_RING_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)  # read-only: whoever created it, any user may lock
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


@pytest.fixture
def kmsg_ring() -> Iterator[None]:
    """The host's kernel ring (a few hundred KiB, shared by every test worker) is not flooded while this test's
    records wait in it: a test that floods it takes ``kmsg_flood``, alone."""
    yield from _hold_kmsg_ring(fcntl.LOCK_SH)


@pytest.fixture
def kmsg_flood() -> Iterator[None]:
    """This test writes more to the host's kernel ring than it holds: no test whose records wait there runs
    meanwhile (``kmsg_ring``)."""
    yield from _hold_kmsg_ring(fcntl.LOCK_EX)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Start real daemons; every one is stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(config: dict[str, Any], **kwargs: Any) -> DaemonProcess:
        workdir = tmp_path / f"daemon{len(started)}"
        workdir.mkdir()
        daemon = DaemonProcess(workdir, config, **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the tpuwatch command line in a subprocess."""
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True,
                          timeout=timeout)


SIM_FAST = {"interval": "200ms", "collector_timeout": "150ms", "canary": {"enabled": False},
            "kernel_log": {"source": "none"},
            "devices": {"backend": "sim", "sim": {"count": 4, "fault_after": "0s"}}}


ALERTING_FAST = {"group_wait": "0s", "group_interval": "1s", "rule_files": [], "retry_initial": "20ms",
                 "retry_max": "100ms", "send_timeout": "2s", "breaker_reset": "300ms"}


@pytest.fixture
def make_alerting(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Make ``Alerting`` facades on one state_dir with fast grouping and retries; all are stopped at teardown."""
    from tpuwatch import config as config_module
    from tpuwatch.alerting import Alerting

    made: list[Alerting] = []

    def make(notify: list[dict[str, Any]], **alerting: Any) -> Alerting:
        config = config_module.parse(yaml.safe_dump({"state_dir": str(tmp_path / "state"),
                                                     "alerting": {**ALERTING_FAST, **alerting}, "notify": notify}))
        made.append(Alerting(config, config.state_dir))
        return made[-1]

    yield make
    for a in made:
        a.stop()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[str, Receiver]]:
    """A real Alertmanager grouping by alertname and device, notifying a recording webhook: (its URL, the hook)."""
    from alertmanager import RealAlertmanager

    hook = Receiver()
    am = RealAlertmanager(tmp_path, hook.url(), send_resolved=True)
    try:
        am.start(20)
        yield am.url, hook
    finally:
        am.stop()
        hook.close()


@pytest.fixture
def receivers() -> Iterator[Any]:
    """Make receivers; all are closed at teardown."""
    made: list[Receiver] = []

    def make(mode: Mode = "record") -> Receiver:
        made.append(Receiver(mode))
        return made[-1]

    yield make
    for r in made:
        r.close()


class Tmpfs:
    """A real tmpfs of a few MiB mounted for one test (root only): remounted read-only, filled, freed."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True,
                       capture_output=True, timeout=30)

    def remount(self, mode: str) -> None:
        """``ro`` or ``rw``."""
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True, capture_output=True,
                       timeout=30)

    def fill(self) -> Path:
        """Write a file until the file system is full; that file."""
        filler = self.path / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 16, 1):  # then the last partial page
                try:
                    while os.write(fd, b"\0" * chunk):
                        pass
                except OSError:
                    pass
        finally:
            os.close(fd)
        return filler

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Tmpfs]]:
    """Mount real tmpfs file systems (root and mount(8) needed: skipped otherwise); unmounted at teardown."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    made: list[Tmpfs] = []

    def mount(name: str = "fs", size: str = "4m") -> Tmpfs:
        try:
            made.append(Tmpfs(tmp_path / name, size))
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc.stderr.decode(errors='replace').strip()}")
        return made[-1]

    yield mount
    for fs in made:
        fs.unmount()


@pytest.fixture(scope="session")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in libnvidia-ml.so.1 (tests/nvml/), built once per session and loaded into this process.

    FAKE_NVML_STATE names one file for the whole session, set before any call can run: a hung call polls
    the environment from its own thread, so no test changes the variable (each rewrites the file instead).
    TPUWATCH_NVML_SANITIZE=1 builds the AddressSanitizer variant (test_nvml_standin's ASan run).
    """
    why = fakenvml.unavailable() or (None if importlib.util.find_spec("pynvml") else
                                     "nvidia-ml-py is not installed (the test extra)")
    if why:
        if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(f"the NVML stand-in is required in CI: {why}")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("nvml")
    sanitize = os.environ.get("TPUWATCH_NVML_SANITIZE") == "1"
    directory = fakenvml.build(root, sanitize=sanitize)
    state = root / "state.json"
    state.write_text('{"gpus": []}')
    os.environ["FAKE_NVML_STATE"] = str(state)
    library = fakenvml.preload(directory)
    assert hasattr(library, "__asan_init") == sanitize, "the ASan run loads the instrumented build, no other"
    return directory


@pytest.fixture
def nvml(nvml_library: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[fakenvml.FakeNvml]:
    """Four H100s (tests/testdata/devices/nvml/h100x4.json) behind the real nvidia-ml-py; subprocesses load the
    same library through LD_LIBRARY_PATH.  Calls left hanging are released at teardown."""
    fake = fakenvml.FakeNvml(Path(os.environ["FAKE_NVML_STATE"]), nvml_library)
    fake.write(json.loads(fakenvml.H100X4.read_text()))
    monkeypatch.setenv("LD_LIBRARY_PATH", fakenvml.environment(nvml_library, fake.state)["LD_LIBRARY_PATH"])
    yield fake
    fake.release()
