"""The fingerprint history, ``state_dir/canary/fingerprints.json``, shared by the daemon and ``tpuwatch canary``.

Both read, judge and rewrite it, so every read-modify-write holds an flock on
``fingerprints.json.lock`` beside it, for that step only (never while a worker
runs), and every write goes through ``statefile.save`` (temp file, fsync,
rename), sealed with the SHA-256 of its content: two processes never lose each
other's fingerprints, a crash never leaves half a file, and a damaged digit
(another valid fingerprint, which would fail an honest chip) is caught.  A
file that cannot be read, has the wrong shape or fails its integrity check
counts as no history and is discarded as every state file is (logged once,
recorded in ``statefile.LEDGER``); the next recorded run's fingerprints
replace it.  ``tpuwatch canary --reset-history`` removes the file.

The file: ``{"sha256": HEX, "state": {"attn-mlp-v1|float32|CHIP|STACK": {"0":
"16 hex digits", ...}, ...}}``, the most recently updated stack last.  A file
from before the digest (the bare ``state`` object) is read as it is and sealed
at the next update that records a run.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tpuwatch import statefile
from tpuwatch.canary.judge import History
from tpuwatch.hw.locks import flock_within

log = logging.getLogger(__name__)

WHAT = "canary fingerprint history"
MAX_BYTES = 1 << 20
LOCK_WAIT_S = 10.0
_MAX_KEY = 1000
_DEVICE = re.compile(r"^\d{1,6}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")

T = TypeVar("T")


class HistoryBusy(Exception):
    """The history's lock could not be taken (held too long by another process, or no lock file can be made)."""


def history_path(state_dir: str) -> Path:
    """Where the fingerprint history of this host lives."""
    return Path(state_dir) / "canary" / "fingerprints.json"


def parse(data: bytes) -> tuple[History, bool]:
    """The history in ``data`` and whether it was sealed (False: a file from before the digest); ValueError
    saying what is wrong with it."""
    history, sealed = statefile.decode(data, MAX_BYTES)
    if not isinstance(history, dict):
        raise ValueError(f"wrong shape: a JSON {type(history).__name__}, not an object")
    for key, devices in history.items():
        if len(key) > _MAX_KEY or not isinstance(devices, dict):
            raise ValueError(f"wrong shape: entry {key[:80]!r} is not a device -> fingerprint object")
        for device, fingerprint in devices.items():
            if not _DEVICE.match(device) or not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
                raise ValueError(f"wrong shape: device {device[:20]!r} of {key[:80]!r} has no 16-hex-digit "
                                 "fingerprint")
    return history, sealed


@dataclass(frozen=True)
class Removed:
    """What ``--reset-history`` removed: fingerprints as (stack key, device, fingerprint), or an unreadable file."""

    path: Path
    fingerprints: tuple[tuple[str, str, str], ...] = ()
    unreadable: str | None = None


class FingerprintHistory:
    """The history file at ``path`` and its lock file."""

    _reported: dict[tuple[Path, str], str] = {}  # the last problem logged per file and step: each logged once
    _reported_lock = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")

    def read(self) -> tuple[History, str | None]:
        """The stored fingerprints and None, or no history and why the file cannot be used (discarded, once)."""
        history, _, problem = self._read()
        return history, problem

    def _read(self) -> tuple[History, bool, str | None]:
        """(fingerprints, whether the file is from before the digest, why it cannot be used)."""
        problem = None
        try:
            history, sealed = parse(_read_bounded(self.path))
        except FileNotFoundError:
            history, sealed = {}, True
        except OSError as exc:
            history, sealed, problem = {}, True, f"unreadable: {exc.strerror or exc}"
        except ValueError as exc:
            history, sealed, problem = {}, True, str(exc)
        if self._note("read", problem):
            statefile.discard(self.path, WHAT, f"{problem}; no chip is checked against its history, and the next "
                                               "recorded run's fingerprints replace it")
        return history, not sealed, problem

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the history's lock (an flock on the lock file), waiting at most LOCK_WAIT_S for it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise HistoryBusy(f"cannot open {self.lock_path}: {exc.strerror or exc}") from None
        try:
            if not flock_within(fd, LOCK_WAIT_S):
                raise HistoryBusy(f"{self.lock_path} still locked by another process after {LOCK_WAIT_S:g}s")
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def update(self, change: Callable[[History], tuple[T, History]]) -> T:
        """Read, ``change`` (what to return, the history to store), write back if it changed: one locked step.

        ``change`` returning the very history it was given stores nothing (a fire drill): not even a file from
        before the digest is sealed then.  An unusable file counts as none, so what ``change`` stores replaces
        it.  Without the lock (HistoryBusy) ``change`` sees the file as it is and nothing is written; that and a
        failed write are logged once, and the answer stands.
        """
        try:
            with self.locked():
                self._note("lock", None)
                history, unsealed, _ = self._read()
                answer, updated = change(history)
                if updated is not history and (updated != history or unsealed):
                    self._save(updated)
                return answer
        except HistoryBusy as exc:
            if self._note("lock", f"not updated: {exc}"):
                log.warning("canary fingerprint history %s not updated: %s", self.path, exc)
            return change(self.read()[0])[0]

    def reset(self, device: str | None) -> Removed:
        """Remove ``device``'s fingerprints on every stack, or the whole file for None (also when unreadable)."""
        if not self.path.exists():  # nothing to lock for (and no directories made)
            return Removed(self.path)
        with self.locked():
            if not self.path.exists():
                return Removed(self.path)
            history, problem = self.read()
            if problem is not None or device is None:
                self.path.unlink()
                self._note("read", None)
                return Removed(self.path, _entries(history, None), problem)
            removed = _entries(history, device)
            if removed:
                kept = {key: {d: fp for d, fp in devices.items() if d != device} for key, devices in history.items()}
                if not statefile.save(self.path, {key: devices for key, devices in kept.items() if devices}):
                    raise OSError(f"cannot write {self.path}")
            return Removed(self.path, removed)

    def _save(self, history: History) -> None:
        statefile.save(self.path, history)  # a failed write is logged there, once until one works

    def _note(self, step: str, problem: str | None) -> bool:
        """Keep ``problem`` as the last of ``step`` (read, lock; None clears it); True if it is to be told: not
        the one kept before."""
        with self._reported_lock:
            last = self._reported.pop((self.path, step), None)
            if problem is not None:
                self._reported[(self.path, step)] = problem
        return problem is not None and problem != last


def _read_bounded(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(MAX_BYTES + 1)


def _entries(history: History, device: str | None) -> tuple[tuple[str, str, str], ...]:
    return tuple((key, d, fp) for key, devices in history.items() for d, fp in devices.items()
                 if device is None or d == device)
