"""The daemon's side of tpuwatch.probe as one part: the socket, the checks on each report, its metrics.

``JobReports`` serves the socket in its own thread (server.ReportServer).
For each report read whole it checks the message (message.parse), which
chips the sending process holds (chips.resolve, against the inventory of the
latest cycle, read from the devices' board), judges it (verdicts.Judge) and records the verdict in the
canary's book (CanaryCollector.record, path ``job``), so the chip's canary
metrics, alerts and views carry it.  ``collect()`` gives the socket's own
counters.  A socket that cannot be bound is said once and counted as down;
monitoring goes on without it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections import Counter
from collections.abc import Sequence

from tpuwatch import probewire as protocol
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceReading
from tpuwatch.devices.inventory import Board
from tpuwatch.hw.procfs import read_text
from tpuwatch.jobreports import chips, drill
from tpuwatch.jobreports.message import Refused, parse
from tpuwatch.jobreports.plugin import ProbeConfig
from tpuwatch.jobreports.server import Limits, Peer, ReportServer, bind
from tpuwatch.jobreports.verdicts import Judge
from tpuwatch.pods import PodLookup, PodRef
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)


class JobReports:
    """Probe reports from running jobs, judged into ``book``; ``inventory`` holds the chips of the latest cycle."""

    name = "probe"

    def __init__(self, config: Config, book: CanaryCollector, inventory: Board,
                 pods: PodLookup | None = None) -> None:
        settings = config.section(ProbeConfig)
        self.book = book
        self.inventory = inventory
        self.pods = pods
        self.socket = settings.socket
        self.problem: str | None = None
        self._procfs, self._dev = config.paths.procfs, config.paths.dev
        self._judge = Judge(config.state_dir, settings.peer_window)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ReportServer | None = None
        self._drill: subprocess.Popen[bytes] | None = None
        try:
            listener = bind(settings.socket)
        except OSError as exc:
            self.problem = f"cannot listen on {settings.socket}: {exc.strerror or exc}"
            log.warning("probe reports off: %s (in-job probes cannot report here)", self.problem)
            return
        limits = Limits(settings.max_connections, settings.max_report_bytes, settings.read_timeout,
                        settings.reports_per_minute)
        self._server = ReportServer(listener, limits, self.handle, self._refused)
        self._server.start()
        log.info("probe reports: listening on %s", settings.socket)
        self._drill = drill.start(config)

    def _refused(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def handle(self, peer: Peer, data: bytes) -> dict[str, object]:
        """The answer to one report from ``peer``: judged and recorded, or refused (and counted)."""
        try:
            report = parse(data)
            readings = self.inventory.current.readings
            files = chips.chip_files(readings, self._dev)
            held = chips.held_by(self._procfs, peer.pid, files)
            mapping = chips.resolve(report, peer.uid, peer.pid, held, files)
        except Refused as refused:
            self._refused(refused.reason)
            return {"accepted": False, "reason": refused.reason, "detail": refused.detail}
        command = read_text(os.path.join(self._procfs, str(peer.pid), "comm")).strip() if peer.pid > 0 else ""
        pod = self._pod(peer.pid, readings, set(mapping.values()))
        job = f"pid {peer.pid}" + (f" ({command})" if command else "") + (f" in {pod.describe()}" if pod.pod or
                                                                          pod.pod_uid else "")
        result = self._judge.judge(report, mapping, job, set(files))
        self.book.record(result, (str(peer.pid), command, pod.namespace, pod.pod))
        self._refused("accepted")
        return {"accepted": True, "status": result.status, "reason": result.reason,
                "devices": {name: next((o.status for o in result.devices if o.device == chip), "unknown")
                            for name, chip in mapping.items()}}

    def _pod(self, pid: int, readings: Sequence[DeviceReading], held: set[str]) -> PodRef:
        if self.pods is None or pid <= 0:
            return PodRef()
        return self.pods.pod_of(pid, [p for r in readings if r.device in held for p in r.plugin_ids])

    def collect(self) -> list[Sample]:
        """The socket's state and its reports by outcome."""
        with self._lock:
            counts = dict(self._counts)
        out = [sample("tpuwatch_probe_socket_up", self._server is not None),
               sample("tpuwatch_probe_reports_total", counts.get("accepted", 0))]
        out += [sample("tpuwatch_probe_reports_rejected_total", counts.get(reason, 0), reason=reason)
                for reason in protocol.REJECTIONS]
        return out

    def close(self) -> None:
        """Stop serving (and the probe-sdc drill's job) and remove the socket file."""
        if self._drill is not None:
            self._drill.kill()
            self._drill.wait()
            self._drill = None
        if self._server is not None:
            self._server.stop()
            self._server = None
            try:
                os.unlink(self.socket)
            except OSError:
                pass
