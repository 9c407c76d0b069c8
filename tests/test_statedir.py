"""The state directory on real file systems: the flock lock across processes, the writability probe on a real
tmpfs (read-only, full), the simulated namespace, shape checks of state files."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tpuwatch import statefile
from tpuwatch.statedir import InUse, StateDir, acquire, holder, probe

from conftest import Tmpfs


def hold_lock(state_dir: Path) -> subprocess.Popen[str]:
    """Another process holding ``state_dir``'s lock, until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from tpuwatch import statedir
        statedir.acquire({str(state_dir)!r})
        print("locked", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    return proc


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    assert holder(str(tmp_path)) is None  # no lock file yet
    other = hold_lock(tmp_path)
    try:
        assert holder(str(tmp_path)) == other.pid
        assert (tmp_path / "lock").read_text() == f"{other.pid}\n"
        with pytest.raises(InUse, match=f"^state_dir {tmp_path}: in use by pid {other.pid}$"):
            acquire(str(tmp_path))
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    assert holder(str(tmp_path)) is None  # the kernel dropped it: nothing stale
    taken = acquire(str(tmp_path))
    assert taken is not None and taken[1]
    assert holder(str(tmp_path)) == os.getpid()
    assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"  # the longer old pid cut off
    os.close(taken[0])


def test_a_read_only_state_dir_is_still_locked_and_its_holder_known(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs()
    (fs.path / "lock").write_text("999999999\n")  # a stale pid from an old run
    fs.remount("ro")
    taken = acquire(str(fs.path))
    assert taken is not None and taken[1] is False  # locked through a read-only descriptor
    try:
        assert holder(str(fs.path)) == os.getpid()  # from /proc/locks, not the stale file
        with pytest.raises(InUse, match=f"in use by pid {os.getpid()}"):
            acquire(str(fs.path))
    finally:
        os.close(taken[0])


def test_the_probe_on_a_real_tmpfs_read_only_full_and_freed(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs(size="2m")
    state = fs.path / "state"
    assert probe(str(state), create=False) is None and not state.exists()  # judged without writing
    assert probe(str(state)) is None and state.is_dir()
    filler = fs.fill()
    assert "No space left on device" in (probe(str(state)) or "")
    assert "No space left on device" in (probe(str(state), create=False) or "")
    filler.unlink()
    assert probe(str(state)) is None
    fs.remount("ro")
    assert probe(str(state)) == "Read-only file system"
    assert probe(str(state), create=False) == f"Read-only file system ({state})"
    assert sorted(os.listdir(state)) == []  # no probe file left behind


def test_state_dir_says_each_change_once_and_locks_once_it_can(tmpfs: Callable[..., Tmpfs],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    fs = tmpfs()
    fs.remount("ro")
    state = StateDir(str(fs.path / "state"))  # cannot even be made
    with caplog.at_level(logging.INFO):
        state.open()
        for _ in range(3):
            state.refresh()
        assert not state.writable and state.reason == "Read-only file system"
        assert caplog.text.count("cannot be written") == 1 and "no lock keeps a second daemon off" in caplog.text
        assert holder(state.path) is None
        fs.remount("rw")
        for _ in range(3):
            state.refresh()
    assert state.writable and caplog.text.count("can be written again") == 1
    assert holder(state.path) == os.getpid()  # locked as soon as it could be
    state.close()
    assert holder(state.path) is None


def test_state_dir_in_use_once_writable_again_stays_in_memory(tmpfs: Callable[..., Tmpfs]) -> None:
    fs = tmpfs()
    fs.remount("ro")
    state = StateDir(str(fs.path / "state"))
    state.open()
    fs.remount("rw")
    os.mkdir(state.path)
    other = hold_lock(Path(state.path))  # another daemon took it meanwhile
    try:
        state.refresh()
        assert state.reason == f"state_dir {state.path}: in use by pid {other.pid}"
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    state.refresh()
    assert state.writable


@pytest.mark.parametrize(("text", "why"), [
    ('{"seq": -100000000000000000000}', "out of range"),
    ('{"offset": "12"}', "str at offset, not an integer"),
    ('{"dev": true}', "bool at dev, not an integer"),
    ('{"seq": 1.5}', "float at seq, not an integer"),
    ('{"boot_id": "' + "x" * 65 + '"}', "longer than 64"),
    ('{"other": 1}', "unknown key 'other'"),
    ("[1, 2]", "list, not an object"),
    ("[" * 100_000, "not JSON"),
    ('{"seq": 1', "not JSON"),
    ("\xff", "not JSON"),
])
def test_a_position_file_of_the_wrong_shape_is_never_trusted(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "kmsg.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff" else b"\xff")
    assert statefile.load(path, "kernel log position") is None
    assert why in statefile.LEDGER.view()[1][-1][2]


def test_good_files_load_and_oversized_ones_do_not(tmp_path: Path) -> None:
    path = tmp_path / "file.json"
    good = {"path": "/var/log/kern.log", "dev": 2049, "ino": 12, "offset": 4096}
    assert statefile.save(path, good) and statefile.load(path, "kernel log position") == good
    history = statefile.MapOf(statefile.MapOf(statefile.Str(128)))
    path.write_text(json.dumps({"k": {"0": "abc"}}))
    assert statefile.load(path, "fingerprints", history) == {"k": {"0": "abc"}}
    path.write_text(json.dumps({"k": {"0": 5}}))
    assert statefile.load(path, "fingerprints", history) is None
    path.write_text(json.dumps({"offset": 1, "path": "x" * 2_000_000}))
    assert statefile.load(path, "kernel log position") is None
    assert "larger than 1048576 bytes" in statefile.LEDGER.view()[1][-1][2]


def test_a_sealed_file_loads_only_as_it_was_saved(tmp_path: Path) -> None:
    path = tmp_path / "file.json"
    good = {"path": "/var/log/kern.log", "dev": 2049, "ino": 12, "offset": 4096}
    assert statefile.save(path, good)
    text = path.read_text()
    assert json.loads(text) == {"sha256": statefile.digest(good), "state": good}
    assert statefile.load(path, "kernel log position") == good
    for damaged, why in ((text.replace("4096", "4095"), "its content does not match its sha256"),  # a valid offset
                         (text.replace('"ino":12,', ""), "its content does not match its sha256"),
                         (text.replace('"sha256"', '"sha255"'), "an envelope with the keys"),
                         (text[:text.index(',"state"')] + "}", "an envelope with the keys 'sha256', not"),
                         (json.dumps({**json.loads(text), "extra": 1}), "an envelope with the keys")):
        path.write_text(damaged)
        assert statefile.load(path, "kernel log position") is None, damaged
        assert f"integrity check failed: {why}" in statefile.LEDGER.view()[1][-1][2]
    reasons = set()
    for depth in range(900, 1100):  # around the recursion limit, where checking may need more of it than reading
        with pytest.raises(ValueError, match="^(not JSON|integrity check failed): ") as caught:
            statefile.decode(b'{"sha256": "x", "state": ' + b"[" * depth + b"]" * depth + b"}")
        reasons.add(str(caught.value).split(":")[0])
    assert reasons == {"not JSON", "integrity check failed"}
    path.write_text(json.dumps(good))  # written before sealing: read as it is, and its shape still checked
    assert statefile.load(path, "kernel log position") == good
    path.write_text(json.dumps({**good, "offset": -1}))
    assert statefile.load(path, "kernel log position") is None
    assert "out of range" in statefile.LEDGER.view()[1][-1][2]


def test_a_seal_covers_every_value_and_the_order_of_keys() -> None:
    state = {"b": [1, 2.5, None, True, float("nan")], "a": {"x": "\u00e9\ud800"}}
    sealed = json.loads(json.dumps(statefile.seal(state)))
    unsealed, was_sealed = statefile.unseal(sealed)
    assert was_sealed and json.dumps(unsealed) == json.dumps(state)  # NaN is not equal to itself
    assert statefile.unseal({"a": 1}) == ({"a": 1}, False) and statefile.unseal([1]) == ([1], False)
    reordered = {"sha256": sealed["sha256"], "state": {"a": sealed["state"]["a"], "b": sealed["state"]["b"]}}
    flipped = {**sealed, "state": {**sealed["state"], "b": [1, 2.5, None, False, float("nan")]}}
    for damaged in (reordered, flipped, {**sealed, "sha256": sealed["sha256"].upper()}, {**sealed, "sha256": 5}):
        with pytest.raises(ValueError, match="integrity check failed: its content does not match its sha256"):
            statefile.unseal(damaged)


def test_a_save_that_fails_says_so_once_and_again_when_it_works(tmpfs: Callable[..., Tmpfs],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    fs = tmpfs()
    path = fs.path / "kernel_log" / "kmsg.json"
    fs.remount("ro")
    with caplog.at_level(logging.INFO):
        assert [statefile.save(path, {"seq": n}) for n in range(3)] == [False] * 3
        assert str(path) in statefile.LEDGER.view()[0]
        fs.remount("rw")
        assert statefile.save(path, {"seq": 3})
    assert caplog.text.count("not saved") == 1 and caplog.text.count("saved again") == 1
    assert str(path) not in statefile.LEDGER.view()[0]
    assert statefile.unseal(json.loads(path.read_text())) == ({"seq": 3}, True)
    assert sorted(os.listdir(path.parent)) == ["kmsg.json"]


def test_a_state_dir_that_is_a_file_is_judged_unwritable_without_writing(tmp_path: Path) -> None:
    # config check said ok for it; the daemon then kept its state in memory only.
    path = tmp_path / "state"
    path.write_text("not a directory")
    assert probe(str(path), create=False) == f"Not a directory ({path})"
    assert probe(str(path / "below"), create=False) == f"Not a directory ({path})"



NOBODY = 65534


def _as_nobody(*args: str) -> tuple[int, str]:
    """``tpuwatch ARGS`` run in a forked child as uid/gid 65534 (nobody), a user without rights to root's files
    (forked, not started: this Python may live where nobody cannot reach it); (exit status, stdout + stderr)."""
    from tpuwatch import (
        cli,
        webconfig,  # noqa: F401
    )
    from tpuwatch.alerting import service  # noqa: F401 - what config check imports, loaded while still root
    from tpuwatch.kernel_log import collector, rulefile  # noqa: F401

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 3
        try:
            os.dup2(write, 1)
            os.dup2(write, 2)
            sys.stdout = os.fdopen(1, "w", closefd=False)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = cli.main(list(args))
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status), out


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_config_check_judges_the_state_dir_for_the_user_running_it_not_its_owner() -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="tpuwatch-statedir-", dir="/tmp"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir(mode=0o755)  # root's, writable by root (its owner) only
        config = base / "config.yaml"
        config.write_text(f"state_dir: {state}\nkernel_log: {{source: none}}\ndevices: {{backend: sim}}\n")
        config.chmod(0o644)
        assert probe(str(state / "simulated"), create=False) is None  # root, its owner, may write it
        code, out = _as_nobody("config", "check", "--config", str(config))
        assert code == 2, out
        assert out == (
            f"tpuwatch: config error: state_dir: {state}/simulated cannot be written: {state} is not writable by "
            f"this user (nobody, uid {NOBODY}; the directory is root's, mode 0755) (the daemon would run, keeping "
            "its state in memory only)\n")
        os.chown(state, NOBODY, NOBODY)  # now the running user's own
        code, out = _as_nobody("config", "check", "--config", str(config))
        assert code == 0 and out == f"{config}: ok\n", out
    finally:
        shutil.rmtree(base)
