"""Alert rules: parsing with key-path errors, functions, the tracker, templating, state and the built-in set."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import pytest

from tpuwatch.alerting import runbooks
from tpuwatch.alerting.rules import CompiledRule, default_rules_text, load_rules, parse_rules, tracks
from tpuwatch.alerting.state import AlertBook, fingerprint
from tpuwatch.alerting.template import render
from tpuwatch.alerting.tracker import Row, Track, Tracker
from tpuwatch.catalog import CATALOG
from tpuwatch.notifiers.webhook import label_set_string
from tpuwatch.samples import Sample, sample
from tpuwatch.schema import ConfigError

T0 = 1_700_000_000.0
HOST = {"host": "h1"}


def rule(text: str) -> CompiledRule:
    (parsed,) = parse_rules(f"rules:\n  - {text}\n", "test.yaml")
    return CompiledRule(parsed)


def fire(compiled: CompiledRule, samples: list[Sample], tracker: Tracker | None = None,
         now: float = T0) -> dict[str, float]:
    tracker = tracker or Tracker()
    return {c.labels.get("device", ""): c.value for c in compiled.evaluate(samples, tracker, now, HOST)}


@pytest.mark.parametrize("text,message", [
    ("{alert: X, metric: m, op: '=>'}", "test.yaml: rules[0].op: must be one of"),
    ("{alert: X, metric: m, for: soon}", "test.yaml: rules[0].for: invalid duration"),
    ("{alert: X, metric: m, function: ratio}", "test.yaml: rules[0].ratio_to: required when function is ratio"),
    ("{alert: 'bad name', metric: m}", "test.yaml: rules[0].alert: 'bad name' is not a valid name"),
    ("{alert: X, metric: m, match: {device: '('}}", "test.yaml: rules[0].match.device: invalid regular expression"),
    ("{alert: X, metric: m, by: [device]}", "test.yaml: rules[0].by: needs aggregate"),
    ("{alert: X, metric: m, annotations: {summary: '{{ $value | hex }}'}}",
     "test.yaml: rules[0].annotations.summary: unknown filter 'hex'"),
    ("{alert: X, metric: m, severity: page}", "test.yaml: rules[0].severity: must be one of critical, warning"),
    ("{alert: X, metric: m, threshold_from: trend.eta}",
     "test.yaml: rules[0].threshold_from: unknown setting 'trend.eta' (known: trend.critical_eta, trend.max_eta)"),
    ("{alert: X, metrc: m}", "test.yaml: rules[0].metrc: unknown key"),
])
def test_rule_errors_name_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules(f"rules:\n  - {text}\n", "test.yaml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_rule_files_are_globbed_and_a_missing_directory_is_fine(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules:\n  - {alert: Mine, metric: tpuwatch_device_up}\n")
    (tmp_path / "b.txt").write_text("not rules")
    rules = load_rules(False, [str(tmp_path / "*.yaml"), str(tmp_path / "absent" / "*.yaml")])
    assert [r.alert for r in rules] == ["Mine"]
    (tmp_path / "c.yaml").write_text("rules: [{alert: Bad}]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: rules\[0\]\.metric: required key missing"):
        load_rules(True, [str(tmp_path / "*.yaml")])


def test_templates_fill_labels_and_value() -> None:
    labels = {"device": "2", "rule": "nvidia_xid"}
    assert render("{{ $labels.rule }} on {{$labels.device}}: {{ $value }}", labels, 3.0) == "nvidia_xid on 2: 3"
    assert render("{{ $value | percent }} {{ $value|number }} {{ $labels.nope }}!", labels, 0.9712) == "97.1% 0.9712 !"
    assert render("in {{ $value | duration }}", labels, 5400.2) == "in 1h 30m 0s"
    assert render("{{ $value | duration }}", labels, 2605) == "43m 25s"
    assert render("{{ $value | duration }}", labels, 0.25) == "0.25s"
    assert [render("{{ $value | duration }}", labels, v) for v in (math.nan, math.inf, -3.0)] == ["nans", "infs", "0s"]
    assert render("{{ $value | bytes }}", labels, 3 * 2**30) == "3.00 GiB"


def test_value_rule_with_matchers_and_severity_override() -> None:
    compiled = rule("{alert: Hot, metric: tpuwatch_device_temperature_celsius, match: {device: '[01]'}, "
                    "threshold: 85, severity: critical, labels: {team: ml}, "
                    "annotations: {summary: 'dev {{ $labels.device }} at {{ $value }}'}}")
    samples = [sample("tpuwatch_device_temperature_celsius", t, device=d) for d, t in (("0", 90), ("1", 80),
                                                                                       ("2", 99))]
    (candidate,) = compiled.evaluate(samples, Tracker(), T0, HOST)
    assert candidate.labels == {"device": "0", "host": "h1", "team": "ml", "alertname": "Hot",
                                "severity": "critical"}
    assert candidate.annotations == {"summary": "dev 0 at 90"}


def test_ratio_age_and_absent_denominator() -> None:
    ratio = rule("{alert: Full, metric: tpuwatch_device_memory_used_bytes, function: ratio, "
                 "ratio_to: tpuwatch_device_memory_total_bytes, threshold: 0.95}")
    samples = [sample("tpuwatch_device_memory_used_bytes", 97, device="0"),
               sample("tpuwatch_device_memory_total_bytes", 100, device="0"),
               sample("tpuwatch_device_memory_used_bytes", 99, device="1")]
    assert fire(ratio, samples) == {"0": 0.97}
    age = rule("{alert: Stale, metric: tpuwatch_last_sample_timestamp_seconds, function: age, threshold: 60}")
    assert fire(age, [sample("tpuwatch_last_sample_timestamp_seconds", T0 - 61)]) == {"": 61.0}
    assert fire(age, [sample("tpuwatch_last_sample_timestamp_seconds", T0 - 59)]) == {}


def test_increase_handles_resets_and_windows() -> None:
    compiled = rule("{alert: Ecc, metric: tpuwatch_device_ecc_errors_total, function: increase, window: 1m}")
    tracker = Tracker()
    tracked = {"tpuwatch_device_ecc_errors_total": Track("external", 60, 60)}
    series = [(0, 5), (10, 5), (20, 7), (30, 1), (40, 2)]  # a reset between 20 and 30
    for t, value in series:
        samples = [sample("tpuwatch_device_ecc_errors_total", value, device="0", kind="corrected")]
        tracker.observe(samples, tracked, T0 + t)
    assert fire(compiled, samples, tracker, T0 + 40) == {"0": 4.0}  # +2, then 1 after the reset, +1
    for t in range(50, 130, 10):
        tracker.observe(samples, tracked, T0 + t)
    assert fire(compiled, samples, tracker, T0 + 120) == {}  # nothing new within the last minute


@pytest.mark.parametrize("kind,count_initial,expected", [
    ("external", False, {"0": 0.0, "1": 0.0}),  # a driver's count, seen first: the baseline
    ("external", True, {"0": 7.0, "1": 1.0}),   # ... unless the rule counts what it already holds
    ("tpuwatch", False, {"0": 7.0, "1": 1.0}),  # tpuwatch's own counter starts with the daemon: all of it is new
])
def test_what_a_counter_holds_at_first_sight_counts_as(kind: str, count_initial: bool,
                                                        expected: dict[str, float]) -> None:
    compiled = rule("{alert: Ecc, metric: tpuwatch_device_ecc_errors_total, function: increase, window: 1h, "
                    f"op: '>=', counter: {kind}, count_initial: {str(count_initial).lower()}}}")
    tracker = Tracker()
    tracked = tracks([compiled.rule])
    first = [sample("tpuwatch_device_ecc_errors_total", 7, device="0", kind="uncorrected")]
    tracker.observe(first, tracked, T0)
    later = first + [sample("tpuwatch_device_ecc_errors_total", 1, device="1", kind="uncorrected")]  # seen later
    tracker.observe(later, tracked, T0 + 10)
    assert fire(compiled, later, tracker, T0 + 10) == expected
    for t in range(20, 3700, 60):
        tracker.observe(later, tracked, T0 + t)
    assert set(fire(compiled, later, tracker, T0 + 3690).values()) == {0.0}  # an hour later it is old news


def test_count_initial_only_for_increase_over_an_external_counter() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]\.count_initial: only for increase over an external"):
        parse_rules("rules: [{alert: X, metric: m, function: increase, counter: tpuwatch, count_initial: true}]",
                    "test.yaml")
    with pytest.raises(ConfigError, match="counter: tpuwatch disagrees with another rule's counter: external"):
        tracks(parse_rules("rules: [{alert: X, metric: m, function: increase},\n"
                           "        {alert: Y, metric: m, function: increase, counter: tpuwatch}]", "test.yaml"))


def test_windows_longer_than_the_store_history_keep_few_points() -> None:
    tracker = Tracker()
    for t in range(0, 7 * 3600, 10):
        samples = [sample("tpuwatch_canary_runs_total", t // 3600, result="error")]
        tracker.observe(samples, {"tpuwatch_canary_runs_total": Track("tpuwatch", 6 * 3600, 6 * 3600)}, T0 + t)
    key = samples[0][:2]
    assert tracker.increase(key, 6 * 3600, T0 + 7 * 3600 - 10) == 6
    assert len(tracker._series[key].times) <= 70


def test_a_counter_holds_its_points_from_its_first_sight_and_no_more_later() -> None:
    """1,000 counters that change every cycle: their points are allocated whole at first sight (packed, under
    2.5 KiB a counter; tuples of floats took over 7 KiB): the next 6 hours of a 6-hour window (65 points each)
    add nothing to them."""
    track = {"tpuwatch_kernel_events_total": Track("tpuwatch", 6 * 3600, 6 * 3600)}
    tracker = Tracker()
    step = 6 * 3600 / 64
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(int(7 * 3600 / step)):
            tracker.observe([sample("tpuwatch_kernel_events_total", k, rule=str(n)) for n in range(1000)],
                            track, T0 + k * step)
            if k == 10:  # after the first hour, when every value the test feeds is a new float
                first = tracemalloc.get_traced_memory()[0]
        held = tracemalloc.get_traced_memory()[0] - before
        later = tracemalloc.get_traced_memory()[0] - first
    finally:
        tracemalloc.stop()
    assert max(len(s.times) for s in tracker._series.values()) == 65
    assert held < 2.5 * 1024 * 1000, held
    assert later < 64 * 1024, later


def test_a_gauge_keeps_no_points() -> None:
    track = {"tpuwatch_device_temperature_celsius": Track("gauge", 0.0, 600.0)}
    tracker = Tracker()
    cycles = [[sample("tpuwatch_device_temperature_celsius", 40 + k, device=str(n)) for n in range(1000)]
              for k in range(3)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k, samples in enumerate(cycles):
            tracker.observe(samples, track, T0 + 10 * k)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 800 * 1000, held  # two counters' histories of points would take 1.4 KB more each


def test_a_saved_log_denser_than_the_window_is_thinned_and_keeps_its_oldest_baseline() -> None:
    """Points saved under a shorter window (one a minute) read by a rule whose window is now 6 h: 360 points
    fit no counter's history, so they are thinned to the window's spacing rather than cut at the oldest."""
    points = [(T0 + 60.0 * k, float(k)) for k in range(361)]
    row = Row("tpuwatch_kernel_events_total", '[["rule", "x"]]', "", 360.0, points[-1][0], 360.0, points[-1][0],
              json.dumps(points), 0.0, None)
    track = {"tpuwatch_kernel_events_total": Track("tpuwatch", 6 * 3600, 6 * 3600)}
    tracker = Tracker()
    tracker.restore([row], track)
    key = ("tpuwatch_kernel_events_total", (("rule", "x"),))
    assert len(tracker._series[key].times) <= 65
    assert tracker.increase(key, 6 * 3600, T0 + 6 * 3600 + 30) == 360.0


def test_aggregate_and_unchanged() -> None:
    compiled = rule("{alert: NoCanary, metric: tpuwatch_canary_runs_total, function: unchanged, aggregate: min, "
                    "threshold: 100}")
    tracker = Tracker()
    windows = tracks([compiled.rule])

    def at(t: float, ok: int, error: int) -> dict[str, float]:
        samples = [sample("tpuwatch_canary_runs_total", ok, result="pass"),
                   sample("tpuwatch_canary_runs_total", error, result="error")]
        tracker.observe(samples, windows, T0 + t)
        return fire(compiled, samples, tracker, T0 + t)

    assert at(0, 1, 0) == {}
    assert at(90, 2, 0) == {}
    assert at(150, 2, 0) == {}       # errors unchanged for 150 s but a pass 60 s ago
    assert at(200, 2, 0) == {"": 110.0}


def test_states_pending_firing_resolved_with_for() -> None:
    compiled = rule("{alert: Hot, metric: tpuwatch_device_temperature_celsius, threshold: 85, for: 5m}")
    book = AlertBook()
    hot = [sample("tpuwatch_device_temperature_celsius", 90, device="0")]

    def step(t: float, samples: list[Sample]) -> list[str]:
        changes = book.apply(compiled.evaluate(samples, Tracker(), T0 + t, HOST), set(), T0 + t)
        return [a.state for a in changes.saved]

    assert step(0, hot) == ["pending"]
    assert step(299, hot) == []
    assert step(300, hot) == ["firing"]
    (alert,) = book.alerts.values()
    assert alert.fingerprint == fingerprint({"device": "0", "host": "h1", "alertname": "Hot", "severity": "warning"})
    assert (alert.active_at, alert.fired_at) == (T0, T0 + 300)
    assert step(310, []) == ["resolved"] and alert.resolved_at == T0 + 310
    assert step(320, hot) == ["pending"]
    assert step(330, []) == ["resolved"] and book.alerts == {}  # a pending alert that goes away is forgotten


def test_fingerprints_are_alertmanagers_and_ignore_label_order() -> None:
    assert fingerprint({"a": "1", "b": "2"}) == fingerprint({"b": "2", "a": "1"}) != fingerprint({"a": "2", "b": "1"})
    assert fingerprint({}) == "cbf29ce484222325"  # FNV-1a 64's offset basis: prometheus/common's empty label set
    # The separator byte keeps {"ab": "c"} and {"a": "bc"} apart.
    assert fingerprint({"ab": "c"}) != fingerprint({"a": "bc"})


def test_group_keys_quote_label_values_as_go_does() -> None:
    assert label_set_string({"device": "0", "alertname": "X"}) == '{alertname="X", device="0"}'
    assert label_set_string({"a": 'say "hi"\\n\n\t\x01\x7f\u00ad\u00e9\U0001f600'}) == \
        '{a="say \\"hi\\"\\\\n\\n\\t\\x01\\x7f\\u00ad\u00e9\U0001f600"}'


def test_alerts_about_a_lost_chip_are_inhibited_but_the_loss_itself_is_not() -> None:
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")]
    samples = [sample("tpuwatch_device_up", 0, device="1"),
               sample("tpuwatch_device_temperature_celsius", 99, device="1"),
               sample("tpuwatch_canary_healthy", 0, device="1")]
    book = AlertBook()
    for t in (0, 60, 120):
        candidates = [c for r in rules for c in r.evaluate(samples, Tracker(), T0 + t, HOST)]
        book.apply(candidates, {"1"}, T0 + t)
    states = {a.labels["alertname"]: (a.state, a.inhibited) for a in book.alerts.values()}
    assert states == {"AcceleratorLost": ("firing", False), "CanaryUnhealthy": ("firing", True),
                      "AcceleratorTemperatureHigh": ("firing", True)}


# The list of what the built-in rules must catch, as (samples before, samples after, alert, severity).
def _fabric(state: str, status: str, health: str) -> dict[str, str]:
    return {"device": "0", "state": state, "status": status, "health": health, "clique_id": "1",
            "cluster_uuid": "ab" * 16}


DEFAULT_CASES = [
    ("uncorrectable ECC", [("tpuwatch_device_ecc_errors_total", 0, {"device": "0", "kind": "uncorrected"})],
     [("tpuwatch_device_ecc_errors_total", 1, {"device": "0", "kind": "uncorrected"})],
     "AcceleratorEccUncorrectable", "critical"),
    ("uncorrectable ECC already counted", [],  # a fault that predates tpuwatch (install, or the ecc-errors drill)
     [("tpuwatch_device_ecc_errors_total", 2, {"device": "0", "kind": "uncorrected"})],
     "AcceleratorEccUncorrectable", "critical"),
    ("row remap failed", [], [("tpuwatch_device_row_remap_failed", 1, {"device": "0"})],
     "AcceleratorRowRemapFailed", "critical"),
    ("memory repair pending", [], [("tpuwatch_device_memory_repair_pending", 1, {"device": "0"})],
     "AcceleratorMemoryRepairPending", "warning"),
    ("corrected ECC rising", [("tpuwatch_device_ecc_errors_total", 0, {"device": "0", "kind": "corrected"})],
     [("tpuwatch_device_ecc_errors_total", 150, {"device": "0", "kind": "corrected"})],
     "AcceleratorEccCorrectedRising", "warning"),
    ("devastating Xid", [], [("tpuwatch_kernel_events_total", 1,
                              {"rule": "nvidia_xid", "severity": "critical", "device": "0"})],
     "KernelHardwareErrorCritical", "critical"),
    ("TPU driver error", [], [("tpuwatch_kernel_events_total", 1,
                               {"rule": "tpu_driver_error", "severity": "critical", "device": "2"})],
     "KernelHardwareErrorCritical", "critical"),
    ("AER corrected rising", [], [("tpuwatch_kernel_events_total", 12,
                                   {"rule": "pcie_aer_corrected", "severity": "warning", "device": "0"})],
     "KernelCorrectedErrorsRising", "warning"),
    ("chip lost", [], [("tpuwatch_device_up", 0, {"device": "0"})], "AcceleratorLost", "critical"),
    ("canary wrong", [("tpuwatch_canary_device_runs_total", 0, {"device": "1", "result": "fail"})],
     [("tpuwatch_canary_device_runs_total", 1, {"device": "1", "result": "fail"})], "CanaryWrongResult", "critical"),
    ("canary unhealthy chip", [], [("tpuwatch_canary_healthy", 0, {"device": "0"})], "CanaryUnhealthy", "warning"),
    ("canary errors", [("tpuwatch_canary_runs_total", 0, {"result": "error"})],
     [("tpuwatch_canary_runs_total", 2, {"result": "error"})], "CanaryFailing", "warning"),
    ("leak", [], [("tpuwatch_memory_leak_suspected", 1, {"memory": "hbm", "device": "0", "pid": ""})],
     "AcceleratorMemoryLeak", "warning"),
    ("leak ETA", [], [("tpuwatch_memory_exhaustion_eta_seconds", 3600, {"memory": "hbm", "device": "0", "pid": ""})],
     "AcceleratorMemoryExhaustionSoon", "critical"),
    ("drift", [], [("tpuwatch_drift_suspected", 1, {"device": "0", "series": "canary_latency", "band": ""})],
     "AcceleratorDrift", "warning"),
    ("temperature drift", [], [("tpuwatch_drift_suspected", 1, {"device": "0", "series": "temperature",
                                                                "band": "0.6-0.8"})], "AcceleratorDrift", "warning"),
    ("hot", [], [("tpuwatch_device_temperature_celsius", 88, {"device": "0"})], "AcceleratorTemperatureHigh",
     "warning"),
    ("very hot", [], [("tpuwatch_device_temperature_celsius", 97, {"device": "0"})],
     "AcceleratorTemperatureHigh", "critical"),
    ("AMD junction over its own limit", [], [("tpuwatch_device_temperature_celsius", 60, {"device": "0"}),
                                             ("tpuwatch_device_temperature_margin_celsius", -2,
                                              {"device": "0", "sensor": "junction"})],
     "AcceleratorTemperatureHigh", "critical"),
    ("memory full", [], [("tpuwatch_device_memory_used_bytes", 96, {"device": "0"}),
                         ("tpuwatch_device_memory_total_bytes", 100, {"device": "0"})],
     "AcceleratorMemoryFull", "warning"),
    ("collector failing", [], [("tpuwatch_collector_success", 0, {"collector": "devices"})],
     "TpuwatchCollectorFailing", "warning"),
    ("drill cannot run", [], [("tpuwatch_drill_cannot_run", 1, {"scenario": "sdc", "needs": "canary",
                                                                "reason": "canary.enabled is false"})],
     "TpuwatchDrillCannotRun", "warning"),
    ("chips missing", [], [("tpuwatch_devices_missing", 1, {"pci": "0000:13:00.0"})], "AcceleratorsMissing",
     "critical"),
    ("NVLink down", [], [("tpuwatch_device_nvlink_up", 0, {"device": "0", "link": "2"})], "AcceleratorLinkDown",
     "critical"),
    ("NVLink CRC errors rising", [("tpuwatch_device_nvlink_errors_total", 0, {"device": "0", "link": "2",
                                                                             "kind": "crc_flit"})],
     [("tpuwatch_device_nvlink_errors_total", 150, {"device": "0", "link": "2", "kind": "crc_flit"})],
     "AcceleratorLinkErrorsRising", "warning"),
    ("NVLink recovery", [("tpuwatch_device_nvlink_errors_total", 0, {"device": "0", "link": "1", "kind": "recovery"})],
     [("tpuwatch_device_nvlink_errors_total", 1, {"device": "0", "link": "1", "kind": "recovery"})],
     "AcceleratorLinkErrorsRising", "warning"),
    ("megascale hang", [], [("tpuwatch_interconnect_error_detected", 1, {"source": "megascale",
                                                                       "kind": "HANG_DETECTED"})],
     "AcceleratorInterconnectError", "critical"),
    ("process leak", [], [("tpuwatch_memory_leak_suspected", 1, {"memory": "process_hbm", "device": "0",
                                                                "pid": "4242"})], "AcceleratorMemoryLeak", "warning"),
    ("GPU needs a reset at start", [], [("tpuwatch_device_recovery_action", 1, {"device": "0", "action": "gpu_reset"})],
     "AcceleratorRecoveryActionRequired", "critical"),
    ("node reboot", [], [("tpuwatch_device_recovery_action", 2, {"device": "1", "action": "node_reboot"})],
     "AcceleratorRecoveryActionRequired", "critical"),
    ("drain P2P", [], [("tpuwatch_device_recovery_action", 3, {"device": "0", "action": "drain_p2p"})],
     "AcceleratorRecoveryActionRequired", "warning"),
    ("a recovery action newer than tpuwatch", [], [("tpuwatch_device_recovery_action", 9, {"device": "0",
                                                                                          "action": "9"})],
     "AcceleratorRecoveryActionRequired", "warning"),
    ("Xid 154 node reboot", [], [("tpuwatch_kernel_recovery_actions_total", 1, {"device": "0",
                                                                               "action": "node_reboot"})],
     "AcceleratorRecoveryActionRequired", "critical"),
    ("Xid 154 recover IMEX domain", [], [("tpuwatch_kernel_recovery_actions_total", 1,
                                          {"device": "0", "action": "recover_imex_domain"})],
     "AcceleratorRecoveryActionRequired", "warning"),
    ("fabric manager down", [], [("tpuwatch_device_fabric_info", 1, _fabric("not_started", "success", ""))],
     "AcceleratorFabricUnhealthy", "critical"),
    ("fabric registration failed", [], [("tpuwatch_device_fabric_info", 1, _fabric("completed", "timeout", "healthy"))],
     "AcceleratorFabricUnhealthy", "critical"),
    ("fabric unhealthy", [], [("tpuwatch_device_fabric_info", 1, _fabric("completed", "success", "unhealthy"))],
     "AcceleratorFabricUnhealthy", "critical"),
    ("fabric limited capacity", [], [("tpuwatch_device_fabric_info", 1,
                                      _fabric("completed", "success", "limited_capacity"))],
     "AcceleratorFabricUnhealthy", "warning"),
    ("field read failing", [], [("tpuwatch_device_read_errors_total", 5, {"device": "0",
                                                                         "field": "nvmlDeviceGetPowerUsage"})],
     "AcceleratorReadFailing", "warning"),
    ("hung chip", [], [("tpuwatch_device_hung", 1, {"device": "0", "pid": "4101", "command": "python3",
                                                    "namespace": "ml", "pod": "trainer-0", "container": "jax"})],
     "AcceleratorHung", "critical"),
    ("runtime error", [], [("tpuwatch_device_runtime_error_info", 1, {"device": "0", "core": "1",
                                                                      "message": "program 7 failed"})],
     "AcceleratorRuntimeError", "warning"),
]


@pytest.mark.parametrize("before,after,alertname,severity", [c[1:] for c in DEFAULT_CASES],
                         ids=[c[0] for c in DEFAULT_CASES])
def test_default_rules_cover_the_mission(before: list, after: list, alertname: str, severity: str) -> None:
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")]
    tracker, book = Tracker(), AlertBook()
    windows = tracks(r.rule for r in rules)
    for t, rows in ((0, before), (10, after), (400, after)):
        samples = [sample(name, value, **labels) for name, value, labels in rows]
        tracker.observe(samples, windows, T0 + t)
        book.apply([c for r in rules for c in r.evaluate(samples, tracker, T0 + t, HOST)], set(), T0 + t)
    firing = {(a.labels["alertname"], a.labels["severity"]) for a in book.alerts.values() if a.state == "firing"}
    assert (alertname, severity) in firing


def test_exhaustion_threshold_follows_trend_critical_eta() -> None:
    eta = [sample("tpuwatch_memory_exhaustion_eta_seconds", 3 * 3600, memory="hbm", device="0", pid="")]

    def fires(critical_eta: float) -> bool:
        rules = [CompiledRule(r) for r in load_rules(True, [], {"trend.critical_eta": critical_eta})]
        return any(c.rule.alert == "AcceleratorMemoryExhaustionSoon"
                   for r in rules for c in r.evaluate(eta, Tracker(), T0, HOST))

    assert fires(4 * 3600) and not fires(2 * 3600)


def test_default_rules_stay_quiet_on_a_healthy_chip() -> None:
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")]
    samples = [sample("tpuwatch_device_up", 1, device="0"),
               sample("tpuwatch_device_temperature_celsius", 60, device="0"),
               sample("tpuwatch_device_memory_used_bytes", 50, device="0"),
               sample("tpuwatch_device_memory_total_bytes", 100, device="0"),
               sample("tpuwatch_collector_success", 1, collector="devices")]
    samples.append(sample("tpuwatch_device_ecc_errors_total", 500, device="0", kind="corrected"))  # old news
    samples += [sample("tpuwatch_device_recovery_action", 0, device="0", action="none"),
                sample("tpuwatch_kernel_recovery_actions_total", 1, device="0", action="none"),
                sample("tpuwatch_device_read_errors_total", 1, device="0", field="nvmlDeviceGetPowerUsage"),
                sample("tpuwatch_device_fabric_info", 1, device="0", state="completed", status="success",
                       health="healthy", clique_id="1", cluster_uuid="ab" * 16)]
    tracker = Tracker()
    for t in (0, 10):
        tracker.observe(samples, tracks(r.rule for r in rules), T0 + t)
    assert [c for r in rules for c in r.evaluate(samples, tracker, T0 + 10, HOST)] == []


def test_default_rules_use_catalogued_metrics_and_labels() -> None:
    for r in parse_rules(default_rules_text(), "built-in"):
        assert r.metric in CATALOG, r.metric
        assert set(r.match) <= set(CATALOG[r.metric].labels), r.alert


def test_every_built_in_rule_links_the_runbook_of_its_name() -> None:
    for rule in load_rules(True, []):
        assert rule.runbook_url == rule.alert and rule.alert in runbooks.shipped(), rule.alert


@pytest.mark.parametrize("base,expected", [
    ("http://gpu-7:9847/runbooks/", "http://gpu-7:9847/runbooks/AcceleratorLost"),
    ("https://wiki.example/ops/tpuwatch", "https://wiki.example/ops/tpuwatch/AcceleratorLost"),
])
def test_runbook_links_join_alerting_runbook_base_url(base: str, expected: str, tmp_path: Path) -> None:
    (lost,) = [r for r in load_rules(True, [], runbook_base=base) if r.alert == "AcceleratorLost"]
    assert lost.runbook_url == expected
    (tmp_path / "mine.yaml").write_text("rules: [{alert: X, metric: m, runbook_url: 'https://rb.example/x'},\n"
                                        "        {alert: Y, metric: m, runbook_url: y.html},\n"
                                        "        {alert: Z, metric: m},\n"
                                        "        {alert: AcceleratorLost, metric: m, threshold: 2}]\n")
    mine = {r.alert: r.runbook_url for r in load_rules(False, [str(tmp_path / "*.yaml")], runbook_base=base)}
    # Absolute as written, relative joined to the base, none without a shipped runbook, the shipped one by name.
    assert mine == {"X": "https://rb.example/x", "Y": expected.replace("AcceleratorLost", "y.html"), "Z": None,
                    "AcceleratorLost": expected}
