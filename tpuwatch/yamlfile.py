"""The one YAML loader of the config, the web config and the rule files: bounded, plain data, errors with a place.

What it refuses, each as ``FILE: line L, column C: reason`` (a YamlError):

- a file over MAX_BYTES (1 MiB; only that much plus one byte is read, from a
  pipe too), a device or a directory (``/dev/zero`` is never streamed, a
  terminal never waited on), invalid UTF-8, NUL bytes and the other characters
  YAML does not allow;
- nesting deeper than MAX_DEPTH, more than MAX_NODES values once aliases are
  expanded (an alias bomb stops there, after that much work), an alias to a
  node that contains it (a recursive structure);
- tags other than YAML's plain data (``!!python/object``, ``!!binary``,
  ``!!set``, ``!!timestamp`` ...): values are only mappings, lists, strings,
  integers, finite floats, booleans and null; a date stays a string;
- duplicate keys (YAML requires unique keys; PyYAML alone keeps the last);
- integers outside the 64-bit range and floats that are not finite
  (``1.0e+400``, ``.inf``, ``.nan``).

Merge keys (``<<: *base``) and anchors work as in PyYAML, within the bounds.
"""

from __future__ import annotations

import math
import os
import re
import stat
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from tpuwatch.schema import ConfigError
from tpuwatch.syntax import short

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000
_INT_RANGE = (-(1 << 63), (1 << 63) - 1)
_MAX_INT_TEXT = 100  # characters of an integer scalar; a 64-bit one in binary with separators fits

_CORE = "tag:yaml.org,2002:"
_MERGE = _CORE + "merge"
_TAGS = {_CORE + name for name in ("null", "bool", "int", "float", "str", "seq", "map", "merge")}
# The characters YAML allows in a stream (its c-printable set), as PyYAML's reader checks them.
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class YamlError(ConfigError):
    """A YAML file that cannot be used: ``str()`` is ``FILE: line L, column C: reason`` (``FILE: reason``
    where there is no place, as for a file too large)."""

    def __init__(self, filename: str, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.filename, self.line, self.column = filename, line, column
        super().__init__(f"{filename}: line {line}, column {column}" if line is not None else filename, reason)


class _Refused(yaml.MarkedYAMLError):
    """A bound or a rule of this loader, raised at a place in the text."""

    def __init__(self, reason: str, mark: Any) -> None:
        super().__init__(problem=reason, problem_mark=mark)


class _Bounded(Composer, SafeConstructor, Resolver):
    """Composes with bounds on depth and expanded size; constructs plain data only."""

    def _start(self) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._built = 0  # values composed so far, each alias counted as the whole node it names
        self._sizes: dict[Node, int] = {}  # expanded size of every finished node

    def _count(self, values: int, mark: Any) -> None:
        self._built += values
        if self._built > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values (an alias counts as all the values it stands for)", mark)

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:
                if target not in self._sizes:
                    raise _Refused(f"alias *{event.anchor[:40]} is inside the node it names (a recursive "
                                   "structure)", event.start_mark)
                self._count(self._sizes[target], event.start_mark)
            node: Node = super().compose_node(parent, index)
            return node
        if event.tag not in (None, "!") and event.tag not in _TAGS:
            tag = "!!" + event.tag[len(_CORE):] if event.tag.startswith(_CORE) else event.tag
            raise _Refused(f"tag {short(tag)[1:-1]} is not allowed (plain data only: mappings, lists, strings, "
                           "numbers, booleans, null)", event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self._depth += 1
        before = self._built
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._count(1, node.start_mark)
        self._sizes[node] = self._built - before
        if isinstance(node, ScalarNode) and _SURROGATE.search(node.value):  # an escape such as "\ud800"
            raise _Refused("a lone surrogate escape is not a Unicode character", node.start_mark)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node: MappingNode = super().compose_mapping_node(anchor)
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a list or mapping as a key: construction refuses it (unhashable)
            key = "<<" if key_node.tag == _MERGE else self.construct_object(key_node, deep=True)
            if key in first:
                raise _Refused(f"duplicate key {short(key)} (first at line {first[key]})", key_node.start_mark)
            first[key] = key_node.start_mark.line + 1
        return node

    def construct_bounded_int(self, node: ScalarNode) -> int:
        text = self.construct_scalar(node)
        if len(text) > _MAX_INT_TEXT:
            raise _Refused(f"integer of {len(text)} characters is out of the 64-bit range", node.start_mark)
        try:
            value: int = SafeConstructor.construct_yaml_int(self, node)
        except (ValueError, IndexError):
            raise _Refused(f"invalid integer {short(text)}", node.start_mark) from None
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise _Refused(f"integer {short(text)} is out of the 64-bit range", node.start_mark)
        return value

    def construct_bounded_float(self, node: ScalarNode) -> float:
        text = self.construct_scalar(node)
        try:
            value: float = SafeConstructor.construct_yaml_float(self, node)
        except (ValueError, IndexError):
            raise _Refused(f"invalid number {short(text)}", node.start_mark) from None
        if not math.isfinite(value):
            raise _Refused(f"number {short(text)} is not finite", node.start_mark)
        return value

    def construct_checked_bool(self, node: ScalarNode) -> bool:
        text = self.construct_scalar(node)
        if text.lower() not in self.bool_values:
            raise _Refused(f"invalid boolean {short(text)}", node.start_mark)
        return bool(self.bool_values[text.lower()])


_Bounded.add_constructor(_CORE + "int", _Bounded.construct_bounded_int)
_Bounded.add_constructor(_CORE + "float", _Bounded.construct_bounded_float)
_Bounded.add_constructor(_CORE + "bool", _Bounded.construct_checked_bool)
# Plain scalars resolve to null, booleans, numbers or strings only: a date or ``=`` stays a string.
_Bounded.yaml_implicit_resolvers = {
    first: kept for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    if (kept := [(tag, regex) for tag, regex in resolvers if tag in _TAGS])
}


class _PythonLoader(_Bounded, Reader, Scanner, Parser):
    """PyYAML's pure-Python parser under the bounds."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        self._start()


LOADERS: list[type[_Bounded]] = [_PythonLoader]
try:
    from yaml.cyaml import CParser
except ImportError:  # PyYAML built without libyaml
    pass
else:

    class _LibyamlLoader(_Bounded, CParser):
        """libyaml's parser (several times faster) under the same bounds: only its events are used."""

        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            self._start()

    LOADERS.insert(0, _LibyamlLoader)


def load(text: str, filename: str, loader: type[_Bounded] | None = None) -> Any:
    """The plain data of one YAML document; YamlError naming ``filename`` and the place on any problem.

    ``loader`` is one of LOADERS (tests run each); by default libyaml's parser when PyYAML has it.
    """
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlError(filename, f"larger than {MAX_BYTES} bytes (1 MiB)")
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        char = bad.group()
        what = "a NUL byte" if char == "\0" else f"character U+{ord(char):04X}"
        raise YamlError(filename, f"{what} is not allowed in YAML", *_place(text, bad.start()))
    instance = (loader or LOADERS[0])(text)
    try:
        return instance.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and exc.problem.startswith("but "):  # "expected X, but found Y"
            reason = f"{exc.context}, {exc.problem}"
        if isinstance(exc, (yaml.scanner.ScannerError, yaml.parser.ParserError)):
            reason = f"YAML syntax error: {reason}"
        if mark is None:
            raise YamlError(filename, reason) from None
        raise YamlError(filename, reason, mark.line + 1, mark.column + 1) from None
    except yaml.YAMLError as exc:  # a reader error the check above did not foresee: no place known
        raise YamlError(filename, f"invalid YAML: {exc}") from None
    finally:
        instance.dispose()


def read_text(path: str | os.PathLike[str], filename: str | None = None) -> str:
    """The text of a regular file or a pipe, at most MAX_BYTES, strict UTF-8; YamlError otherwise."""
    filename = os.fspath(path) if filename is None else filename
    try:
        # A pipe (--config /dev/stdin, a named pipe) is opened blocking, so that it is read once its writer comes,
        # not found empty; anything else without blocking, so that a device or a pipe put there meanwhile cannot
        # hang the read.
        pipe = stat.S_ISFIFO(os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if pipe else os.O_NONBLOCK))
    except OSError as exc:
        raise YamlError(filename, f"cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte in the path
        raise YamlError(filename, "cannot read: the path contains a NUL byte") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode) and not stat.S_ISFIFO(mode):
        os.close(fd)
        raise YamlError(filename, "cannot read: " + ("is a directory" if stat.S_ISDIR(mode)
                                                   else "not a regular file or a pipe"))
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_BYTES + 1)
        except OSError as exc:
            raise YamlError(filename, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise YamlError(filename, f"larger than {MAX_BYTES} bytes (1 MiB)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start].decode("utf-8")
        raise YamlError(filename, f"invalid UTF-8 (byte 0x{data[exc.start]:02x})", *_place(before, len(before))) \
            from None


def read(path: str | os.PathLike[str], filename: str | None = None) -> Any:
    """The plain data of the YAML file at ``path`` (see ``read_text`` and ``load``)."""
    filename = os.fspath(path) if filename is None else filename
    return load(read_text(path, filename), filename)


def _place(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of ``text[index]``."""
    line_start = text.rfind("\n", 0, index) + 1
    return text.count("\n", 0, index) + 1, index - line_start + 1
