"""``type: webhook``: Alertmanager's webhook JSON, version 4, one body per group; signed with ``secret_file``."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tpuwatch.notifiers.base import GroupKey, NotifierType, Sent, common

_GO_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
               '"': r"\"", "\\": r"\\"}


def go_quote(text: str) -> str:
    """``text`` as Go's strconv.Quote writes it (Alertmanager quotes label values so in group keys)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:  # not a valid rune: Go writes the replacement character
            out.append(r"\ufffd")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out) + '"'


def label_set_string(labels: dict[str, str]) -> str:
    """``{a="1", b="2"}``: prometheus/common's LabelSet.String, names sorted, values Go-quoted."""
    return "{" + ", ".join(f"{name}={go_quote(labels[name])}" for name in sorted(labels)) + "}"


class Webhook(NotifierType):
    """The body Alertmanager's webhook receiver sends, groupKey included (alertmanager ``dispatch/dispatch.go``)."""

    name = "webhook"
    signs = True

    def bodies(self, receiver: str, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        alerts = [{"status": "firing" if s.firing else "resolved", **s.am_alert(external_url),
                   "fingerprint": s.fingerprint} for s in sent]
        group_labels = {"alertname": group[0], **({"device": group[1]} if group[1] else {})}
        return [json.dumps({
            "version": "4", "groupKey": "{}:" + label_set_string(group_labels), "truncatedAlerts": 0,
            "status": "firing" if any(s.firing for s in sent) else "resolved", "receiver": receiver,
            "groupLabels": group_labels,
            "commonLabels": common([s.labels for s in sent]),
            "commonAnnotations": common([s.annotations for s in sent]),
            "externalURL": external_url, "alerts": alerts}, sort_keys=True)]


TYPE = Webhook()
