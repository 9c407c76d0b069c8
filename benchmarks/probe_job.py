"""The probe benchmark's job: a small decoder-only language model trained data parallel on the four host CPU
devices, the probe inside it at each cadence (arms), and the probe's own cost (imports, a check, device memory)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common import checkout_env
from probe_base import (
    BATCH,
    CALL_KINDS,
    D_MODEL,
    DAEMON_LIBRARIES,
    DATA_BATCHES,
    GUARD,
    HEADS,
    IMPORT_SCRIPT,
    LAYERS,
    LEARNING_RATE,
    SEQ,
    SHARES,
    START_LIMIT_S,
    VOCAB,
    BenchmarkError,
    Mesh,
    NamedSharding,
    OtherLoad,
    PartitionSpec,
    Probe,
    jax,
    jnp,
    np,
    progress,
)

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
