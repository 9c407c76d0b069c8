"""What ``--simulate`` changes of a config (tpuwatch.drills.simulate): simulated chips keep their state apart."""

from __future__ import annotations

from tpuwatch.config import Config, DevicesConfig
from tpuwatch.drills.simulate import is_simulated, namespaced


def test_simulated_chips_have_their_own_namespace() -> None:
    real = Config(state_dir="/var/lib/tpuwatch")
    assert namespaced(real) is real
    sim = Config(state_dir="/var/lib/tpuwatch", devices=DevicesConfig(backend="sim"))
    assert namespaced(sim).state_dir == "/var/lib/tpuwatch/simulated" and is_simulated(sim)
