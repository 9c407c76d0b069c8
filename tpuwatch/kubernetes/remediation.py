"""The remediation ladders: which action is due, held, rate-limited or capped.  Decisions only, no I/O.

Each ladder belongs to a trigger: a node condition (``AcceleratorHardwareProblem``) or an alert name.  An
*episode* is one stretch of the trigger being present; ``repeats`` counts the episodes within
``repeat_window``, the current one included, so a ladder escalates (reset on the first two, a drain request
from the third, as gpud does per Xid).  An action runs once per episode, after ``debounce``, no sooner than
``min_interval`` after its previous run and at most ``daily_cap`` times in 24 hours; one with ``before_window``
waits until the window its trigger announces (a maintenance notice's start) is that close.  ``taint``, ``cordon``
and ``drain-request`` are marks on the Node that stay while the episode lasts (and after it, until an
operator's ``tpuwatch set-healthy``, with ``manual_release``); ``exec`` and ``webhook`` run once.
Everything decided is recorded: taken, dry run, held back by the blast-radius limit, rate-limited, capped,
failed.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from tpuwatch.alerting.state import rfc3339
from tpuwatch.kubernetes.node import Marks, taint_key
from tpuwatch.kubernetes.plugin import KubernetesConfig, RemediationActionConfig

log = logging.getLogger(__name__)

MARK_ACTIONS = ("taint", "cordon", "drain-request")
DAY_S = 86400.0
RECORDS = 200


@dataclass(frozen=True)
class Trigger:
    """A trigger as seen this cycle."""

    name: str
    active: bool
    reason: str = ""
    message: str = ""
    devices: tuple[str, ...] = ()
    pcis: tuple[str, ...] = ()
    starts_at: float | None = None  # the start of the window it announces (a maintenance notice's ``start``)


@dataclass(frozen=True)
class Step:
    """An action that is due now."""

    trigger: str
    index: int
    action: RemediationActionConfig
    dry_run: bool
    event: dict[str, Any]

    @property
    def key(self) -> str:
        """The action's identity in the state: ``TRIGGER#INDEX``."""
        return f"{self.trigger}#{self.index}"


@dataclass
class Plan:
    """One cycle's decisions: steps due now, marks already applied that stay."""

    steps: list[Step]
    marks: Marks

    def needs_slot(self) -> bool:
        """True if anything would act on the node for real."""
        return not self.marks.empty() or any(not s.dry_run for s in self.steps)


def add_mark(marks: Marks, trigger: Trigger, action: RemediationActionConfig, now: float) -> None:
    """Put ``action``'s mark for ``trigger`` into ``marks``."""
    if action.type == "taint":
        marks.taints[taint_key(trigger.name)] = (action.effect, trigger.reason[:63])
    elif action.type == "cordon":
        marks.cordon = trigger.name
    elif action.type == "drain-request":
        marks.drain = {"trigger": trigger.name, "reason": trigger.reason, "devices": list(trigger.devices),
                       "time": rfc3339(now)}


class Ladders:
    """Every ladder of the config, with the state that must survive restarts (``to_json``/``from_json``)."""

    def __init__(self, config: KubernetesConfig, node: str, state: dict[str, Any] | None = None) -> None:
        self.ladders = {r.trigger: r for r in config.remediation}
        self.global_dry_run = config.dry_run
        self.node = node
        state = state or {}
        self.episodes: dict[str, list[float]] = {k: list(v) for k, v in (state.get("episodes") or {}).items()}
        self.since: dict[str, float] = dict(state.get("since") or {})
        self.runs: dict[str, list[float]] = {k: list(v) for k, v in (state.get("runs") or {}).items()}
        self.applied: dict[str, float] = dict(state.get("applied") or {})
        held = state.get("manual") or {}
        self.manual = Marks({k: (v[0], v[1]) for k, v in (held.get("taints") or {}).items()}, held.get("cordon"),
                            held.get("drain"))
        self.triggers: dict[str, Trigger] = {}
        self.records: deque[dict[str, Any]] = deque(maxlen=RECORDS)
        self.totals: Counter[tuple[str, str, str]] = Counter()
        self._noted: set[tuple[str, int, str]] = set()

    def to_json(self) -> dict[str, Any]:
        """The state to persist."""
        return {"episodes": self.episodes, "since": self.since, "runs": self.runs, "applied": self.applied,
                "manual": {"taints": {k: list(v) for k, v in self.manual.taints.items()},
                           "cordon": self.manual.cordon, "drain": self.manual.drain}}

    def plan(self, triggers: dict[str, Trigger], now: float) -> Plan:
        """Open and close episodes, and say which actions are due and which marks stay."""
        steps: list[Step] = []
        marks = Marks()
        for name, ladder in self.ladders.items():
            trigger = triggers.get(name, Trigger(name, False))
            self._episode(name, trigger.active, ladder.repeat_window, now)
            self.triggers[name] = trigger
            if not trigger.active:
                continue
            since = self.since[name]
            repeats = len(self.episodes[name])
            for index, action in enumerate(ladder.actions):
                if not action.min_repeats <= repeats <= (action.max_repeats or math.inf):
                    continue
                if now - since < action.debounce:
                    continue
                if action.before_window is not None and trigger.starts_at is not None \
                        and trigger.starts_at - now > action.before_window:
                    continue
                key, dry_run = f"{name}#{index}", action.dry_run or self.global_dry_run
                if self.applied.get(key) == since:  # done this episode
                    if action.type in MARK_ACTIONS and not dry_run:
                        add_mark(marks, trigger, action, since)
                    continue
                runs = [t for t in self.runs.get(key, []) if now - t < DAY_S]
                self.runs[key] = runs
                if runs and now - runs[-1] < action.min_interval:
                    self.note(name, index, action, "rate_limited", f"last run {now - runs[-1]:.0f}s ago", now)
                    continue
                if len(runs) >= action.daily_cap:
                    self.note(name, index, action, "capped", f"{len(runs)} runs in 24h", now)
                    continue
                event = {"node": self.node, "trigger": name, "reason": trigger.reason, "message": trigger.message,
                         "devices": list(trigger.devices), "pci": list(trigger.pcis), "repeats": repeats,
                         "action": action.type, "dry_run": dry_run, "time": rfc3339(now)}
                steps.append(Step(name, index, action, dry_run, event))
        marks.taints = {**self.manual.taints, **marks.taints}
        marks.cordon = marks.cordon or self.manual.cordon
        marks.drain = marks.drain or self.manual.drain
        return Plan(steps, marks)

    def _episode(self, name: str, active: bool, window: float, now: float) -> None:
        if active and name not in self.since:
            self.since[name] = now
            self.episodes[name] = [t for t in self.episodes.get(name, []) if now - t < window] + [now]
            self._noted = {n for n in self._noted if n[0] != name}
        elif not active and name in self.since:
            since = self.since.pop(name)
            for index, action in enumerate(self.ladders[name].actions):
                key = f"{name}#{index}"
                if self.applied.get(key) == since and action.manual_release and action.type in MARK_ACTIONS \
                        and not (action.dry_run or self.global_dry_run):
                    add_mark(self.manual, self.triggers.get(name, Trigger(name, False)), action, since)
                self.applied.pop(key, None)

    def done(self, step: Step, result: str, detail: str, now: float) -> None:
        """Record the outcome of a due step; a step that ran (or would have, in a dry run) counts for its limits."""
        if result in ("done", "dry_run", "failed"):
            self.applied[step.key] = self.since.get(step.trigger, now)
            self.runs.setdefault(step.key, []).append(now)
            self._record(step.trigger, step.index, step.action, result, detail, now)
        else:
            self.note(step.trigger, step.index, step.action, result, detail, now)

    def note(self, trigger: str, index: int, action: RemediationActionConfig, result: str, detail: str,
             now: float) -> None:
        """Record a skip, once per episode and kind."""
        if (trigger, index, result) in self._noted:
            return
        self._noted.add((trigger, index, result))
        self._record(trigger, index, action, result, detail, now)

    def _record(self, trigger: str, index: int, action: RemediationActionConfig, result: str, detail: str,
                now: float) -> None:
        self.totals[(trigger, action.type, result)] += 1
        self.records.append({"time": rfc3339(now), "trigger": trigger, "index": index, "action": action.type,
                             "result": result, "detail": detail[:500]})
        level = logging.WARNING if result in ("failed", "held_back") else logging.INFO
        log.log(level, "remediation %s #%d %s: %s%s", trigger, index, action.type, result,
                f" ({detail})" if detail else "")

    def release_all(self) -> None:
        """``set-healthy``: forget the repeats and the marks held for manual release."""
        self.episodes = {name: ([self.since[name]] if name in self.since else []) for name in self.episodes}
        self.manual = Marks()
