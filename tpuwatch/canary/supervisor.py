"""Keeps the canary worker's process group from outliving the process that started it.

``python -m tpuwatch.canary.supervisor FD -- COMMAND...``, run under the
runner's own interpreter as the leader of a new session and process group:
it starts COMMAND (the worker, under ``canary.python``) in that group and
waits for it.  FD is the read end of a pipe whose only write end the runner
holds.  When the runner dies, whatever kills it (Ctrl-C, SIGTERM, kill -9, a
crash), the kernel closes that end, the read returns, and the supervisor kills
its whole group with SIGKILL: the worker, anything the worker started (the
hang drill's child, a compiler), and itself.  A parent-death signal would only
reach a direct child and fire when the thread that forked ends; the pipe
needs neither, and works even if the worker is stuck in the driver.

The supervisor imports only the standard library and never touches a chip,
so it cannot hang the way a worker can.  Started without a session of its
own (by hand), it makes one first, so that it never kills its caller's group.  It exits with the worker's status,
and dies of the same signal as a worker that was killed by one.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading

EXIT_CANNOT_START = 3


def _watch(fd: int) -> None:
    """Block until the runner's end of the pipe closes, then kill this whole process group."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except OSError:
            break
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Run the worker command under the watch of the pipe ``argv[0]``; ``argv[1]`` is ``--``."""
    fd, command = int(argv[0]), argv[2:]
    if os.getpgrp() != os.getpid():  # started by hand, not by the runner: never take the caller's group down
        os.setsid()
    threading.Thread(target=_watch, args=(fd,), daemon=True).start()
    try:
        worker = subprocess.Popen(command)
    except OSError as exc:
        reason = f"cannot start canary.python {command[0]}: {exc.strerror or exc}"
        print(json.dumps({"event": "error", "reason": reason}), flush=True)
        return EXIT_CANNOT_START
    returncode = worker.wait()
    if returncode < 0:  # die of the worker's signal, without a core file of our own
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if -returncode != signal.SIGKILL:
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
        return 128 - returncode  # the shell's convention, should the signal not end this process
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
