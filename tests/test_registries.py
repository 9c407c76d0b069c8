"""The registries by name that the config's choices must match: kernel-log sources (the config sits below the
collector that registers them, so it names them again) and device backends (both read tpuwatch.backends)."""

from __future__ import annotations

import typing

import pytest

from tpuwatch.config import DevicesConfig, KernelLogConfig
from tpuwatch.devices import BACKENDS
from tpuwatch.kernel_log.opening import SOURCES
from tpuwatch.schema import OneOf


def _choices(section: type, key: str) -> tuple[str, ...]:
    hint = typing.get_type_hints(section, include_extras=True)[key]
    checks = [c for c in getattr(hint, "__metadata__", ()) if isinstance(c, OneOf)]
    return checks[0].choices if checks else typing.get_args(hint)


@pytest.mark.parametrize("section,key,registry", [(KernelLogConfig, "source", SOURCES),
                                                  (DevicesConfig, "backend", BACKENDS)])
def test_the_config_offers_exactly_the_registered_names(section: type, key: str, registry: dict) -> None:
    choices = _choices(section, key)
    assert choices[:1] == ("auto",) and choices[-1:] == ("none",)
    assert list(choices[1:-1]) == list(registry)
