"""A procfs tree in a temp dir whose holder process hangs on read, like a wedged driver."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def make_hanging_procfs(root: Path) -> tuple[Path, Path]:
    """(procfs, dev): meminfo and stat copied from /proc; pid 4242 holds dev/accel0; its statm never answers."""
    procfs, dev = root / "proc", root / "dev"
    (procfs / "4242" / "fd").mkdir(parents=True)
    dev.mkdir()
    (dev / "accel0").write_text("")
    for name in ("meminfo", "stat"):
        shutil.copyfile(f"/proc/{name}", procfs / name)
    (procfs / "4242" / "comm").write_text("trainer\n")
    os.symlink(dev / "accel0", procfs / "4242" / "fd" / "3")
    os.mkfifo(procfs / "4242" / "statm")  # opening a FIFO with no writer blocks forever
    return procfs, dev
