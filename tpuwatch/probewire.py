"""The report a job's probe sends the daemon over its Unix socket, and the answer: shared by both sides.

Standard library only: ``tpuwatch.probe`` (inside the job) imports it, and so
do the daemon's side (``tpuwatch.jobreports``) and its config, which must not
import jax or numpy.

A report is one JSON object on one line, at most ``MAX_REPORT_BYTES``::

    {"version": 1, "model": "attn-mlp-v1", "platform": "tpu", "chip": "TPU v5 lite",
     "stack": "jax 0.10.2, jaxlib 0.10.2, ...", "dtype": "float32", "scale": 3.1,
     "named_by": "env" | "ordinal",
     "results": [{"device": "0", "finite": true, "max_abs_error": 1.2e-06, "fingerprint": "16 hex digits"}],
     "drill": null | {"kind": "bitflip", "device": "2"}}

``device`` is the chip as the job names it: from the environment that chose its
chips (``named_by: env``: TPU_VISIBLE_CHIPS, CUDA_VISIBLE_DEVICES, ...), or the
order of its local devices (``ordinal``), which the daemon maps onto the chips
the process holds.  The answer is one line: ``{"accepted": true, "status":
"pass" | "fail" | ..., "devices": {"0": "pass", ...}}`` or ``{"accepted": false,
"reason": REASON, "detail": TEXT}`` with REASON one of ``REJECTIONS``.
"""

from __future__ import annotations

VERSION = 1
DEFAULT_SOCKET = "/run/tpuwatch/probe.sock"
SOCKET_ENV = "TPUWATCH_PROBE_SOCKET"
MAX_REPORT_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 4096
MAX_RESULTS = 64

# Why a report is refused: counted on /metrics as tpuwatch_probe_reports_rejected_total{reason}.
REJECTIONS = (
    "busy",          # too many connections open at once
    "rate_limited",  # the process sent more than its share of reports
    "timeout",       # the report did not arrive whole within the read deadline
    "oversized",     # over the size limit
    "malformed",     # not a report: bad JSON, wrong shape or values, another protocol version
    "not_holder",    # the process does not hold the chips it reports about (and is not root)
    "unknown_chip",  # root named a chip this host does not have
)
