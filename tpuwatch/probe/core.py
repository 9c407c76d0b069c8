"""``Probe``: the canary's reference model run on the job's own devices, between its steps, never in their way.

A step does at most one of three cheap things: start compiling (in a
background thread, once), dispatch the model on every device when a run is
due (JAX dispatch is asynchronous: it returns at once and the chip runs it
between the job's own programs), or, once every output is ready
(``jax.Array.is_ready``), read them back and judge them.  No step waits on
the chip.  The results go to the daemon (``channel``), which judges them
against the reference, the host's other chips and the chip's history exactly
as it judges the scheduled canary; the probe's own verdict (reference and
peers within this process) is ``last_result``.

The probe sets everything that can change its bits itself (explicit HIGHEST
matmul precision, float32 arrays, x64 off, standard dtype promotion, jit on,
NaN checks off, transfers allowed) in a thread-local scope, so the job's JAX
settings neither change its answer nor are changed by it; the XLA flags it
cannot set are part of the ``stack`` its fingerprints are keyed by.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jaxlib
import numpy as np

from tpuwatch import probewire as protocol
from tpuwatch.canary import model, spec
from tpuwatch.canary.judge import CanaryResult, Drill, judge
from tpuwatch.probe.channel import Channel, socket_path
from tpuwatch.probe.chips import name_devices

log = logging.getLogger("tpuwatch.probe")

DEFAULT_EVERY_S = 300.0  # a run costs a job tens of ms of host time on a busy CPU host (benchmarks/probe.py)
INJECT_ENV = "TPUWATCH_PROBE_INJECT"  # "bitflip@2": a fire drill on the job's chip 2


@contextlib.contextmanager
def insulated() -> Iterator[None]:
    """This thread's JAX settings as the probe needs them, whatever the job chose (restored on exit)."""
    wanted: list[tuple[str, Any]] = [
        ("disable_jit", False), ("debug_nans", False), ("debug_infs", False), ("transfer_guard", "allow"),
        ("numpy_dtype_promotion", "standard"), ("numpy_rank_promotion", "allow"),
        ("default_matmul_precision", "highest"), ("enable_x64", False)]
    with contextlib.ExitStack() as stack:
        for name, value in wanted:
            scope = getattr(jax, name, None)
            if name == "enable_x64" and scope is None:
                scope = getattr(getattr(jax, "experimental", None), "enable_x64", None)
            if callable(scope):
                stack.enter_context(scope(value))
        yield


def parse_inject(text: str | None) -> Drill | None:
    """"bitflip@2" -> Drill("bitflip", "2"); ValueError for anything else."""
    if not text:
        return None
    kind, _, device = text.partition("@")
    if kind not in model.WEIGHT_DRILLS or not device.isdigit():
        raise ValueError(f"{INJECT_ENV}={text!r}: want KIND@CHIP with KIND one of {', '.join(model.WEIGHT_DRILLS)}")
    return Drill(kind, device)


class Probe:
    """The in-job reference check; call ``step()`` once per training or serving step (see docs/probe.md).

    ``every`` is the time between runs; ``socket`` the daemon's socket (default $TPUWATCH_PROBE_SOCKET, else
    /run/tpuwatch/probe.sock); ``devices`` the devices to check (default ``jax.local_devices()``); ``inject``
    a fire drill ``KIND@CHIP`` (default $TPUWATCH_PROBE_INJECT).
    """

    def __init__(self, every: float = DEFAULT_EVERY_S, *, socket: str | None = None,
                 devices: Sequence[Any] | None = None, inject: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.drill = parse_inject(inject if inject is not None else os.environ.get(INJECT_ENV))
        self.devices, self.named_by = name_devices(devices if devices is not None else jax.local_devices(),
                                                   os.environ)
        if self.drill is not None and self.drill.device not in {name for name, _ in self.devices}:
            raise ValueError(f"inject {self.drill.kind}@{self.drill.device}: no such chip in this job "
                             f"({', '.join(name for name, _ in self.devices)})")
        self.channel = Channel(socket_path(socket))
        self.last_result: CanaryResult | None = None
        self.runs = 0
        self.error: str | None = None  # why the probe stopped itself (it never raises into the job)
        self._said: tuple[str, str | None] = ("pass", None)
        self._params, self._x = model.weights(), model.inputs()
        self._expected = model.reference(self._params, self._x)
        self._start = self._start_line()
        self._compiled: list[tuple[str, Any, tuple[Any, ...]]] | None = None
        self._compiler: threading.Thread | None = None
        self._inflight: list[tuple[str, Any]] | None = None
        self._due = clock()

    def step(self) -> CanaryResult | None:
        """Advance the probe without waiting; the run's result on the step that finished one, else None."""
        if self.error is not None:
            return None
        try:
            return self._advance()
        except Exception as exc:  # noqa: BLE001 - the probe never harms the job: it stops and says why, once
            self._stop(f"{type(exc).__name__}: {exc}")
            return None

    def check(self) -> CanaryResult | None:
        """One run now, waiting for it (for a job that chooses its moment); None if the probe has stopped."""
        try:
            if self._compiled is None:
                self._compile()
            if self._inflight is None:
                self._dispatch()
            assert self._inflight is not None
            for _, output in self._inflight:
                output.block_until_ready()
            return self._finish()
        except Exception as exc:  # noqa: BLE001 - as in step()
            self._stop(f"{type(exc).__name__}: {exc}")
            return None

    def _advance(self) -> CanaryResult | None:
        if self._inflight is not None:
            return self._finish() if all(output.is_ready() for _, output in self._inflight) else None
        if self._compiled is None:
            if self._compiler is None:
                self._compiler = threading.Thread(target=self._compile_quietly, name="tpuwatch-probe-compile",
                                                  daemon=True)
                self._compiler.start()
            return None
        if self.clock() >= self._due:
            self._dispatch()
        return None

    def _compile_quietly(self) -> None:
        try:  # the job's own threads first (Linux: a thread has its own nice value; best effort)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        try:
            self._compile()
        except Exception as exc:  # noqa: BLE001 - said once; the job goes on
            self._stop(f"cannot compile the reference model: {type(exc).__name__}: {exc}")

    def _compile(self) -> None:
        step = jax.jit(model.device_forward(jax))
        compiled = []
        with insulated():
            for name, device in self.devices:
                kind = self.drill.kind if self.drill is not None and self.drill.device == name else None
                args = jax.device_put((model.injected(self._params, kind), self._x), device)
                compiled.append((name, step.lower(*args).compile(), args))
        self._compiled = compiled

    def _dispatch(self) -> None:
        assert self._compiled is not None
        with insulated():
            self._inflight = [(name, program(*args)) for name, program, args in self._compiled]
        self._due = self.clock() + self.every

    def _finish(self) -> CanaryResult:
        assert self._inflight is not None
        with insulated():
            outputs = jax.device_get([output for _, output in self._inflight])
        names = [name for name, _ in self._inflight]
        self._inflight = None
        results = [self._result(name, np.asarray(output)) for name, output in zip(names, outputs)]
        result, _ = judge([self._start, *({"event": "result", **r} for r in results)], None, {}, self.drill)
        self.runs += 1
        self.last_result = result
        self.channel.send(self.report(results))
        if (result.status, result.reason) != self._said:  # said when it changes, not at every run
            self._said = (result.status, result.reason)
            log.log(logging.INFO if result.status == "pass" else logging.WARNING, "tpuwatch probe: %s%s",
                    result.status, f": {result.reason}" if result.reason else "")
        return result

    def _result(self, name: str, output: np.ndarray) -> dict[str, Any]:
        finite = bool(np.isfinite(output).all())
        error = float(np.max(np.abs(output.astype(np.float64) - self._expected))) if finite else None
        return {"device": name, "finite": finite, "max_abs_error": error, "fingerprint": model.fingerprint(output),
                "duration_seconds": None}

    def report(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The message for the daemon (tpuwatch.jobreports.protocol) carrying ``results``."""
        start = {k: v for k, v in self._start.items() if k not in ("event", "devices")}
        return {"version": protocol.VERSION, "model": spec.MODEL_VERSION, **start, "named_by": self.named_by,
                "results": results,
                "drill": {"kind": self.drill.kind, "device": self.drill.device} if self.drill else None}

    def _start_line(self) -> dict[str, Any]:
        device = self.devices[0][1] if self.devices else None
        if device is None:
            raise ValueError("no JAX device to probe")
        versions = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, {device.client.platform_version}"
        return {"event": "start", "platform": device.platform, "chip": device.device_kind,
                "devices": [name for name, _ in self.devices], "stack": model.stack(versions, device.platform,
                                                                                   os.environ),
                "dtype": spec.DTYPE, "scale": float(np.max(np.abs(self._expected)))}

    def _stop(self, why: str) -> None:
        if self.error is None:
            self.error = why
            log.warning("tpuwatch probe stopped, the job goes on: %s", why)
        self._inflight = None


_default: Probe | None = None
_default_lock = threading.Lock()


def check(socket: str | None = None) -> CanaryResult | None:
    """One run now on every local device, waiting for it, reported to the daemon before returning."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Probe(socket=socket)
        probe = _default
    result = probe.check()
    probe.channel.flush()
    return result
