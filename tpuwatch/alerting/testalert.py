"""``tpuwatch test-alert [--receiver NAME]``: send a test alert down the real path and show each answer.

The test alert is built by the same body builders, queued in the same outbox
(claimed by this process so a running daemon does not race it), and posted by
the same notifier; the message is removed whatever the answer, so a failed
test is reported here and never retried later.  Run as root against a state
directory that belongs to another user (the daemon's), it first becomes that
user, so that the outbox files stay writable by the daemon.  Where the state
directory does not exist (the daemon has never run, so none can race), the
outbox is a scratch directory removed afterwards: a test never creates the
daemon's state directory, as root or as anyone.
"""

from __future__ import annotations

import argparse
import os
import pwd
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from tpuwatch.alerting.dbopen import open_db
from tpuwatch.alerting.state import Alert, fingerprint
from tpuwatch.config import Config
from tpuwatch.notifiers import build_notifiers
from tpuwatch.schema import ConfigError

TEST_ALERTNAME = "TpuwatchTestAlert"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tpuwatch test-alert``."""
    parser.add_argument("--receiver", metavar="NAME", help="only this receiver (default: every one in notify)")


def test_alert(host: str, now: float) -> Alert:
    """The synthetic firing alert a test sends."""
    labels = {"alertname": TEST_ALERTNAME, "severity": "info", "host": host}
    annotations = {"summary": f"Test alert from tpuwatch on {host}",
                   "description": "Sent by `tpuwatch test-alert`; nothing is wrong."}
    return Alert(fingerprint(labels), labels, annotations, "firing", now, fired_at=now)


def become_state_owner(state_dir: str) -> str | None:
    """As root, become the user owning ``state_dir`` when that is not root, with that user's own groups (as the
    daemon has them); the user's name, or None when nothing changed."""
    if os.geteuid() != 0:
        return None
    try:
        owner = os.stat(state_dir).st_uid
    except OSError:
        return None
    if owner == 0:
        return None
    try:
        user = pwd.getpwuid(owner)
    except KeyError:
        raise ConfigError("state_dir", f"{state_dir} belongs to uid {owner}, which has no passwd entry") from None
    os.initgroups(user.pw_name, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(owner)
    return user.pw_name


@contextmanager
def outbox_dir(state_dir: str) -> Iterator[str]:
    """``state_dir`` when it exists, else a scratch directory removed on exit; ConfigError if none can be made."""
    if os.path.exists(state_dir):
        yield state_dir
        return
    try:
        scratch = tempfile.TemporaryDirectory(prefix="tpuwatch-test-alert-")
    except OSError as exc:
        raise ConfigError("state_dir", f"{state_dir} does not exist, and no scratch outbox can be made in "
                                       f"{tempfile.gettempdir()}: {exc.strerror or exc}") from None
    with scratch as path:
        yield path


def run(args: argparse.Namespace, config: Config) -> int:
    """Send the test alert to the chosen receivers; 0 if every one accepted it, 1 if not, 2 on usage errors."""
    receivers = [r for r in config.notify if args.receiver in (None, r.name)]
    if not receivers:
        known = ", ".join(r.name for r in config.notify) or "none configured in notify"
        print(f"tpuwatch: no receiver {args.receiver!r} (known: {known})" if args.receiver
              else "tpuwatch: no receivers configured in notify", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        try:
            user = become_state_owner(config.state_dir)
            if user is not None:
                print(f"tpuwatch: running as {user}, the owner of {config.state_dir}", file=sys.stderr)
            notifiers = build_notifiers(receivers, config.alerting.send_timeout)
            db = open_db(stack.enter_context(outbox_dir(config.state_dir)), config.alerting.outbox_max_bytes)
        except ConfigError as exc:
            print(f"tpuwatch: config error: {exc}", file=sys.stderr)
            return 2
        stack.callback(db.close)
        now = time.time()
        alert = test_alert(socket.gethostname(), now)
        ok = True
        for notifier in notifiers:
            ends_at = now + 300.0 if notifier.kind.resend else None  # the resend path's alerts expire unless resent
            for body in notifier.bodies((TEST_ALERTNAME, ""), [alert.told(True, ends_at)], "tpuwatch test-alert"):
                message = db.insert_claimed(notifier.name, body, now, config.alerting.send_timeout + 5.0)
                answer = notifier.send(message.body, message.key)
                db.delete(message.id)
                ok = ok and answer.ok
                print(f"{notifier.name} ({notifier.type}): {'delivered' if answer.ok else 'FAILED'}: "
                      f"{answer.detail}")
    return 0 if ok else 1
