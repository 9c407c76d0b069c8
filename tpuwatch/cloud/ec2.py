"""EC2: the instance's scheduled events through IMDSv2, polled.

https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html: a session token
from ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (at most 21600), then every GET
with ``X-aws-ec2-metadata-token``; a 401 means the token is missing or expired: fetch a new one (once per
round).  The service is ``http://169.254.169.254/``, or ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (a URL), or the
IPv6 address with ``AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6``, as botocore chooses it
(botocore/utils.py ``IMDSFetcher._select_base_url``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tpuwatch.cloud.events import parse_ec2_scheduled
from tpuwatch.cloud.http import Answer, Link
from tpuwatch.cloud.plugin import MaintenanceConfig
from tpuwatch.cloud.watch import HttpError, Watch

TOKEN_PATH = "/latest/api/token"
EVENTS_PATH = "/latest/meta-data/events/maintenance/scheduled"
TOKEN_TTL_S = 21600  # botocore's _TOKEN_TTL
TOKEN_HEADROOM_S = 300.0  # a token is renewed this long before it expires


def endpoint(env: dict[str, str] | None = None) -> str:
    """The metadata service's base URL, as botocore chooses it."""
    env = dict(os.environ) if env is None else env
    if env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        return env["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
    if env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "").lower() == "ipv6":
        return "http://[fd00:ec2::254]/"
    return "http://169.254.169.254/"


class Ec2Watch(Watch):
    """``events/maintenance/scheduled``, polled every ``poll_interval`` with an IMDSv2 session token."""

    cloud = "ec2"

    def __init__(self, settings: MaintenanceConfig, base: str | None = None) -> None:
        super().__init__(settings, Link(base or endpoint()))
        self._token: str | None = None
        self._token_until = 0.0

    def loops(self) -> dict[str, Callable[[], float]]:
        return {"scheduled-events": self._round}

    def _round(self) -> float:
        answer = self._get()
        if answer.status == 401:  # expired or refused: one new token, then the round fails
            self._token = None
            answer = self._get()
        if answer.status == 404:  # nothing under events/maintenance/ (no event was ever scheduled)
            self._set("scheduled-events", [])
        elif answer.status != 200:
            raise HttpError(f"HTTP {answer.status}")
        else:
            self._set("scheduled-events", parse_ec2_scheduled(answer.body))
        return self.settings.poll_interval

    def _get(self) -> Answer:
        if self._token is None or time.monotonic() >= self._token_until:
            token = self.link.request("PUT", TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
                                      self.settings.request_timeout, limit=1024)
            text = token.body.decode("ascii", "replace").strip()
            if token.status != 200 or not text or not text.isprintable():
                raise HttpError(f"token request: HTTP {token.status}")
            self._token, self._token_until = text, time.monotonic() + TOKEN_TTL_S - TOKEN_HEADROOM_S
        return self.link.request("GET", EVENTS_PATH, {"X-aws-ec2-metadata-token": self._token},
                                 self.settings.request_timeout)
