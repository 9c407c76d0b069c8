"""``type: slack``: an incoming webhook's ``text`` (the notification fallback) plus blocks, one per alert."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tpuwatch.notifiers.base import GroupKey, NotifierType, Sent


class Slack(NotifierType):
    """``[FIRING:2] AlertName device 1`` as a header, then summary, description and runbook of each alert."""

    name = "slack"

    def bodies(self, receiver: str, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        firing = sum(1 for s in sent if s.firing)
        status = f"FIRING:{firing}" if firing else "RESOLVED"
        where = f" device {group[1]}" if group[1] else ""
        text = f"[{status}] {group[0]}{where}"
        blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": text[:150]}}]
        for s in sent[:40]:
            mark = ":red_circle:" if s.firing else ":large_green_circle:"
            line = f"{mark} *{s.annotations.get('summary', s.labels.get('alertname', ''))}*"
            if s.annotations.get("description"):
                line += f"\n{s.annotations['description']}"
            if s.annotations.get("runbook_url"):
                line += f"\n<{s.annotations['runbook_url']}|runbook>"
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": line[:3000]}})
        return [json.dumps({"text": text, "blocks": blocks}, sort_keys=True)]


TYPE = Slack()
