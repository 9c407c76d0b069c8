"""tpuwatch.probe inside a job: the canary's own bits whatever the job's JAX settings, never in the job's way,
harmless without a daemon.  Each job runs in its own process (tests/probejob.py): jax stays out of this one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tpuwatch.canary.model import stack
from tpuwatch.probe.chips import name_devices

JOB = Path(__file__).with_name("probejob.py")
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the canary extra (jax) is missing")


def job(*args: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """Run a probejob scenario: (its JSON answer, its stderr)."""
    done = subprocess.run([sys.executable, str(JOB), *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer, done.stderr


@needs_jax
def test_the_job_s_jax_settings_change_neither_the_probe_s_bits_nor_are_changed_by_it() -> None:
    plain, _ = job("plain")
    unusual, _ = job("unusual")
    assert plain["status"] == unusual["status"] == "pass"
    assert unusual["fingerprints"] == plain["fingerprints"]
    assert len(set(plain["fingerprints"].values())) == 1 and len(plain["fingerprints"]) == 4
    assert unusual["settings"] == {"enable_x64": True, "default_matmul_precision": "bfloat16", "debug_nans": True,
                                   "numpy_dtype_promotion": "strict", "transfer_guard": "disallow"}


@needs_jax
def test_the_probe_computes_the_scheduled_canary_s_fingerprints_on_the_same_stack(tmp_path: Path) -> None:
    probed, _ = job("plain")
    (tmp_path / "config.yaml").write_text(f"state_dir: {tmp_path}/state\ndevices: {{backend: none}}\n")
    canary = subprocess.run([sys.executable, "-m", "tpuwatch", "canary", "--json", "--config",
                             str(tmp_path / "config.yaml")], capture_output=True, text=True, timeout=240,
                            env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    scheduled = json.loads(canary.stdout)
    assert scheduled["status"] == "pass", canary.stderr
    assert scheduled["stack"] == probed["stack"]
    assert {d["fingerprint"] for d in scheduled["devices"]} == set(probed["fingerprints"].values())


@needs_jax
def test_a_drill_in_the_job_is_caught_on_its_chip() -> None:
    found, _ = job("plain", "--inject", "scale@1")
    assert found["status"] == "fail" and found["drill"] is True
    fingerprints = found["fingerprints"]
    assert fingerprints["1"] != fingerprints["0"] == fingerprints["2"] == fingerprints["3"]


@needs_jax
def test_without_a_daemon_the_job_goes_on_and_hears_it_once() -> None:
    found, stderr = job("steps", "--runs", "3", "--every", "0.2")
    assert found["runs"] == 3 and found["error"] is None and found["status"] == "pass"
    assert found["failed"] >= 2  # every report it could not send was counted, none raised
    assert stderr.count("the daemon is not reachable") == 1, stderr
    assert found["went_on"] >= 1  # steps that found the probe's work still running went on without it


@needs_jax
def test_a_drill_on_a_chip_the_job_does_not_have_is_refused_at_once() -> None:
    done = subprocess.run([sys.executable, str(JOB), "plain", "--inject", "bitflip@7"], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode != 0
    assert "inject bitflip@7: no such chip in this job (0, 1, 2, 3)" in done.stderr


def device(id: int, platform: str = "tpu", core: int = 0) -> SimpleNamespace:
    return SimpleNamespace(id=id, platform=platform, core_on_chip=core)


def test_chips_are_named_by_the_environment_that_chose_them() -> None:
    tpus = [device(1), device(0)]
    assert [(n, d.id) for n, d in name_devices(tpus, {"TPU_VISIBLE_CHIPS": "2,3"})[0]] == [("2", 0), ("3", 1)]
    assert name_devices(tpus, {"TPU_VISIBLE_CHIPS": "2,3"})[1] == "env"
    gpus = [device(0, "gpu")]
    assert name_devices(gpus, {"CUDA_VISIBLE_DEVICES": "5"})[0][0][0] == "5"
    assert name_devices(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-8d5c1f2a"}) == ([("0", gpus[0])], "ordinal")
    assert name_devices(gpus, {"TPUWATCH_PROBE_CHIPS": "6", "CUDA_VISIBLE_DEVICES": "5"})[0][0][0] == "6"
    assert name_devices(tpus, {"TPU_VISIBLE_CHIPS": "2"})[1] == "ordinal"  # a list that does not fit is not used


def test_a_two_core_chip_is_probed_on_its_first_core() -> None:
    cores = [device(0, core=0), device(1, core=1), device(2, core=0), device(3, core=1)]
    named, how = name_devices(cores, {})
    assert [(n, d.id) for n, d in named] == [("0", 0), ("1", 2)] and how == "ordinal"


def test_the_stack_keys_the_flags_that_can_change_bits_on_that_platform() -> None:
    base = "jax 0.10.2, jaxlib 0.10.2, cpu"
    assert stack(base, "cpu", {}) == base
    assert stack(base, "cpu", {"XLA_FLAGS": "--xla_force_host_platform_device_count=4 --xla_dump_to=/tmp/x "
                                            "--xla_gpu_deterministic_ops=true"}) == base
    fast = stack(base, "cpu", {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    other = stack(base, "cpu", {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false"})
    assert fast.startswith(base + ", flags ") and fast != other
    assert stack(base, "tpu", {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_sdc_checker=true"}) != base
    assert stack(base, "tpu", {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}) == base
