"""One POST to a receiver, with the standard library: no redirects followed, the answer's first bytes read.

The standard library, not requests, on the daemon's delivery path: requests and its dependencies would add
about 15 MB to the resident memory of a daemon that must stay small.  Imported by the first delivery, so that
reading the config (every command) does not load the HTTP stack.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from typing import Any


class Unreachable(Exception):
    """No HTTP answer: the connection failed (the message says why)."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A receiver that redirects is answered as it is: a 3xx is a rejection, never followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects())


def post(url: str, data: bytes, headers: dict[str, str], timeout: float,
         read: int) -> tuple[int, str, bytes, str | None]:
    """POST ``data``: (status, reason, the body's first ``read`` bytes, Location of a redirect or None).

    Raises TimeoutError when no answer came within ``timeout``, Unreachable for any other failure.
    """
    try:
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.reason, response.read(read), None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.reason, exc.read(read), exc.headers.get("Location")
    except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
            raise TimeoutError from None
        raise Unreachable(str(reason)) from None
