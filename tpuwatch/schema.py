"""Turn plain YAML data into typed dataclasses, naming the key path of every error.

Field types drive validation.  Besides ``int``, ``float``, ``bool``, ``str``,
``Literal[...]``, ``list[...]``, ``dict[...]``, ``X | None`` and nested
dataclasses, a field may be ``Annotated`` with one of the checks below
(``Duration``, ``Range``, ``FilePath``, ``ListenAddress``, ``Url``, ``Regex``,
``Secret``).  A string never holds a NUL byte, and a list of strings also takes
one string, as a list of one.

Key paths have one style: ``notify[0].match.severity`` (list items by index,
mapping keys after a dot), a key that is not a plain name in brackets and
quotes: ``notify[0].match["app.kubernetes.io/name"]``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import types
import typing
import warnings
from collections.abc import Iterable
from typing import Any, Literal, Union
from urllib.parse import urlsplit

from tpuwatch.syntax import format_duration, no_unit, one_line, parse_duration, parse_listen_address, short

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_KEY_SHOWN = 60  # characters of a key shown in a key path; a longer one is cut, in brackets
_SUGGEST_CUTOFF = 0.75  # difflib's ratio: sorce/source 0.91, lsiten/listen 0.83, but gpu/tpu 0.67 is no typo


def did_you_mean(word: Any, candidates: Iterable[Any]) -> str:
    """``; did you mean 'source'?`` for the string of ``candidates`` that ``word`` is most likely a misspelling
    or a shortening (``warn``) of, or ``""`` when none is close.  Case and ``-`` for ``_`` do not count:
    ``NVIDIA`` is ``nvidia``."""
    if not isinstance(word, str):
        return ""
    folded = {_fold(c): c for c in candidates if isinstance(c, str)}
    typed = _fold(word)
    close = difflib.get_close_matches(typed, folded, n=1, cutoff=_SUGGEST_CUTOFF)
    longer = [c for c in folded if c.startswith(typed)] if len(typed) >= 3 else []
    found = close[0] if close else longer[0] if len(longer) == 1 else None
    return f"; did you mean {folded[found]!r}?" if found else ""


def _fold(word: str) -> str:
    return word.lower().replace("-", "_")


class ConfigError(ValueError):
    """A config value that cannot be used; ``str()`` is ``path.to.key: reason``, always one line."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(one_line(f"{path}: {reason}" if path else reason))


class Check:
    """Base of the ``Annotated`` markers: convert and validate one value.

    A check that ``parses`` sees the raw YAML value before the base type is checked.
    """

    parses = False

    def convert(self, value: Any) -> Any:
        return value


@dataclasses.dataclass(frozen=True)
class Duration(Check):
    """A duration with its unit (``10s``; a bare number only for 0) converted to float seconds, within bounds."""

    parses = True

    minimum: float = 0.0
    maximum: float = float("inf")

    def convert(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"expected a duration like 10s, got {_kind(value)}")
        if not isinstance(value, str) and value != 0:
            raise ValueError(no_unit(short(value)))
        seconds = parse_duration(value) if isinstance(value, str) else 0.0
        if not self.minimum <= seconds <= self.maximum:
            raise ValueError(
                f"duration {format_duration(seconds)} out of range "
                f"{format_duration(self.minimum)}..{format_duration(self.maximum)}"
            )
        return seconds


@dataclasses.dataclass(frozen=True)
class OneOf(Check):
    """A name among ``choices``: a ``Literal`` whose names come from a registry's keys."""

    parses = True

    choices: tuple[str, ...] = ()

    def convert(self, value: Any) -> str:
        if value not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}; got {short(value)}"
                             f"{did_you_mean(value, self.choices)}")
        return str(value)


@dataclasses.dataclass(frozen=True)
class Range(Check):
    """A number within ``minimum..maximum``."""

    minimum: float = float("-inf")
    maximum: float = float("inf")

    def convert(self, value: Any) -> Any:
        if not self.minimum <= value <= self.maximum:
            raise ValueError(f"{short(value)} out of range {self.minimum:g}..{self.maximum:g}")
        return value


@dataclasses.dataclass(frozen=True)
class FilePath(Check):
    """A file or directory path (or glob): not empty and, unless ``absolute`` is False, absolute.

    ``home`` also takes ``~/...``, for keys whose paths are expanded with the user's home.
    """

    absolute: bool = True
    home: bool = False

    def convert(self, value: Any) -> str:
        if not value:
            raise ValueError("must not be empty")
        if self.absolute and not os.path.isabs(os.path.expanduser(value) if self.home else value):
            raise ValueError(f"must be an absolute path (starting with /{' or ~' if self.home else ''}), "
                             f"got {short(value)}")
        return value


class ListenAddress(Check):
    """``host:port`` for a listening socket."""

    def convert(self, value: Any) -> str:
        parse_listen_address(value)
        return value


class Url(Check):
    """An absolute http or https URL with a host."""

    def convert(self, value: Any) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"[\x00-\x20\x7f]", value):
            raise ValueError(f"invalid URL {short(redact_url(value))} (need http:// or https://, a host, "
                             "no spaces or control characters)")
        return value


class Regex(Check):
    """A Python regular expression that compiles."""

    def convert(self, value: Any) -> str:
        try:
            with warnings.catch_warnings():  # "possible nested set" and the like: not this message's business
                warnings.simplefilter("ignore")
                re.compile(value)
        except (re.error, OverflowError) as exc:
            raise ValueError(f"invalid regular expression: {exc}") from None
        except RecursionError:
            raise ValueError("invalid regular expression: nested too deeply") from None
        return value


class Secret(Check):
    """A value never printed: ``config show`` writes ``<secret>``."""


SECRET_PLACEHOLDER = "<secret>"


def redact_url(url: str) -> str:
    """Hide the password of ``user:password@`` in a URL."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", f":{SECRET_PLACEHOLDER}@", 1)
    return parts._replace(netloc=netloc).geturl()


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def build(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; raise ConfigError naming the failing key path."""
    return _convert(cls, data, path)


def build_field(cls: type, name: str, value: Any) -> Any:
    """``value`` checked and converted as field ``name`` of dataclass ``cls`` is by ``build``; ConfigError with no
    key path (the caller names where the value came from, a command-line flag) if it cannot be used."""
    return _convert(_hints(cls)[name], value, "")


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base, *markers = typing.get_args(hint)
        checks = [m for m in markers if isinstance(m, Check)]
        for check in checks:
            if check.parses:
                value = _check(check, value, path)
        value = _convert(base, value, path)
        for check in checks:
            if not check.parses:
                value = _check(check, value, path)
        return value
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _convert(inner, value, path)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(path, f"must be one of {', '.join(map(str, choices))}; got {short(value)}"
                                    f"{did_you_mean(value, choices)}")
        return value
    if origin is list:
        (inner,) = typing.get_args(hint)
        if isinstance(value, str) and _takes_str(inner):
            return [_convert(inner, value, path)]
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {_kind(value)}")
        return [_convert(inner, item, f"{path}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_kind(value)}")
        return {_convert(key_hint, k, join_key(path, k)): _convert(value_hint, v, join_key(path, k))
                for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _build_dataclass(hint, value, path)
    return _convert_scalar(hint, value, path)


def _check(check: Check, value: Any, path: str) -> Any:
    try:
        return check.convert(value)
    except ValueError as exc:
        raise ConfigError(path, str(exc)) from None


def _takes_str(hint: Any) -> bool:
    return hint is str or (typing.get_origin(hint) is typing.Annotated and typing.get_args(hint)[0] is str)


def _convert_scalar(hint: Any, value: Any, path: str) -> Any:
    if hint is str and isinstance(value, str) and "\0" in value:
        raise ConfigError(path, "a NUL byte is not allowed")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any or (isinstance(value, hint) and not (hint is int and isinstance(value, bool))):
        return value
    expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    raise ConfigError(path, f"expected {expected.get(hint, hint.__name__)}, got {_kind(value)}")


def _build_dataclass(cls: Any, value: Any, path: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a mapping, got {_kind(value)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.metadata.get("key", True)}
    for key in value:
        if key not in fields:
            hint = did_you_mean(key, fields) or f" (known keys: {', '.join(sorted(fields))})"
            raise ConfigError(join_key(path, key), f"unknown key{hint}")
    for name, spec in fields.items():
        if name not in value and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ConfigError(join_key(path, name), "required key missing")
    kwargs = {name: _convert(hints[name], value[name], join_key(path, name)) for name in fields if name in value}
    instance = cls(**kwargs)
    validate = getattr(instance, "validate", None)
    if validate is not None:
        validate(path)
    return instance


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The field types of dataclass ``cls`` (resolving them is most of the cost of a small build)."""
    return typing.get_type_hints(cls, include_extras=True)


def join_key(path: str, key: Any) -> str:
    """``path`` and one mapping key in the key-path style: ``a.b``, or ``a["x.y"]`` for a key not a plain name
    (``a["xxx..."]`` cut, for one too long to show)."""
    if isinstance(key, str) and len(key) <= _KEY_SHOWN and _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    text = key if isinstance(key, str) else short(key)
    return f"{path}[{json.dumps(text[:_KEY_SHOWN] + ('...' if len(text) > _KEY_SHOWN else ''), ensure_ascii=False)}]"


def dump(instance: Any) -> Any:
    """Plain data for ``instance`` in config syntax, with secrets and URL passwords redacted."""
    if not dataclasses.is_dataclass(instance):
        if isinstance(instance, list):
            return [dump(item) for item in instance]
        return instance
    hints = _hints(instance.__class__)
    out: dict[str, Any] = {}
    for field in dataclasses.fields(instance):
        if not field.metadata.get("key", True):
            continue  # not a key of the file (metadata {"key": False}): its owner dumps it
        value = getattr(instance, field.name)
        hint = hints[field.name]
        if isinstance(value, list) and typing.get_origin(hint) is list:
            out[field.name] = [dump(_redacted(item, typing.get_args(hint)[0])) for item in value]
        else:
            out[field.name] = dump(_redacted(value, hint))
    return out


def _redacted(value: Any, hint: Any) -> Any:
    """``value`` as ``config show`` prints it: secrets hidden, durations spelled, URL passwords hidden."""
    markers = _markers(hint)
    if value is None:
        return None
    if any(isinstance(m, Secret) for m in markers):
        return SECRET_PLACEHOLDER
    if any(isinstance(m, Duration) for m in markers):
        return format_duration(value)
    if any(isinstance(m, Url) for m in markers):
        return redact_url(value)
    return value


def _markers(hint: Any) -> list[Any]:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return [m for arg in typing.get_args(hint) for m in _markers(arg)]
    if typing.get_origin(hint) is typing.Annotated:
        return list(typing.get_args(hint)[1:])
    return []
