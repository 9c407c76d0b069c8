"""What tpuwatch puts on its Node besides conditions: taints, cordon, a drain request.  Pure.

Taints live in the Node's spec, a list without a merge key (core/v1 ``NodeSpec.Taints``), so a patch
replaces the whole list: the patch is computed from the Node as read and carries its ``resourceVersion``,
and the API server answers 409 Conflict if anyone changed the Node in between (then read and compute
again).  tpuwatch's own taints are told apart by their key prefix; a cordon by an annotation that says
tpuwatch set it, so that a node an operator cordoned is never uncordoned by tpuwatch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PREFIX = "tpuwatch.io/"
CORDONED = PREFIX + "cordoned"
DRAIN = PREFIX + "drain-requested"


def taint_key(condition: str) -> str:
    """``tpuwatch.io/AcceleratorHardwareProblem``."""
    return PREFIX + condition


@dataclass
class Marks:
    """What tpuwatch wants on the Node: taint key -> (effect, value), cordon (condition), drain request."""

    taints: dict[str, tuple[str, str]] = field(default_factory=dict)
    cordon: str | None = None
    drain: dict[str, Any] | None = None

    def empty(self) -> bool:
        """True if tpuwatch wants nothing on the Node."""
        return not self.taints and self.cordon is None and self.drain is None


def carried(node: dict[str, Any]) -> Marks:
    """The marks tpuwatch has on ``node`` now."""
    spec, meta = node.get("spec") or {}, node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    taints = {t["key"]: (t.get("effect", ""), t.get("value", "")) for t in spec.get("taints") or []
              if isinstance(t, dict) and str(t.get("key", "")).startswith(PREFIX)}
    drain = None
    if DRAIN in annotations:
        try:
            drain = json.loads(annotations[DRAIN])
        except ValueError:
            drain = {"raw": annotations[DRAIN]}
    return Marks(taints, annotations.get(CORDONED) if spec.get("unschedulable") else None, drain)


def dirty(node: dict[str, Any]) -> bool:
    """True if ``node`` carries any mark of tpuwatch's (what a slot's holder keeps while it has any)."""
    return not carried(node).empty()


def patch_for(node: dict[str, Any], want: Marks) -> dict[str, Any] | None:
    """The strategic merge patch that makes ``node`` carry exactly ``want`` of tpuwatch's marks, or None.

    Other taints, an operator's cordon and other annotations are left as they are.
    """
    spec, meta = node.get("spec") or {}, node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    have = carried(node)
    patch_spec: dict[str, Any] = {}
    patch_annotations: dict[str, Any] = {}
    patch_labels: dict[str, Any] = {}
    if have.taints != want.taints:
        others = [t for t in spec.get("taints") or [] if not str(t.get("key", "")).startswith(PREFIX)]
        ours = [{"key": key, "value": value, "effect": effect} for key, (effect, value) in sorted(want.taints.items())]
        patch_spec["taints"] = others + ours
    if want.cordon is not None and not spec.get("unschedulable"):
        patch_spec["unschedulable"] = True
        patch_annotations[CORDONED] = want.cordon
    elif want.cordon is None and CORDONED in annotations:
        if spec.get("unschedulable"):
            patch_spec["unschedulable"] = False
        patch_annotations[CORDONED] = None
    if want.drain is not None and have.drain is None:
        patch_annotations[DRAIN] = json.dumps(want.drain, sort_keys=True, separators=(",", ":"))
        patch_labels[DRAIN] = "true"
    elif want.drain is None and (DRAIN in annotations or DRAIN in labels):
        patch_annotations[DRAIN] = None
        patch_labels[DRAIN] = None
    if not (patch_spec or patch_annotations or patch_labels):
        return None
    metadata: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
    if patch_annotations:
        metadata["annotations"] = patch_annotations
    if patch_labels:
        metadata["labels"] = patch_labels
    return {"metadata": metadata, **({"spec": patch_spec} if patch_spec else {})}
