"""Options over the config: `run --listen/--state-dir` start a second daemon beside the first from the same config
(a reload keeps them)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
import yaml

from conftest import SIM_FAST, DaemonProcess, free_port, run_cli, stop_process, wait_until

# What SIM_FAST says, less devices (--simulate sets them), listen and state_dir (the options set them).
SHARED = {"interval": "200ms", "collector_timeout": "150ms", "canary": {"enabled": False},
          "kernel_log": {"source": "none"}}


def _sampled(url: str) -> bool:
    answer = requests.get(f"{url}/healthz", timeout=2).json()
    return answer["checks"]["sampling"]["last_sample_age_seconds"] is not None


@pytest.fixture
def run_daemon(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``tpuwatch run ARGS...`` as subprocesses, its output in ``tmp_path/run<N>.log``; all stopped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def run(*args: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"run{len(started)}.log", "wb") as log:
            started.append(subprocess.Popen([sys.executable, "-m", "tpuwatch", "run", *args], stdout=log,
                                            stderr=subprocess.STDOUT))
        return started[-1]

    yield run
    for proc in started:
        stop_process(proc)


def test_two_daemons_run_side_by_side_from_one_config(run_daemon: Callable[..., subprocess.Popen[bytes]],
                                                      tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(SHARED))  # the one file both read: no listen, no state_dir
    ports = {name: free_port() for name in "ab"}
    daemons = {name: run_daemon("--config", str(config), "--simulate", "healthy", "--listen",
                                f"127.0.0.1:{ports[name]}", "--state-dir", str(tmp_path / name))
               for name in "ab"}
    for name, port in ports.items():
        wait_until(lambda port=port: _sampled(f"http://127.0.0.1:{port}"), timeout=30, what=f"daemon {name}")
    for name, port in ports.items():
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert all(f'tpuwatch_device_up{{device="{d}"}} 1.0' in metrics for d in "0123"), name
        # Each keeps its state, and holds its lock, in its own directory (simulated chips' namespace in it).
        lock = tmp_path / name / "simulated" / "lock"
        assert lock.read_text() == f"{daemons[name].pid}\n"
    third = run_daemon("--config", str(config), "--simulate", "healthy", "--listen", f"127.0.0.1:{free_port()}",
                       "--state-dir", str(tmp_path / "a"))
    assert third.wait(timeout=30) == 2
    assert f"state_dir {tmp_path / 'a' / 'simulated'}: in use by pid {daemons['a'].pid}" in \
        (tmp_path / "run2.log").read_text()
    assert all(proc.poll() is None for proc in daemons.values())


def test_a_reload_keeps_the_options_over_the_file(start_daemon: Callable[..., DaemonProcess],
                                                  tmp_path: Path) -> None:
    port, state = free_port(), tmp_path / "elsewhere"
    daemon = start_daemon(SIM_FAST, args=["--listen", f"127.0.0.1:{port}", "--state-dir", str(state)])
    filed_port, daemon.port = daemon.port, port
    daemon.wait_ready()
    assert (state / "simulated" / "lock").read_text() == f"{daemon.proc.pid}\n"
    assert not (daemon.workdir / "state").exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{filed_port}/healthz", timeout=2)
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in daemon.log(), what="the reload")
    before = requests.get(f"{daemon.url}/healthz", timeout=2).json()["checks"]["sampling"]
    wait_until(lambda: requests.get(f"{daemon.url}/healthz", timeout=2).json()["checks"]["sampling"] != before,
               what="sampling after the reload, at the option's address")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{filed_port}/healthz", timeout=2)
    assert "takes effect at the next start" not in daemon.log()


@pytest.mark.parametrize("args,message", [
    (["--listen", "nope"], "argument --listen: invalid listen address 'nope' (use host:port, like 127.0.0.1:9847)"),
    (["--listen", "127.0.0.1:70000"], "argument --listen: port 70000 out of range 1-65535"),
    (["--state-dir", "state"], "argument --state-dir: must be an absolute path (starting with /), got 'state'"),
    (["--state-dir", ""], "argument --state-dir: must not be empty"),
])
def test_a_bad_option_value_is_refused_as_its_key_would_be(args: list[str], message: str) -> None:
    result = run_cli("run", "--simulate", "healthy", *args)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"tpuwatch run: {message} (see --help)"]
