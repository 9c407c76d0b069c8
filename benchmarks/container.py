"""A fresh "container" for benchmarks/quickstart.py: a ``git archive HEAD`` copy of this checkout, an empty HOME,
Debian's PATH, and a private mount namespace in which ``/opt``, ``/var/lib``, ``/etc`` and ``/run`` are overlays on
temporary directories, each ``tpuwatch`` in them an empty directory hiding whatever the host has there."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servers import BenchmarkError, die_with_parent

from common import REPO_ROOT

DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The parents of the venv, the default state_dir, the default config and the runtime directory (the probe's socket).
OVERLAID = ("/opt", "/var/lib", "/etc", "/run")


def mount_points(mountinfo: str) -> list[str]:
    """The mount points a ``/proc/PID/mountinfo`` lists, in its order (parents first)."""
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            for line in mountinfo.splitlines() if line.strip()]


# --- the container ---------------------------------------------------------------------------------------------


class Container:
    """A temporary directory holding a copy of the checkout, a HOME and the overlays' upper layers, and a process
    holding the mount namespace the steps enter."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.src = root / "src"
        self.home = root / "home"
        for path in (self.src, self.home):
            path.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "HEAD"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(self.src)], input=archive.stdout, check=True)
        self.env = {"PATH": DEBIAN_PATH, "HOME": str(self.home), "LANG": "C.UTF-8", "TERM": "dumb",
                    **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                        self._mount_script()], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
        assert self.holder.stdout is not None and self.holder.stderr is not None
        if self.holder.stdout.readline().strip() != "ready":
            self.holder.wait()
            raise BenchmarkError(f"cannot make the container's mount namespace: {self.holder.stderr.read().strip()}")

    def _mount_script(self) -> str:
        """Overlay each of OVERLAID, its ``tpuwatch`` an empty opaque directory of the upper layer (whatever the
        host has or later puts there stays hidden), the mounts under it (a container's /etc/resolv.conf) kept."""
        lines = []
        mounts = mount_points(Path("/proc/self/mountinfo").read_text())
        for index, lower in enumerate(OVERLAID):
            upper, work = self.root / f"upper{index}", self.root / f"work{index}"
            (upper / "tpuwatch").mkdir(parents=True)
            os.setxattr(upper / "tpuwatch", "trusted.overlay.opaque", b"y")
            work.mkdir()
            kept = [(m, self.root / f"kept{index}-{n}") for n, m in enumerate(mounts) if m.startswith(lower + "/")]
            for mount, stage in kept:
                (stage.mkdir if Path(mount).is_dir() else stage.touch)()
            lines += [f"mount --bind {shlex.quote(mount)} {stage}" for mount, stage in kept]
            lines.append(f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {lower}")
            lines += [f"mount --bind {stage} {shlex.quote(mount)}" for mount, stage in kept]
        return " && ".join([*lines, "echo ready", "exec sleep infinity"])

    def argv(self, step: str) -> list[str]:
        """``step`` as a shell command line run in the container's working directory."""
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--", "sh", "-c",
                f"cd {shlex.quote(str(self.src))} && exec {step}"]

    def output(self, step: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``step`` and capture what it prints."""
        return subprocess.run(self.argv(step), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=self.env, timeout=timeout, preexec_fn=die_with_parent, check=False)

    def start(self, step: str, log: Path) -> subprocess.Popen[bytes]:
        """Start ``step`` in its own process group, its output in ``log``."""
        with open(log, "wb") as out:
            return subprocess.Popen(self.argv(step), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env, start_new_session=True, preexec_fn=die_with_parent)

    def close(self) -> None:
        """End the namespace's holder (the mounts go with the last process in it)."""
        self.holder.kill()
        self.holder.wait()


@contextmanager
def container() -> Iterator[Container]:
    """A fresh container, removed on the way out."""
    root = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-quickstart-"))
    box = None
    try:
        box = Container(root)
        yield box
    finally:
        if box is not None:
            box.close()
        shutil.rmtree(root, ignore_errors=True)
