"""The registries by name that the config's choices must match (the config sits below the parts it names, so
it cannot import their registries): kernel-log sources and device backends."""

from __future__ import annotations

import typing

import pytest

from tpuwatch.config import DevicesConfig, KernelLogConfig
from tpuwatch.devices import BACKENDS
from tpuwatch.kernel_log.collector import SOURCES


@pytest.mark.parametrize("section,key,registry", [(KernelLogConfig, "source", SOURCES),
                                                  (DevicesConfig, "backend", BACKENDS)])
def test_the_config_offers_exactly_the_registered_names(section: type, key: str, registry: dict) -> None:
    choices = typing.get_args(typing.get_type_hints(section)[key])
    assert choices[:1] == ("auto",) and choices[-1:] == ("none",)
    assert list(choices[1:-1]) == list(registry)
