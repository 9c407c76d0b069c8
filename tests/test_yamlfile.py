"""The one YAML loader: plain data within bounds, every refusal as ``FILE: line L, column C: reason``.

Each case runs through both parsers the loader can use (libyaml's and PyYAML's pure-Python one).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tpuwatch import yamlfile
from tpuwatch.yamlfile import MAX_BYTES, MAX_DEPTH, MAX_NODES, YamlError

LOADERS = pytest.mark.parametrize("loader", yamlfile.LOADERS, ids=lambda cls: cls.__name__)


def _bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs" shape: each list holds ``width`` aliases of the one before."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@LOADERS
@pytest.mark.parametrize("text,data", [
    ("", None),
    ("# only a comment\n", None),
    ("a: 1\nb: [x, 2.5, true, null]\n", {"a": 1, "b": ["x", 2.5, True, None]}),
    ("a: 2024-01-01\nb: '='\nc: =\n", {"a": "2024-01-01", "b": "=", "c": "="}),  # dates stay strings
    ("a: 0x10\nb: 017\nc: 1_000\nd: -9223372036854775808\n", {"a": 16, "b": 15, "c": 1000, "d": -(1 << 63)}),
    ("a: !!str 12\nb: ! 12\nc: !!int '7'\n", {"a": "12", "b": 12, "c": 7}),
    ("base: &b {x: 1, y: 2}\nuse: {<<: *b, y: 3}\nalso: *b\n",
     {"base": {"x": 1, "y": 2}, "use": {"x": 1, "y": 3}, "also": {"x": 1, "y": 2}}),
    ("\ufeffa: 1\r\nb: 2\r\n", {"a": 1, "b": 2}),
    ("a: \"\\u00e9\\U0001F600\"\n", {"a": "\u00e9\U0001F600"}),
])
def test_plain_data_loads(loader: Any, text: str, data: Any) -> None:
    assert yamlfile.load(text, "f.yaml", loader) == data


@LOADERS
@pytest.mark.parametrize("text,message", [
    ("a: b\x00c\n", "f.yaml: line 1, column 5: a NUL byte is not allowed in YAML"),
    ("a: 1\nb: \x1b[31m\n", "f.yaml: line 2, column 4: character U+001B is not allowed in YAML"),
    ("a: 1\na: 2\n", "f.yaml: line 2, column 1: duplicate key 'a' (first at line 1)"),
    ("a: {1: x, 0x1: y}\n", "f.yaml: line 1, column 11: duplicate key 1 (first at line 1)"),
    ("a: {<<: {x: 1}, <<: {y: 2}}\n", "f.yaml: line 1, column 17: duplicate key '<<' (first at line 1)"),
    ("a: !!python/object/apply:os.system [true]\n", "f.yaml: line 1, column 4: tag !!python/object/apply:os.system "
                                                    "is not allowed"),
    ("a: !!binary aGk=\n", "f.yaml: line 1, column 4: tag !!binary is not allowed"),
    ("a: !!set {x}\n", "f.yaml: line 1, column 4: tag !!set is not allowed"),
    ("a: !!timestamp 2001-12-14\n", "f.yaml: line 1, column 4: tag !!timestamp is not allowed"),
    ("a: !local x\n", "f.yaml: line 1, column 4: tag !local is not allowed"),
    ("a: " + "9" * 5000 + "\n", "f.yaml: line 1, column 4: integer of 5000 characters is out of the 64-bit range"),
    ("a: 9223372036854775808\n", "f.yaml: line 1, column 4: integer '9223372036854775808' is out of the 64-bit"),
    ("a: 1.0e+400\n", "f.yaml: line 1, column 4: number '1.0e+400' is not finite"),
    ("a: -.inf\n", "f.yaml: line 1, column 4: number '-.inf' is not finite"),
    ("a: .nan\n", "f.yaml: line 1, column 4: number '.nan' is not finite"),
    ("a: !!int abc\n", "f.yaml: line 1, column 4: invalid integer 'abc'"),
    ("a: !!int ''\n", "f.yaml: line 1, column 4: invalid integer ''"),
    ("a: !!float x\n", "f.yaml: line 1, column 4: invalid number 'x'"),
    ("a: !!bool maybe\n", "f.yaml: line 1, column 4: invalid boolean 'maybe'"),
    ("a: &x [*x]\n", "f.yaml: line 1, column 8: alias *x is inside the node it names"),
    ("a: &x {<<: *x}\n", "f.yaml: line 1, column 12: alias *x is inside the node it names"),
    ("a: *nope\n", "f.yaml: line 1, column 4: found undefined alias 'nope'"),
    ("? [k]\n: v\n", "f.yaml: line 1, column 3: found unhashable key"),
    ("a: 1\n---\nb: 2\n", "f.yaml: line 2, column 1: expected a single document in the stream, but found another"),
    ("a: [1, 2\nb: 3\n", "f.yaml: line 2, column 2: YAML syntax error: "),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "f.yaml: line 1, column "),
    (_bomb(), f"f.yaml: line 6, column 10: more than {MAX_NODES} values (an alias counts as all the values it "
              "stands for)"),
])
def test_refusals_name_file_line_and_column(loader: Any, text: str, message: str) -> None:
    with pytest.raises(YamlError) as caught:
        yamlfile.load(text, "f.yaml", loader)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


@LOADERS
def test_nesting_is_bounded(loader: Any) -> None:
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert yamlfile.load(ok, "f.yaml", loader) is not None
    for deep in ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "[" * 100_000, "a:\n" + "".join(
            " " * i + "b:\n" for i in range(1, 200))):
        with pytest.raises(YamlError, match=r"^f\.yaml: line \d+, column \d+: "):
            yamlfile.load(deep, "f.yaml", loader)


@LOADERS
def test_aliases_within_the_bound_expand(loader: Any) -> None:
    data = yamlfile.load(_bomb(levels=4, width=9), "f.yaml", loader)  # 9 + 81 + 729 + 6561 leaves: fine
    assert len(data["a3"]) == 9 and data["a3"][0][0][0] == ["lol"] * 9


def test_a_surrogate_escape_is_refused_by_both_parsers() -> None:
    for loader in yamlfile.LOADERS:
        with pytest.raises(YamlError, match=r"^f\.yaml: line 1, column \d+: "):
            yamlfile.load('a: "\\ud800"\n', "f.yaml", loader)


def test_size_is_bounded(tmp_path: Path) -> None:
    assert yamlfile.load("a: '" + "x" * (MAX_BYTES - 10) + "'\n", "f.yaml")["a"]
    with pytest.raises(YamlError, match=r"^f\.yaml: larger than 1048576 bytes \(1 MiB\)$"):
        yamlfile.load("a: '" + "é" * (MAX_BYTES // 2) + "'\n", "f.yaml")  # counted in bytes, not characters
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" + b"#" * MAX_BYTES)
    with pytest.raises(YamlError, match=rf"^{big}: larger than 1048576 bytes \(1 MiB\)$"):
        yamlfile.read(big)


def test_files_that_are_not_plain_utf8_files(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"a: 1\nname: caf\xe9\n")
    with pytest.raises(YamlError, match=rf"^{bad}: line 2, column 10: invalid UTF-8 \(byte 0xe9\)$"):
        yamlfile.read(bad)
    with pytest.raises(YamlError, match=rf"^{tmp_path}: cannot read: is a directory$"):
        yamlfile.read(tmp_path)
    with pytest.raises(YamlError, match=r"^/dev/zero: cannot read: not a regular file or a pipe$"):
        yamlfile.read("/dev/zero")
    with pytest.raises(YamlError, match=rf"^{tmp_path}/absent.yaml: cannot read: No such file or directory$"):
        yamlfile.read(tmp_path / "absent.yaml")


def test_a_pipe_is_read_up_to_the_bound(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    for payload, expected in ((b"a: 1\n", {"a": 1}), (b"#" * (2 * MAX_BYTES), None)):
        os.mkfifo(fifo)
        writer = threading.Thread(target=_write_ignoring_a_closed_pipe, args=(fifo, payload))
        writer.start()
        try:
            if expected is None:
                with pytest.raises(YamlError, match=rf"^{fifo}: larger than 1048576 bytes"):
                    yamlfile.read(fifo)
            else:
                assert yamlfile.read(fifo) == expected
        finally:
            writer.join()
            fifo.unlink()


def _write_ignoring_a_closed_pipe(path: Path, payload: bytes) -> None:
    with contextlib.suppress(BrokenPipeError), open(path, "wb") as pipe:
        pipe.write(payload)
