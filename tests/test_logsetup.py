"""Logging: plain lines on a terminal or file, priority-prefixed lines when stderr is the journal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tpuwatch import logsetup

from conftest import free_port

SCRIPT = """
import logging, sys
if sys.argv[1] == "no-systemd":
    sys.modules["systemd"] = None  # as on a host without systemd-python
from tpuwatch import logsetup
logsetup.configure("info")
logging.getLogger("tpuwatch.test").error("chip 3 lost")
logging.getLogger("tpuwatch.test").info("all good")
"""


def run_logging(tmp_path: Path, journal: bool) -> str:
    log_file = tmp_path / "stderr.log"
    with open(log_file, "wb") as stderr:
        env = dict(os.environ)
        env.pop("JOURNAL_STREAM", None)
        if journal:
            stat = os.fstat(stderr.fileno())
            env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}"
        subprocess.run([sys.executable, "-c", SCRIPT, "no-systemd"], stderr=stderr, env=env, check=True, timeout=60)
    return log_file.read_text()


def test_plain_lines_with_time_and_level(tmp_path: Path) -> None:
    lines = run_logging(tmp_path, journal=False).splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("ERROR tpuwatch.test: chip 3 lost") and lines[1].endswith("INFO tpuwatch.test: all good")


LEAKY = """
import logging, sys, urllib.parse
sys.modules["systemd"] = None
from tpuwatch import logsetup
logsetup.configure("debug")
secret = "hunter2-" + "Pa ss/w"
logsetup.add_secrets([secret])
log = logging.getLogger("tpuwatch.test")
log.error("receiver said %s and %r", secret, {"auth": urllib.parse.quote(secret)})
try:
    raise ValueError(f"cannot parse {secret!r}")
except ValueError:
    log.exception("failed for %s", "chip 3")
log.warning("stack", stack_info=True, extra={"x": secret})
log.info("%s %d", "bad", "format")
"""


def test_every_record_is_redacted_message_arguments_exception_and_stack(tmp_path: Path) -> None:
    for journal in (False, True):
        log_file = tmp_path / f"stderr-{journal}.log"
        with open(log_file, "wb") as stderr:
            env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
            if journal:
                stat = os.fstat(stderr.fileno())
                env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}"
            subprocess.run([sys.executable, "-c", LEAKY], stderr=stderr, env=env, check=True, timeout=60)
        text = log_file.read_text()
        assert "hunter2" not in text and "Pa%20ss" not in text, text
        assert "receiver said <secret> and {'auth': '<secret>'}" in text
        assert "failed for chip 3" in text and "ValueError: cannot parse '<secret>'" in text
        assert "Stack (most recent call last)" in text


def test_journal_stream_gets_syslog_priorities(tmp_path: Path) -> None:
    assert run_logging(tmp_path, journal=True).splitlines() == ["<3>tpuwatch.test: chip 3 lost",
                                                                 "<6>tpuwatch.test: all good"]


SKIPPED_RUNS = """
import sys, threading, time
from tpuwatch import config, logsetup
from tpuwatch.daemon import Daemon
logsetup.configure("info")
text = f"devices: {{backend: sim}}\\nstate_dir: {sys.argv[1]}\\nlisten: 127.0.0.1:{sys.argv[2]}"  # never served
daemon = Daemon(config.parse(text), None)
busy = threading.Event()
daemon._scheduler.add_job(busy.wait, "interval", seconds=0.01, id="sample", max_instances=1)
daemon._scheduler.start()
deadline = time.monotonic() + 60
while daemon.scheduler_events["max_instances"] < 50 and time.monotonic() < deadline:
    time.sleep(0.01)
busy.set()
daemon._scheduler.shutdown()
print(daemon.scheduler_events["max_instances"])
"""


def test_a_run_skipped_at_every_tick_is_counted_each_time_and_logged_once(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SKIPPED_RUNS, str(tmp_path / "state"), str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert int(done.stdout) >= 50
    skipped = [line for line in done.stderr.splitlines() if "max instances" in line or "apscheduler" in line]
    assert len(skipped) == 1, done.stderr
    assert "job sample max instances; tpuwatch_scheduler_events_total counts them" in skipped[0]


def test_a_repeating_problem_is_logged_first_then_every_period_with_its_count() -> None:
    sparse = logsetup.Sparse(every=600.0, limit=2)
    assert sparse("missed", 0.0) == 1
    assert [sparse("missed", t) for t in (1.0, 300.0, 599.0)] == [None, None, None]
    assert sparse("missed", 600.0) == 4  # three quiet ones and this one
    assert sparse("missed", 601.0) is None
    assert sparse("skipped", 2.0) == 1  # each key on its own
    assert sparse("third", 3.0) is None  # past the limit, a new key is not logged
