#!/usr/bin/env python3
"""The in-job probe (``tpuwatch.probe``): what it costs a real JAX training job, and the daemon under a report flood.

Usage::

    python benchmarks/probe.py [--seconds S] [--rounds N] [--steps N] [--every S] [--stress-every S]
                               [--reports N] [--flood-seconds S] [--flood-rate R] [--slow N] [--quick]
                               [--output BENCHMARKS.md]

On four host CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``, set before jax is
imported), in one run, beside one ``tpuwatch run`` daemon (4 simulated chips, interval 1 s, the probe socket
with ``reports_per_minute: 600``) whose chips' device files this process holds open, as a job holds its chips:

1. **Job overhead.** A training loop written here: a decoder-only transformer language model (2 layers,
   d_model 128, 4 heads, sequence 64, vocabulary 256), batch 8 per device, data parallel over the 4 devices
   (``jax.jit`` over a ``Mesh``, ``NamedSharding``), Adam written by hand, random tokens from a fixed seed;
   every step blocks on ``float(loss)``, and ``probe.step()`` is called right after the train step is
   dispatched.  ``--rounds`` rounds of interleaved blocks (the order rotated each round, to cancel drift) of
   the same loop, ``--seconds`` in all: without the probe, with it at the default cadence (``--every``, 300 s)
   and at a stressed one (``--stress-every``, 1 s), 1.5 : 2.5 : 1 of each round's time (the default
   cadence's blocks longest, so that it runs several times in them).  Each probe's cadence runs on a clock
   that counts its own blocks only, so it runs as often as in a job that always has it; its compile and
   first run are a start phase before the rounds.  Reported: median and p99 step time, added job time (mean
   step time with / without - 1, per round, and fitted over the blocks with the CPU other processes used
   during each block taken out), the runs, the wall time of every ``probe.step()`` call (p99, max) and how
   many calls found the outputs not ready and moved on.  The default cadence's cost is far inside the noise,
   so it is also scaled from the stressed blocks (their added time per run, times runs per second).
2. **The probe's own cost.** ``step()`` calls by what they did (dispatch, read back and judge, ...); compile
   time from the first ``step()`` to ``probe._compiled``; a synchronous ``Probe.check()`` on a fresh Probe in
   this process and in a fresh one; import time and RSS of ``import tpuwatch.probe`` in fresh interpreters
   beside a bare ``import jax`` (the anchor), and which daemon libraries it loads (none wanted); the device
   memory the probe keeps resident per device (its arrays' nbytes; ``memory_stats()`` where the backend has
   it, None on CPU) and the compiled program's temporaries.
3. **The daemon's side.** Daemon CPU per accepted report (``--reports`` valid reports from this process, the
   chips' holder, less the idle CPU over as long); then ``--flood-seconds`` of hostile reports at
   ``--flood-rate`` a second from child processes (malformed JSON, 70 KB lines, reports about chips the
   sender does not hold, and ``--slow`` connections that send nothing, all as another user, uid 65534, as an
   attacker on the host would be; and valid reports beyond the rate limit from one process of the holder's
   own user), the first three from a new process every 500 reports so that
   the per-process rate limit does not absorb them, while /metrics is scraped every 0.5 s: the rate reached,
   refusals by reason (``tpuwatch_probe_reports_rejected_total``) beside the senders' own tallies, scrape
   latency before and during the flood, sampling cycles completed against expected, daemon CPU, the holder's
   reports during the flood, and that its next report is accepted after it.

Targets: added job time <= 0.1 % at the default cadence; p99 step time unchanged within the run's noise (the
spread of p99 between blocks without the probe); no ``step()`` call waits on the chip; <= 4 MiB of device
memory per device; the sampling cycle keeps running through the flood and the holder is accepted after it.

The default run takes about 8 minutes on 2 CPUs; ``--quick`` (about 2 minutes) is a smoke run whose figures
are not to be quoted.  It prints the Markdown section (``probe``) for BENCHMARKS.md and writes it there only
with ``--output``.  Needs root to run the hostile senders as another user (without root they run as this
user and the not-holder sender is left out).  Every child process is
stopped on exit (and gets SIGTERM if this script dies).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEVICES = 4
_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"
os.environ["XLA_FLAGS"] = " ".join(f for f in [os.environ.get("XLA_FLAGS", ""), _FLAG] if f)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import requests  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
import tpuwatch  # noqa: E402
from tpuwatch.probe.channel import exchange  # noqa: E402
from tpuwatch.probe.core import Probe  # noqa: E402

from common import (  # noqa: E402
    BENCHMARKS_MD,
    checkout_env,
    cpu_model,
    machine_and_command,
    wait_for_first_cycle,
    write_section,
)

# The job's model.
LAYERS, D_MODEL, HEADS, SEQ, VOCAB, BATCH = 2, 128, 4, 64, 256, 8
DATA_BATCHES = 32
LEARNING_RATE = 1e-3
# The daemon.
INTERVAL_S = 1.0
REPORTS_PER_MINUTE = 600
SCRAPE_EVERY_S = 0.5
START_LIMIT_S = 180.0
NOBODY = 65534
OVERSIZED_BYTES = 70 * 1024
ROTATE = 500  # hostile reports per sending process, under the per-process burst (REPORTS_PER_MINUTE)
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Targets.
TARGET_ADDED_PCT = 0.1
TARGET_DEVICE_MIB = 4.0
DAEMON_LIBRARIES = ("psutil", "prometheus_client", "yaml", "apscheduler", "requests", "systemd")
SHARES = {"off": 1.5, "default": 2.5, "stressed": 1.0}  # of each round's training time, by arm
CALL_KINDS = ("compile_start", "nothing", "dispatch", "not_ready", "finish", "error")
CALL_NAMES = {"compile_start": "starts the compile thread", "nothing": "nothing to do (compiling, or no run due)",
              "dispatch": "dispatches a run", "not_ready": "outputs not ready: moved on",
              "finish": "reads back, judges, queues the report", "error": "the probe stopped itself"}
# The hostile mix: per kind, its share of --flood-rate and how its reports are made (FLOODER).
FLOOD_SHARES = {"malformed": 1 / 3, "oversized": 1 / 12, "not_holder": 1 / 4, "beyond_limit": 1 / 3}
FLOOD_THREADS = 4
REFUSALS = ("busy", "rate_limited", "timeout", "oversized", "malformed", "not_holder", "unknown_chip")

# In a child before exec: SIGTERM when this script dies, even by SIGKILL (prctl PR_SET_PDEATHSIG).
GUARD = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
         "os.execv(sys.argv[1], sys.argv[1:])")
IMPORT_SCRIPT = """
import json, sys, time
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
steps = []
for name in sys.argv[2:]:  # "module", or "module:attribute" (the attribute's first access, lazy modules)
    module, _, attribute = name.partition(":")
    before, started = rss_kib(), time.perf_counter()
    __import__(module)
    if attribute:
        getattr(sys.modules[module], attribute)
    steps.append([name, time.perf_counter() - started, rss_kib() - before])
print(json.dumps({"steps": steps, "loaded": [m for m in json.loads(sys.argv[1]) if m in sys.modules],
                  "tpuwatch": sorted(m for m in sys.modules if m.startswith("tpuwatch"))}))
"""
FRESH_CHECK_SCRIPT = """
import json, sys, time
def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
import jax
jax.devices()
from tpuwatch.probe import Probe
before, started = rss_kib(), time.perf_counter()
probe = Probe(socket=sys.argv[1])
made = time.perf_counter()
result = probe.check()
checked = time.perf_counter()
again = probe.check()
print(json.dumps({"init": made - started, "check": checked - made, "again": time.perf_counter() - checked,
                  "status": result.status if result else probe.error, "rss_kib": rss_kib() - before}))
"""
# One kind of hostile sender (standard library only; drops to the uid it is given, 65534 for the hostile kinds).
FLOODER = r'''
import ctypes, json, os, signal, socket, sys, threading, time
spec = json.loads(sys.argv[1])
payloads = [p.encode("latin-1") for p in json.loads(sys.stdin.read())]
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
def die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
die_with_parent()
def send(data):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(spec["timeout"])
            conn.connect(spec["path"])
            if data:
                try:
                    conn.sendall(data)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # closed by the daemon first (oversized): its answer may be there still
            answer = b""
            while b"\n" not in answer:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                answer += chunk
    except socket.timeout:
        return "no_answer"
    except OSError as exc:
        return type(exc).__name__
    try:
        doc = json.loads(answer.split(b"\n", 1)[0])
    except ValueError:
        return "no_answer"
    return "accepted" if doc.get("accepted") else str(doc.get("reason"))
def run(first, count, start, end):
    counts, lock, index = {}, threading.Lock(), [first]
    def sender():
        while time.monotonic() < end:
            if spec["rate"]:
                with lock:
                    i = index[0]
                    if i >= first + count:
                        return
                    index[0] += 1
                delay = start + i / spec["rate"] - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if time.monotonic() >= end:
                    return
                reason = send(payloads[i % len(payloads)])
            else:
                reason = send(b"")  # slow: connects, sends nothing, waits for the daemon to give up
            with lock:
                counts[reason] = counts.get(reason, 0) + 1
    threads = [threading.Thread(target=sender) for _ in range(spec["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts
start = time.monotonic()
end = start + spec["seconds"]
total, done, pids = {}, 0, 1
limit = int(spec["seconds"] * spec["rate"]) if spec["rate"] else 0
if spec["rotate"]:
    while done < limit and time.monotonic() < end:
        count = min(spec["rotate"], limit - done)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            die_with_parent()
            os.write(write_end, json.dumps(run(done, count, start, end)).encode())
            os._exit(0)
        os.close(write_end)
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
        os.close(read_end)
        os.waitpid(pid, 0)
        for reason, n in json.loads(data or b"{}").items():
            total[reason] = total.get(reason, 0) + n
        done, pids = done + count, pids + 1
else:
    total = run(0, limit, start, end)
print(json.dumps({"counts": total, "seconds": time.monotonic() - start, "pids": pids}))
'''


class BenchmarkError(RuntimeError):
    """A measurement could not be made; the message says why."""


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the wall clock."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); nan for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def ms(seconds: float, digits: int = 1) -> str:
    """Seconds as milliseconds with ``digits`` decimals."""
    return f"{seconds * 1000:.{digits}f}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all threads) in seconds, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # fields from 3 (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all CPUs: user, nice, system, irq, softirq, steal)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields[:3]) + sum(fields[5:8])) / CLK_TCK


class OtherLoad:
    """CPU seconds used by everything but this process and ``pids`` (the daemon): other processes' load."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def __call__(self) -> float:
        own = os.times()
        ours = own.user + own.system + sum(cpu_seconds(pid) for pid in self.pids if Path(f"/proc/{pid}").exists())
        return machine_busy_seconds() - ours


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the job: a small decoder-only language model, data parallel ---------------------------------------


def init_params(key: jax.Array) -> dict[str, Any]:
    """The model's weights: embeddings, LAYERS pre-norm blocks (attention, 4x MLP), final norm and unembedding."""
    keys = iter(jax.random.split(key, 3 + 4 * LAYERS))

    def dense(shape: tuple[int, int]) -> jax.Array:
        return jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(shape[0])

    layers = [{"ln1": jnp.ones(D_MODEL), "qkv": dense((D_MODEL, 3 * D_MODEL)), "out": dense((D_MODEL, D_MODEL)),
               "ln2": jnp.ones(D_MODEL), "up": dense((D_MODEL, 4 * D_MODEL)), "down": dense((4 * D_MODEL, D_MODEL))}
              for _ in range(LAYERS)]
    return {"embed": 0.02 * jax.random.normal(next(keys), (VOCAB, D_MODEL)),
            "pos": 0.02 * jax.random.normal(next(keys), (SEQ, D_MODEL)),
            "layers": layers, "lnf": jnp.ones(D_MODEL), "unembed": dense((D_MODEL, VOCAB))}


def layer_norm(x: jax.Array, gain: jax.Array) -> jax.Array:
    """Layer normalisation over the last axis (no bias)."""
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gain


def forward(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    """Logits of the next token at every position (causal self-attention)."""
    x = params["embed"][tokens] + params["pos"]
    mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    for layer in params["layers"]:
        q, k, v = jnp.split(layer_norm(x, layer["ln1"]) @ layer["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(t.shape[0], SEQ, HEADS, D_MODEL // HEADS).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(D_MODEL // HEADS), -1e9)
        attended = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = x + attended @ layer["out"]
        x = x + jax.nn.gelu(layer_norm(x, layer["ln2"]) @ layer["up"]) @ layer["down"]
    return layer_norm(x, params["lnf"]) @ params["unembed"]


def loss_fn(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy of a batch of SEQ + 1 token rows."""
    log_probs = jax.nn.log_softmax(forward(params, tokens[:, :-1]))
    return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1).mean()


def train_step(state: tuple[Any, Any, Any, jax.Array], tokens: jax.Array) -> tuple[tuple[Any, ...], jax.Array]:
    """One Adam step (written out: no optax) on ``tokens``; the new state and the loss."""
    params, m, v, t = state
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    t = t + 1
    m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
    v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
    rate = LEARNING_RATE * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
    params = jax.tree.map(lambda p, a, b: p - rate * a / (jnp.sqrt(b) + 1e-8), params, m, v)
    return (params, m, v, t), loss


class Job:
    """The training job: state replicated, each batch split over the devices' ``data`` axis."""

    def __init__(self, seed: int = 0) -> None:
        mesh = Mesh(np.array(jax.devices()), ("data",))
        replicated, split = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
        params = init_params(jax.random.key(seed))
        m, v = (jax.tree.map(jnp.zeros_like, params) for _ in range(2))  # two trees: each buffer donated once
        self.state = jax.device_put((params, m, v, jnp.zeros((), jnp.int32)), replicated)
        self.parameters = sum(int(np.size(p)) for p in jax.tree.leaves(params))
        rng = np.random.default_rng(seed)
        self.batches = [jax.device_put(rng.integers(0, VOCAB, (BATCH * len(jax.devices()), SEQ + 1),
                                                    dtype=np.int32), split) for _ in range(DATA_BATCHES)]
        self._step = jax.jit(train_step, donate_argnums=0, out_shardings=(replicated, replicated))
        self.steps = 0

    def dispatch(self) -> jax.Array:
        """Dispatch one train step (returns at once); its loss."""
        self.state, loss = self._step(self.state, self.batches[self.steps % len(self.batches)])
        self.steps += 1
        return loss


# --- the probe inside the job ---------------------------------------------------------------------------


class BlockClock:
    """A monotonic clock that runs only between ``resume()`` and ``pause()``: a probe's cadence in its own blocks."""

    def __init__(self) -> None:
        self._spent = 0.0
        self._since: float | None = None

    def resume(self) -> None:
        """Start counting."""
        self._since = time.monotonic()

    def pause(self) -> None:
        """Stop counting."""
        if self._since is not None:
            self._spent += time.monotonic() - self._since
            self._since = None

    def __call__(self) -> float:
        return self._spent + (time.monotonic() - self._since if self._since is not None else 0.0)


@dataclass
class Calls:
    """The wall time of every ``probe.step()`` call, by what the call did."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in CALL_KINDS})

    def step(self, probe: Probe) -> None:
        """Call ``probe.step()`` once, timed and classified by the probe's state before and after."""
        starts = probe._compiler is None
        inflight = probe._inflight is not None
        started = time.perf_counter()
        result = probe.step()
        elapsed = time.perf_counter() - started
        if probe.error is not None:
            kind = "error"
        elif result is not None:
            kind = "finish"
        elif inflight:
            kind = "not_ready"
        elif probe._inflight is not None:
            kind = "dispatch"
        else:
            kind = "compile_start" if starts else "nothing"
        self.seconds[kind].append(elapsed)

    def all(self) -> list[float]:
        """Every call's wall time."""
        return [s for kind in CALL_KINDS for s in self.seconds[kind]]


@dataclass
class StartPhase:
    """A probe's first steps: until its compile is done and its first run judged."""

    compile_s: float | None
    first_result_s: float | None
    steps: list[float]


@dataclass
class Arm:
    """One kind of block: without the probe (``probe`` None) or with it at ``every`` seconds."""

    name: str
    every: float | None
    probe: Probe | None = None
    clock: BlockClock = field(default_factory=BlockClock)
    calls: Calls = field(default_factory=Calls)
    start_calls: Calls = field(default_factory=Calls)
    blocks: list[list[float]] = field(default_factory=list)
    start: StartPhase | None = None
    runs_at_start: int = 0
    steps: int = 0  # per block
    others: list[float] = field(default_factory=list)  # other processes' CPU (cores) during each block


def watch_compile(probe: Probe, limit: float) -> Callable[[], float | None]:
    """Seconds from now until ``probe._compiled`` is set (polled every 10 ms in a thread), once known."""
    started, seen = time.perf_counter(), []

    def watch() -> None:
        while probe._compiled is None and probe.error is None and time.perf_counter() - started < limit:
            time.sleep(0.01)
        if probe._compiled is not None:
            seen.append(time.perf_counter() - started)

    threading.Thread(target=watch, name="compile-watch", daemon=True).start()
    return lambda: seen[0] if seen else None


def run_block(job: Job, steps: int, arm: Arm, others: OtherLoad) -> list[float]:
    """``steps`` training steps, each blocking on its loss, with ``arm``'s probe stepped after each dispatch; the
    other processes' load meanwhile goes to ``arm.others``."""
    times = []
    load0, wall0 = others(), time.monotonic()
    arm.clock.resume()
    try:
        for _ in range(steps):
            started = time.perf_counter()
            loss = job.dispatch()
            if arm.probe is not None:
                arm.calls.step(arm.probe)
            float(loss)
            times.append(time.perf_counter() - started)
    finally:
        arm.clock.pause()
    arm.others.append((others() - load0) / (time.monotonic() - wall0))
    return times


def start_probe(job: Job, arm: Arm) -> None:
    """Step the job with ``arm``'s probe until its first run is judged: the one-time compile, in the job."""
    assert arm.probe is not None
    arm.clock.resume()
    compiled = watch_compile(arm.probe, START_LIMIT_S)
    started, steps = time.perf_counter(), []
    first: float | None = None
    try:
        while arm.probe.runs == 0 and arm.probe.error is None and time.perf_counter() - started < START_LIMIT_S:
            step_started = time.perf_counter()
            loss = job.dispatch()
            arm.start_calls.step(arm.probe)
            float(loss)
            steps.append(time.perf_counter() - step_started)
            if arm.probe.runs and first is None:
                first = time.perf_counter() - started
    finally:
        arm.clock.pause()
    if arm.probe.error is not None or first is None:
        raise BenchmarkError(f"the probe (every {arm.every:g} s) did not finish a run: {arm.probe.error}")
    arm.start = StartPhase(compiled(), first, steps)
    arm.runs_at_start = arm.probe.runs


def measure_job(args: argparse.Namespace, socket_path: str, others: OtherLoad) -> tuple[Job, list[Arm], float]:
    """Figure 1: the job, the arms after the interleaved rounds and the warm-up's median step seconds."""
    job = Job()
    progress(f"job: {job.parameters} parameters, compiling the train step")
    for _ in range(3):
        float(job.dispatch())
    warm = []
    for _ in range(10):
        started = time.perf_counter()
        float(job.dispatch())
        warm.append(time.perf_counter() - started)
    step_s = statistics.median(warm)
    unit = args.steps / SHARES["off"] if args.steps else args.seconds / (args.rounds * sum(SHARES.values())) / step_s
    arms = [Arm("off", None), Arm("default", args.every), Arm("stressed", args.stress_every)]
    for arm in arms:
        arm.steps = max(10, round(unit * SHARES[arm.name]))
    for arm in arms[1:]:
        assert arm.every is not None
        arm.probe = Probe(arm.every, socket=socket_path, clock=arm.clock)
        progress(f"job: start phase of the probe at every {arm.every:g} s (compile and first run)")
        start_probe(job, arm)
    per_round = sum(a.steps for a in arms)
    progress(f"job: {args.rounds} rounds of {' + '.join(str(a.steps) for a in arms)} steps (warm-up step "
             f"{step_s * 1000:.0f} ms, about {args.rounds * per_round * step_s:.0f} s)")
    for round_no in range(args.rounds):
        shift = round_no % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            arm.blocks.append(run_block(job, arm.steps, arm, others))
        progress(f"job: round {round_no + 1}/{args.rounds} done; mean step ms "
                 f"{', '.join(f'{a.name} {statistics.fmean(a.blocks[-1]) * 1000:.1f}' for a in arms)}; runs "
                 f"{', '.join(f'{a.name} {a.probe.runs}' for a in arms if a.probe is not None)}; other processes "
                 f"{', '.join(f'{a.others[-1]:.2f}' for a in arms)} cores")
    for arm in arms[1:]:
        assert arm.probe is not None
        arm.probe.channel.flush()
    return job, arms, step_s


# --- the probe's own cost --------------------------------------------------------------------------------


@dataclass
class ImportCost:
    """Medians over fresh interpreters: wall seconds and RSS KiB of each import; the daemon libraries loaded."""

    jax_s: float
    jax_kib: float
    module_s: float  # import tpuwatch.probe (lazy: Probe and check load on first access)
    module_kib: float
    probe_cold_s: float  # then tpuwatch.probe.Probe, jax not yet imported
    probe_cold_kib: float
    probe_after_jax_s: float  # import tpuwatch.probe and its Probe after import jax
    probe_after_jax_kib: float
    loaded: list[str]
    tpuwatch_modules: list[str]


def run_python(code: str, *argv: str, timeout: float = 300) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with this checkout's tpuwatch; its JSON output."""
    done = subprocess.run([sys.executable, "-c", GUARD, sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, env=checkout_env(), timeout=timeout, check=False)
    if done.returncode != 0:
        raise BenchmarkError(f"a fresh interpreter failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_imports(runs: int) -> ImportCost:
    """``import jax`` (the anchor); ``import tpuwatch.probe`` then its ``Probe`` with jax not loaded yet; both
    after ``import jax``; each in ``runs`` fresh interpreters."""
    libs = json.dumps(list(DAEMON_LIBRARIES))
    bare, cold, after = [], [], []
    for _ in range(runs):  # interleaved, so all three see the same background
        bare.append(run_python(IMPORT_SCRIPT, libs, "jax"))
        cold.append(run_python(IMPORT_SCRIPT, libs, "tpuwatch.probe", "tpuwatch.probe:Probe"))
        after.append(run_python(IMPORT_SCRIPT, libs, "jax", "tpuwatch.probe", "tpuwatch.probe:Probe"))

    def median(docs: list[dict[str, Any]], steps: Sequence[int], column: int) -> float:
        return statistics.median(sum(d["steps"][i][column] for i in steps) for d in docs)

    return ImportCost(median(bare, [0], 1), median(bare, [0], 2), median(cold, [0], 1), median(cold, [0], 2),
                      median(cold, [1], 1), median(cold, [1], 2), median(after, [1, 2], 1),
                      median(after, [1, 2], 2), sorted({m for d in cold + after for m in d["loaded"]}),
                      cold[-1]["tpuwatch"])


@dataclass
class DeviceMemory:
    """What the probe keeps on each device, and what one run needs besides."""

    resident: dict[str, int]
    memory_stats: str
    temp: int | None
    output: int | None
    code: int | None


def device_memory(probe: Probe) -> DeviceMemory:
    """The nbytes of the probe's resident arrays per device, the backend's memory_stats() and XLA's memory
    analysis of the compiled program (temporaries, output, generated code)."""
    assert probe._compiled is not None
    resident = {name: sum(int(leaf.nbytes) for leaf in jax.tree.leaves(args)) for name, _, args in probe._compiled}
    stats = [device.memory_stats() for _, device in probe.devices]
    analysis: Any = None
    try:
        analysis = probe._compiled[0][1].memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend has it: the figure is then left out
        analysis = None

    def size(name: str) -> int | None:
        value = getattr(analysis, name, None)
        return int(value) if value is not None else None

    shown = "None on every device" if all(s is None for s in stats) else \
        "; ".join(f"{d}: {(s or {}).get('bytes_in_use')} B in use" for (d, _), s in zip(probe.devices, stats))
    return DeviceMemory(resident, shown, size("temp_size_in_bytes"), size("output_size_in_bytes"),
                        size("generated_code_size_in_bytes"))


def in_process_check(socket_path: str) -> tuple[float, float, dict[str, Any], Probe]:
    """A fresh Probe's synchronous ``check()`` in this (warm) process, first and second call; the report it made
    (captured, not sent) and the probe."""
    probe = Probe(socket=socket_path)
    captured: list[dict[str, Any]] = []
    probe.channel.send = captured.append  # type: ignore[method-assign, assignment]
    started = time.perf_counter()
    result = probe.check()
    first = time.perf_counter() - started
    started = time.perf_counter()
    probe.check()
    again = time.perf_counter() - started
    if result is None or not captured:
        raise BenchmarkError(f"check() on a fresh probe failed: {probe.error}")
    return first, again, captured[0], probe


# --- the daemon -----------------------------------------------------------------------------------------


@dataclass
class Daemon:
    """``tpuwatch run`` as a child, with its URL, probe socket and log."""

    process: subprocess.Popen[bytes]
    url: str
    socket: str
    log: Path

    def complaints(self) -> list[str]:
        """The distinct WARNING and ERROR messages of its log so far (timestamps dropped)."""
        lines = self.log.read_text(errors="replace").splitlines()
        found = [line.split(" ", 2)[-1] for line in lines if " WARNING " in line or " ERROR " in line]
        return list(dict.fromkeys(found))

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        return self.process.pid

    def ensure_alive(self) -> None:
        """BenchmarkError with the log's tail if the daemon has exited."""
        if self.process.poll() is not None:
            raise BenchmarkError(f"the daemon exited ({self.process.returncode}): {self.log.read_text()[-3000:]}")


def hold_chips(dev: Path) -> list[Any]:
    """Create the simulated chips' device files and hold them open, as a job holds its chips."""
    dev.mkdir(parents=True)
    return [open(dev / f"accel{i}", "a") for i in range(DEVICES)]  # noqa: SIM115 - held until the end


def start_daemon(workdir: Path) -> Daemon:
    """Start ``tpuwatch run`` on a free port (config as JSON, which is YAML) and wait for its first cycle."""
    port = free_port()
    socket_path = str(workdir / "probe.sock")
    config = {"listen": f"127.0.0.1:{port}", "state_dir": str(workdir / "state"), "interval": f"{INTERVAL_S:g}s",
              "devices": {"backend": "sim", "sim": {"count": DEVICES, "device_dir": str(workdir / "dev")}},
              "canary": {"enabled": False}, "kernel_log": {"source": "file", "path": str(workdir / "empty.log")},
              "probe": {"socket": socket_path, "reports_per_minute": REPORTS_PER_MINUTE}}
    (workdir / "empty.log").touch()
    path = workdir / "config.yaml"
    path.write_text(json.dumps(config, indent=1))
    log = workdir / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", GUARD, sys.executable, "-m", "tpuwatch", "run", "--config",
                                    str(path)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   env=checkout_env())
    daemon = Daemon(process, f"http://127.0.0.1:{port}", socket_path, log)
    wait_for_first_cycle(daemon.url, process, log)
    progress(f"daemon up (pid {process.pid}) on {daemon.url}, probe socket {daemon.socket}")
    return daemon


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def scrape(url: str) -> tuple[float, dict[str, float] | None]:
    """One /metrics scrape on a new connection: its seconds and the samples by ``name{labels}`` (None: failed)."""
    started = time.perf_counter()
    try:
        response = requests.get(f"{url}/metrics", timeout=10)
        response.raise_for_status()
        text = response.text
    except requests.RequestException:
        return time.perf_counter() - started, None
    elapsed = time.perf_counter() - started
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                samples[key] = float(value)
            except ValueError:
                continue
    return elapsed, samples


def probe_counts(samples: dict[str, float]) -> Counter[str]:
    """The daemon's report counters: accepted and each refusal reason."""
    counts: Counter[str] = Counter({"accepted": int(samples.get("tpuwatch_probe_reports_total", 0))})
    for reason in REFUSALS:
        counts[reason] = int(samples.get(f'tpuwatch_probe_reports_rejected_total{{reason="{reason}"}}', 0))
    return counts


def settled(daemon: Daemon, window: Window | None = None) -> dict[str, float]:
    """The daemon's samples once its next cycles have rendered what came before; scraped every SCRAPE_EVERY_S
    meanwhile, so that ``window`` sees the cycles that ended at its very end (the exposition shows a cycle late)."""
    deadline = time.monotonic() + 2.5 * INTERVAL_S
    while True:
        _, samples = scrape(daemon.url)
        if samples is not None and window is not None:
            window.seen(samples)
        if time.monotonic() >= deadline:
            break
        time.sleep(SCRAPE_EVERY_S)
    if samples is None:
        raise BenchmarkError("cannot scrape the daemon")
    return samples


def holder_exchange(daemon: Daemon, report: dict[str, Any]) -> str:
    """Send ``report`` as the probe's channel does (``exchange``); "accepted", the refusal's reason, or the error
    (a refusal at accept, busy or rate_limited, reaches ``exchange`` as ECONNRESET or EPIPE when the daemon closes
    the connection before reading the report)."""
    try:
        answer = exchange(daemon.socket, report)
    except (OSError, ValueError) as exc:
        return type(exc).__name__
    return "accepted" if answer.get("accepted") else str(answer.get("reason"))


@dataclass
class ReportCost:
    """Figure 3a: valid reports from the holder, one after another."""

    count: int
    answers: Counter[str]
    seconds: float
    cpu: float
    idle_seconds: float
    idle_cpu: float
    latencies: list[float]

    @property
    def idle_rate(self) -> float:
        """The daemon's idle CPU seconds per second."""
        return self.idle_cpu / self.idle_seconds

    @property
    def per_report(self) -> float:
        """Daemon CPU seconds per report, the idle CPU over as long subtracted."""
        return (self.cpu - self.idle_rate * self.seconds) / self.count


def report_cost(daemon: Daemon, report: dict[str, Any], count: int, min_idle: float) -> ReportCost:
    """``count`` valid reports sent one after another from this process (it holds the chips), then as long idle."""
    answers: Counter[str] = Counter()
    latencies = []
    cpu0, started = cpu_seconds(daemon.pid), time.perf_counter()
    for _ in range(count):
        sent = time.perf_counter()
        answers[holder_exchange(daemon, report)] += 1
        latencies.append(time.perf_counter() - sent)
    seconds, cpu = time.perf_counter() - started, cpu_seconds(daemon.pid) - cpu0
    idle_seconds = max(seconds, min_idle)
    cpu0, started = cpu_seconds(daemon.pid), time.perf_counter()
    time.sleep(idle_seconds)
    idle_seconds, idle_cpu = time.perf_counter() - started, cpu_seconds(daemon.pid) - cpu0
    return ReportCost(count, answers, seconds, cpu, idle_seconds, idle_cpu, latencies)


@dataclass
class Window:
    """Scrapes every SCRAPE_EVERY_S over a window: latencies, failures, the cycles seen, the daemon's CPU."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    cycle_ends: list[float] = field(default_factory=list)
    cpu: float = 0.0
    collectors_failing: set[str] = field(default_factory=set)
    slowest: dict[str, float] = field(default_factory=dict)  # collector -> longest duration seen
    scheduler: dict[str, tuple[float, float]] = field(default_factory=dict)  # event -> (first, last) count seen
    unix: tuple[float, float] = (0.0, 0.0)

    def gaps(self) -> list[float]:
        """Seconds between consecutive cycle ends inside the window."""
        ends = self.cycles()
        return [b - a for a, b in zip(ends, ends[1:])]

    def scheduler_events(self) -> dict[str, int]:
        """Scheduler problems (missed, max_instances, error) counted during the window."""
        return {event: int(last - first) for event, (first, last) in self.scheduler.items() if last > first}

    def cycles(self) -> list[float]:
        """The distinct cycle end times inside the window (its scrapes and one after it seen them)."""
        return sorted({t for t in self.cycle_ends if self.unix[0] <= t <= self.unix[1]})

    def stretch(self) -> float:
        """The longest time inside the window without a cycle ending, its edges included."""
        points = [self.unix[0], *self.cycles(), self.unix[1]]
        return max(b - a for a, b in zip(points, points[1:]))

    def seen(self, samples: dict[str, float]) -> None:
        """Note the cycle end a scrape shows, the collectors' durations and the scheduler's problems."""
        for key, value in samples.items():
            if key.startswith("tpuwatch_collector_duration_seconds{"):
                name = key.split('"')[1]
                self.slowest[name] = max(self.slowest.get(name, 0.0), value)
            elif key.startswith("tpuwatch_scheduler_events_total{"):
                event = key.split('"')[1]
                first, _ = self.scheduler.get(event, (value, value))
                self.scheduler[event] = (first, value)
        if "tpuwatch_last_sample_timestamp_seconds" in samples:
            self.cycle_ends.append(samples["tpuwatch_last_sample_timestamp_seconds"])


def observe(daemon: Daemon, seconds: float, until: Callable[[], bool] | None = None) -> Window:
    """Scrape every SCRAPE_EVERY_S for ``seconds`` (or until ``until()``)."""
    window = Window()
    cpu0, started, unix0 = cpu_seconds(daemon.pid), time.monotonic(), time.time()
    next_at = started
    while True:
        now = time.monotonic()
        if now - started >= seconds or (until is not None and until()):
            break
        daemon.ensure_alive()
        latency, samples = scrape(daemon.url)
        window.latencies.append(latency)
        if samples is None:
            window.failed += 1
        else:
            window.seen(samples)
            window.collectors_failing |= {key for key, value in samples.items()
                                          if key.startswith("tpuwatch_collector_success") and value != 1}
        next_at += SCRAPE_EVERY_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    window.seconds, window.cpu = time.monotonic() - started, cpu_seconds(daemon.pid) - cpu0
    window.unix = (unix0, time.time())
    return window


@dataclass
class Sender:
    """One hostile sender process and what it said at the end."""

    kind: str
    rate: float | None
    process: subprocess.Popen[str]
    result: dict[str, Any] = field(default_factory=dict)


def flood_payloads(report: dict[str, Any]) -> dict[str, list[str]]:
    """The reports each kind of sender sends (latin-1 text, one line each)."""
    line = json.dumps(report, separators=(",", ":"))
    bad_fingerprint = json.dumps({**report, "results": [{**r, "fingerprint": "nothex"} for r in report["results"]]})
    return {
        "malformed": ["{not json\n", "[]\n", '{"version": 2}\n', "[" * 200 + "\n", bad_fingerprint + "\n",
                      line[: len(line) // 2] + "\n", "\x00\xff\xfe garbage\n"],
        "oversized": ['{"version":1,"pad":"' + "x" * OVERSIZED_BYTES + '"}\n'],
        "not_holder": [line + "\n"],
        "beyond_limit": [line + "\n"],
        "slow": [""],
    }


def start_senders(daemon: Daemon, report: dict[str, Any], rate: float, seconds: float, slow: int) -> list[Sender]:
    """Start the hostile senders (from the main thread: their parent-death signal follows this thread)."""
    payloads = flood_payloads(report)
    root = os.geteuid() == 0
    plan: list[tuple[str, float | None, int, int | None, int]] = [
        (kind, rate * share, FLOOD_THREADS, None if kind == "beyond_limit" or not root else NOBODY,
         0 if kind == "beyond_limit" else ROTATE)
        for kind, share in FLOOD_SHARES.items() if root or kind != "not_holder"]
    if slow:
        plan.append(("slow", None, slow, NOBODY if root else None, 0))
    senders = []
    for kind, kind_rate, threads, uid, rotate in plan:
        spec = {"path": daemon.socket, "rate": kind_rate, "seconds": seconds, "threads": threads, "uid": uid,
                "rotate": rotate, "timeout": 10.0}
        process = subprocess.Popen([sys.executable, "-c", FLOODER, json.dumps(spec)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="latin-1")
        senders.append(Sender(kind, kind_rate, process))
    for sender in senders:
        assert sender.process.stdin is not None
        sender.process.stdin.write(json.dumps(payloads[sender.kind]))
        sender.process.stdin.close()
        sender.process.stdin = None  # communicate() later reads the tally only
    return senders


def finish_senders(senders: list[Sender], seconds: float) -> None:
    """Wait for every sender's tally (each stops itself after ``seconds``)."""
    for sender in senders:
        try:
            out, err = sender.process.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            sender.process.kill()
            out, err = sender.process.communicate()
        if sender.process.returncode != 0 or not out.strip():
            raise BenchmarkError(f"the {sender.kind} sender failed ({sender.process.returncode}): {err[-2000:]}")
        sender.result = json.loads(out.strip().splitlines()[-1])


class HolderDuringFlood(threading.Thread):
    """The real holder (this process) sends one valid report a second while the flood runs."""

    def __init__(self, daemon: Daemon, report: dict[str, Any]) -> None:
        super().__init__(name="holder", daemon=True)
        self.daemon_ = daemon
        self.report = report
        self.stop = threading.Event()
        self.answers: Counter[str] = Counter()
        self.latencies: list[float] = []

    def run(self) -> None:
        """Until stopped: a report, then a second's pause."""
        while not self.stop.is_set():
            started = time.perf_counter()
            reason = holder_exchange(self.daemon_, self.report)
            self.latencies.append(time.perf_counter() - started)
            self.answers[reason] += 1
            self.stop.wait(1.0)


@dataclass
class Flood:
    """Figure 3b."""

    seconds: float
    senders: list[Sender]
    before: Window
    during: Window
    server: Counter[str]
    holder: Counter[str]
    holder_latencies: list[float]
    after: str
    after_latency: float
    slow: int

    def attempts(self, sender: Sender) -> int:
        """Connections the sender made."""
        return int(sum(sender.result.get("counts", {}).values()))

    @property
    def rate(self) -> float:
        """Reports a second over all senders."""
        return sum(self.attempts(s) / max(s.result.get("seconds", self.seconds), 1e-9) for s in self.senders)

    @property
    def clients(self) -> Counter[str]:
        """The answers every sender and the holder got, by reason."""
        total: Counter[str] = Counter(self.holder)
        for sender in self.senders:
            total.update(sender.result.get("counts", {}))
        return total


def flood(daemon: Daemon, report: dict[str, Any], args: argparse.Namespace, senders: list[Sender]) -> Flood:
    """Figure 3b: scrapes before the flood, then the flood with scrapes, the holder's reports during and after."""
    progress(f"daemon: {args.baseline:g} s of scrapes before the flood")
    before = observe(daemon, args.baseline)
    samples = settled(daemon, before)
    counts0 = probe_counts(samples)
    progress(f"daemon: flood at {args.flood_rate:g}/s for {args.flood_seconds:g} s, {args.slow} slow connections")
    senders += start_senders(daemon, report, args.flood_rate, args.flood_seconds, args.slow)
    holder = HolderDuringFlood(daemon, report)
    holder.start()
    during = observe(daemon, args.flood_seconds + 30, until=lambda: all(s.process.poll() is not None for s in senders))
    holder.stop.set()
    holder.join(5)
    finish_senders(senders, args.flood_seconds)
    time.sleep(max(0.2, 60 / REPORTS_PER_MINUTE))  # a token back in the holder's bucket
    started = time.perf_counter()
    after_reason = holder_exchange(daemon, report)
    after_latency = time.perf_counter() - started
    daemon.ensure_alive()
    samples = settled(daemon, during)
    progress(f"daemon: cycle gaps during the flood {[round(g, 2) for g in during.gaps()]}, window "
             f"{[round(t - during.unix[0], 2) for t in during.cycles()]} of {during.unix[1] - during.unix[0]:.2f} s")
    server = probe_counts(samples)
    server.subtract(counts0)
    server[after_reason] -= 1  # not the flood's
    return Flood(during.seconds, senders, before, during, +server, holder.answers, holder.latencies, after_reason,
                 after_latency, args.slow)


# --- the report -----------------------------------------------------------------------------------------


@dataclass
class Results:
    """Everything one run measured."""

    job: Job
    arms: list[Arm]
    warm_step_s: float
    imports: ImportCost
    fresh: dict[str, Any]
    check_first_s: float
    check_again_s: float
    memory: DeviceMemory
    reports: ReportCost
    flood: Flood
    daemon_accepted_job_reports: int
    complaints: list[str]


def mean_step(blocks: list[list[float]]) -> float:
    """Mean step seconds over ``blocks``."""
    return sum(map(sum, blocks)) / sum(map(len, blocks))


def added_pct(arm: Arm, off: Arm) -> tuple[float, list[float]]:
    """Added job time in %: mean step with / without - 1, overall and per round (same round's off block)."""
    overall = 100 * (mean_step(arm.blocks) / mean_step(off.blocks) - 1)
    per_round = [100 * (statistics.fmean(b) / statistics.fmean(o) - 1) for b, o in zip(arm.blocks, off.blocks)]
    return overall, per_round


def spread(values: list[float]) -> str:
    """'min to max' of ``values`` in %."""
    return f"{min(values):+.2f} to {max(values):+.2f} %"


def verdict(ok: bool) -> str:
    """Met or not."""
    return "met" if ok else "**not met**"


@dataclass
class Estimate:
    """The default cadence's added job time, scaled from the stressed blocks."""

    mean_pct: float  # stressed, mean over rounds
    se_pct: float
    job_s_per_run: float  # stressed job seconds per run
    per_run_s: float
    host_per_run_s: float
    every: float

    @property
    def pct(self) -> float:
        """Added job time at the default cadence, %."""
        return self.mean_pct * self.job_s_per_run / self.every

    @property
    def upper_pct(self) -> float:
        """The same from the mean + 2 SE."""
        return (self.mean_pct + 2 * self.se_pct) * self.job_s_per_run / self.every

    @property
    def floor_pct(self) -> float:
        """What the time inside ``step()`` alone adds, %: a floor."""
        return 100 * self.host_per_run_s / self.every

    def verdict(self) -> str:
        """Met when even the upper bound is; unresolved when only the estimate is."""
        if self.upper_pct <= TARGET_ADDED_PCT:
            return "met (upper bound)"
        if self.pct <= TARGET_ADDED_PCT:
            return f"**not resolved** (estimate within it, upper bound {self.upper_pct:+.3f} % not)"
        return "**not met**"


@dataclass
class Fit:
    """Every block's mean step by least squares: base + slope x other processes' cores + the arm's effect."""

    base: float  # seconds, without the probe and with nothing else running
    slope: float | None  # seconds per core of other processes' load (None: too little load to fit)
    effect: dict[str, float]  # arm -> added seconds per step
    se: dict[str, float]  # arm -> its standard error
    blocks: int

    def pct(self, arm: str) -> tuple[float, float]:
        """The arm's added job time and its standard error, in %."""
        return 100 * self.effect[arm] / self.base, 100 * self.se[arm] / self.base


def fit_blocks(arms: list[Arm]) -> Fit:
    """Fit the blocks' mean step times (``Fit``); the load term only when the load varied between blocks."""
    loads = [load for arm in arms for load in arm.others]
    with_load = max(loads) - min(loads) > 0.05
    probed = [arm.name for arm in arms if arm.probe is not None]
    rows, means = [], []
    for arm in arms:
        for block, load in zip(arm.blocks, arm.others):
            rows.append([1.0, *([load] if with_load else []), *(float(arm.name == name) for name in probed)])
            means.append(statistics.fmean(block))
    x, y = np.array(rows), np.array(means)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = max(len(y) - x.shape[1], 1)
    residual = y - x @ coef
    cov = float(residual @ residual) / dof * np.linalg.pinv(x.T @ x)
    first = 2 if with_load else 1
    return Fit(float(coef[0]), float(coef[1]) if with_load else None,
               {name: float(coef[first + i]) for i, name in enumerate(probed)},
               {name: float(np.sqrt(cov[first + i, first + i])) for i, name in enumerate(probed)}, len(y))


def estimate(r: Results, runs: int, fit: Fit) -> Estimate:
    """Scale the stressed blocks' added time (``fit``: other processes' load taken out) to the default cadence by
    job seconds per run."""
    _, default, stressed = r.arms
    assert default.every is not None
    runs = max(runs, 1)
    job_s = sum(map(sum, stressed.blocks))
    mean_pct, se_pct = fit.pct("stressed")
    per_run = fit.effect["stressed"] * sum(map(len, stressed.blocks)) / runs
    return Estimate(mean_pct, se_pct, job_s / runs, per_run, sum(stressed.calls.all()) / runs, default.every)


def job_section(r: Results, args: argparse.Namespace) -> list[str]:
    """Figure 1's table and what follows from it."""
    off, default, stressed = r.arms
    assert default.probe is not None and stressed.probe is not None
    steps = {a.name: [s for b in a.blocks for s in b] for a in r.arms}
    block_p99 = {a.name: [pct(b, 99) for b in a.blocks] for a in r.arms}
    added = {a.name: added_pct(a, off) for a in r.arms[1:]}
    runs = {a.name: a.probe.runs - a.runs_at_start for a in r.arms if a.probe is not None}
    calls = {a.name: a.calls for a in r.arms[1:]}
    off_noise = max(block_p99["off"]) - min(block_p99["off"])
    p99_delta = pct(steps["default"], 99) - pct(steps["off"], 99)
    fit = fit_blocks(r.arms)
    est = estimate(r, runs["stressed"], fit)
    busiest = max(o for a in r.arms for o in a.others)
    all_calls = calls["default"].all() + calls["stressed"].all()
    not_ready = {n: len(c.seconds["not_ready"]) for n, c in calls.items()}

    def col(name: str, fn: Callable[[Arm], str]) -> str:
        return fn(next(a for a in r.arms if a.name == name))

    def row(label: str, fn: Callable[[Arm], str], target: str = "") -> str:
        return f"| {label} | {col('off', fn)} | {col('default', fn)} | {col('stressed', fn)} | {target} |"

    lines = [
        "### 1. The job's overhead", "",
        f"{args.rounds} rounds; each round one block of each kind, the order rotated every round: {off.steps} steps "
        f"without the probe, {default.steps} at every {default.every:g} s (longer, so that it runs several times), "
        f"{stressed.steps} at every {stressed.every:g} s. "
        "Step time is from dispatching the train step to `float(loss)` returning, `probe.step()` between them.", "",
        f"| | no probe | `Probe(every={default.every:g})` | `Probe(every={stressed.every:g})` (stressed) | Target |",
        "|---|---:|---:|---:|---|",
        row("steps measured", lambda a: str(len(steps[a.name]))),
        row("median step (ms)", lambda a: ms(statistics.median(steps[a.name]))),
        row("p99 step (ms), all blocks", lambda a: ms(pct(steps[a.name], 99)),
            f"unchanged within noise: {verdict(abs(p99_delta) <= off_noise)}"),
        row("p99 step (ms) per block, min to max", lambda a: f"{ms(min(block_p99[a.name]))} to "
            f"{ms(max(block_p99[a.name]))}", f"noise: {ms(off_noise)} ms between blocks without the probe"),
        row("mean step (ms)", lambda a: ms(mean_step(a.blocks), 2)),
        row("added job time (mean with / without - 1)", lambda a: "" if a.probe is None else
            f"{added[a.name][0]:+.2f} %"),
        row("added job time per round (same round's block without)", lambda a: "" if a.probe is None else
            spread(added[a.name][1])),
        row(f"added job time, other processes' load taken out (least squares over the {fit.blocks} blocks' means)",
            lambda a: "" if a.probe is None else "{:+.2f} % ± {:.2f} (1 SE)".format(*fit.pct(a.name)),
            f"<= {TARGET_ADDED_PCT} % at the default cadence"),
        row("probe runs in the measured blocks (+ start phase)", lambda a: "" if a.probe is None else
            f"{runs[a.name]} (+{a.runs_at_start})"),
        row("`probe.step()` calls", lambda a: "" if a.probe is None else str(len(a.calls.all()))),
        row("time inside `probe.step()`: p99 / max (ms)", lambda a: "" if a.probe is None else
            f"{ms(pct(a.calls.all(), 99), 3)} / {ms(max(a.calls.all()), 2)}", "no step waits on the probe"),
        row("calls that found the outputs not ready and moved on", lambda a: "" if a.probe is None else
            str(not_ready[a.name])),
        row("reports sent / failed / dropped (channel)", lambda a: "" if a.probe is None else
            f"{a.probe.channel.sent} / {a.probe.channel.failed} / {a.probe.channel.dropped}"),
        row("other processes' CPU during the blocks (cores), mean / busiest block", lambda a:
            f"{statistics.fmean(a.others):.2f} / {max(a.others):.2f}", "0: nothing else running"),
        "",
        *([f"**Other processes used up to {busiest:.2f} of the {os.cpu_count()} CPUs during the blocks (this "
           "process and the daemon not counted): the step times carry their noise; the fit below takes out what "
           f"is linear in it ({ms(fit.slope or 0.0)} ms a step per core).**", ""] if busiest > 0.1 else []),
        f"- Added job time at the default cadence (every {default.every:g} s), measured directly: "
        f"{added['default'][0]:+.2f} % (per round {spread(added['default'][1])}); a run every {default.every:g} s "
        f"is far inside this noise. Scaled from the stressed blocks, whose runs cost the same each: "
        f"{est.mean_pct:+.2f} % ± {est.se_pct:.2f} (1 SE, the fit) with a run every {est.job_s_per_run:.2f} s of "
        "job time, "
        f"{ms(est.per_run_s, 2)} ms of job time per run (of which {ms(est.host_per_run_s, 2)} ms inside `step()`, "
        f"a floor; the rest is the probe's program and its report thread on the job's cores), so every "
        f"{default.every:g} s adds {est.pct:+.4f} % (upper bound, mean + 2 SE: {est.upper_pct:+.4f} %; floor from "
        f"`step()` alone {est.floor_pct:.4f} %). Target <= {TARGET_ADDED_PCT} %: {est.verdict()}"
        f"{' (other processes loaded the machine: rerun on an idle one to confirm)' if busiest > 0.1 else ''}.",
        f"- p99 step time with the probe at the default cadence {ms(pct(steps['default'], 99))} ms against "
        f"{ms(pct(steps['off'], 99))} ms without ({ms(p99_delta):s} ms; the p99 of blocks without the probe spans "
        f"{ms(off_noise)} ms): {verdict(abs(p99_delta) <= off_noise)}.",
        f"- Waiting on the probe: the longest of the {len(all_calls)} `probe.step()` calls in the measured blocks "
        f"took {ms(max(all_calls), 2)} ms ({100 * max(all_calls) / statistics.median(steps['off']):.1f} % of a "
        f"median step; p99 {ms(pct(all_calls, 99), 3)} ms); no call waits on the chip (a run is read back only once "
        f"every output `is_ready()`): {sum(not_ready.values())} calls found the outputs still running and moved "
        f"on. The daemon accepted {r.daemon_accepted_job_reports} of the "
        f"{default.probe.runs + stressed.probe.runs} reports the two probes made.", ""]
    return lines


def cost_section(r: Results, args: argparse.Namespace) -> list[str]:
    """Figure 2."""
    _, default, stressed = r.arms
    assert default.start is not None and stressed.start is not None
    imp, mem = r.imports, r.memory
    lines = ["### 2. The probe's own cost", "",
             "`probe.step()` calls, both probes together, the start phases included:", "",
             "| The call | Calls | Median (ms) | p99 (ms) | Max (ms) |", "|---|---:|---:|---:|---:|"]
    for kind in CALL_KINDS:
        values = [s for a in (default, stressed) for c in (a.start_calls, a.calls) for s in c.seconds[kind]]
        if values:
            lines.append(f"| {CALL_NAMES[kind]} | {len(values)} | {ms(statistics.median(values), 3)} | "
                         f"{ms(pct(values, 99), 3)} | {ms(max(values), 3)} |")
    resident = max(mem.resident.values())
    lines += [
        "", "| Measure | Value | Target / anchor |", "|---|---|---|",
        *[f"| compile in the job, first `step()` to `probe._compiled` (every {a.every:g} s) | "
          f"{a.start.compile_s:.2f} s; until the first run was judged {len(a.start.steps)} job steps, median "
          f"{ms(statistics.median(a.start.steps))} ms against {ms(r.warm_step_s)} ms before: "
          f"{sum(a.start.steps) - len(a.start.steps) * r.warm_step_s:+.2f} s of job time once | in a thread: steps "
          "go on |"
          for a in (default, stressed) if a.start is not None and a.start.compile_s is not None],
        *[f"| first run judged, from the first `step()` (every {a.every:g} s) | {a.start.first_result_s:.2f} s | |"
          for a in (default, stressed) if a.start is not None and a.start.first_result_s is not None],
        f"| `Probe()` + `check()` in a fresh process (jax imported, devices up) | {r.fresh['init']:.2f} s + "
        f"{r.fresh['check']:.2f} s (status {r.fresh['status']}); a second `check()` {ms(r.fresh['again'], 2)} ms; "
        f"RSS +{r.fresh['rss_kib'] / 1024:.1f} MiB | |",
        f"| `check()` on a fresh `Probe` in this process (jax warm) | {r.check_first_s:.2f} s; a second one "
        f"{ms(r.check_again_s, 2)} ms | |",
        f"| anchor: `import jax` in a fresh interpreter | {imp.jax_s:.2f} s, RSS +{imp.jax_kib / 1024:.1f} MiB | |",
        f"| `import tpuwatch.probe` in a fresh interpreter (lazy) | {ms(imp.module_s)} ms, RSS "
        f"+{imp.module_kib / 1024:.1f} MiB | |",
        f"| then `tpuwatch.probe.Probe` (loads jax with it) | {imp.probe_cold_s:.2f} s, RSS "
        f"+{imp.probe_cold_kib / 1024:.1f} MiB | {imp.probe_cold_s / imp.jax_s:.2f}x the anchor |",
        f"| `from tpuwatch.probe import Probe` after `import jax` (what a job pays) | "
        f"{ms(imp.probe_after_jax_s)} ms, RSS +{imp.probe_after_jax_kib / 1024:.1f} MiB | |",
        f"| daemon libraries it loads ({', '.join(DAEMON_LIBRARIES)}) | {', '.join(imp.loaded) or 'none'} | none |",
        f"| device memory kept resident per device (weights + input, nbytes) | {resident / 1024:.0f} KiB "
        f"({resident / 2 ** 20:.2f} MiB) | <= {TARGET_DEVICE_MIB:g} MiB: "
        f"{verdict(resident <= TARGET_DEVICE_MIB * 2 ** 20)} |",
        f"| per run besides (XLA memory analysis: temporaries, output; generated code) | "
        f"{_bytes(mem.temp)}, {_bytes(mem.output)}; {_bytes(mem.code)} | |",
        f"| `device.memory_stats()` | {mem.memory_stats} | |",
        "",
        f"Imports: medians of {args.import_runs} fresh interpreters each. `Probe` loads "
        f"{len(imp.tpuwatch_modules)} tpuwatch modules: {', '.join(imp.tpuwatch_modules)}.", ""]
    return lines


def _bytes(value: int | None) -> str:
    """Bytes as KiB, or 'n/a'."""
    return "n/a" if value is None else f"{value / 1024:.1f} KiB"


def daemon_section(r: Results, args: argparse.Namespace) -> list[str]:
    """Figure 3."""
    rc, fl = r.reports, r.flood
    by_kind = {s.kind: s for s in fl.senders}
    clients, server = fl.clients, fl.server
    reasons = ["accepted", *REFUSALS]
    extra = sorted(set(clients) - set(reasons))
    cycles_ok = fl.during.stretch() <= 2 * INTERVAL_S
    lines = [
        "### 3. The daemon's side", "",
        f"One `tpuwatch run` (4 simulated chips, interval {INTERVAL_S:g} s, canary off, `probe.reports_per_minute: "
        f"{REPORTS_PER_MINUTE}`); this process holds the chips' device files open.", "",
        "| Measure | Value |", "|---|---|",
        f"| daemon CPU per accepted report ({rc.count} valid reports one after another from the holder, idle CPU "
        f"subtracted) | {ms(rc.per_report, 3)} ms ({rc.cpu:.2f} s CPU in {rc.seconds:.2f} s; answers "
        f"{_tally(rc.answers)}) |",
        f"| daemon CPU idle, over {rc.idle_seconds:.1f} s | {ms(rc.idle_rate, 1)} ms/s |",
        f"| report round trip seen by the sender, median / p99 | {ms(statistics.median(rc.latencies), 2)} / "
        f"{ms(pct(rc.latencies, 99), 2)} ms |", ""]
    lines += [
        f"The flood: {fl.seconds:.1f} s; malformed, oversized ({OVERSIZED_BYTES // 1024} KB lines) and not-holder "
        f"senders start a new process every {ROTATE} reports (so each process stays inside its burst of "
        f"{REPORTS_PER_MINUTE}); the beyond-the-limit sender is one process of the holder's user sending valid "
        f"reports; {fl.slow} slow connections send nothing and reconnect when the daemon gives up on them. "
        + ("Every hostile sender but the beyond-the-limit one runs as another user (uid 65534)." if os.geteuid() == 0
           else "Not root: every sender runs as this user, the holder's."), "",
        "| Sender | Target rate (/s) | Reached (/s) | Processes | Answers it got |", "|---|---:|---:|---:|---|"]
    for kind in (*FLOOD_SHARES, "slow"):
        sender = by_kind.get(kind)
        if sender is None:
            lines.append(f"| {kind} | | | | left out (needs root) |")
            continue
        reached = fl.attempts(sender) / max(sender.result.get("seconds", fl.seconds), 1e-9)
        lines.append(f"| {kind} | {'' if sender.rate is None else f'{sender.rate:.0f}'} | {reached:.0f} | "
                     f"{sender.result.get('pids', 1)} | {_tally(Counter(sender.result.get('counts', {})))} |")
    lines += [f"| all | {args.flood_rate:g} | {fl.rate:.0f} | | |", "",
              "| Outcome | Daemon's counter (delta) | Senders' tally | Match |", "|---|---:|---:|---|"]
    for reason in reasons:
        lines.append(f"| {reason} | {server.get(reason, 0)} | {clients.get(reason, 0)} | "
                     f"{'yes' if server.get(reason, 0) == clients.get(reason, 0) else '**no**'} |")
    for reason in extra:
        lines.append(f"| senders only: {reason} | | {clients[reason]} | no answer read |")
    lines += [
        "", "| During the flood | Value | Before it |", "|---|---|---|",
        f"| `/metrics` scrape latency median / p99 / max (ms) | {_latency(fl.during)} | {_latency(fl.before)} |",
        f"| scrapes failed | {fl.during.failed} of {len(fl.during.latencies)} | {fl.before.failed} of "
        f"{len(fl.before.latencies)} |",
        f"| sampling cycles ended (distinct `tpuwatch_last_sample_timestamp_seconds`), against the window / "
        f"interval | {_cycles(fl.during)} | {_cycles(fl.before)} |",
        f"| slowest collectors (longest `tpuwatch_collector_duration_seconds` seen); "
        f"`tpuwatch_scheduler_events_total` | {_slowest(fl.during)} | {_slowest(fl.before)} |",
        f"| collectors not succeeding (`tpuwatch_collector_success` != 1) | "
        f"{', '.join(sorted(fl.during.collectors_failing)) or 'none'} | "
        f"{', '.join(sorted(fl.before.collectors_failing)) or 'none'} |",
        f"| daemon CPU | {fl.during.cpu / fl.during.seconds * 100:.0f} % of a core | "
        f"{fl.before.cpu / fl.before.seconds * 100:.1f} % |",
        f"| the holder's reports, one a second | {_tally(fl.holder)}; round trip median "
        f"{ms(statistics.median(fl.holder_latencies), 1) if fl.holder_latencies else 'n/a'} ms, max "
        f"{ms(max(fl.holder_latencies), 1) if fl.holder_latencies else 'n/a'} ms | |",
        f"| the holder's report right after the flood | {fl.after} in {ms(fl.after_latency, 1)} ms | |", "",
        f"- The sampling cycle kept running (no stretch over {2 * INTERVAL_S:g} s without a cycle ending, no "
        f"scrape failed): {verdict(cycles_ok and not fl.during.failed)}; the holder accepted "
        f"after the flood: {verdict(fl.after == 'accepted')}.",
        f"- The daemon's log over the whole run, WARNING and ERROR messages: "
        f"{'; '.join(f'`{c[:160]}`' for c in r.complaints[:6]) or 'none'}.", ""]
    return lines


def _cycles(window: Window) -> str:
    """'19 of 20.3; longest stretch without one 1.02 s, between two 1.01 s'."""
    span = window.unix[1] - window.unix[0]
    return (f"{len(window.cycles())} of {span / INTERVAL_S:.1f}; longest stretch without one {window.stretch():.2f} s "
            f"(edges included), between two {max(window.gaps(), default=float('nan')):.2f} s")


def _slowest(window: Window) -> str:
    """The two slowest collectors' longest run seen, and the scheduler's problems."""
    top = sorted(window.slowest.items(), key=lambda kv: -kv[1])[:2]
    events = window.scheduler_events()
    return (", ".join(f"{name} {ms(value)} ms" for name, value in top) or "n/a") + \
        f"; scheduler problems: {', '.join(f'{k} {v}' for k, v in events.items()) or 'none'}"


def _tally(counts: Counter[str]) -> str:
    """'accepted 3, busy 1' or 'none'."""
    return ", ".join(f"{k} {v}" for k, v in counts.most_common() if v) or "none"


def _latency(window: Window) -> str:
    """median / p99 / max of a window's scrapes, in ms."""
    if not window.latencies:
        return "n/a"
    values = window.latencies
    return f"{ms(statistics.median(values), 1)} / {ms(pct(values, 99), 1)} / {ms(max(values), 1)}"


def render(r: Results, args: argparse.Namespace, started: datetime, command: str) -> str:
    """The ``probe`` section of BENCHMARKS.md."""
    quick = ["**Quick run (`--quick`): a smoke test, do not quote these figures.**", ""] if args.quick else []
    facts = {"nproc": str(len(os.sched_getaffinity(0))), "CPU": cpu_model(), "Kernel": platform.release(),
             "Python": platform.python_version(), "jax": f"{jax.__version__}, {DEVICES} XLA CPU devices",
             "tpuwatch": tpuwatch.__version__}
    intro = [
        "## In-job probe", "", *quick,
        "What `tpuwatch.probe` costs a JAX training job, what it costs itself, and the daemon's side under a "
        "flood of hostile reports (`benchmarks/probe.py`).", "",
        f"A JAX training job in this process: a decoder-only transformer LM ({LAYERS} layers, d_model {D_MODEL}, "
        f"{HEADS} heads, sequence {SEQ}, vocabulary {VOCAB}, {r.job.parameters:,} parameters), batch {BATCH} per "
        f"device, data parallel over {DEVICES} host CPU devices (`jax.jit`, `NamedSharding` over a `Mesh`), Adam "
        "by hand, random tokens from seed 0. Each probe's cadence counts only its own blocks' time (a clock paused "
        "outside them), so it runs as often as in a job that always has it; its compile and first run are a start "
        "phase before the measured rounds. Reports go to the daemon of part 3.", ""]
    return "\n".join([*intro, *job_section(r, args), *cost_section(r, args), *daemon_section(r, args),
                      *machine_and_command(facts, started, command)])


# --- the run --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; --quick shortens every window."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=380.0, help="training-loop seconds over all rounds")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of interleaved blocks")
    parser.add_argument("--steps", type=int, help="steps per block without the probe, the others in proportion "
                        "(default: from --seconds and the warm-up's step time)")
    parser.add_argument("--every", type=float, default=300.0, help="the default cadence, seconds")
    parser.add_argument("--stress-every", type=float, default=1.0, help="the stressed cadence, seconds")
    parser.add_argument("--reports", type=int, default=500, help=f"valid reports for the daemon's CPU per report "
                        f"(at most {REPORTS_PER_MINUTE}, one process's burst)")
    parser.add_argument("--idle", type=float, default=5.0, help="shortest idle window for the daemon's idle CPU")
    parser.add_argument("--baseline", type=float, default=10.0, help="seconds of scrapes before the flood")
    parser.add_argument("--flood-seconds", type=float, default=20.0)
    parser.add_argument("--flood-rate", type=float, default=1200.0, help="hostile reports a second, all senders")
    parser.add_argument("--slow", type=int, default=16, help="connections that send nothing; over the daemon's "
                        "max_connections (32) every other connection is refused busy")
    parser.add_argument("--import-runs", type=int, default=3, help="fresh interpreters per import measured")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short windows, figures not to quote")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD, help="where the section is written")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.reports, args.baseline = 40.0, 2, 100, 3.0
        args.flood_seconds, args.import_runs = 5.0, 1
    if not 0 < args.reports <= REPORTS_PER_MINUTE:
        parser.error(f"--reports: 1 to {REPORTS_PER_MINUTE}")
    return args


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C, so every child is stopped on the way out."""
    raise KeyboardInterrupt


def run(args: argparse.Namespace, workdir: Path, senders: list[Sender], daemons: list[Daemon]) -> Results:
    """Every measurement, in order: imports, a fresh process's check, the job, the probe's costs, the daemon."""
    progress("imports in fresh interpreters")
    imports = measure_imports(args.import_runs)
    progress("Probe().check() in a fresh process")
    fresh = run_python(FRESH_CHECK_SCRIPT, str(workdir / "nowhere.sock"))
    daemon = start_daemon(workdir)
    daemons.append(daemon)
    others = OtherLoad()
    others.pids.append(daemon.pid)
    job, arms, step_s = measure_job(args, daemon.socket, others)
    accepted = probe_counts(settled(daemon))["accepted"]
    progress("check() on a fresh probe in this process")
    first, again, report, probe = in_process_check(daemon.socket)
    memory = device_memory(arms[1].probe or probe)
    progress(f"daemon: {args.reports} valid reports from the holder, then as long idle")
    reports = report_cost(daemon, report, args.reports, args.idle)
    flooded = flood(daemon, report, args, senders)
    return Results(job, arms, step_s, imports, fresh, first, again, memory, reports, flooded,
                   accepted, daemon.complaints())


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the section (and write it with --output); 1 on failure, 130 when interrupted."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    started = datetime.now(UTC)
    command = shlex.join(["python", "benchmarks/probe.py", *(sys.argv[1:] if argv is None else argv)])
    workdir = Path(tempfile.mkdtemp(prefix="tpuwatch-probe-bench-")).resolve()
    workdir.chmod(0o755)  # the uid-65534 sender reaches the socket in it
    held = hold_chips(workdir / "dev")
    senders: list[Sender] = []
    daemons: list[Daemon] = []
    try:
        results = run(args, workdir, senders, daemons)
    except KeyboardInterrupt:
        progress("interrupted: children stopped, no report")
        return 130
    except (BenchmarkError, requests.RequestException, OSError, subprocess.SubprocessError) as exc:
        progress(f"benchmark failed: {exc}")
        return 1
    finally:
        for sender in senders:
            stop_process(sender.process)
        for daemon in daemons:
            stop_process(daemon.process)
            progress(f"stopped the daemon (pid {daemon.pid}); its warnings: {daemon.complaints()}")
        for handle in held:
            handle.close()
        shutil.rmtree(workdir, ignore_errors=True)
    section = render(results, args, started, command)
    if args.output is not None and not args.quick:
        write_section("probe", section, args.output)
        progress(f"wrote the probe section of {args.output}")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
