"""The shared test helpers themselves: a flaw here makes other tests fail by chance."""

from __future__ import annotations

from conftest import free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    # The kernel picks bind(0) ports at random: 2,000 plain picks repeat about a hundred times, and a repeat
    # gave two fleet daemons one port, so that one host's pages were counted as another's.
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
