"""The canary's subprocess: ``python -m tpuwatch.canary.worker --state-dir DIR [...]``.

The only module of the daemon's canary that imports jax (``tpuwatch.probe``,
the in-job check, is the other).  It finds chips that other processes hold
before jax starts (and keeps jax away from them), then runs the suite
(canary/checks) on every idle chip and prints one JSON object per line on
stdout, flushed as it goes, so the runner keeps what finished before a hang or
a crash:

    {"event": "start", "platform": "cpu", "chip": "cpu", "devices": ["0", ...], "stack": "...",
     "dtype": "float32", "scale": X, "suite": "v2", "entry": N}
    {"event": "skipped", "device": "2", "reason": "..."}
    {"event": "running", "device": "0"}
    {"event": "result", "device": "0", "check": "gemm", "entry": N, "finite": true, "max_abs_error": X,
     "error_ratio": X, "fingerprint": HEX, "duration_seconds": X}          (one per check and chip)
    {"event": "confirm", "device": "0", "check": "gemm", "entry": N, "deviations": [true, false, false]}
    {"event": "confirm", "device": "1", "check": "speed", "entry": 0, "deviations": [...], "conclusive": [...],
     "rounds": [{"took": X, "beside": [X, ...], "best": X, "peers_best": X, "host": [X, ...], "slow": true,
                 "conclusive": true}, ...]}                          (a chip that looked slow: canary/speed.py)
    {"event": "error", "reason": "..."}      (the run could not start)
    {"event": "done"}

A result that deviates (off its reference bound, other bits than its peers'
majority or its own past) is re-run twice at once: the confirm line.  An
injection (--inject CLASS[:key=value,...] --inject-device N) changes only what
chip N computes, inside the same loop as a real run: the operator's fire drill.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuwatch.canary import holds, model, spec
from tpuwatch.canary.history import FingerprintHistory, history_path
from tpuwatch.canary.judge import history_key


def emit(event: str, **fields: Any) -> None:
    """Write one protocol line and flush it at once."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def misbehave(kind: str | None) -> None:
    """The hang and crash drills: block forever on a child process, or die of SIGSEGV."""
    if kind == "hang":
        subprocess.run([sys.executable, "-c", "import signal; signal.pause()"], check=False)
    elif kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)


@dataclass(frozen=True)
class Plan:
    """Decided before jax starts: the platform, chips to leave alone (index -> why), jax's environment."""

    platform: str
    tpu_chips: int
    skips: dict[int, str]
    env: dict[str, str]

    @property
    def idle_tpu_left(self) -> bool:
        """False when every TPU chip is held: jax must not start at all."""
        return self.platform != "tpu" or len(self.skips) < self.tpu_chips


def plan(args: argparse.Namespace) -> Plan:
    """Look at sysfs, the libtpu lockfile and device file holders; keep jax off every held TPU chip."""
    found = holds.accelerator_functions(args.sysfs)
    tpus = found["tpu"]
    platform = "tpu" if tpus else "gpu" if found["nvidia"] or found["amd"] else "cpu"  # jax's CUDA or ROCm
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.05"}
    if platform != "tpu":  # jax for CUDA or ROCm runs deterministic GPU ops; a CPU-only jax ignores the flag
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
    locker = holds.lock_holder(args.lockfile) if platform == "tpu" else None
    if locker is not None:
        reason = f"held by pid {locker} (lock on {args.lockfile})"
        return Plan(platform, len(tpus), {chip: reason for chip in range(len(tpus))}, env)
    holders = holds.device_file_holders(args.procfs, args.dev, holds.vfio_groups(args.sysfs, tpus))
    skips = {chip: f"held by pid {pid} (device file open)" for chip, pid in holders.items()}
    if platform == "tpu" and skips:
        idle = [chip for chip in range(len(tpus)) if chip not in skips]
        for chip in idle[1:]:
            skips[chip] = "not run: another chip is held, one idle chip per run"
        if idle:
            env.update(TPU_VISIBLE_CHIPS=str(idle[0]), TPU_CHIPS_PER_PROCESS_BOUNDS="1,1,1",
                       TPU_PROCESS_BOUNDS="1,1,1")
    return Plan(platform, len(tpus), skips, env)


def run(args: argparse.Namespace) -> int:
    """Plan, start jax on the idle chips, run the suite on them; the protocol lines go to stdout."""
    decided = plan(args)
    skips, env = decided.skips, decided.env
    if not decided.idle_tpu_left:
        emit("start", platform="tpu", chip=None, devices=[str(c) for c in sorted(skips)], stack=None,
             dtype=spec.DTYPE, scale=None)
        for chip, reason in sorted(skips.items()):
            emit("skipped", device=str(chip), reason=reason)
        emit("done")
        return 0
    os.environ.update(env)
    try:
        import jax
        import jaxlib

        from tpuwatch.canary.checks import faults
        from tpuwatch.canary.checks.suite import Settings, Suite
    except ImportError as exc:
        emit("error", reason=f"cannot import jax with {sys.executable}: {exc}")
        return 3
    cache = os.path.join(args.state_dir, "canary", "jax-cache")
    jax.config.update("jax_default_matmul_precision", "highest")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    devices = sorted(jax.local_devices(), key=lambda d: d.id)
    visible = env.get("TPU_VISIBLE_CHIPS")
    chips = [int(visible)] if visible is not None else [d.id for d in devices]
    expected = model.reference(model.weights(), model.inputs())
    platform = devices[0].platform
    stack = model.stack(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, {devices[0].client.platform_version}",
                        platform, os.environ)
    emit("start", platform=platform, chip=devices[0].device_kind, devices=[str(c) for c in chips], stack=stack,
         dtype=spec.DTYPE, scale=float(np.max(np.abs(expected))), suite=spec.SUITE_VERSION, entry=args.entry)
    if args.inject is not None and args.inject_device not in chips:
        emit("error", reason=f"--inject-device {args.inject_device}: no such device (devices: "
                             f"{', '.join(map(str, chips))})")
        return 3
    fault = faults.parse(args.inject) if args.inject else None
    settings = Settings(tuple(args.checks.split(",")), args.memory_bytes, args.memory_share)
    suite = Suite(jax, platform, settings, fault, str(args.inject_device) if fault else None)
    idle = [(str(chip), device) for chip, device in zip(chips, devices) if chip not in skips]
    for chip in chips:
        if chip in skips:
            emit("skipped", device=str(chip), reason=skips[chip])

    def running(name: str) -> None:
        emit("running", device=name)
        if fault is not None and name == str(args.inject_device):
            misbehave(fault.kind)

    results = suite.run(idle, args.entry, running, lambda result: emit("result", **result))
    for line in suite.confirm(idle, results, _history(args.state_dir, stack, devices[0].device_kind, results)):
        emit("confirm", **line)
    for chip in sorted(set(skips) - set(chips)):
        emit("skipped", device=str(chip), reason=skips[chip])
    emit("done")
    return 0


def _history(state_dir: str, stack: str, chip: str, results: list[dict[str, Any]]
             ) -> dict[tuple[str, int], dict[str, str]]:
    """The chips' recorded fingerprints for each (check, entry) the run has results of: what a deviation is
    judged against, under the keys the judge keeps them by."""
    stored, _ = FingerprintHistory(history_path(state_dir)).read()
    groups = {(r["check"], r["entry"]) for r in results}
    return {group: stored.get(history_key(stack, chip, spec.DTYPE, *group), {}) for group in groups}


def main(argv: list[str] | None = None) -> int:
    """Parse the worker's arguments and run it."""
    parser = argparse.ArgumentParser(prog="python -m tpuwatch.canary.worker")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--lockfile", default="/tmp/libtpu_lockfile")
    parser.add_argument("--procfs", default="/proc")
    parser.add_argument("--sysfs", default="/sys")
    parser.add_argument("--dev", default="/dev")
    parser.add_argument("--inject")  # CLASS[:key=value,...] (checks/faults.py); checked by the runner
    parser.add_argument("--inject-device", type=int, default=0)
    parser.add_argument("--entry", type=int, default=0)
    parser.add_argument("--checks", default=",".join(spec.CHECKS))
    parser.add_argument("--memory-bytes", type=int, default=16 << 20)
    parser.add_argument("--memory-share", type=float, default=0.05)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
