"""libtpu's RuntimeMetricService for tests: a real gRPC server on tpu-info's generated stubs.

It answers a recorded fixture (tests/testdata/devices/runtime/GEN.json) in
one of its states ("idle": a workload that runs nothing, "busy"), or fails as
told.  ``GetTpuRuntimeStatus`` answers UNIMPLEMENTED (a libtpu without it)
unless ``status`` names a state of the cores ("healthy", "idle", "hung",
"error"; see ``runtime_status``), which a test may change while a daemon
reads it.  Run as a program it is a workload process: it opens the device files
given on the command line, serves on a free port, prints the port and runs
until its stdin closes:

    python tests/fakelibtpu.py GEN STATE IDS DEVICE_FILE...

IDS ("all", or device ids such as "12,13") keeps only the entries of those
devices, like a process that was given a subset of the chips.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from tpu_info.proto import tpu_metric_service_pb2 as pb2
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb2_grpc

RUNTIME = Path(__file__).parent / "testdata" / "devices" / "runtime"


def fixture(generation: str) -> dict[str, Any]:
    """The recorded answers of one generation."""
    return json.loads((RUNTIME / f"{generation}.json").read_text())


STATUS_STATES = ("healthy", "idle", "hung", "error")
HUNG_QUEUED = 2


def runtime_status(state: str, chip_ids: list[int], step: int, cores_per_chip: int = 1,
                   error: str = "TensorCore 0 halted: program 7 failed an assertion") -> dict[str, Any]:
    """A GetTpuRuntimeStatusResponse as JSON, in the shape tpu-info's ``get_tpuz_info`` reads
    (cloud-accelerator-diagnostics tpu_info/metrics.py at fe85c12; tpu_telemetry.proto): global core id ->
    CurrentCoreStateSummary with core_id {global_core_id, chip_id, core_on_chip}, one TensorCore sequencer
    (pc, tag, tracemark, program_id, run_id), queued_program_info and, in state "error", error_message on the
    first core.  "healthy" and "error": the sequencer is ``step`` instructions on (a new run every 16) with one
    program queued behind it; "idle": stopped, nothing queued; "hung": stopped, HUNG_QUEUED programs queued.
    What libtpu answers on real hardware in each state is not published: these are composed."""
    moving = state in ("healthy", "error")
    pc, run = (0x400 + step % 16, 1 + step // 16) if moving else (0x517, 3)
    queued = {"healthy": 1, "error": 1, "idle": 0, "hung": HUNG_QUEUED}[state]
    states: dict[str, Any] = {}
    for rank, chip in enumerate(chip_ids):
        for index in range(cores_per_chip):
            core = rank * cores_per_chip + index
            states[str(core)] = {
                "coreId": {"globalCoreId": core, "chipId": chip,
                           "coreOnChip": {"type": "TPU_CORE_TYPE_TENSOR_CORE", "index": index}},
                "sequencerInfo": [{"sequencerType": "TPU_SEQUENCER_TYPE_TENSOR_CORE_SEQUENCER", "sequencerIndex": 0,
                                   "pc": str(pc), "tag": "0", "tracemark": "0", "programId": "7",
                                   "runId": str(run)}],
                "xdbServerRunning": False,
                "programFingerprint": "q80=",
                "launchId": run,
                "queuedProgramInfo": [{"runId": str(run + 1 + q), "launchId": str(run + 1 + q),
                                       "programFingerprint": "q80="} for q in range(queued)],
            }
            if state == "error" and core == 0:
                states[str(core)]["errorMessage"] = error
    return {"hostName": "t1v-n-test-w-0", "coreStates": states}


class Runtime(pb2_grpc.RuntimeMetricServiceServicer):
    """Answers from a fixture state; ``mode`` "unavailable" (no workload) or "slow" (until released).

    ``status`` (one of STATUS_STATES, or None for UNIMPLEMENTED) is the cores' state for ``status_chips``
    (the runtime's chip ids; TPU7x answers one id per device), ``status_cores`` TensorCores each.
    """

    def __init__(self, generation: str | None = None, state: str = "busy", mode: str = "ok",
                 ids: set[int] | None = None, status: str | None = None, status_chips: tuple[int, ...] = (0,),
                 status_cores: int = 1) -> None:
        self.mode = mode
        self.status = status
        self.status_chips = status_chips
        self.status_cores = status_cores
        self.release = threading.Event()
        self.calls: Counter[str] = Counter()
        self.ids = ids
        recorded = fixture(generation) if generation else {"ListSupportedMetrics": {}, state: {}}
        self.listing = recorded["ListSupportedMetrics"]
        self.answers: dict[str, Any] = {}
        self._keep(recorded[state])

    def _fail(self, context: Any, code: str, details: str) -> None:
        context.abort(getattr(grpc.StatusCode, code), details)

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
        self.calls["ListSupportedMetrics"] += 1
        if self.mode == "unavailable":
            self._fail(context, "UNAVAILABLE", "TPU runtime is not initialized")
        if "error" in self.listing:
            self._fail(context, self.listing["error"], "Method not found")
        return json_format.ParseDict(self.listing, pb2.ListSupportedMetricsResponse())

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
        self.calls[request.metric_name] += 1
        if self.mode == "unavailable":
            self._fail(context, "UNAVAILABLE", "TPU runtime is not initialized")
        if self.mode == "slow":
            self.release.wait(30)
        answer = self.answers.get(request.metric_name, {"error": "NOT_FOUND"})
        if "error" in answer:
            self._fail(context, answer["error"], f"metric {request.metric_name} is not available")
        return json_format.ParseDict(answer, pb2.MetricResponse())

    def use(self, generation: str, state: str) -> None:
        """Answer the metrics of another fixture state from now on (the workload went idle, or busy again)."""
        self._keep(fixture(generation)[state])

    def _keep(self, answers: dict[str, Any]) -> None:
        """Answer ``answers``, only the entries of the devices in ``ids`` where it is set."""
        if self.ids is not None:
            for answer in answers.values():
                if "metric" in answer:
                    answer["metric"]["metrics"] = [m for m in answer["metric"]["metrics"] if _device(m) in self.ids]
        self.answers = answers

    def GetTpuRuntimeStatus(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method name
        self.calls["GetTpuRuntimeStatus"] += 1
        step = self.calls["GetTpuRuntimeStatus"]
        if self.mode == "unavailable":
            self._fail(context, "UNAVAILABLE", "TPU runtime is not initialized")
        if self.mode == "slow":
            self.release.wait(30)
        if self.status is None:
            self._fail(context, "UNIMPLEMENTED", "Method not found: GetTpuRuntimeStatus")
        answer = runtime_status(str(self.status), list(self.status_chips), step, self.status_cores)
        return json_format.ParseDict(answer, pb2.GetTpuRuntimeStatusResponse())


def _device(entry: dict[str, Any]) -> int | None:
    value = entry["attribute"]["value"]
    if "intAttr" in value:
        return int(value["intAttr"])
    for attr in value.get("kvlistAttr", {}).get("attributes", []):
        if attr["key"] == "device_ordinal":
            return int(next(iter(attr["value"].values())))
    return None


def start(runtime: Runtime, raw: bytes | None = None) -> tuple[Any, str]:
    """A started server on localhost with local credentials, like libtpu's, and its address.

    With ``raw``, every method answers those bytes, which need not be a protobuf at all.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    if raw is None:
        pb2_grpc.add_RuntimeMetricServiceServicer_to_server(runtime, server)
    else:
        handler = grpc.unary_unary_rpc_method_handler(lambda request, context: raw, request_deserializer=None,
                                                      response_serializer=None)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "tpu.monitoring.runtime.RuntimeMetricService",
            {"GetRuntimeMetric": handler, "ListSupportedMetrics": handler, "GetTpuRuntimeStatus": handler}),))
    port = server.add_secure_port("localhost:0", grpc.local_server_credentials())
    server.start()
    return server, f"localhost:{port}"


def serving() -> Iterator[Callable[..., str]]:
    """For a fixture: a function that starts servers in this process; all are stopped at the end."""
    servers: list[tuple[Any, Runtime]] = []

    def begin(runtime: Runtime, raw: bytes | None = None) -> str:
        server, address = start(runtime, raw)
        servers.append((server, runtime))
        return address

    yield begin
    for server, runtime in servers:
        runtime.release.set()
        server.stop(grace=None)


def main(argv: list[str]) -> int:
    generation, state, ids, *device_files = argv
    held = [open(path, "rb") for path in device_files]  # noqa: SIM115 - held until the process ends
    chosen = None if ids == "all" else {int(i) for i in ids.split(",")}
    server, address = start(Runtime(generation, state, ids=chosen))
    print(address.rsplit(":", 1)[1], flush=True)
    sys.stdin.read()
    server.stop(grace=None)
    for handle in held:
        handle.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
