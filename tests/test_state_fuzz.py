"""Every state file the daemon reads, broken many ways (statefuzz: 1,000 cases each by default, a fixed seed):
the part reading it never raises, never trusts it, and still handles the next real event.

A longer run: ``TPUWATCH_FUZZ_CASES=20000 TPUWATCH_FUZZ_SEED=$RANDOM pytest tests/test_state_fuzz.py``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tpuwatch import config as config_module
from tpuwatch.alerting import Alerting
from tpuwatch.alerting.db import DB_NAME, AlertDB, Notification
from tpuwatch.alerting.sqlitefile import KEEP_MOVED_ASIDE
from tpuwatch.alerting.state import Alert
from tpuwatch.analysis.state import FILE_NAME, TrendStateFile
from tpuwatch.analysis.trend import TrendAnalyzer
from tpuwatch.canary.history import FingerprintHistory
from tpuwatch.canary.judge import history_key, judge
from tpuwatch.config import TrendConfig
from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.journal import JournalSource
from tpuwatch.kernel_log.sources import KmsgSource

import statefuzz
from kernellog import drain

TABLES = {"alerts": ["fingerprint", "labels", "annotations", "state", "active_at", "fired_at", "resolved_at",
                     "value"],
          "notified": ["receiver", "fingerprint", "at"],
          "outbox": ["id", "receiver", "key", "body", "created", "next_attempt", "attempts", "claimed_until"]}


@pytest.fixture(autouse=True)
def quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)  # every case logs what it discards; thousands of lines help nobody


def _rng(name: str) -> random.Random:
    return random.Random(f"{statefuzz.SEED}:{name}")


def _ecc(value: float) -> list[Any]:
    from tpuwatch.samples import sample
    return [sample("tpuwatch_device_up", 1, device="3"),
            sample("tpuwatch_device_ecc_errors_total", value, device="3", kind="uncorrected")]


def _good_alerting_db(path: Path) -> None:
    db = AlertDB(str(path), 1 << 20)
    alert = Alert("f00d", {"alertname": "AcceleratorEccUncorrectable", "severity": "critical", "device": "1"},
                  {"summary": "s"}, "firing", 1.0, fired_at=2.0)
    db.save_alerts([alert])
    db.enqueue([Notification("hook", ('{"alerts": []}',), told_firing=("f00d",))], 3.0)
    db.close()


def test_fuzzed_alerting_db_is_moved_aside_or_cleaned_and_the_next_alert_is_queued(tmp_path: Path) -> None:
    good = statefuzz.sqlite_files(_good_alerting_db, tmp_path)
    assert set(good) == {"", "-wal", "-shm", "whole"} and len(good["-wal"]) > 32  # the WAL holds frames to break
    config = config_module.parse(yaml.safe_dump({
        "alerting": {"group_wait": "0s", "rule_files": []},
        "notify": [{"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/hook"}]}))
    state = tmp_path / "state"
    rng = _rng("alerting.db")
    for name, files in statefuzz.sqlite_cases(good, rng, tmp_path, TABLES):
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir()
        for suffix, data in files.items():
            if data is not None:
                (state / f"{DB_NAME}{suffix}").write_bytes(data)
        alerting = Alerting(config, str(state))
        try:
            assert alerting.state_problem is None, name
            now = time.time()
            alerting.evaluate(_ecc(0), now - 1)
            alerting.evaluate(_ecc(1), now)
            alerting.flush(now)
            message, _ = alerting.db.claim("hook", now, 5.0)
            while message is not None and '"device": "3"' not in message.body:
                alerting.db.delete(message.id)  # what the broken file still held, sent first
                message, _ = alerting.db.claim("hook", now, 5.0)
            assert message is not None and "AcceleratorEccUncorrectable" in message.body, name
        finally:
            alerting.db.close()
        moved = {p.name.split("-wal")[0].split("-shm")[0] for p in state.iterdir() if ".corrupt-" in p.name}
        assert len(moved) <= KEEP_MOVED_ASIDE, name


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "from-before-the-digest"])
def test_fuzzed_trend_state_is_not_trusted_and_the_detectors_go_on(tmp_path: Path, sealed: bool) -> None:
    """Sealed, as the daemon writes it: what was saved is restored, or nothing.  A file from before the digest
    (still read): restoring it never raises."""
    from test_trend_state import START, STEP, cycle, feed

    trained = TrendAnalyzer(TrendConfig())
    feed(trained, np.arange(START, START + 1800, STEP), seed=5)
    state = TrendStateFile(str(tmp_path))
    state.save(trained, START + 1800)
    good = json.loads((tmp_path / FILE_NAME).read_bytes())
    learned = json.dumps(good["state"])
    for name, data in statefuzz.json_cases(good if sealed else good["state"],
                                           _rng("trend.json" if sealed else "trend.json before the digest")):
        (tmp_path / FILE_NAME).write_bytes(data)
        trend = TrendAnalyzer(TrendConfig())
        restored = state.restore(trend, START + 1830)
        assert 0 <= restored <= 2, name
        if sealed:
            assert restored in (0, 2) and (restored == 0 or json.dumps(trend.snapshot(START + 1800)) == learned), name
        for t in (START + 1840, START + 1850):
            trend.observe(cycle(t, np.random.default_rng(int(t))), t)
        trend.samples()
        json.dumps(trend.snapshot(START + 1860))


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "from-before-the-digest"])
def test_fuzzed_file_position_never_blinds_the_kernel_log(tmp_path: Path, sealed: bool) -> None:
    log_file, position = tmp_path / "kern.log", tmp_path / "kernel_log" / "file.json"
    log_file.write_text("old line 1\nold line 2\n")
    source = FileSource(str(log_file), position)
    source.commit()
    good = json.loads(position.read_text())
    assert good["state"]["offset"] == log_file.stat().st_size
    for i, (name, data) in enumerate(statefuzz.json_cases(good if sealed else good["state"], _rng(
            "kernel_log/file.json" if sealed else "kernel_log/file.json before the digest"))):
        position.write_bytes(data)
        source = FileSource(str(log_file), position)
        drain(source)
        with open(log_file, "a") as handle:
            handle.write(f"event {i}\n")
        assert f"event {i}" in [r.message for r in drain(source)], name
        source.commit()
        source.close()


def _fuzz_positions(position: Path, open_source: Callable[[], Any], what: str) -> None:
    """A good position saved by a real read, then every broken variant of it: opening, reading and saving never
    raise."""
    source = open_source()
    drain(source)
    source.commit()
    source.close()
    good = json.loads(position.read_text())
    cases = [*statefuzz.json_cases(good, _rng(what)), *statefuzz.json_cases(good["state"], _rng(f"{what} before"))]
    for _, data in cases:
        position.write_bytes(data)
        source = open_source()
        try:
            source.read()
            source.commit()
        finally:
            source.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs read access to /dev/kmsg")
def test_fuzzed_kmsg_position_never_raises(tmp_path: Path) -> None:
    position = tmp_path / "kernel_log" / "kmsg.json"
    boot_id = read_boot_id()
    _fuzz_positions(position, lambda: KmsgSource("/dev/kmsg", position, boot_id), "kernel_log/kmsg.json")


CANARY_LINES = [{"event": "start", "platform": "cpu", "chip": "cpu", "stack": "jax 0.4", "dtype": "float32",
                 "scale": 1.0, "devices": ["0", "1"]},
                *({"event": "result", "device": d, "max_abs_error": 1e-7, "fingerprint": "0123456789abcdef",
                   "finite": True, "duration_seconds": 0.1} for d in ("0", "1"))]


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "from-before-the-digest"])
def test_fuzzed_fingerprint_history_is_not_trusted(tmp_path: Path, sealed: bool) -> None:
    """Sealed, as the canary writes it: no fingerprint but the saved ones, so an honest run passes.  A file from
    before the digest (still read, and sealed at the next run): reading and judging it never raise."""
    path = tmp_path / "canary" / "fingerprints.json"
    path.parent.mkdir()
    key = history_key("jax 0.4", "cpu", "float32")
    learned = {key: {"0": "0123456789abcdef", "1": "0123456789abcdef"}}
    FingerprintHistory(path).update(lambda history: (None, learned))
    good = json.loads(path.read_bytes())
    for name, data in statefuzz.json_cases(good if sealed else good["state"],
                                           _rng("canary/fingerprints.json" if sealed else
                                                "canary/fingerprints.json before the digest")):
        path.write_bytes(data)
        history = FingerprintHistory(path).read()[0]
        result, _ = judge(CANARY_LINES, None, history)
        if sealed:
            kept = [(key, device, fp) for key, devices in history.items() for device, fp in devices.items()]
            assert all(learned.get(key, {}).get(device) == fp for key, device, fp in kept), name  # none but saved
            assert result.status == "pass", name


def test_fuzzed_journal_position_never_raises(tmp_path: Path) -> None:
    pytest.importorskip("systemd.journal")
    from test_kernel_log_sources import _append_journal

    journal, position = tmp_path / "k.journal", tmp_path / "kernel_log" / "journal.json"
    _append_journal(journal, ["EDAC MC0: 1 UE memory read error"], int(time.time() * 1e6) - 10**7)
    _fuzz_positions(position, lambda: JournalSource(position, str(journal)), "kernel_log/journal.json")


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs root's /dev/kmsg")
def test_a_kmsg_position_beyond_the_ring_does_not_blind_the_kernel_log(tmp_path: Path) -> None:
    position = tmp_path / "kmsg.json"
    position.write_text(json.dumps({"boot_id": read_boot_id(), "seq": 2**62}))
    source = KmsgSource("/dev/kmsg", position, read_boot_id())
    tag = f"tpuwatch-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        drain(source)
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<6>{tag}: a record after the restart\n")
        assert any(tag in r.message for r in drain(source))
    finally:
        source.close()
