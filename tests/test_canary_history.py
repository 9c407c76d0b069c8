"""The fingerprint history file: its shape and integrity check, one locked read-modify-write between processes,
resets."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tpuwatch import statefile
from tpuwatch.canary import history as history_module
from tpuwatch.canary.history import FingerprintHistory, HistoryBusy, parse
from tpuwatch.canary.judge import history_key, judge

FP_A, FP_B = "0a98d6364a9cd7c3", "869a2cde9c64063e"
KEY = "attn-mlp-v1|float32|cpu|jax 0.10.2, jaxlib 0.10.2, cpu"
OLD_KEY = "attn-mlp-v1|float32|cpu|jax 0.4.0, jaxlib 0.4.0, cpu"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path: Path) -> FingerprintHistory:
    return FingerprintHistory(tmp_path / "canary" / "fingerprints.json")


def write(store: FingerprintHistory, content: str | bytes) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(content if isinstance(content, bytes) else content.encode())


def sealed(history: dict[str, dict[str, str]]) -> str:
    """The file as the history saves it."""
    return json.dumps(statefile.seal(history), separators=(",", ":"))


def test_a_good_history_parses_sealed_or_from_before_the_digest() -> None:
    good = {KEY: {"0": FP_A, "1": FP_A}, OLD_KEY: {"0": FP_B}}
    assert parse(json.dumps(statefile.seal(good), indent=1).encode()) == (good, True)
    assert parse(json.dumps(good, indent=1).encode()) == (good, False)  # what tpuwatch wrote before the digest


@pytest.mark.parametrize("data, problem", [
    (b"{", "not JSON: "),
    (b"\xff\xfe", "not JSON: "),
    (b"[" * 100000, "not JSON: "),
    (b"[]", "wrong shape: a JSON list, not an object"),
    (b'{"k": ["0a98d6364a9cd7c3"]}', "wrong shape: entry 'k' is not a device -> fingerprint object"),
    (b'{"k": {"zero": "0a98d6364a9cd7c3"}}', "wrong shape: device 'zero' of 'k' has no 16-hex-digit fingerprint"),
    (b'{"k": {"0": 12}}', "wrong shape: device '0' of 'k' has no 16-hex-digit fingerprint"),
    (b'{"k": {"0": "0A98"}}', "wrong shape: device '0' of 'k' has no 16-hex-digit fingerprint"),
    (b" " * (history_module.MAX_BYTES + 1), "larger than 1048576 bytes"),
    (sealed({"k": {"0": FP_A}}).replace(FP_A, FP_B).encode(), "integrity check failed: its content does not match"),
    (sealed({"k": {"0": FP_A}}).replace('"sha256"', '"sha265"').encode(), "integrity check failed: an envelope"),
    (json.dumps({"state": {"k": {"0": FP_A}}}).encode(), "integrity check failed: an envelope with the keys 'state'"),
    (json.dumps(statefile.seal([FP_A])).encode(), "wrong shape: a JSON list, not an object"),
])
def test_a_bad_history_says_what_is_wrong(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse(data)
    assert str(caught.value).startswith(problem)


def test_an_unusable_file_is_no_history_discarded_once_and_replaced_by_the_next_recorded_run(
        store: FingerprintHistory, caplog: pytest.LogCaptureFixture) -> None:
    write(store, "[1, 2]")
    discarded = statefile.LEDGER.view()[2].get(str(store.path), 0)
    with caplog.at_level(logging.WARNING, logger="tpuwatch"):
        assert store.read() == ({}, "wrong shape: a JSON list, not an object")
        assert store.update(lambda history: ("drill", history)) == "drill"  # stores nothing: the file stays
        assert store.path.read_text() == "[1, 2]"
        answer = store.update(lambda history: ("judged", {KEY: {"0": FP_A}}))
        assert store.read() == ({KEY: {"0": FP_A}}, None)
    assert answer == "judged" and store.path.read_text() == sealed({KEY: {"0": FP_A}})
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring unusable canary fingerprint history file {store.path}: wrong shape: a JSON list, not an object; "
        "no chip is checked against its history, and the next recorded run's fingerprints replace it"]
    assert statefile.LEDGER.view()[2][str(store.path)] == discarded + 1  # counted once, for /healthz and /metrics


def test_a_flipped_hex_digit_is_caught_and_never_fails_an_honest_chip(store: FingerprintHistory) -> None:
    key = history_key("jax 0.4", "cpu", "float32")
    lines = [{"event": "start", "platform": "cpu", "chip": "cpu", "stack": "jax 0.4", "dtype": "float32",
              "scale": 1.0, "devices": ["0", "1"]},
             *({"event": "result", "device": d, "max_abs_error": 1e-7, "fingerprint": FP_A, "finite": True,
                "duration_seconds": 0.1} for d in ("0", "1"))]
    assert store.update(lambda history: judge(lines, None, history)).status == "pass"
    text = store.path.read_text()
    assert text == sealed({key: {"0": FP_A, "1": FP_A}})
    at = text.index(FP_A) + 5  # the 6th hex digit of device 0's fingerprint, turned into another hex digit
    write(store, text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1:])
    history, problem = store.read()
    assert history == {} and problem is not None and problem.startswith("integrity check failed")
    assert store.update(lambda history: judge(lines, None, history)).status == "pass"
    assert store.path.read_text() == text  # learned afresh, and the next run is checked against it
    assert store.read() == ({key: {"0": FP_A, "1": FP_A}}, None)
    assert judge(lines, None, store.read()[0])[0].status == "pass"


def test_a_history_from_before_the_digest_loads_and_is_sealed_by_the_next_recorded_run(
        store: FingerprintHistory) -> None:
    legacy = json.dumps({OLD_KEY: {"0": FP_B}, KEY: {"0": FP_A}})
    write(store, legacy)
    assert store.read() == ({OLD_KEY: {"0": FP_B}, KEY: {"0": FP_A}}, None)
    store.update(lambda history: (None, history))  # a fire drill: nothing stored, nothing sealed
    assert store.path.read_text() == legacy
    store.update(lambda history: (None, dict(history)))  # a run that changed nothing: sealed all the same
    assert store.path.read_text() == sealed({OLD_KEY: {"0": FP_B}, KEY: {"0": FP_A}})


def test_a_missing_file_is_no_history_and_the_first_update_writes_it(store: FingerprintHistory) -> None:
    assert store.read() == ({}, None)
    assert store.update(lambda history: (history, {KEY: {"0": FP_A}})) == {}
    assert store.path.read_text() == sealed({KEY: {"0": FP_A}})
    assert not list(store.path.parent.glob("*.tmp"))  # written through the atomic helper


def test_an_unchanged_history_is_not_rewritten(store: FingerprintHistory) -> None:
    write(store, json.dumps(statefile.seal({KEY: {"0": FP_A}}), indent=1))
    store.update(lambda history: (None, dict(history)))
    assert store.path.read_text() == json.dumps(statefile.seal({KEY: {"0": FP_A}}), indent=1)


_OTHER_PROCESS = """
import sys
from pathlib import Path
from tpuwatch import statefile
from tpuwatch.canary.history import FingerprintHistory
store = FingerprintHistory(Path(sys.argv[1]))
with store.locked():
    history, _ = store.read()  # the other process's read ...
    print("read", flush=True)
    sys.stdin.readline()
    statefile.save(store.path, {**history, sys.argv[2]: {"0": sys.argv[3]}})  # ... and its write, all under the lock
"""


def test_an_update_waits_for_another_process_s_read_modify_write(store: FingerprintHistory) -> None:
    write(store, json.dumps({OLD_KEY: {"0": FP_B}}))
    other = subprocess.Popen([sys.executable, "-c", _OTHER_PROCESS, str(store.path), "other-stack", FP_B],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert other.stdin is not None and other.stdout is not None
    try:
        assert other.stdout.readline() == "read\n"
        done = threading.Event()

        def ours() -> None:
            store.update(lambda history: (None, {**history, KEY: {"0": FP_A}}))
            done.set()

        thread = threading.Thread(target=ours)
        thread.start()
        assert not done.wait(0.5)  # held off while the other process has read and not yet written
        other.stdin.write("go\n")
        other.stdin.flush()
        thread.join(timeout=10)
        assert done.is_set()
    finally:
        other.stdin.close()
        assert other.wait(timeout=10) == 0
    # Without the lock ours would have been overwritten by the other process's stale read.
    assert store.read()[0] == {OLD_KEY: {"0": FP_B}, "other-stack": {"0": FP_B}, KEY: {"0": FP_A}}


def test_a_lock_held_too_long_judges_without_writing(store: FingerprintHistory, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    write(store, json.dumps({KEY: {"0": FP_A}}))
    monkeypatch.setattr(history_module, "LOCK_WAIT_S", 0.2)
    with store.locked(), caplog.at_level(logging.WARNING, logger="tpuwatch.canary.history"):
        seen = store.update(lambda history: (history, {KEY: {"0": FP_B}}))
        store.update(lambda history: (history, {KEY: {"0": FP_B}}))
    assert seen == {KEY: {"0": FP_A}} and json.loads(store.path.read_text()) == {KEY: {"0": FP_A}}
    assert [r.getMessage() for r in caplog.records] == [
        f"canary fingerprint history {store.path} not updated: {store.lock_path} still locked by another process "
        "after 0.2s"]
    with pytest.raises(HistoryBusy):
        with store.locked():
            store.reset(None)


def test_a_failed_write_is_logged_once_and_the_answer_stands(store: FingerprintHistory,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.with_name(store.path.name + ".tmp").mkdir()  # the temp file cannot be created
    with caplog.at_level(logging.WARNING, logger="tpuwatch"):
        for _ in range(3):
            assert store.update(lambda history: ("answer", {KEY: {"0": FP_A}})) == "answer"
    assert not store.path.exists()
    assert len(caplog.records) == 1
    assert "not saved (kept in memory, retried at each save): Is a directory" in caplog.records[0].getMessage()


def test_resetting_one_device_removes_it_on_every_stack_and_keeps_the_rest(store: FingerprintHistory) -> None:
    write(store, json.dumps({OLD_KEY: {"0": FP_B}, KEY: {"0": FP_B, "1": FP_A}}))
    removed = store.reset("0")
    assert removed.fingerprints == ((OLD_KEY, "0", FP_B), (KEY, "0", FP_B)) and removed.unreadable is None
    assert store.path.read_text() == sealed({KEY: {"1": FP_A}})
    assert store.reset("0").fingerprints == ()


def test_resetting_everything_removes_the_file(store: FingerprintHistory) -> None:
    assert store.reset(None).fingerprints == ()  # nothing there, and nothing made
    assert not store.path.parent.exists()
    write(store, json.dumps({KEY: {"0": FP_A, "1": FP_A}}))
    assert store.reset(None).fingerprints == ((KEY, "0", FP_A), (KEY, "1", FP_A))
    assert not store.path.exists()


def test_resetting_an_unusable_file_removes_it_and_says_why(store: FingerprintHistory) -> None:
    write(store, "{not json")
    removed = store.reset("3")
    assert removed.fingerprints == () and removed.unreadable.startswith("not JSON: ")
    assert not store.path.exists()
