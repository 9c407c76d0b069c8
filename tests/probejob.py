"""A JAX job for the probe's tests: ``python tests/probejob.py SCENARIO [options]``, one JSON line out at the end.

Scenarios (each runs on --devices host CPU devices):

- ``plain``: ``Probe.check()`` once with JAX's defaults; prints the fingerprints.
- ``unusual``: the same after the job set every JAX setting that could change the probe's bits or break it
  (x64, bfloat16 default matmul precision, NaN/Inf checks, strict dtype promotion, rank promotion errors,
  transfer guard); prints the fingerprints and that the job's settings are as it left them.
- ``steps``: a job loop of real work calling ``step()`` each step until --runs runs; prints the runs, whether any
  step found the probe's outputs not ready (it moved on instead of waiting) and the probe's state.
- ``hold``: opens --hold device files, then loops ``step()`` until killed; prints nothing (the e2e job).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("scenario", choices=["plain", "unusual", "steps", "hold"])
parser.add_argument("--devices", type=int, default=4)
parser.add_argument("--socket", default="/nonexistent/tpuwatch-test.sock")
parser.add_argument("--every", type=float, default=0.2)
parser.add_argument("--runs", type=int, default=3)
parser.add_argument("--inject")
parser.add_argument("--hold", nargs="*", default=[])
args = parser.parse_args()
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
os.environ["JAX_PLATFORMS"] = "cpu"
held = [open(path, "a") for path in args.hold]  # noqa: SIM115 - held open for the process's life

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpuwatch.probe import Probe  # noqa: E402


def fingerprints(result) -> dict[str, str | None]:  # noqa: ANN001
    return {o.device: o.fingerprint for o in result.devices}


if args.scenario == "plain":
    result = Probe(socket=args.socket, inject=args.inject).check()
    print(json.dumps({"status": result.status, "fingerprints": fingerprints(result), "stack": result.stack,
                      "drill": result.drill.caught if result.drill else None}))
elif args.scenario == "unusual":
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_default_matmul_precision", "bfloat16")
    jax.config.update("jax_debug_nans", True)
    jax.config.update("jax_debug_infs", True)
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_transfer_guard", "disallow")
    result = Probe(socket=args.socket, inject=args.inject).check()
    after = {name: getattr(jax.config, f"jax_{name}") for name in
             ("enable_x64", "default_matmul_precision", "debug_nans", "numpy_dtype_promotion", "transfer_guard")}
    print(json.dumps({"status": result.status if result else None, "fingerprints": fingerprints(result) if result
                      else {}, "settings": after}))
elif args.scenario == "steps":
    probe = Probe(every=args.every, socket=args.socket, inject=args.inject)
    work = [jax.device_put(jnp.ones((512, 512), jnp.float32), d) for d in jax.local_devices()]
    waited_out, steps, started = 0, 0, time.monotonic()
    while probe.runs < args.runs and time.monotonic() - started < 120:
        work = [jnp.tanh(w @ w / 512.0) for w in work]  # the job's step: real work on every device
        probe.step()
        steps += 1
        if probe._inflight is not None and not all(o.is_ready() for _, o in probe._inflight):
            waited_out += 1  # the probe's work was still running and the step went on without it
    print(json.dumps({"runs": probe.runs, "steps": steps, "went_on": waited_out, "error": probe.error,
                      "status": probe.last_result.status if probe.last_result else None,
                      "failed": probe.channel.failed}))
else:
    probe = Probe(every=args.every, socket=args.socket, inject=args.inject)
    while True:
        probe.step()
        time.sleep(0.02)
sys.stdout.flush()
