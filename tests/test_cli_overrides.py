"""Options over the config: `run --listen/--state-dir` start a second daemon beside the first from the same config
(a reload keeps them), and `--url` points `alerts`, `ack` and `set-healthy` at any daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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
        listed = run_cli("alerts", "--config", str(config), "--url", f"http://127.0.0.1:{port}")
        assert (listed.returncode, listed.stdout) == (0, "no active alerts\n"), listed.stderr
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


class _Daemonish:
    """A real HTTP server on 127.0.0.1 answering GETs with ``answer(path)`` as JSON; the paths asked are kept."""

    def __init__(self, answer: Callable[[str], Any]) -> None:
        self.paths: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                stub.paths.append(self.path)
                body = json.dumps(answer(self.path)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def daemonish() -> Iterator[Callable[[Callable[[str], Any]], _Daemonish]]:
    made: list[_Daemonish] = []

    def make(answer: Callable[[str], Any]) -> _Daemonish:
        made.append(_Daemonish(answer))
        return made[-1]

    yield make
    for stub in made:
        stub.close()


def _config(tmp_path: Path, **keys: Any) -> str:
    """A config whose daemon is nowhere: listen on a port nothing listens on."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{free_port()}", "state_dir": str(tmp_path / "state"),
                                    **keys}))
    return str(path)


FIRING = {"labels": {"alertname": "AcceleratorLost", "severity": "critical", "device": "3", "pci": "0000:13:00.0"},
          "annotations": {"summary": "Device 3 is lost or dead"}, "state": "firing",
          "activeAt": "2026-01-01T00:00:00Z", "startsAt": "2026-01-01T00:00:30Z"}


def test_alerts_asks_the_daemon_at_url(daemonish: Callable[..., _Daemonish], tmp_path: Path) -> None:
    stub = daemonish(lambda path: {"status": "success", "alerts": [FIRING]})
    config = _config(tmp_path)
    nowhere = run_cli("alerts", "--config", config)
    assert nowhere.returncode == 1 and "tpuwatch: the daemon at http://127.0.0.1:" in nowhere.stderr
    listed = run_cli("alerts", "--config", config, "--url", stub.url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:5] == ["firing", "critical", "AcceleratorLost", "3", "0000:13:00.0"]
    behind_a_proxy = run_cli("alerts", "--config", config, "--url", f"{stub.url}/tpuwatch/", "--json")
    assert json.loads(behind_a_proxy.stdout)["alerts"] == [FIRING]
    assert stub.paths == ["/api/alerts", "/tpuwatch/api/alerts"]


@pytest.mark.parametrize("url,message", [
    ("127.0.0.1:9847", "invalid URL '127.0.0.1:9847' (need http:// or https://, a host, no spaces or control "
                       "characters)"),
    ("http://ops:hunter2@127.0.0.1:9847", "a URL with credentials would show them to every user of this host (ps): "
                                          "give the daemon's address alone"),
    ("http://127.0.0.1:9847/?x=1", "a URL with a query or fragment: give the daemon's address alone, like "
                                   "http://127.0.0.1:9847"),
])
@pytest.mark.parametrize("command", [["alerts"], ["ack", "3"], ["set-healthy"]])
def test_a_bad_url_is_a_usage_error(command: list[str], url: str, message: str) -> None:
    result = run_cli(*command, "--url", url)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"tpuwatch {command[0]}: argument --url: {message} (see --help)"]


@pytest.mark.parametrize("command,devices,said", [
    (["ack", "3"], ["3"], "device(s) 3 marked healthy on node n1: AcceleratorLost acknowledged"),
    (["set-healthy"], None, "every device marked healthy on node n1: AcceleratorLost acknowledged"),
])
def test_ack_leaves_its_request_in_state_dir_and_waits_on_url(
        daemonish: Callable[..., _Daemonish], tmp_path: Path, command: list[str], devices: list[str] | None,
        said: str) -> None:
    state = tmp_path / "other-state"

    def agent(path: str) -> dict[str, Any]:  # as the daemon's agent: every request left is applied
        left = sorted((state / "kubernetes-requests").glob("*.json"))
        return {"node": "n1", "acks": [{"id": p.stem, "alerts": ["AcceleratorLost"]} for p in left]}

    stub = daemonish(agent)
    config = _config(tmp_path, kubernetes={"node_conditions": True})
    result = run_cli(*command, "--config", config, "--url", stub.url, "--state-dir", str(state), "--wait", "20")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{said}\n"
    (request,) = (state / "kubernetes-requests").glob("*.json")
    assert json.loads(request.read_text()) == {"devices": devices}
    assert not (tmp_path / "state").exists()
    assert set(stub.paths) == {"/api/kubernetes"}


# --- a reader that goes away: `| head` -------------------------------------------------------------------------


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``tpuwatch ARGS`` writing into a pipe whose reader has already gone, as ``| head -1`` leaves it."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "tpuwatch", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)
    return proc


@pytest.mark.parametrize("command", ["check", "top", "alerts"])
def test_a_reader_that_goes_away_ends_the_command_quietly(daemonish: Callable[..., _Daemonish], tmp_path: Path,
                                                          command: str) -> None:
    stub = daemonish(lambda path: {"status": "success", "alerts": [FIRING] * 50})
    config = _config(tmp_path, devices={"backend": "sim"}, kernel_log={"source": "none"},
                     canary={"enabled": False})
    args = {"check": ["check", "--config", config], "top": ["top", "--once", "--local", "--config", config],
            "alerts": ["alerts", "--config", config, "--url", stub.url]}[command]
    result = _into_a_closed_pipe(*args)
    assert result.stderr == "", result.stderr  # no "internal error: BrokenPipeError", no "Exception ignored"
    assert result.returncode == 128 + signal.SIGPIPE  # as a Unix tool the pipe killed


def test_top_and_alerts_word_a_daemon_that_does_not_answer_the_same_way(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    config = _config(tmp_path)
    said = {command: run_cli(command, "--config", config, "--url", url, *extra)
            for command, extra in (("alerts", ()), ("top", ("--once",)))}
    assert {c: (r.returncode, r.stdout) for c, r in said.items()} == {"alerts": (1, ""), "top": (1, "")}
    assert said["alerts"].stderr == said["top"].stderr == f"tpuwatch: the daemon at {url} does not answer " \
                                                          "(ConnectionError)\n"
