"""A probe's report checked (tpuwatch.jobreports.message) and its chips resolved (chips.resolve): pure, on literals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpuwatch.jobreports.chips import resolve
from tpuwatch.jobreports.message import Refused, Report, parse

FP = "479b034ebb20dd7c"


def report(**changes: Any) -> dict[str, Any]:
    """A valid report of a job on four chips, with ``changes`` applied: composed here, in the shape
    tpuwatch.probe.Probe.report() writes (tests/test_probe_e2e.py sends real ones)."""
    base: dict[str, Any] = {
        "version": 1, "model": "attn-mlp-v1", "platform": "cpu", "chip": "cpu",
        "stack": "jax 0.10.2, jaxlib 0.10.2, cpu", "dtype": "float32", "scale": 3.25, "named_by": "ordinal",
        "results": [{"device": str(i), "finite": True, "max_abs_error": 1e-6, "fingerprint": FP,
                     "duration_seconds": None} for i in range(4)],
        "drill": None}
    return {**base, **changes}


def encoded(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_a_valid_report_is_read_whole() -> None:
    parsed = parse(encoded(report(drill={"kind": "bitflip", "device": "2"})))
    assert parsed.devices == ["0", "1", "2", "3"]
    assert (parsed.platform, parsed.chip, parsed.named_by, parsed.drill) == ("cpu", "cpu", "ordinal", ("bitflip", "2"))
    assert parsed.results[0] == {"device": "0", "finite": True, "max_abs_error": 1e-6, "fingerprint": FP,
                                 "duration_seconds": None}


def test_a_nan_result_has_no_error_figure() -> None:
    results = [{"device": "0", "finite": False, "max_abs_error": None, "fingerprint": FP}]
    assert parse(encoded(report(results=results))).results[0]["max_abs_error"] is None


BAD: list[tuple[str, bytes, str]] = [
    ("not json", b"hello", "not JSON"),
    ("a list", b"[1, 2]", "want a JSON object"),
    ("deep nesting", b"[" * 30_000 + b"]" * 30_000, "not JSON"),
    ("nested deeper than a report", encoded(report(stack={"a": {"b": {"c": {"d": {}}}}})), "nested deeper"),
    ("another version", encoded(report(version=2)), "version"),
    ("another model", encoded(report(model="resnet")), "model"),
    ("another dtype", encoded(report(dtype="bfloat16")), "dtype"),
    ("no naming", encoded(report(named_by="guess")), "named_by"),
    ("a negative scale", encoded(report(scale=-1)), "scale"),
    ("an infinite scale", encoded(report(scale=float("inf"))), "scale"),
    ("no results", encoded(report(results=[])), "results"),
    ("65 results", encoded(report(results=[report()["results"][0]] * 65)), "results"),
    ("a chip twice", encoded(report(results=[report()["results"][0]] * 2)), "named twice"),
    ("a chip name", encoded(report(results=[{**report()["results"][0], "device": "../0"}])), "device"),
    ("a short fingerprint", encoded(report(results=[{**report()["results"][0], "fingerprint": "abc"}])),
     "fingerprint"),
    ("finite as text", encoded(report(results=[{**report()["results"][0], "finite": "yes"}])), "finite"),
    ("a finite result without error", encoded(report(results=[{**report()["results"][0], "max_abs_error": None}])),
     "max_abs_error"),
    ("an error as bool", encoded(report(results=[{**report()["results"][0], "max_abs_error": True}])),
     "max_abs_error"),
    ("a drill on a chip not reported", encoded(report(drill={"kind": "bitflip", "device": "7"})), "drill"),
    ("an unknown drill", encoded(report(drill={"kind": "meltdown", "device": "0"})), "drill"),
    ("a control character", encoded(report(stack="jax\n0.10")), "stack"),
    ("a long text", encoded(report(chip="x" * 300)), "chip"),
]


@pytest.mark.parametrize(("data", "detail"), [(d, w) for _, d, w in BAD], ids=[n for n, _, _ in BAD])
def test_a_malformed_report_is_refused_saying_what_is_wrong(data: bytes, detail: str) -> None:
    with pytest.raises(Refused) as refused:
        parse(data)
    assert refused.value.reason == "malformed"
    assert detail in refused.value.detail


def test_an_oversized_report_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(Refused) as refused:
        parse(b" " * (64 * 1024 + 1))
    assert refused.value.reason == "oversized"


def _named(named_by: str, *devices: str) -> Report:
    return parse(encoded(report(named_by=named_by, results=[{**report()["results"][0], "device": d}
                                                            for d in devices])))


KNOWN = ["0", "1", "2", "3"]


def test_chips_named_by_the_environment_must_be_held() -> None:
    assert resolve(_named("env", "2", "3"), 1000, 42, ["2", "3"], KNOWN) == {"2": "2", "3": "3"}
    with pytest.raises(Refused) as refused:
        resolve(_named("env", "2"), 1000, 42, ["0", "1"], KNOWN)
    assert (refused.value.reason, refused.value.detail) == (
        "not_holder", "pid 42 holds chip(s) 0, 1; the report is about chip(s) 2")


def test_chips_named_by_order_map_onto_the_chips_held_in_order() -> None:
    # A container sees host chips 5 and 6 as its devices 0 and 1.
    assert resolve(_named("ordinal", "1", "0"), 1000, 42, ["5", "6"], [*KNOWN, "5", "6"]) == {"0": "5", "1": "6"}
    assert resolve(_named("ordinal", "0", "1"), 1000, 42, ["0", "1"], KNOWN) == {"0": "0", "1": "1"}


def test_more_chips_than_held_is_refused_whatever_the_naming() -> None:
    for naming in ("env", "ordinal"):
        with pytest.raises(Refused) as refused:
            resolve(_named(naming, "0", "1", "2", "3"), 1000, 42, ["0", "1"], KNOWN)
        assert refused.value.reason == "not_holder"


def test_a_process_holding_nothing_may_not_report_unless_root() -> None:
    with pytest.raises(Refused) as refused:
        resolve(_named("env", "2"), 1000, 42, [], KNOWN)
    assert refused.value.detail == "pid 42 holds no chip; the report is about chip(s) 2"
    assert resolve(_named("env", "2"), 0, 42, [], KNOWN) == {"2": "2"}
    with pytest.raises(Refused):  # root the kernel cannot name to us (pid 0: another PID namespace) is not trusted
        resolve(_named("env", "2"), 0, 0, [], KNOWN)
    with pytest.raises(Refused) as refused:
        resolve(_named("env", "2", "9"), 0, 42, [], KNOWN)
    assert (refused.value.reason, refused.value.detail) == ("unknown_chip", "no chip 9 on this host")


def test_root_holding_chips_is_held_to_them() -> None:
    # A job running as root in a pod holds its chips: it is mapped onto them, never onto chips it does not hold.
    assert resolve(_named("ordinal", "0"), 0, 42, ["3"], KNOWN) == {"0": "3"}
    with pytest.raises(Refused):
        resolve(_named("env", "2"), 0, 42, ["3"], KNOWN)


# --- the limits, exactly, and what a refusal says (each a mutant of message.py that survived without it) ---------


def _refused(data: bytes) -> Refused:
    with pytest.raises(Refused) as refused:
        parse(data)
    return refused.value


def test_a_report_of_exactly_the_size_limit_is_read_and_one_byte_more_is_not() -> None:
    body = encoded(report())
    at_limit = body + b" " * (64 * 1024 - len(body))  # JSON allows trailing white space
    assert parse(at_limit).devices == ["0", "1", "2", "3"]
    over = _refused(at_limit + b" ")
    assert (over.reason, over.detail, str(over)) == ("oversized", "65537 bytes, over 65536",
                                                      "oversized: 65537 bytes, over 65536")


@pytest.mark.parametrize("extra", [{}, [], {"a": {"b": {}}}, [[[]]], [[["x"]]], {"a": [{"b": 1}]}])
def test_nesting_up_to_four_levels_is_read(extra: Any) -> None:
    assert parse(encoded(report(extra=extra))).devices == ["0", "1", "2", "3"]  # unknown keys are ignored


@pytest.mark.parametrize("extra", [{"a": {"b": {"c": {}}}}, [[[[]]]], [[[["x"]]]], {"a": [{"b": [1]}]}])
def test_nesting_of_five_levels_is_refused(extra: Any) -> None:
    assert _refused(encoded(report(extra=extra))).detail == "nested deeper than 4"


def test_the_limits_of_results_and_texts_are_inclusive() -> None:
    results = [{**report()["results"][0], "device": str(i)} for i in range(64)]
    assert len(parse(encoded(report(results=results))).results) == 64
    assert parse(encoded(report(chip="x" * 256))).chip == "x" * 256
    assert _refused(encoded(report(chip="x" * 257))).detail == "chip: want a printable string of 1-256 characters"


def test_a_bit_exact_result_and_a_zero_scale_are_numbers_like_any_other() -> None:
    exact = [{**report()["results"][0], "max_abs_error": 0}]
    assert parse(encoded(report(results=exact, scale=0))).results[0]["max_abs_error"] == 0.0


def test_a_nan_result_keeps_an_error_figure_it_was_given() -> None:
    results = [{"device": "0", "finite": False, "max_abs_error": 0.5, "fingerprint": FP}]
    assert parse(encoded(report(results=results))).results[0]["max_abs_error"] == 0.5


def test_the_parsed_report_keeps_its_scale_and_the_reference_dtype() -> None:
    parsed = parse(encoded(report()))
    assert (parsed.scale, parsed.dtype) == (3.25, "float32")


EXACT: list[tuple[str, bytes, str]] = [
    ("no scale", encoded({k: v for k, v in report().items() if k != "scale"}), "scale: want a finite number >= 0"),
    ("a number as text", encoded(report(chip=5)), "chip: want a printable string of 1-256 characters"),
    ("a list", b"[1, 2]", "want a JSON object"),
    ("no naming", encoded(report(named_by="guess")), "named_by: want env or ordinal"),
    ("a chip twice", encoded(report(results=[report()["results"][0]] * 2)), "results: a chip named twice"),
    ("an unknown drill", encoded(report(drill={"kind": "meltdown", "device": "0"})),
     "drill: want null or {kind, device} naming a reported chip"),
    ("a result not an object", encoded(report(results=[report()["results"][0], 7])), "results[1]: want an object"),
    ("a second result's chip", encoded(report(results=[report()["results"][0],
                                                        {**report()["results"][0], "device": "x"}])),
     "results[1].device: want a chip number"),
    ("a finite result without error", encoded(report(results=[{**report()["results"][0], "max_abs_error": None}])),
     "results[0].max_abs_error: want a finite number >= 0"),
]


@pytest.mark.parametrize(("data", "detail"), [(d, w) for _, d, w in EXACT], ids=[n for n, _, _ in EXACT])
def test_a_refusal_says_exactly_which_field_and_what_it_wants(data: bytes, detail: str) -> None:
    refused = _refused(data)
    assert (refused.reason, refused.detail, str(refused)) == ("malformed", detail, f"malformed: {detail}")


def test_a_json_error_is_quoted_in_at_most_80_characters() -> None:
    deep = _refused(b"[" * 30_000 + b"]" * 30_000)  # the decoder's own message is longer than that
    assert deep.detail.startswith("not JSON: maximum recursion depth") and len(deep.detail) == len("not JSON: ") + 80
    assert _refused(b"hello").detail == "not JSON: Expecting value: line 1 column 1 (char 0)"
