"""The state directory: one daemon per directory, and whether state can be kept there now.

- ``acquire(path)`` takes an exclusive ``flock(2)`` on ``path/lock`` (the pid
  written inside); the kernel drops it when the holder dies, so a kill -9
  leaves no stale lock.  ``holder(path)`` says which process has it.
- ``probe(path)`` says whether a new file can be written there now: not
  read-only, not full (``MIN_FREE_BYTES`` left).
- ``StateDir``: the daemon's lock and writability, probed periodically,
  saying each change once in the log.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import pwd
import stat

from tpuwatch.hw.locks import flock_within

log = logging.getLogger(__name__)

LOCK_NAME = "lock"
PROBE_BYTES = 4096
MIN_FREE_BYTES = 1 << 20
LOCK_WAIT_S = 0.5  # a concurrent holder() probe holds the lock for microseconds


class InUse(RuntimeError):
    """Another live process holds the state directory's lock."""

    def __init__(self, state_dir: str, pid: int | None) -> None:
        self.pid = pid
        super().__init__(f"state_dir {state_dir}: in use by {f'pid {pid}' if pid else 'another process'}")


# --- the lock ---------------------------------------------------------------------------------------------------


def _locker_pid(fd: int) -> int | None:
    """The pid holding a flock on ``fd``'s file, from /proc/locks; None if not listed there."""
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == where and parts[4].isdigit():
                    return int(parts[4])
    except OSError:
        pass
    return None


def _pid_of(fd: int) -> int | None:
    """Who holds the lock on ``fd``'s file: /proc/locks, else the pid written in the file."""
    pid = _locker_pid(fd)
    if pid is not None:
        return pid
    try:
        first = os.pread(fd, 32, 0).split(b"\n", 1)[0]
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def _write_pid(fd: int) -> bool:
    """Write this process's pid into the lock file (over the old one, then cut to length)."""
    text = f"{os.getpid()}\n".encode()
    try:
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
    except OSError:
        return False
    return True


def holder(state_dir: str) -> int | None:
    """The pid of the process holding ``state_dir``'s lock (a running daemon); None if nobody holds it.

    Only a process allowed to read the lock file can tell (root or the daemon's user).
    """
    try:
        fd = os.open(os.path.join(state_dir, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid_of(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def acquire(state_dir: str) -> tuple[int, bool] | None:
    """Take ``state_dir``'s lock: (fd, pid written); None when no lock file can be opened there.

    A read-only directory whose lock file exists is still locked (through a read-only descriptor).
    Raises InUse when another process holds it.
    """
    path = os.path.join(state_dir, LOCK_NAME)
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd, writable = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644), True
    except OSError:
        try:
            fd, writable = os.open(path, os.O_RDONLY | flags), False
        except OSError:
            return None
    if not flock_within(fd, LOCK_WAIT_S, poll=0.05):
        pid = _pid_of(fd)
        os.close(fd)
        raise InUse(state_dir, pid)
    return fd, writable and _write_pid(fd)


# --- writability ------------------------------------------------------------------------------------------------


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def probe(state_dir: str, create: bool = True) -> str | None:
    """None if a new file can be written in ``state_dir`` now, else why not (one line).

    With ``create`` a missing directory is made (the daemon); without, its nearest existing parent is judged
    and nothing is written (``config check``, ``tpuwatch check``).
    """
    try:
        if not create:
            return _judge(state_dir)
        os.makedirs(state_dir, exist_ok=True)
        name = os.path.join(state_dir, f".probe-{os.getpid()}")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            written = os.write(fd, b"\0" * PROBE_BYTES)
        finally:
            os.close(fd)
            os.unlink(name)
        free = _free_bytes(state_dir)
    except OSError as exc:
        return exc.strerror or str(exc)
    if written < PROBE_BYTES or free < MIN_FREE_BYTES:
        return f"{os.strerror(errno.ENOSPC)} (only {free} bytes free)"
    return None


def _judge(state_dir: str) -> str | None:
    """Without writing: not a directory, a read-only or full file system, or a directory this process's user
    (its effective uid and groups, ACLs included) cannot write."""
    existing = state_dir
    while not os.path.exists(existing):
        existing = os.path.dirname(existing) or "."
    st, fs = os.stat(existing), os.statvfs(existing)
    if not stat.S_ISDIR(st.st_mode):
        return f"{os.strerror(errno.ENOTDIR)} ({existing})"
    if fs.f_flag & os.ST_RDONLY:
        return f"{os.strerror(errno.EROFS)} ({existing})"
    if not os.access(existing, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        euid = os.geteuid()
        return (f"{existing} is not writable by this user ({_user_name(euid)}, uid {euid}; the directory is "
                f"{_user_name(st.st_uid)}'s, mode {stat.S_IMODE(st.st_mode):04o})")
    free = _free_bytes(existing)
    return None if free >= MIN_FREE_BYTES else f"{os.strerror(errno.ENOSPC)} (only {free} bytes free)"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def probe_every(interval: float) -> float:
    """Seconds between writability probes: the sampling interval, within 1-30 s."""
    return min(30.0, max(1.0, interval))


class StateDir:
    """The daemon's state directory: locked at ``open()``, probed by ``refresh()``; each change logged once.

    ``reason`` is None while state can be kept there, else why not (the daemon then keeps it in memory).
    A directory that cannot be made has no lock yet: it is taken as soon as the directory becomes usable.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.reason: str | None = None
        self._lock_fd: int | None = None
        self._pid_written = False

    @property
    def writable(self) -> bool:
        """True while state can be kept in the directory."""
        return self.reason is None

    def open(self) -> None:
        """Probe and lock; raises InUse when another daemon has the directory."""
        reason = probe(self.path)
        self._lock()
        self.reason = reason
        unlocked = "" if self._lock_fd is not None else "; until then no lock keeps a second daemon off it"
        if reason is not None:
            log.warning("state_dir %s cannot be written (%s): state is kept in memory, and persisted again "
                        "as soon as it can be%s", self.path, reason, unlocked)
        elif unlocked:
            log.warning("state_dir %s: no lock file can be made there, so nothing keeps a second daemon off it",
                        self.path)

    def _lock(self) -> None:
        if self._lock_fd is None:
            taken = acquire(self.path)
            if taken is not None:
                self._lock_fd, self._pid_written = taken
        elif not self._pid_written:  # locked read-only so far
            try:
                fd = os.open(os.path.join(self.path, LOCK_NAME), os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                return
            self._pid_written = _write_pid(fd)
            os.close(fd)

    def refresh(self) -> None:
        """Probe again (one job at a time); a change of writability is logged."""
        reason = probe(self.path)
        if reason is None:
            try:
                self._lock()
            except InUse as exc:
                reason = str(exc)
        old, self.reason = self.reason, reason
        if reason is None and old is not None:
            log.info("state_dir %s can be written again: state is persisted there again", self.path)
        elif reason is not None and old is None:
            log.warning("state_dir %s cannot be written (%s): state is kept in memory until it can", self.path,
                        reason)

    def close(self) -> None:
        """Release the lock (the kernel would at exit anyway)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
