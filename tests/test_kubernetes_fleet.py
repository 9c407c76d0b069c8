"""The fleet rehearsal of benchmarks/fleet.py, shortened: 10 simulated hosts of 4 chips as node agents of one
stand-in API server, Debian's Prometheus with alerts/ and Alertmanager paging a recording webhook.  One chip
computes wrong numbers and pages once, naming host and chip; three hosts fail at once under a 10% limit: one
is tainted, two report that they held back.  Timings are recorded by the benchmark, never asserted here."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from conftest import require_tool

REPO = Path(__file__).resolve().parent.parent


def test_fleet_pages_once_per_chip_and_keeps_the_blast_radius(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for tool in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):
        require_tool(tool)
    pytest.importorskip("jax")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    fleet = importlib.import_module("fleet")  # benchmarks/fleet.py, with its helpers
    spec = fleet.Spec(hosts=10, chips=4, failing=3, limit="10%", interval="2s", scrape="2s", group_wait="2s",
                      fault_after=45.0, settle=15.0, timeout=420.0)
    result = fleet.rehearse(spec, tmp_path)
    assert all(e.page and e.condition for e in result.events), result.events
    assert result.pages == {("host-0", spec.sdc_chip): 1, ("host-1", "0"): 1, ("host-2", "0"): 1,
                            ("host-3", "0"): 1}
    assert len(result.tainted) == 1 and result.tainted[0] in ("host-1", "host-2", "host-3")
    assert sorted(result.held_back) == sorted({"host-1", "host-2", "host-3"} - set(result.tainted))
    assert result.series_per_host > 0 and result.rule_seconds
