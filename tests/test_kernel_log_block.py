"""A block's cheap answers, checked on literal texts: which bytes are text, how many lines and records it has, and
each record's text (a record is a line and the continuation lines after it)."""

from __future__ import annotations

import pytest

from tpuwatch.kernel_log.blocks import MAX_CONTINUATION_LINES, Block
from tpuwatch.kernel_log.formats import is_text


def test_text_is_every_byte_but_the_control_bytes_other_than_tab_cr_and_lf() -> None:
    junk = {b for b in range(256) if is_text(b"kernel: " + bytes([b]) + b" line\n") is False}
    assert junk == {*range(0, 9), 11, 12, *range(14, 32), 127}
    assert is_text(b"")
    assert is_text("NVRM: Xid (PCI:0000:10:00): 13, name=pyth\u00f6n\r\n".encode())
    assert not is_text(b"a clean line\n" * 1000 + b"\x1b[31m")


@pytest.mark.parametrize(("text", "records", "lines"), [
    ("", [], 0),
    ("one\n", ["one"], 1),
    ("one\ntwo", ["one", "two"], 2),
    ("one\ntwo\n\nfour\n", ["one", "two", "", "four"], 4),
    ("head\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\nnext\n",
     ["head\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0", "next"], 4),
    ("head\n\tindented\nnext \n", ["head\n\tindented", "next "], 3),
    (" starts with a space\nnext\n", [" starts with a space", "next"], 2),
])
def test_a_blocks_records_are_its_lines_with_their_continuation_lines(text: str, records: list[str],
                                                                        lines: int) -> None:
    block = Block(text)
    assert block.raws() == records
    assert len(block) == len(records)
    assert block.lines == lines


def test_a_run_of_continuation_lines_past_the_bound_begins_a_new_record() -> None:
    run = [f" KEY{i}=value" for i in range(MAX_CONTINUATION_LINES + 3)]
    block = Block("\n".join(["head", *run, "next"]) + "\n")
    raws = block.raws()
    assert raws[0] == "\n".join(["head", *run[:MAX_CONTINUATION_LINES]])
    assert raws[-1] == "next"
    assert len(raws) == len(block) == 3
    assert block.lines == len(run) + 2
