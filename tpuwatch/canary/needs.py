"""Whether the canary can run here: on, and jax where its worker would run (``canary.python``, else this one).

``canary_unavailable(config)`` says why not, or None; ``jax_missing_here()`` asks for this interpreter alone (a
plugin's drill that runs jax in the daemon).  The fire drills ask it for the scenarios that need the canary
(``tpuwatch.drills.needs``: the ``sdc`` drill), and ``tpuwatch canary`` for the install that gives jax.

Nothing here imports jax: this interpreter is asked with ``importlib.util.find_spec``, the one
``canary.python`` names by a subprocess that does the same.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tpuwatch.config import Config

INSTALL = "pip install 'tpuwatch[canary]'"
PROBE_TIMEOUT_S = 30.0
_FIND_JAX = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('jax') else 1)"


def jax_missing_here() -> str | None:
    """Why a canary run by this interpreter cannot start (jax not installed), or None."""
    if importlib.util.find_spec("jax") is not None:
        return None
    return f"jax is not installed for {sys.executable} ({INSTALL}, or point canary.python at an interpreter with jax)"


def canary_unavailable(config: Config, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the daemon's canary cannot run with ``config`` (off, or no jax where its worker would run), or None."""
    if not config.canary.enabled:
        return "canary.enabled is false"
    python = config.canary.python
    if python is None:
        return jax_missing_here()
    try:
        answer = subprocess.run([python, "-c", _FIND_JAX], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except OSError as exc:
        return f"canary.python {python} cannot be started ({exc.strerror or exc})"
    except subprocess.TimeoutExpired:
        return f"canary.python {python} did not answer within {timeout:g} s"
    if answer.returncode == 0:
        return None
    if answer.returncode == 1:
        return f"jax is not installed for canary.python {python} ({python} -m {INSTALL})"
    return f"canary.python {python} cannot run Python (exit status {answer.returncode})"
