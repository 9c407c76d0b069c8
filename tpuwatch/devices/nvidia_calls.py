"""The NVML calls of one GPU's read, made in the GPU's lane: which call is in progress, GPU_IS_LOST as GpuLost,
functions a driver or nvidia-ml-py lacks passed over, and every other failure but NOT_SUPPORTED recorded."""

from __future__ import annotations

import logging
from typing import Any

from tpuwatch.logsetup import Once

log = logging.getLogger("tpuwatch.devices.nvidia")


class GpuLost(Exception):
    """NVML answered NVML_ERROR_GPU_IS_LOST."""


def error_text(nvml: Any, code: int) -> str:
    """An nvmlReturn_t in nvidia-ml-py's words ("Not Supported"), for a code met outside an NVMLError."""
    try:
        return str(nvml.NVMLError(code))
    except Exception:  # noqa: BLE001 - an nvidia-ml-py without the code's class: its number will do
        return f"NVML error {code}"


class GpuCalls:
    """NVML calls for GPU ``index``; ``in_call`` (shared with the backend) names the call in progress, so a
    call that never returns is reported by name, and ``failures`` collects (field, error) for this read."""

    def __init__(self, nvml: Any, index: int, in_call: dict[int, str], logged: Once) -> None:
        self.nvml = nvml
        self.index = index
        self.in_call = in_call
        self.logged = logged
        self.failures: dict[str, str] = {}
        # Answers that mean "this driver or nvidia-ml-py has no such function": pass on to an older one.
        self.not_found = {getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None)}
        self.not_supported = nvml.NVML_ERROR_NOT_SUPPORTED

    def call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """A required NVML call; GpuLost on NVML_ERROR_GPU_IS_LOST, other NVMLErrors raised."""
        self.in_call[self.index] = function
        try:
            return getattr(self.nvml, function)(*args, **kwargs)
        except self.nvml.NVMLError as exc:
            if exc.value == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"{function}: {exc}") from None
            raise

    def attempt(self, function: str, *args: Any, **kwargs: Any) -> tuple[Any, int | None]:
        """(answer, None), or (None, the nvmlReturn_t it failed with); a function nvidia-ml-py lacks, or
        reports as version-mismatched (its unversioned wrappers), fails with NVML_ERROR_FUNCTION_NOT_FOUND."""
        not_found = getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1)
        if not hasattr(self.nvml, function):
            return None, not_found
        mismatch = getattr(self.nvml, "NVMLLibraryMismatchError", ())
        try:
            return self.call(function, *args, **kwargs), None
        except self.nvml.NVMLError as exc:
            return None, exc.value
        except mismatch:  # type: ignore[misc]  # pynvml's throwOnVersionMismatch: the driver lacks the symbol
            return None, not_found

    def first(self, functions: tuple[str, ...], *args: Any, field: str | None = None, **kwargs: Any) -> Any:
        """The answer of the first of ``functions`` that this nvidia-ml-py and driver have; None if none answers.

        A function missing passes on to the next; NOT_SUPPORTED makes the value absent; any other failure
        makes it absent too and is recorded under ``field`` (default: the function's name).
        """
        for function in functions:
            answer, code = self.attempt(function, *args, **kwargs)
            if code is None:
                return answer
            if code in self.not_found:
                continue
            if code != self.not_supported:
                self.failed(field or function, function, error_text(self.nvml, code))
            return None
        return None

    def optional(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call whose failure makes its value absent (recorded unless NOT_SUPPORTED)."""
        return self.first((function,), *args, **kwargs)

    def quiet(self, function: str, *args: Any) -> Any:
        """An NVML call whose failure (a link the GPU lacks, a counter it does not keep) is simply no value."""
        answer, _ = self.attempt(function, *args)
        return answer

    def failed(self, field: str, function: str, error: str) -> None:
        """Record a failed read of ``field`` (counted by the devices collector, shown by ``check``); log it once."""
        self.failures[field] = f"NVML {function}: {error}"
        if self.logged((self.index, function, error)):
            log.warning("GPU %d: NVML %s failed: %s (logged once)", self.index, function, error)
