"""The canary's suite on 4 host CPU devices in one process, for the tests: ``python tests/suitejob.py FAULT...``.

For each fault (``clean`` for none), one run of the suite exactly as the worker runs it (Suite.run, then
Suite.confirm, then the judge), the fault on chip 2; prints one JSON line per fault: the run's status, every chip
whose status is not pass, the reason, and which checks were timed beside the host reference (check, runs, references).
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from tpuwatch.canary.checks import faults  # noqa: E402
from tpuwatch.canary.checks.suite import Settings, Suite  # noqa: E402
from tpuwatch.canary.judge import judge  # noqa: E402

chips = [(str(i), d) for i, d in enumerate(jax.local_devices())]
start = {"event": "start", "platform": "cpu", "chip": "cpu", "devices": [c for c, _ in chips], "stack": "test",
         "dtype": "float32", "scale": 3.6073094633660014}
for text in sys.argv[1:]:
    fault = None if text == "clean" else faults.parse(text)
    suite = Suite(jax, "cpu", Settings(memory_bytes=1 << 20), fault, "2" if fault else None)
    results = suite.run(chips, entry=5)
    confirms = suite.confirm(chips, results, {})
    lines = [start, *({"event": "result", **r} for r in results), *({"event": "confirm", **c} for c in confirms)]
    verdict, _ = judge(lines, None, {})
    print(json.dumps({"fault": text, "status": verdict.status, "reason": verdict.reason,
                      "chips": {o.device: o.status for o in verdict.devices if o.status != "pass"},
                      "checks": sorted({r["check"] for r in results}),
                      "paced": sorted({(r["check"], len(r.get("runs_seconds", ())), len(r.get("host_seconds", ())))
                                       for r in results if "host_seconds" in r})}), flush=True)
