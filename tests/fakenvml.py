"""Builds and loads the stand-in libnvidia-ml.so.1 (tests/nvml/) that the real nvidia-ml-py talks to.

The library is compiled with gcc against nvml.h from the installed PyPI package nvidia-nvml-dev (a test
dependency used at build time only) into a directory of its own, named libnvidia-ml.so.1 with that
soname.  Subprocesses (the daemon, the CLI) find it through LD_LIBRARY_PATH, as nvidia-ml-py dlopens
"libnvidia-ml.so.1"; this process loads it once by path with RTLD_GLOBAL (``preload``), after which
nvidia-ml-py's dlopen by soname finds the library already loaded (glibc reads LD_LIBRARY_PATH only at
process start).  ``missing`` builds a variant whose dynamic symbol table lacks those functions (a linker
version script makes them local), as an older driver's library lacks newer versioned entry points.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).parent / "nvml"
SONAME = "libnvidia-ml.so.1"
# Where the nvidia-nvml-dev wheels put nvml.h: 13.x (cu13) and the cu12 ones.
HEADER_DIRS = (("cu13", "include"), ("nvml_dev", "include"))
CFLAGS = ("-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared")
SANITIZE = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined")


def header_dir() -> Path | None:
    """The directory holding nvml.h of the installed nvidia-nvml-dev, or None."""
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations or () if spec else ():
        for parts in HEADER_DIRS:
            candidate = Path(root, *parts)
            if (candidate / "nvml.h").is_file():
                return candidate
    return None


def unavailable() -> str | None:
    """Why the library cannot be built here, or None."""
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    if header_dir() is None:
        return "nvml.h not found: pip install nvidia-nvml-dev (the test extra)"
    return None


def build(root: Path, missing: Sequence[str] = (), sanitize: bool = False) -> Path:
    """Compile the library into a directory under ``root`` (reused when its inputs are unchanged); that directory."""
    header = header_dir()
    if header is None:
        raise RuntimeError(unavailable())
    sources = sorted(SOURCE.glob("*.[ch]"))
    flags = [*CFLAGS, *(SANITIZE if sanitize else ())]
    key = hashlib.sha256(repr((flags, sorted(missing), str(header))).encode())
    for path in [*sources, header / "nvml.h"]:
        key.update(path.read_bytes())
    out = root / f"fakenvml-{key.hexdigest()[:16]}"
    library = out / SONAME
    if library.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    command = ["gcc", *flags, f"-Wl,-soname,{SONAME}", f"-I{header}", f"-I{SOURCE}"]
    if missing:
        script = out / "hide.map"
        script.write_text("{ global: *; local: %s; };\n" % "; ".join(missing))
        command.append(f"-Wl,--version-script={script}")
    temporary = out / f".{SONAME}.{os.getpid()}"
    command += ["-o", str(temporary), *(str(s) for s in sources if s.suffix == ".c")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the NVML stand-in failed: {' '.join(command)}\n{done.stderr}")
    temporary.replace(library)
    return out


_loaded: tuple[Path, ctypes.CDLL] | None = None


def preload(directory: Path) -> ctypes.CDLL:
    """Load the library into this process so nvidia-ml-py's dlopen("libnvidia-ml.so.1") finds it (once)."""
    global _loaded
    if _loaded is None:
        _loaded = directory, ctypes.CDLL(str(directory / SONAME), mode=ctypes.RTLD_GLOBAL)
    elif _loaded[0] != directory:
        raise RuntimeError(f"{SONAME} from {_loaded[0]} is loaded already; {directory} needs a process of its own")
    return _loaded[1]


def environment(directory: Path, state: Path) -> dict[str, str]:
    """Environment variables for a subprocess that should load the library and read ``state``."""
    paths = [str(directory), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    return {"LD_LIBRARY_PATH": os.pathsep.join(paths), "FAKE_NVML_STATE": str(state)}


H100X4 = Path(__file__).parent / "testdata" / "devices" / "nvml" / "h100x4.json"


class FakeNvml:
    """The state file the library reads on every call, and the directory it was built into."""

    def __init__(self, state: Path, library: Path) -> None:
        self.state = state
        self.library = library

    def read(self) -> dict[str, Any]:
        return json.loads(self.state.read_text())

    def write(self, data: dict[str, Any]) -> None:
        """Replace the state at once (a reader sees the old file or the new one, never half of it)."""
        temporary = self.state.with_name(self.state.name + ".tmp")
        temporary.write_text(json.dumps(data))
        temporary.replace(self.state)

    def change(self, index: int, **fields: Any) -> None:
        """Update GPU ``index``'s keys."""
        data = self.read()
        data["gpus"][index].update(fields)
        self.write(data)

    def update(self, **keys: Any) -> None:
        """Update top-level keys (driver_version, missing_symbols, ...)."""
        self.write({**self.read(), **keys})

    def release(self) -> None:
        """Let every hung call return: no GPU and no system call says "hang" any more."""
        try:
            data = self.read()
        except (OSError, ValueError, RecursionError):  # a test left garbage: nothing hangs on garbage
            data = {}
        if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
            data = {"gpus": []}
        data.pop("hang", None)
        for gpu in data["gpus"]:
            if isinstance(gpu, dict):
                gpu.pop("hang", None)
        self.write(data)
