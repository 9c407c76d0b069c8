#!/usr/bin/env python3
"""Device backends: one TPU read beside Google's tpu-info client, one NVIDIA read beside plain NVML calls.

Usage::

    python benchmarks/devices.py [--reads N] [--quick]

TPU: 4-chip v6e and v5p hosts (sysfs trees in a temp dir) and a real
RuntimeMetricService on localhost answering the recorded busy fixtures;
tpuwatch's ``TpuBackend.read()`` (sysfs, owners, the metrics the runtime
lists in ListSupportedMetrics, asked once and kept, all asked at once)
against the anchor, tpu-info's own client functions fetching the same
runtime data (usage, HBM bandwidth, idle time, HLO queue, HLO timing; on v5p
also the three megascale latencies), with an instant runtime and with one
that takes 20 ms per call.
NVIDIA: 8 GPUs of the test stand-in libnvidia-ml.so.1 (tests/nvml/, built with
gcc against nvidia-nvml-dev's nvml.h) read through the real nvidia-ml-py;
``NvidiaBackend.read()`` (one deadline lane per GPU) against the same NVML calls
made one GPU after the other on the calling thread, which is what the lanes cost.
AMD: 8 MI300X functions (the composed tests/testdata/amd/mi300x tree, its GPU
copied to 8 PCI addresses); ``AmdBackend.read()`` (one deadline lane per GPU,
parsing, RAS totals) against the same files read one GPU after the other on
the calling thread.  Rewrites the ``devices`` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from tpu_info import device as tpu_device
from tpu_info import metrics as tpu_metrics
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb2_grpc

REPO_ROOT = Path(__file__).resolve().parent.parent
# The tpuwatch of this checkout, whatever else is installed; the test doubles from tests/.
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "benchmarks"), str(REPO_ROOT / "tests")]
from fakelibtpu import Runtime  # noqa: E402
from test_devices_tpu import make_config, make_host  # noqa: E402

from tpuwatch.config import Config, DevicesConfig, Paths  # noqa: E402
from tpuwatch.devices.amd import AmdBackend, discover, read_gpu  # noqa: E402
from tpuwatch.devices.nvidia import NvidiaBackend  # noqa: E402
from tpuwatch.devices.tpu import TpuBackend  # noqa: E402

import fakenvml  # noqa: E402
from common import cpu_model, write_section  # noqa: E402


class DelayedRuntime(Runtime):
    """The test runtime, taking ``delay`` seconds per call like a busy libtpu."""

    def __init__(self, generation: str, delay: float) -> None:
        super().__init__(generation, "busy")
        self.delay = delay

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
        time.sleep(self.delay)
        return super().GetRuntimeMetric(request, context)


def serve(runtime: Runtime) -> tuple[Any, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb2_grpc.add_RuntimeMetricServiceServicer_to_server(runtime, server)
    port = server.add_secure_port("localhost:0", grpc.local_server_credentials())
    server.start()
    return server, f"localhost:{port}"


def median_ms(fn: Callable[[], Any], reads: int) -> float:
    fn()  # warm: channels, imports
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


MEGASCALE = ("buffer_transfer_latency", "collective_e2e_latency", "grpc_tcp_min_rtt")


def tpu_info_read(address: str, generation: str) -> None:
    """What tpu-info's CLI asks for the same runtime data, with its own client functions."""
    chip = {"v6e": tpu_device.TpuChip.V6E, "v5p": tpu_device.TpuChip.V5P}[generation]
    tpu_metrics.get_chip_usage(chip, address)
    tpu_metrics.get_runtime_hbm_utilization(address)
    tpu_metrics.get_tensorcore_idle_duration(address)
    tpu_metrics.get_hlo_queue_size(chip, address)
    tpu_metrics.get_hlo_exec_timing(chip, address)
    if generation == "v5p":
        for metric in MEGASCALE:
            tpu_metrics.get_transfer_latency(metric, address)


def tpu_rows(root: Path, reads: int) -> list[tuple[str, float, float]]:
    rows: list[tuple[str, float, float]] = []
    for generation, label, runtime in (
            ("v6e", "instant runtime", Runtime("v6e", "busy")),
            ("v6e", "runtime taking 20 ms per call", DelayedRuntime("v6e", 0.02)),
            ("v5p", "instant runtime, multislice (3 megascale latencies more)", Runtime("v5p", "busy"))):
        paths = make_host(root / f"{generation}-{len(rows)}", generation, chips=4)
        server, address = serve(runtime)
        try:
            backend = TpuBackend(make_config(paths, [address], timeout=2.0))
            first = backend.read()
            assert len(first) == 4 and first[3].runtime_metrics, first[3].sources
            ours = median_ms(backend.read, reads)
            anchor = median_ms(partial(tpu_info_read, address, generation), reads)
        finally:
            server.stop(grace=None)
        rows.append((f"{generation} × 4, {label}", anchor, ours))
    return rows


def nvidia_row(root: Path, reads: int) -> tuple[float, float]:
    root.mkdir(parents=True)
    state = root / "gpus.json"
    gpus = json.loads(fakenvml.H100X4.read_text())["gpus"]
    gpus = [dict(g, lost=False) for g in gpus] * 2
    state.write_text(json.dumps({"gpus": gpus}))
    os.environ["FAKE_NVML_STATE"] = str(state)
    fakenvml.preload(fakenvml.build(root / "lib"))
    import pynvml as nvml
    backend = NvidiaBackend(Config(devices=DevicesConfig(backend="nvidia")))
    assert len(backend.read()) == 8

    def sequential() -> None:  # the anchor: the same calls, no lanes, no deadline
        for index in range(nvml.nvmlDeviceGetCount()):
            backend._read_gpu(nvml, index)

    return median_ms(sequential, reads), median_ms(backend.read, reads)


def amd_row(root: Path, reads: int) -> tuple[float, float]:
    """(anchor ms, tpuwatch ms) of reading 8 MI300X GPUs' sysfs files."""
    tree = REPO_ROOT / "tests" / "testdata" / "amd" / "mi300x" / "sys"
    devices = root / "sys" / "bus" / "pci" / "devices"
    gpu = next(d for d in (tree / "bus" / "pci" / "devices").iterdir() if (d / "mem_info_vram_total").exists())
    for n in range(8):
        shutil.copytree(gpu, devices / f"0000:{0x15 + n:02x}:00.0")
    (root / "dev" / "dri").mkdir(parents=True)
    backend = AmdBackend(Config(paths=Paths(sysfs=str(root / "sys"), procfs="/proc", dev=str(root / "dev")),
                                devices=DevicesConfig(backend="amd")))
    assert len(backend.read()) == 8

    def sequential() -> None:  # the anchor: the same files, no lanes, no deadline, no parsing
        for found in discover(str(root / "sys")):
            read_gpu(devices / found.pci, {})

    return median_ms(sequential, reads), median_ms(backend.read, reads)




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=50, help="timed reads per measure (median reported)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 reads, figures not to quote")
    args = parser.parse_args()
    reads = 5 if args.quick else args.reads
    root = Path(tempfile.mkdtemp(prefix="tpuwatch-bench-devices-"))
    try:
        tpu = tpu_rows(root / "tpu", reads)
        nvidia_anchor, nvidia_ours = nvidia_row(root / "nvidia", reads)
        amd_anchor, amd_ours = amd_row(root / "amd", reads)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    tpu_version = importlib.metadata.version("tpu-info")
    command = "python benchmarks/devices.py" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    lines = [
        "## Device backends",
        "",
        f"`{command}` on {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
        f"grpcio {grpc.__version__}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. "
        f"Median of {reads} reads each{' (quick: not to quote)' if args.quick else ''}.",
        "",
        "| Read | Anchor | Anchor ms | tpuwatch ms | vs anchor |",
        "|---|---|---|---|---|",
    ]
    for label, anchor, ours in tpu:
        lines.append(f"| TPU {label}: sysfs, owners (rescanned every 1 s), the runtime metrics it lists | "
                     f"tpu-info {tpu_version} client, same runtime data | {anchor:.1f} | {ours:.1f} | "
                     f"{ours / anchor:.2f} |")
    lines.append(f"| NVIDIA × 8 (nvidia-ml-py {importlib.metadata.version('nvidia-ml-py')}, stand-in "
                 f"libnvidia-ml.so.1): every field, one deadline lane per GPU | same NVML calls "
                 f"in sequence, no deadline | {nvidia_anchor:.1f} | {nvidia_ours:.1f} | "
                 f"{nvidia_ours / nvidia_anchor:.2f} |")
    lines.append(f"| AMD × 8 (MI300X sysfs, composed tree): every file, one deadline lane per GPU | the same files "
                 f"read in sequence, no deadline | {amd_anchor:.1f} | {amd_ours:.1f} | {amd_ours / amd_anchor:.2f} |")
    lines += [
        "",
        "tpuwatch lists an address's metrics once (ListSupportedMetrics, asked again only after the runtime",
        "went away) and then asks all of them at once on a kept channel, so a slow runtime costs one call's",
        "latency, not one per metric; tpu-info opens a channel per function and asks in turn. tpuwatch also",
        "folds per-core answers per chip and turns distributions into summaries, which tpu-info does not for",
        "every row. The NVIDIA row measures the lanes' thread cost through the real nvidia-ml-py against the",
        "stand-in C library (which reads and parses a JSON file per call), not real NVML latency. The AMD",
        "row reads a copy of the sysfs tree on the local disk, not the driver: on a host every file is a",
        "driver call, and the lanes keep a slow one from stalling the rest.",
    ]
    write_section("devices", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
