"""`tpuwatch test-alert` and `tpuwatch alerts`, against real receivers and a real HTTP endpoint."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuwatch import config as config_module
from tpuwatch.alerting import Alerting, listing, testalert
from tpuwatch.alerting.db import DB_NAME
from tpuwatch.alerting.dbopen import open_db
from tpuwatch.config import Config
from tpuwatch.samples import sample


def parse_args(module: Any, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


def config_with(tmp_path: Path, notify: list[dict[str, Any]], **extra: Any) -> Config:
    return config_module.parse(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "notify": notify,
                                               "alerting": {"send_timeout": "1s"}, **extra}))


def test_test_alert_prints_each_answer(receivers: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hook, broken, pd = receivers(), receivers("error"), receivers()
    (tmp_path / "state").mkdir()  # the daemon's, which has run
    config = config_with(tmp_path, [{"name": "hook", "type": "webhook", "url": hook.url()},
                                    {"name": "broken", "type": "slack", "url": broken.url()},
                                    {"name": "pd", "type": "pagerduty", "url": pd.url("/v2/enqueue"),
                                     "routing_key": "k"}])
    assert testalert.run(parse_args(testalert), config) == 1
    assert capsys.readouterr().out.splitlines() == [
        'hook (webhook): delivered: HTTP 200 OK: {"status":"success"}',
        "broken (slack): FAILED: HTTP 500 Internal Server Error: upstream broken",
        'pd (pagerduty): delivered: HTTP 202 Accepted: {"status":"success"}']
    (body,) = hook.json()
    assert body["alerts"][0]["labels"]["alertname"] == "TpuwatchTestAlert"
    assert pd.json()[0]["event_action"] == "trigger"
    with sqlite3.connect(tmp_path / "state" / DB_NAME) as conn:
        assert conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 0  # passed through, nothing left


def test_test_alert_before_the_daemon_ever_ran_leaves_no_state_directory(
        receivers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hook = receivers()
    config = config_with(tmp_path, [{"name": "hook", "type": "webhook", "url": hook.url()}])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    closed_in: list[list[Path]] = []

    def open_watched_db(state_dir: str, max_bytes: int) -> Any:
        db = open_db(state_dir, max_bytes)
        close = db.close
        db.close = lambda: (closed_in.append(list(Path(state_dir).iterdir())), close())  # type: ignore[method-assign]
        return db

    monkeypatch.setattr(testalert, "open_db", open_watched_db)
    assert testalert.run(parse_args(testalert), config) == 0
    assert len(hook.requests) == 1
    assert not (tmp_path / "state").exists()
    assert closed_in and DB_NAME in {p.name for p in closed_in[0]}  # closed before its scratch directory went
    assert list(scratch.iterdir()) == []

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))  # no scratch outbox can be made: one line
    assert testalert.run(parse_args(testalert), config) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tpuwatch: config error: state_dir: {tmp_path / 'state'} does not exist, and no scratch")
    assert len(err.splitlines()) == 1


@pytest.fixture
def nobodys_state_dir() -> Iterator[Path]:
    """A state directory owned by nobody, group root, where nobody can reach it (pytest's tmp_path is root-only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to change user")
    base = Path(tempfile.mkdtemp(prefix="tpuwatch-test-"))
    base.chmod(0o755)
    state = base / "state"
    state.mkdir()
    os.chown(state, pwd.getpwnam("nobody").pw_uid, 0)
    yield state
    shutil.rmtree(base)


def test_as_root_test_alert_becomes_the_state_owner_with_its_groups(nobodys_state_dir: Path) -> None:
    nobody, state = pwd.getpwnam("nobody"), nobodys_state_dir
    child = os.fork()
    if child == 0:  # the change of user is for good: only a child may make it
        code = 1
        try:
            user = testalert.become_state_owner(str(state))
            open_db(str(state), 1 << 20).close()
            code = 0 if (user, os.getuid(), os.getgid()) == ("nobody", nobody.pw_uid, nobody.pw_gid) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    created = list(state.iterdir())
    assert created and {(p.stat().st_uid, p.stat().st_gid) for p in created} == {(nobody.pw_uid, nobody.pw_gid)}


def _others_can_reach(path: Path) -> bool:
    """Whether a user other than the owner can reach ``path`` through every directory above it."""
    return all(parent.stat().st_mode & 0o001 for parent in [path, *path.parents] if parent.is_dir())


@pytest.mark.skipif(not all(_others_can_reach(Path(p).resolve()) for p in
                            (sys.base_prefix, sys.prefix, Path(testalert.__file__).parent)),
                    reason="this Python or tpuwatch is installed where other users cannot reach it")
def test_test_alert_as_root_keeps_the_daemons_state_files_the_daemons(receivers: Any, tmp_path: Path,
                                                                     nobodys_state_dir: Path) -> None:
    hook, state = receivers(), nobodys_state_dir
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(state), "notify": [
        {"name": "hook", "type": "webhook", "url": hook.url()}]}))
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "test-alert", "--config", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"tpuwatch: running as nobody, the owner of {state}")
    assert len(hook.requests) == 1
    created = list(state.iterdir())
    assert created and {p.stat().st_uid for p in created} == {pwd.getpwnam("nobody").pw_uid}


def test_test_alert_one_receiver_and_usage_errors(receivers: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    hook, other = receivers(), receivers()
    config = config_with(tmp_path, [{"name": "hook", "type": "webhook", "url": hook.url()},
                                    {"name": "other", "type": "webhook", "url": other.url()}])
    assert testalert.run(parse_args(testalert, "--receiver", "other"), config) == 0
    assert len(other.requests) == 1 and hook.requests == []
    assert testalert.run(parse_args(testalert, "--receiver", "nope"), config) == 2
    assert capsys.readouterr().err == "tpuwatch: no receiver 'nope' (known: hook, other)\n"
    assert testalert.run(parse_args(testalert), config_with(tmp_path, [])) == 2
    assert capsys.readouterr().err == "tpuwatch: no receivers configured in notify\n"
    missing = config_with(tmp_path, [{"name": "pd", "type": "pagerduty", "routing_key_file": "/nonexistent/key"}])
    assert testalert.run(parse_args(testalert), missing) == 2
    err = capsys.readouterr().err
    assert err.startswith("tpuwatch: config error: notify.pd.routing_key_file: cannot read /nonexistent/key")
    assert len(err.splitlines()) == 1


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[Alerting, int]]:
    """A tiny real HTTP server answering /api/alerts from an Alerting, as the daemon does."""
    alerting = Alerting(config_with(tmp_path, [], alerting={"rule_files": []}), str(tmp_path / "state"))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(alerting.api_payload()).encode()
            self.send_response(200 if self.path == "/api/alerts" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield alerting, server.server_port
    server.shutdown()
    server.server_close()


def test_alerts_lists_the_daemons_active_alerts_most_severe_then_oldest_first(
        endpoint: tuple[Alerting, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alerting, port = endpoint
    config = config_with(tmp_path, [], listen=f"0.0.0.0:{port}")
    assert listing.run(parse_args(listing), config) == 0
    assert capsys.readouterr().out == "no active alerts\n"
    now = time.time()
    info = [sample("tpuwatch_device_info", 1, device=d, chip="v5e", pci=f"0000:1{d}:00.0", backend="sim")
            for d in "0123"]
    alerting.evaluate([*info, sample("tpuwatch_device_temperature_celsius", 90, device="1")], now - 20)
    alerting.evaluate([*info, sample("tpuwatch_device_temperature_celsius", 90, device="1"),
                       sample("tpuwatch_memory_leak_suspected", 1, memory="host", device="", pid=""),
                       sample("tpuwatch_device_up", 0, device="3")], now - 10)
    alerting.evaluate([*info, sample("tpuwatch_device_temperature_celsius", 90, device="1"),
                       sample("tpuwatch_device_up", 0, device="3"), sample("tpuwatch_device_up", 0, device="2")], now)
    assert listing.run(parse_args(listing), config) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["STATE", "SEVERITY", "ALERT", "DEVICE", "PCI", "SINCE", "SUMMARY"]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["firing", "critical", "AcceleratorLost", "3", "0000:13:00.0"],
        ["firing", "critical", "AcceleratorLost", "2", "0000:12:00.0"],
        ["pending", "warning", "AcceleratorTemperatureHigh", "1", "0000:11:00.0"],
        ["firing", "warning", "AcceleratorMemoryLeak", "-", "-"]]  # held: its series missed the last cycle
    assert lines[1].endswith("Accelerator chip 3 (0000:13:00.0) is lost or dead")
    assert listing.run(parse_args(listing, "--json"), config) == 0
    listed = json.loads(capsys.readouterr().out)  # /api/alerts as it is: oldest first
    assert listed["status"] == "success"
    assert [a["labels"]["alertname"] for a in listed["alerts"]] == [
        "AcceleratorTemperatureHigh", "AcceleratorLost", "AcceleratorMemoryLeak", "AcceleratorLost"]


def test_alerts_without_a_daemon_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import free_port

    port = free_port()
    config = config_with(tmp_path, [], listen=f"0.0.0.0:{port}")
    assert listing.run(parse_args(listing), config) == 1
    assert capsys.readouterr().err == f"tpuwatch: the daemon at http://127.0.0.1:{port} does not answer " \
                                      "(ConnectionError)\n"
