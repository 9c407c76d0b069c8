"""The forms kernel log lines come in, and the message in each: raw /dev/kmsg records and their escapes, the heads
dmesg, syslog daemons and journalctl put before the kernel's message, journal JSON, a line some other program
logged, and what makes a line of bytes text.  ``records`` makes records of them."""

from __future__ import annotations

import json
import re

MAX_LINE_BYTES = 64 * 1024
MAX_MESSAGE_CHARS = 2048
_JUNK_BYTES = bytes(b for b in range(32) if b not in (9, 10, 13)) + b"\x7f"
_JUNK_TO_REPLACEMENT = {b: "\ufffd" for b in _JUNK_BYTES}
_TEXT_BYTES = bytes(b for b in range(256) if b not in _JUNK_BYTES)

# Raw /dev/kmsg: "PRIO,SEQ,USEC,FLAGS[,...];text" (the kernel prints 64-bit numbers: at most 20 digits).
KMSG_HEAD = r"(\d{1,20}),(\d{1,20}),(\d{1,20}),[^;\n]{0,256};"
KMSG_HEAD_RE = re.compile(KMSG_HEAD)
KMSG_HEAD_BYTES_RE = re.compile(KMSG_HEAD.encode())
# /dev/kmsg escapes every byte below 0x20 or above 0x7e, and the backslash itself, as \xNN
# (Documentation/ABI/testing/dev-kmsg; msg_add_ext_text() in kernel/printk/printk.c).
_KMSG_ESCAPE_RE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_KEPT_CONTROLS = (0x09, 0x0A)  # tab and newline are decoded; other control bytes stay written as \xNN

# journalctl -o json-seq puts RS (0x1e, read as U+FFFD) before each entry.
JSON_STREAM_HEADS = ("\x1e{", "\ufffd{")


# A month or weekday name in any language strftime writes (Nov, Mär, фев, mrt.).
_NAME = r"[^\W\d_]{2,4}\.?"
# A syslog line's head before its program tag: the time and a host name, which `journalctl --no-hostname` leaves
# out.  The time as syslog daemons and every `journalctl -o short-*` mode write it: traditional (short; with
# microseconds, short-precise), ISO 8601 with T or a space (short-iso, short-iso-precise, RFC 3339), with the
# weekday and zone (short-full, with-unit: "Mon 2026-11-30 04:37:39 UTC"), seconds since the epoch (short-unix),
# or as Incus OS exports it ("04 Aug, 14:03:32").
_SYSLOG_TIME = (rf"(?:{_NAME} +\d+ \d\d:\d\d:\d\d(?:\.\d{{1,9}})?"
                rf"|(?:{_NAME} )?\d{{4}}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{{1,9}})?"
                r"(?:Z| ?[+-]\d\d(?::?\d\d)?| [A-Za-z]{1,6})?"
                rf"|\d{{1,12}}\.\d{{1,9}}|\d\d {_NAME}, \d\d:\d\d:\d\d)")
# journalctl -o short-monotonic and short-delta: "[  123.456789] host kernel: ", "[  123.456789 <  1.000000 >]
# host kernel: " (the first entry padded with spaces instead), which dmesg's own "[seconds] " head only differs
# from by what follows it.
_MONOTONIC = r"\[ *\d+\.\d+(?: <[ \d.]+>| +)?\]"
_HOST = r"(?: [^\s:](?:\S*[^\s:])?)?"
_SYSLOG_HEAD = rf"(?:{_SYSLOG_TIME}|{_MONOTONIC}){_HOST} "
_KERNEL_TAG = r"kernel(?:\[\d+\])?: "
_CALLER = r"\[ *[TC]\d{1,10}\]"  # printk's caller (CONFIG_PRINTK_CALLER): "[  T123]", "[    C3]"

# The times dmesg writes before a message: [seconds], -T (ctime), -H (a time, then deltas), --time-format delta
# and iso (a comma before the microseconds, as no syslog head has), each maybe followed by the printk caller
# (CONFIG_PRINTK_CALLER: "[    5.123456][  T123] ").
_DMESG_TIME = (rf"(?:(?:\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{{1,9}})?\])?\[ *\d+\.\d+\]"
               rf"|\[{_NAME} {_NAME} [ \d]\d \d\d:\d\d:\d\d \d{{4}}\]"
               rf"|\[ *\+ *\d+\.\d+\]|\[{_NAME} ?\d\d? \d\d:\d\d\]|\[< *\d+\.\d+>\]"
               rf"|\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{{1,9}}(?:[+-]\d\d:?\d\d)?)(?: ?{_CALLER})? ")

# Prefixes that dmesg, syslog daemons and `dmesg -x/-r/-T` put before the kernel's text; also a bare "kernel: "
# (a syslog line pasted without its time and host) and `talosctl dmesg`'s "host: kern:  warn: [RFC 3339 time]: ".
PREFIX_RE = re.compile(
    r"(?:<\d+>)?"                                                     # dmesg -r: <prio>
    r"(?:[a-z]+ *:[a-z]+ *: |[^\s:]+: kern: *[a-z]+: \[[\dT:.Z+-]{1,40}\]: )?"  # dmesg -x: "kern  :warn  : "
    rf"(?P<syslog>(?:{_SYSLOG_HEAD})?{_KERNEL_TAG}(?:{_CALLER} )?)?"  # syslog: "Nov 30 04:37:39 host kernel: "
    rf"(?:{_DMESG_TIME})?"
)

# A syslog line some other program wrote ("Nov 30 04:37:39 host job[4242]: ..."): not the kernel's, whatever it
# says (any local user can log "NVRM: Xid ..."); it becomes an empty record, which no rule matches.  After a
# monotonic time only with a host and a [pid]: dmesg's "[  5.1] usb 1-1: ..." has the same shape without them.
_IDENT = r"[^\s:\[\]]{1,64}"
OTHER_PROGRAM_RE = re.compile(
    rf"(?:<\d+>)?(?:{_SYSLOG_TIME}{_HOST} (?!{_KERNEL_TAG}){_IDENT}(?:\[\d{{1,10}}\])?"
    rf"|{_MONOTONIC} [^\s:](?:\S*[^\s:])? (?!{_KERNEL_TAG}){_IDENT}\[\d{{1,10}}\]): ")


def maybe_other_program(line: str) -> bool:
    """False where ``OTHER_PROGRAM_RE`` cannot match, cheaply: a line that starts with "[" (dmesg's, nearly every
    line) can only be journalctl's short-monotonic "[  5.1] host job[42]: ", so it needs "]: "."""
    return not line.startswith("[") or "]: " in line


def is_text(data: bytes) -> bool:
    """True if ``data`` holds no control bytes other than tab, CR and LF (UTF-8 validity is not checked)."""
    return not data.translate(None, _TEXT_BYTES)  # what is left is the junk, and writes no copy of the text


def as_text(line: bytes) -> str | None:
    """One line as text, its invalid UTF-8 and control bytes (other than tab and CR) each written as U+FFFD.

    A few bad bytes never hide a line: a process name is set by whoever runs the process, and syslog daemons
    write it raw, so one byte in it must not keep an Xid or an OOM kill from matching.  None for a line over
    64 KiB, or one that is mostly junk (more than a quarter replaced: binary data, not a message).
    """
    if len(line) > MAX_LINE_BYTES:
        return None
    if is_text(line):
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError:
            pass
    text = line.decode("utf-8", "replace").translate(_JUNK_TO_REPLACEMENT)
    return None if 4 * text.count("\ufffd") > len(text) else text


def text_or_reason(line: bytes) -> tuple[str | None, str]:
    """``(text, "")`` for a usable line, else ``(None, reason)``: ``too_long`` or ``not_text``."""
    if len(line) > MAX_LINE_BYTES:
        return None, "too_long"
    text = as_text(line)
    return (text, "") if text is not None else (None, "not_text")


def unescape_kmsg(text: str) -> str:
    """The real text of a /dev/kmsg record: ``\\xNN`` escapes decoded as bytes, then as UTF-8.

    ``\\x0a`` becomes a newline (one record, several lines: newer NVIDIA drivers
    print those), ``\\x5c`` a backslash, ``\\xc3\\xa9`` an "é"; a control byte other
    than tab and newline stays written as ``\\xNN`` so that no message carries one.
    """
    if "\\x" not in text:
        return text

    def byte(match: re.Match[bytes]) -> bytes:
        value = int(match[1], 16)
        return match[0] if (value < 0x20 and value not in _KEPT_CONTROLS) or value == 0x7F else bytes((value,))

    return _KMSG_ESCAPE_RE.sub(byte, text.encode("utf-8", "surrogatepass")).decode("utf-8", "replace")

def kmsg_message(head: str, match: re.Match[str], continuation_lines: list[str]) -> tuple[str, str | None]:
    """The message of a /dev/kmsg header line that ``KMSG_HEAD_RE`` matched (``match``), and the ``DEVICE=`` value
    among its continuation lines."""
    message = unescape_kmsg(head[match.end():match.end() + 4 * MAX_MESSAGE_CHARS])[:MAX_MESSAGE_CHARS]
    device = next((unescape_kmsg(extra[len(" DEVICE="):len(" DEVICE=") + 256].rstrip("\r"))
                   for extra in continuation_lines if extra.startswith(" DEVICE=")), None)
    return message, device


def line_message(line: str) -> tuple[str, str | None]:
    """The message, and the device the kernel tagged it with, of one line of dmesg text, syslog, raw kmsg or
    ``journalctl -o json`` output; an empty message for a line another program logged."""
    line = line[:MAX_LINE_BYTES].rstrip("\r\n")
    if line.startswith(JSON_STREAM_HEADS):
        line = line[1:]
    if line.startswith("{"):
        found = _json_message(line)
        if found is not None:
            return found
    kmsg = KMSG_HEAD_RE.match(line)
    if kmsg is not None:
        return kmsg_message(line, kmsg, [])
    prefix = PREFIX_RE.match(line)
    start = prefix.end() if prefix else 0
    if (prefix is None or prefix["syslog"] is None) and maybe_other_program(line) and OTHER_PROGRAM_RE.match(line):
        return "", None
    return line[start:start + MAX_MESSAGE_CHARS], None


def _json_message(line: str) -> tuple[str, str | None] | None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, a number Python refuses to parse, nesting too deep
        return None
    if not isinstance(entry, dict):
        return None
    if entry.get("_TRANSPORT", "kernel") != "kernel":  # an entry some program logged: not the kernel's
        return "", None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald's form of a message that is not valid UTF-8
        message = bytes(b & 0xFF for b in message[:4 * MAX_MESSAGE_CHARS] if isinstance(b, int)).decode(
            "utf-8", "replace")
    if not isinstance(message, str):
        return None
    device = entry.get("_KERNEL_DEVICE")
    return message[:MAX_MESSAGE_CHARS], device if isinstance(device, str) else None
