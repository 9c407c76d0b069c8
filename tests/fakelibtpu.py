"""libtpu's RuntimeMetricService for tests: a real gRPC server on tpu-info's generated stubs.

It answers a recorded fixture (tests/testdata/devices/runtime/GEN.json) in
one of its states ("idle": a workload that runs nothing, "busy"), or fails as
told.  Run as a program it is a workload process: it opens the device files
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


class Runtime(pb2_grpc.RuntimeMetricServiceServicer):
    """Answers from a fixture state; ``mode`` "unavailable" (no workload) or "slow" (until released)."""

    def __init__(self, generation: str | None = None, state: str = "busy", mode: str = "ok",
                 ids: set[int] | None = None) -> None:
        self.mode = mode
        self.release = threading.Event()
        self.calls: Counter[str] = Counter()
        recorded = fixture(generation) if generation else {"ListSupportedMetrics": {}, state: {}}
        self.listing = recorded["ListSupportedMetrics"]
        self.answers: dict[str, Any] = recorded[state]
        if ids is not None:
            for answer in self.answers.values():
                if "metric" in answer:
                    answer["metric"]["metrics"] = [m for m in answer["metric"]["metrics"] if _device(m) in ids]

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
            {"GetRuntimeMetric": handler, "ListSupportedMetrics": handler}),))
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
