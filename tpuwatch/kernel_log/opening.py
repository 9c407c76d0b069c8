"""Which kernel-log input to read (``kernel_log.source``), and opening it.

Each input (/dev/kmsg, the journal, a followed file) is registered by name in
``SOURCES`` with how it opens; ``auto`` tries those that say so, in order, and
says why it chose one or none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuwatch.config import Config
from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.journal import JournalSource
from tpuwatch.kernel_log.sources import KmsgSource, NoSource, Source, SourceError
from tpuwatch.schema import ConfigError

# Opens a source: (config, kernel_log.path when this source is the one named, the position file, the lookback).
Opener = Callable[[Config, str | None, Path | None, float | None], tuple[Source, str]]


def _kmsg(config: Config, path: str | None, state: Path | None, lookback: float | None) -> tuple[Source, str]:
    path = path or f"{config.paths.dev}/kmsg"
    return KmsgSource(path, state, _boot_id(config.paths.procfs), lookback), f"reading {path}"


def _journal(config: Config, path: str | None, state: Path | None, lookback: float | None) -> tuple[Source, str]:
    return (JournalSource(state, path, lookback),
            f"reading the journal's kernel messages{' in ' + path if path else ''}")


def _file(config: Config, path: str | None, state: Path | None, lookback: float | None) -> tuple[Source, str]:
    assert path is not None  # KernelLogConfig.validate
    return FileSource(path, state), f"following file {path}"


@dataclass(frozen=True)
class SourceType:
    """A kernel-log source by name (``kernel_log.source``): how it opens, and whether ``auto`` tries it."""

    open: Opener
    auto: bool = False


# Registered by name; ``auto`` tries the ones that say so in this order.  The names are also the choices of
# KernelLogConfig.source (tpuwatch/config.py, which cannot import this; a test keeps the two equal).
SOURCES: dict[str, SourceType] = {
    "kmsg": SourceType(_kmsg, auto=True),
    "journal": SourceType(_journal, auto=True),
    "file": SourceType(_file),
}


def open_source(config: Config, persist: bool = True) -> tuple[Source | None, str]:
    """The source ``kernel_log.source`` names (``auto``: /dev/kmsg, else the journal), and why.

    With ``persist`` the position is kept under ``state_dir``/kernel_log, and a
    first start this boot reads back only ``kernel_log.lookback``; without, the
    position is neither read nor saved and the whole boot is read.  Raises
    ConfigError when an explicitly chosen source cannot be opened; ``auto``
    with none usable gives a NoSource that says why.
    """
    settings = config.kernel_log
    state_dir = Path(config.state_dir, "kernel_log")
    lookback = settings.lookback if persist else None

    def opened(name: str) -> tuple[Source, str]:
        path = settings.path if settings.source == name else None  # auto reads each source where it lives
        return SOURCES[name].open(config, path, state_dir / f"{name}.json" if persist else None, lookback)

    if settings.source == "none":
        return None, "kernel_log.source is none: kernel log not read"
    if settings.source != "auto":
        try:
            source, what = opened(settings.source)
        except SourceError as exc:
            raise ConfigError("kernel_log.source", f"{settings.source}: {exc}") from None
        return source, f"kernel log: {what}"
    reasons = []
    for name in (name for name, kind in SOURCES.items() if kind.auto):
        try:
            source, what = opened(name)
        except SourceError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        return source, f"kernel log: auto chose {name}, {what}" + (f" ({reasons[0]})" if reasons else "")
    return NoSource(f"no kernel-log source usable ({'; '.join(reasons)})"), \
        f"kernel log: no source usable ({'; '.join(reasons)})"


def _boot_id(procfs: str) -> str:
    try:
        return read_boot_id(procfs)
    except OSError as exc:
        raise SourceError(f"cannot read this boot's id under {procfs}: {exc.strerror}") from None
