"""Small JSON state files under the state directory: written atomically, read back only if they have the right shape.

``write()`` is the one atomic write (temp file, fsync, rename).  ``save()``,
the daemon's, never raises for a full or read-only disk: it says False, and the
failure is logged once per file until a save there works again.  ``load()``
gives None for a file that is missing, too large, not JSON, or not of the
expected shape; a file that is there but unfit is logged and recorded as
discarded (never trusted), and the next save replaces it.  ``LEDGER`` holds
what failed and what was discarded, for /healthz and /metrics.

Every file ``save()`` writes is sealed: ``seal()`` stores the state with its
SHA-256, ``{"sha256": HEX, "state": STATE}``, and ``load()`` refuses one whose
digest does not match, so a flipped byte, a truncation or a hand edit is unfit
like any other damage - it matters where one damaged digit is another valid
value rather than a wrong shape (a learned baseline, a known-good fingerprint,
an offset).  A file written before sealing (neither envelope key) is still
read, and sealed at its next save.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import types
import typing
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, Union

log = logging.getLogger(__name__)

MAX_BYTES = 1 << 20  # a position or history file is a few hundred bytes
MAX_FAILING = 64
MAX_DISCARDED = 32
DIGEST_KEY, STATE_KEY = "sha256", "state"  # a sealed file: {"sha256": HEX, "state": STATE}


@dataclass(frozen=True)
class Int:
    """An integer (not a bool) in [low, high]."""

    low: int = 0
    high: int = (1 << 63) - 1


@dataclass(frozen=True)
class Str:
    """A string of at most ``max_chars`` characters."""

    max_chars: int = 4096


@dataclass(frozen=True)
class MapOf:
    """A JSON object of at most ``max_items`` entries, keys of at most ``key_chars``, values of shape ``value``."""

    value: Shape
    max_items: int = 4096
    key_chars: int = 256


@dataclass(frozen=True)
class Fields:
    """A JSON object with some of these keys, each of its shape, and no other key."""

    fields: dict[str, Shape]


Shape = Union[Int, Str, MapOf, Fields]

# What the kernel-log sources save (kmsg: boot_id and seq; journal: cursor; file: path, dev, ino, offset): the
# default shape of ``load()``.
POSITION = Fields({"boot_id": Str(64), "seq": Int(), "cursor": Str(4096), "path": Str(4096), "dev": Int(),
                   "ino": Int(), "offset": Int()})


def mismatch(value: Any, shape: Shape, where: str = "") -> str | None:
    """Why ``value`` is not of ``shape`` (naming where in it), or None if it is."""
    at = f" at {where}" if where else ""
    if isinstance(shape, Int):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{type(value).__name__}{at}, not an integer"
        return None if shape.low <= value <= shape.high else f"integer{at} out of range [{shape.low}, {shape.high}]"
    if isinstance(shape, Str):
        if not isinstance(value, str):
            return f"{type(value).__name__}{at}, not a string"
        return None if len(value) <= shape.max_chars else f"string{at} longer than {shape.max_chars}"
    if not isinstance(value, dict):
        return f"{type(value).__name__}{at}, not an object"
    if isinstance(shape, Fields):
        for key, item in value.items():
            if key not in shape.fields:
                return f"unknown key {key[:64]!r}{at}"
            reason = mismatch(item, shape.fields[key], f"{where}.{key}" if where else key)
            if reason:
                return reason
        return None
    if len(value) > shape.max_items:
        return f"object{at} with more than {shape.max_items} entries"
    for key, item in value.items():
        if len(key) > shape.key_chars:
            return f"key{at} longer than {shape.key_chars}"
        reason = mismatch(item, shape.value, f"{where}.{key}" if where else key)
        if reason:
            return reason
    return None


T = TypeVar("T")


def _of_type(value: Any, kind: Any) -> bool:
    if kind is type(None):
        return value is None
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def restore_dataclass(cls: type[T], data: Any) -> T:
    """``cls(**data)`` if ``data`` is an object of ``cls``'s fields, each of its annotated type (bool, int,
    float, str, or None where allowed); TypeError naming the field otherwise.  For small saved states."""
    hints = typing.get_type_hints(cls)
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: {type(data).__name__}, not an object")
    for name, value in data.items():
        kind = hints.get(name)
        kinds = typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)
        if kind is None or not any(_of_type(value, k) for k in kinds):
            raise TypeError(f"{cls.__name__}.{str(name)[:64]}: {type(value).__name__} does not fit")
    return cls(**data)


class Ledger:
    """State files that cannot be saved now, and those discarded (bounded), shared by every part of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failing: dict[str, str] = {}
        self.discarded: deque[tuple[float, str, str]] = deque(maxlen=MAX_DISCARDED)
        self.discarded_total: dict[str, int] = {}

    def save_failed(self, path: Path, reason: str) -> bool:
        """Record a failed save; True if it is this file's first since it last worked."""
        with self._lock:
            first = str(path) not in self.failing
            if first and len(self.failing) < MAX_FAILING:
                self.failing[str(path)] = reason
            return first

    def saved(self, path: Path) -> bool:
        """Record a save that worked; True if the file was failing before."""
        with self._lock:
            return self.failing.pop(str(path), None) is not None

    def forget_failures(self) -> None:
        """Forget the failed saves (state_dir is writable again: the next save of each file tells)."""
        with self._lock:
            self.failing.clear()

    def discard(self, path: Path, reason: str) -> None:
        """Record a state file not used because it was unfit."""
        with self._lock:
            self.discarded.append((time.time(), str(path), reason))
            if str(path) in self.discarded_total or len(self.discarded_total) < MAX_FAILING:
                self.discarded_total[str(path)] = self.discarded_total.get(str(path), 0) + 1

    def view(self) -> tuple[dict[str, str], list[tuple[float, str, str]], dict[str, int]]:
        """(failing saves, recent discards, discards per file) as copies."""
        with self._lock:
            return dict(self.failing), list(self.discarded), dict(self.discarded_total)


LEDGER = Ledger()


def discard(path: Path, what: str, reason: str) -> None:
    """Say once that the ``what`` file at ``path`` is not used, and record it in the ledger."""
    log.warning("ignoring unusable %s file %s: %s", what, path, reason)
    LEDGER.discard(path, reason)


def write(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` as JSON to ``path`` atomically: ``PATH.tmp``, fsync, rename over ``path``.

    OSError if it cannot be written; no half-written file is left behind.
    """
    temp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(state, handle, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError:
        try:
            temp.unlink(missing_ok=True)  # a full disk keeps no half-written file
        except OSError:
            pass  # read-only: there is none
        raise


def digest(state: Any) -> str:
    """The SHA-256, as hex, of ``state`` as compact JSON in its own key order: what a sealed file stores."""
    return hashlib.sha256(json.dumps(state, separators=(",", ":")).encode()).hexdigest()


def seal(state: Any) -> dict[str, Any]:
    """``state`` in its envelope with its digest, as ``save()`` writes it."""
    return {DIGEST_KEY: digest(state), STATE_KEY: state}


def unseal(document: Any) -> tuple[Any, bool]:
    """The state in a loaded ``document`` and whether it was sealed; ValueError if its seal does not hold.

    A document with neither envelope key was written before sealing: it is given as it is (False).
    """
    if not isinstance(document, dict) or (DIGEST_KEY not in document and STATE_KEY not in document):
        return document, False
    if set(document) != {DIGEST_KEY, STATE_KEY}:
        keys = ", ".join(sorted(repr(str(key)[:64]) for key in document)[:4])
        raise ValueError(f"integrity check failed: an envelope with the keys {keys}, not {DIGEST_KEY!r} and "
                         f"{STATE_KEY!r}")
    if document[DIGEST_KEY] != digest(document[STATE_KEY]):
        raise ValueError(f"integrity check failed: its content does not match its {DIGEST_KEY} (damaged, or "
                         "edited by hand)")
    return document[STATE_KEY], True


def decode(data: bytes, max_bytes: int = MAX_BYTES) -> tuple[Any, bool]:
    """The state in the JSON document ``data``, out of its envelope (``unseal()``), and whether it was sealed.

    ValueError saying why it is unfit: larger than ``max_bytes``, not JSON, or a seal that does not hold.
    """
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"not JSON: {str(exc)[:200]}") from None
    try:
        return unseal(document)
    except RecursionError:  # the digest's dumps runs a few frames deeper than loads did
        raise ValueError("integrity check failed: nested too deep to check") from None


def save(path: Path | None, state: dict[str, Any]) -> bool:
    """Write ``state``, sealed (``seal()``), as JSON to ``path`` atomically (``write()``); nothing for None.

    True if it was written; False (logged once per file until it works again) if the disk is full or read-only.
    """
    if path is None:
        return True
    try:
        write(path, seal(state))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if LEDGER.save_failed(path, reason):
            log.warning("state file %s not saved (kept in memory, retried at each save): %s", path, reason)
        return False
    if LEDGER.saved(path):
        log.info("state file %s saved again", path)
    return True


def load(path: Path | None, what: str, shape: Shape | None = POSITION, max_bytes: int = MAX_BYTES
         ) -> dict[str, Any] | None:
    """The state ``save()`` wrote at ``path`` (its digest matching, or a file from before sealing), if it is of
    ``shape`` (None: any object) and at most ``max_bytes``.

    None if there is none, or if it is unfit (logged and recorded naming ``what``): a file is never trusted.
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        discard(path, what, exc.strerror or str(exc))
        return None
    try:
        state, _ = decode(data, max_bytes)
    except ValueError as exc:
        discard(path, what, str(exc))
        return None
    reason = mismatch(state, shape) if shape is not None else (
        None if isinstance(state, dict) else f"{type(state).__name__}, not an object")
    if reason:
        discard(path, what, f"wrong shape: {reason}")
        return None
    return state
