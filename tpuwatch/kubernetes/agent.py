"""The node agent: alert state in, node conditions, marks and remediation out, on its own thread.

The daemon hands it each cycle's active alerts with ``feed()``, which never blocks: a one-place mailbox
whose newest content replaces an unread older one.  The thread does the API calls, each under
``api_timeout``; a failure is counted, retried with exponential backoff, and what was decided meanwhile
(transition times included) is written once the server answers again.  State that must survive a restart
(remediation repeats and limits, marks held for manual release, acks) is kept in
``STATE_DIR/kubernetes.json``; what the Node carries (conditions, taints, cordon) is read back from the Node.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tpuwatch import statefile
from tpuwatch.config import Config
from tpuwatch.kubernetes import actions
from tpuwatch.kubernetes.client import ApiError, KubeClient, connect, in_cluster_namespace
from tpuwatch.kubernetes.conditions import ConditionBook, Fault, PatchGate, condition_table, faults, offered
from tpuwatch.kubernetes.node import Marks, patch_for
from tpuwatch.kubernetes.plugin import KubernetesConfig, NodeConditionConfig
from tpuwatch.kubernetes.remediation import MARK_ACTIONS, Ladders, Trigger, add_mark
from tpuwatch.kubernetes.slots import SlotLimiter
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError

log = logging.getLogger(__name__)

STATE_FILE = "kubernetes.json"
REQUESTS_DIR = "kubernetes-requests"
MAX_REQUESTS = 32
MAX_REQUEST_BYTES = 4096
CONFLICT_RETRIES = 3


def build(config: Config) -> KubernetesAgent | None:
    """The agent ``config`` asks for, or None when ``kubernetes.node_conditions`` is off; ConfigError if unusable."""
    section = config.kubernetes
    if not section.node_conditions:
        return None
    node = section.node_name or os.environ.get("NODE_NAME", "")
    if not node:
        raise ConfigError("kubernetes.node_name", "unset and $NODE_NAME is empty (set it from the downward API: "
                          "fieldRef spec.nodeName)")
    return KubernetesAgent(section, node, connect(section.kubeconfig, section.api_timeout), Path(config.state_dir),
                           offered(config))


class KubernetesAgent:
    """Keeps the Node's conditions, marks and remediation in step with tpuwatch's alerts (an action)."""

    name = "kubernetes"

    def __init__(self, section: KubernetesConfig, node: str, client: KubeClient, state_dir: Path,
                 plugins: Sequence[NodeConditionConfig] = ()) -> None:
        self.section, self.node, self.client = section, node, client
        self.state_path = state_dir / STATE_FILE
        self.requests_dir = state_dir / REQUESTS_DIR
        state = statefile.load(self.state_path, "kubernetes state", shape=None) or {}
        self.table = condition_table(section, plugins)
        self.book = ConditionBook(self.table, section.clear_after, time.time())
        self.gate = PatchGate(section.heartbeat)
        try:
            self.ladders = Ladders(section, node, state.get("ladders"))
            self.acks: dict[str, float] = {str(k): float(v) for k, v in (state.get("acks") or {}).items()}
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # a file of the wrong shape: start afresh
            statefile.discard(self.state_path, "kubernetes state", f"wrong shape: {type(exc).__name__}: {exc}")
            self.ladders, self.acks = Ladders(section, node, None), {}
        namespace = section.lease_namespace or os.environ.get("POD_NAMESPACE") or in_cluster_namespace() or "default"
        self.slots = SlotLimiter(client, namespace, section.lease_prefix, node, section.lease_duration,
                                 section.node_selector, section.max_unhealthy_nodes) if section.remediation else None
        self.adopted = False
        self.held_back = False
        self.last_sync: float | None = None
        self.errors: Counter[tuple[str, str]] = Counter()
        self.dropped = 0
        self.save_failures = 0
        self.processed: deque[dict[str, Any]] = deque(maxlen=20)
        self._faults: list[Fault] = []
        self._alerts: list[dict[str, Any]] = []
        self._mail: tuple[list[dict[str, Any]], dict[str, str]] | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry_at = 0.0
        self._backoff = section.retry_initial
        self._failing = False
        self._saved: dict[str, Any] | None = None
        self._marked: Marks | None = None
        self._marked_at = 0.0
        self._payload: dict[str, Any] = {}
        self._samples: list[Sample] = []
        self._publish()

    # --- the daemon's hooks ---------------------------------------------------------------

    def feed(self, alerts: list[dict[str, Any]], pci_by_device: dict[str, str]) -> None:
        """Hand over one cycle's active alerts and the chips' PCI addresses; never blocks."""
        with self._lock:
            if self._mail is not None:
                self.dropped += 1
            self._mail = (alerts, pci_by_device)
        self._wake.set()

    def start(self) -> None:
        """Start the agent's thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="kubernetes", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (a call in flight ends by its own deadline); save the state."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._save()
        self.client.close()

    def _loop(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self.step(time.time())
                failing = False
            except Exception as exc:  # noqa: BLE001 - the agent must outlive any bug in one round (logged once)
                if not failing:
                    log.error("kubernetes agent round failed, retried every second: %s: %s", type(exc).__name__, exc)
                    log.debug("kubernetes agent round failed", exc_info=True)
                failing = True

    # --- one round -----------------------------------------------------------------------------

    def step(self, now: float) -> None:
        """Take the newest cycle's alerts and any ack requests, decide, and talk to the API server if due."""
        with self._lock:
            mail, self._mail = self._mail, None
        release = self._take_requests(now)
        if mail is not None or release:
            if mail is not None:
                self._alerts = mail[0]
                self._faults = faults(mail[0], mail[1], self.table)
            self._prune_acks()
            self.book.update([f for f in self._faults if not self._acked(f)], now, release)
        if now < self._retry_at:
            self._publish()
            return
        operation = "get_node"
        try:
            if not self.adopted:
                node = self.client.get_node(self.node)
                self.book.adopt((node.get("status") or {}).get("conditions") or [], now)
                self.adopted = True
                log.info("kubernetes: node %s adopted (%s)", self.node, ", ".join(
                    f"{s.type}={'True' if s.status else 'False'}" for s in self.book.states.values()))
            if self.gate.due(self.book, now):
                operation = "patch_node_status"
                self.client.patch_node_status(self.node, {"status": {"conditions": self.book.api_conditions(now)}})
                self.gate.sent(self.book, now)
                self.last_sync = now
            if self.slots is not None and (mail is not None or release or self._failing):
                operation = "remediate"
                self._remediate(now)
        except ApiError as exc:
            self._failed(operation, exc, now)
        else:
            if self._failing:
                log.info("kubernetes API answers again")
            self._failing, self._backoff = False, self.section.retry_initial
        self._save()
        self._publish()

    def _failed(self, operation: str, exc: ApiError, now: float) -> None:
        self.errors[(operation, exc.reason)] += 1
        if not self._failing:
            log.warning("kubernetes %s failed (%s); retrying with backoff up to %gs", operation, exc,
                        self.section.retry_max)
        self._failing = True
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, self.section.retry_max)

    # --- remediation --------------------------------------------------------------------------

    def triggers(self) -> dict[str, Trigger]:
        """Every condition, and every firing alert that a ladder names, as a remediation trigger."""
        starts = {str(a.get("fingerprint")): _start(a) for a in self._alerts}
        out = {s.type: Trigger(s.type, s.status, s.reason, s.message, s.devices,
                               tuple(sorted({f.pci for f in self._faults if f.condition == s.type and f.pci})),
                               _earliest(starts.get(f.fingerprint) for f in self._faults if f.condition == s.type))
               for s in self.book.states.values()}
        for alert in self._alerts:
            labels = alert.get("labels") or {}
            name = str(labels.get("alertname", ""))
            acked = self.acks.get(str(alert.get("fingerprint")))
            if (alert.get("state") != "firing" or name in self.book.states or name not in self.ladders.ladders
                    or acked is not None and float(alert.get("value") or 0.0) <= acked):
                continue
            previous = out.get(name, Trigger(name, True, name))
            device = str(labels.get("device", ""))
            devices = previous.devices + ((device,) if device and device not in previous.devices else ())
            out[name] = Trigger(name, True, name, str((alert.get("annotations") or {}).get("summary", "")), devices,
                                starts_at=_earliest([previous.starts_at, _start(alert)]))
        return out

    def _remediate(self, now: float) -> None:
        assert self.slots is not None
        plan = self.ladders.plan(self.triggers(), now)
        need = plan.needs_slot()
        have_slot = self.slots.acquire(now) if need else False
        self.held_back = need and not have_slot
        want = Marks(dict(plan.marks.taints), plan.marks.cordon, plan.marks.drain) if have_slot else Marks()
        marked = []
        for step in plan.steps:
            if step.dry_run:
                self.ladders.done(step, "dry_run", "", now)
            elif not have_slot:
                self.ladders.done(step, "held_back", f"max_unhealthy_nodes {self.section.max_unhealthy_nodes} "
                                  f"reached ({self.slots.limit} slots)", now)
            elif step.action.type in MARK_ACTIONS:
                add_mark(want, self.ladders.triggers[step.trigger], step.action, now)
                marked.append(step)
            else:
                run = actions.run_exec if step.action.type == "exec" else actions.post_webhook
                ok, said = run(step.action, step.event)
                self.ladders.done(step, "done" if ok else "failed", said, now)
        self._mark(want, now)
        for step in marked:
            self.ladders.done(step, "done", "", now)
        if not need and self.slots.held is not None:
            self.slots.release()

    def _mark(self, want: Marks, now: float) -> None:
        """Make the Node carry ``want``: read, patch with its resourceVersion, again on a conflict.

        Unchanged marks are checked against the Node only every ``heartbeat`` (someone may have removed them).
        """
        if want == self._marked and now - self._marked_at < self.section.heartbeat:
            return
        for attempt in range(CONFLICT_RETRIES):
            node = self.client.get_node(self.node)
            patch = patch_for(node, want)
            try:
                if patch is not None:
                    self.client.patch_node(self.node, patch)
                break
            except ApiError as exc:
                if exc.code != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
        self._marked, self._marked_at = Marks(dict(want.taints), want.cordon, want.drain), now

    # --- acks ----------------------------------------------------------------------------------

    def _acked(self, fault: Fault) -> bool:
        value = self.acks.get(fault.fingerprint)
        return value is not None and fault.value <= value

    def _prune_acks(self) -> None:
        active = {str(a.get("fingerprint")) for a in self._alerts if a.get("state") == "firing"}
        self.acks = {fp: v for fp, v in self.acks.items() if fp in active}

    def _take_requests(self, now: float) -> bool:
        """Apply ``tpuwatch ack`` / ``set-healthy`` requests left in the requests directory; True if any."""
        try:
            paths = sorted(self.requests_dir.glob("*.json"))[:MAX_REQUESTS]
        except OSError:
            return False
        taken = False
        for path in paths:
            try:
                with open(path, "rb") as handle:
                    request = json.loads(handle.read(MAX_REQUEST_BYTES))
                path.unlink()
            except (OSError, ValueError) as exc:
                log.warning("ignoring ack request %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            devices = request.get("devices") if isinstance(request, dict) else None
            everything = not isinstance(devices, list)
            acked = [f for f in self._faults if everything or f.device in {str(d) for d in devices or []}]
            for fault in acked:
                self.acks[fault.fingerprint] = fault.value
            if everything:
                self.ladders.release_all()
            self.processed.append({"id": path.stem, "time": now, "devices": None if everything else devices,
                                   "alerts": sorted({f.alertname for f in acked})})
            log.info("kubernetes: %s after a repair (%d alert(s) acknowledged)",
                     "set healthy" if everything else f"device(s) {', '.join(map(str, devices or []))} acked",
                     len(acked))
            taken = True
        return taken

    # --- state, views ----------------------------------------------------------------------------

    def _save(self) -> None:
        state = {"ladders": self.ladders.to_json(), "acks": self.acks}
        if state == self._saved:
            return
        if statefile.save(self.state_path, state):  # a failure is logged there, once until one works
            self._saved = json.loads(json.dumps(state))
        else:
            self.save_failures += 1

    def _publish(self) -> None:
        """Build the views in the agent's own thread; readers take the latest whole (no shared iteration)."""
        self._payload, self._samples = self._build_payload(), self._build_samples()

    def api_payload(self) -> dict[str, Any]:
        """``GET /api/kubernetes``: the node's conditions, slot, and every recorded action (as of the last round)."""
        return self._payload

    def samples(self) -> list[Sample]:
        """tpuwatch_kubernetes_* metrics, as of the agent's last round."""
        return [*self._samples, sample("tpuwatch_kubernetes_handoffs_dropped_total", self.dropped)]

    def _build_payload(self) -> dict[str, Any]:
        return {"status": "success", "node": self.node, "adopted": self.adopted,
                "conditions": self.book.api_conditions(self.last_sync or time.time()),
                "slot": self.slots.slot if self.slots else None,
                "limit": self.slots.limit if self.slots else None,
                "held_back": self.held_back, "actions": list(self.ladders.records),
                "acks": list(self.processed),
                "errors": [{"operation": op, "reason": r, "count": n} for (op, r), n in sorted(self.errors.items())]}

    def _build_samples(self) -> list[Sample]:
        out = [sample("tpuwatch_kubernetes_node_condition", 1 if s.status else 0, condition=s.type)
               for s in self.book.states.values()]
        out += [sample("tpuwatch_kubernetes_api_errors_total", n, operation=op, reason=r)
                for (op, r), n in sorted(self.errors.items())]
        out += [sample("tpuwatch_kubernetes_remediation_actions_total", n, trigger=t, action=a, result=r)
                for (t, a, r), n in sorted(self.ladders.totals.items())]
        if self.slots is not None:
            out.append(sample("tpuwatch_kubernetes_remediation_held_back", 1 if self.held_back else 0))
            out.append(sample("tpuwatch_kubernetes_slot_held", 1 if self.slots.held else 0))
        if self.last_sync is not None:
            out.append(sample("tpuwatch_kubernetes_last_sync_timestamp_seconds", self.last_sync))
        out.append(sample("tpuwatch_kubernetes_state_save_failures_total", self.save_failures))
        return out


def _start(alert: dict[str, Any]) -> float | None:
    """The window start an alert announces (its ``start`` label, Unix seconds: MaintenanceScheduled's), if any."""
    try:
        return float((alert.get("labels") or {})["start"])
    except (KeyError, TypeError, ValueError):
        return None


def _earliest(starts: Iterable[float | None]) -> float | None:
    known = [s for s in starts if s is not None]
    return min(known) if known else None
