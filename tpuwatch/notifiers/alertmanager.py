"""``type: alertmanager``: POST /api/v2/alerts with every active alert, resent as Prometheus does."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tpuwatch.notifiers.base import GroupKey, Notifier, NotifierType, Sent


class Alertmanager(NotifierType):
    """The JSON array Alertmanager's API takes; each of ``urls`` (an HA cluster's members) is sent every alert."""

    name = "alertmanager"
    resend = True
    several_urls = True

    def bodies(self, receiver: str, group: GroupKey, sent: Sequence[Sent], external_url: str) -> list[str]:
        return [json.dumps([s.am_alert(external_url) for s in sent], sort_keys=True)]

    def request(self, target: Notifier, body: str) -> tuple[str, str]:
        return target.url.rstrip("/") + "/api/v2/alerts", body


TYPE = Alertmanager()
