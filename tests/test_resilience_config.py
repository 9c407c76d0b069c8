"""Config input cannot hurt tpuwatch: fuzzed configs, web configs and rule files, bombs, huge files, a bad reload.

Every generated file goes through ``tpuwatch config check`` (in-process, and a sample through the
real command line): the answer is exit 0, or exit 2 with exactly one line ``...: reason``; never a
traceback or an internal error.  The cases are structure-aware mutations of valid files (wrong
types, huge, deep and odd values, NUL bytes, unicode, 1e400/nan/inf, giant integers, anchors,
aliases and merge keys, tags, duplicate keys, binary, truncation, empty files).

The seed is fixed, so CI runs the same cases every time.  A longer run (docs/configuration.md):
``TPUWATCH_FUZZ_CASES=20000 TPUWATCH_FUZZ_SEED=$RANDOM pytest tests/test_resilience_config.py -k fuzz``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml

from tpuwatch import cli, yamlfile
from tpuwatch import config as config_module
from tpuwatch.alerting.rules import default_rules_text
from tpuwatch.config import Config
from tpuwatch.kernel_log.rulefile import SHIPPED_DIR
from tpuwatch.schema import ConfigError, dump

from certs import make_tls_files
from conftest import SIM_FAST, DaemonProcess, wait_until

SEED = int(os.environ.get("TPUWATCH_FUZZ_SEED", "14"))
CASES = int(os.environ.get("TPUWATCH_FUZZ_CASES", "1000"))
SUBPROCESS_EVERY = max(1, CASES // 8)  # this many cases per kind also go through the real command line
PARTS = 4  # each kind's cases in four tests, so that pytest-xdist's workers share them
ONE_LINE = re.compile(r"tpuwatch: config error: [^\n]+: [^\n]+")
QUIET = {"alerting": {"default_rules": False, "rule_files": []}, "kernel_log": {"rules_dirs": []}}


def alias_bomb(levels: int = 9, width: int = 9, key: str = "lol") -> str:
    """A value in the "billion laughs" shape: ``width``**``levels`` strings once expanded."""
    text = f"&{key}0 [" + ", ".join(["lol"] * width) + "]"
    for i in range(1, levels):
        text = f"&{key}{i} [{text}, " + ", ".join([f"*{key}{i - 1}"] * (width - 1)) + "]"
    return text


# --- what the fuzzer starts from: valid files of each kind ---------------------------------------------------


def _config_bases(tls: Path) -> list[Any]:
    full = {**dump(Config()), **QUIET}
    receivers = {**QUIET, "notify": [
        {"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/hook", "headers": {"X-Team": "ml"},
         "match": {"severity": "critical|warning"}, "send_resolved": False},
        {"name": "am", "type": "alertmanager", "urls": ["http://am-0:9093", "http://am-1:9093"]},
        {"name": "pd", "type": "pagerduty", "routing_key": "R0UTING"},
        {"name": "chat", "type": "slack", "url": "https://hooks.example/x"}]}
    sim = {**SIM_FAST, **QUIET, "devices": {"backend": "sim", "sim": {"count": 8, "scenario": "hbm-leak",
                                                                       "fault_device": 3, "chip": "v6e"}}}
    web = {**QUIET, "web_config": str(tls / "web.yml"), "state_dir": "/var/lib/x", "paths": {"sysfs": "/sys"}}
    return [full, receivers, sim, web, QUIET]


def _web_bases(tls: Path) -> list[Any]:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    return [{"basic_auth_users": {"prometheus": hashed, "ops": hashed}},
            {"tls_server_config": {"cert_file": str(tls / "server.pem"), "key_file": str(tls / "server.key"),
                                   "client_auth_type": "RequireAndVerifyClientCert",
                                   "client_ca_file": str(tls / "ca.pem"), "min_version": "TLS13"},
             "basic_auth_users": {"u": hashed}},
            {"tls_server_config": {"cert_file": "server.pem", "key_file": "server.key"}}]


def _alert_rule_bases() -> list[Any]:
    return [yaml.safe_load(default_rules_text()),
            {"rules": [{"alert": "X", "metric": "tpuwatch_device_up", "op": "==", "threshold": 0, "for": "1m",
                        "labels": {"team": "ml"}, "annotations": {"summary": "{{ $labels.device }} {{ $value }}"}}]}]


def _kernel_rule_bases() -> list[Any]:
    return [yaml.safe_load(p.read_text()) for p in sorted(SHIPPED_DIR.glob("*.yaml"))]


# --- mutations ------------------------------------------------------------------------------------------------

ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 7, 64, 65, (1 << 63) - 1, -(1 << 63), 10 ** 18, 0.0, -0.0, 1e-300, 2.5, 1e300,
    "", " ", "0", "10", "-1s", "1e3s", "10 s", "500ms", "0s", "1h30m", "9" * 30 + "d", "∞", "NaN", "yes", "off",
    "~", "null", "relative/path", "/abs/path", "~/x/*.yaml", "/", "/a\x00b", "a\nb", "tab\there", "\x07bell",
    "\u202eevil\u0644", "\U0001f600" * 20, "e\u0301", "x" * 70_000, "http://", "ftp://x/", "http://u:p@h:99999/x",
    "http://h/\r\nX: y", "[::1]:9847", ":0", "localhost:65536", "127.0.0.1:9847", "(", "(?P<x>a)", "a{99999999999}",
    "[[:alpha:]]", "(" * 50 + ")" * 50, "$2b$10$" + "a" * 53, "critical", "webhook", "sim", "TLS13", "%s%n",
    "{{ $labels.x | nosuch }}", [], {}, [[]], [None], {"a": {"b": {"c": {}}}}, list(range(300)),
    {str(i): i for i in range(50)}, ["a"] * 3, [{"name": "x"}], {1: 2}, {None: 1}, {True: "x"},
]
# Spelled into the YAML text itself: what yaml.safe_dump would never write.
ODD_TEXT = [
    "!!python/object/apply:os.system ['true']", "!!python/name:os.system", "!!binary aGVsbG8=", "!!set {a, b}",
    "!!timestamp 2001-12-14", "!!omap [a: 1]", "!!pairs [a: 1]", "!local x", "!!int 'abc'", "!!int ''",
    "!!float ''", "!!bool maybe", "!!str", "!!null x", "!!map [1]", "!!seq {a: 1}", "1.0e+400", "-1.0e+400", ".inf",
    "-.inf", ".nan", "9" * 5000, "-" + "9" * 4400, "0x" + "f" * 40, "0b" + "1" * 80, "1:2:3:4:5:6:7:8:9:10:11",
    "0o17", "017", "*undefined", "&a [*a]", "&m {<<: *m}", "{<<: 5}", "{<<: [1]}", "\"\\0\"", "\"\\ud800\"",
    "\"\\U0010FFFF\"", "\"\\x00/etc\"", "'unterminated", "[1, 2", "{a: 1", "|\n  block\n", ">-\n  folded\n",
    "? [complex]\n  : key", "[" * 200 + "]" * 200, "- " * 100 + "x", alias_bomb(), alias_bomb(levels=5),
    "\"" + "\\t" * 1000 + "\"", "@reserved", "`reserved", "% directive", "---", "...",
]
BYTES = [b"\x00", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x1b[2J", b"\r", b"\t", b"\xef\xbb\xbf", b"\x85",
         b"\xc2\xa0", b"\n---\n", b"\n...\n", b"&", b"*", b"!", b"|", b">", b"%", b"@", b"{", b"[", b":", b"#", b"'"]


def _positions(node: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) slot in a plain-data tree."""
    if isinstance(node, dict):
        for key in list(node):
            out.append((node, key))
            _positions(node[key], out)
    elif isinstance(node, list):
        for index in range(len(node)):
            out.append((node, index))
            _positions(node[index], out)
    return out


def _odd(rng: random.Random, among: int = len(ODD_VALUES)) -> Any:
    return copy.deepcopy(rng.choice(ODD_VALUES[:among]))  # a copy: mutations never reach the table


def _deep(rng: random.Random) -> Any:
    value: Any = _odd(rng, 20)
    for _ in range(rng.choice([10, 63, 64, 65, 200])):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _mutate_tree(rng: random.Random, data: Any) -> Any:
    for _ in range(rng.choice([1, 1, 1, 2, 3, 6])):
        slots = _positions(data, [])
        if not slots:
            return _odd(rng)
        container, key = rng.choice(slots)
        op = rng.randrange(9)
        if op <= 2:
            container[key] = _odd(rng)
        elif op == 3:
            del container[key]
        elif op == 4 and isinstance(container, dict):
            container[rng.choice(["nosuch", key + "x" if isinstance(key, str) else 0, 1, None, "a b", "a.b"])] = \
                _odd(rng)
        elif op == 5:
            container[key] = [container[key]]
        elif op == 6 and isinstance(container[key], list) and container[key]:
            container[key] = container[key][0]
        elif op == 7:
            container[key] = _deep(rng)
        else:
            container[key] = str(container[key]) if rng.random() < 0.5 else _odd(rng, 30)
    return data


def _serialize(rng: random.Random, data: Any) -> str:
    style = rng.randrange(4)
    if style == 0:
        return json.dumps(data, ensure_ascii=rng.random() < 0.5)
    return yaml.safe_dump(data, default_flow_style=style == 1, allow_unicode=rng.random() < 0.5, width=10 ** 6,
                          sort_keys=rng.random() < 0.5)


def _mutate_text(rng: random.Random, text: str) -> str | bytes:
    lines = text.splitlines(keepends=True) or [""]
    op = rng.randrange(12)
    index = rng.randrange(len(lines))
    if op <= 3:  # a value written as YAML text that safe_dump would never produce
        line = lines[index]
        head = line.split(": ", 1)[0] + ": " if ": " in line else line.rstrip("\n") + " "
        lines[index] = head + rng.choice(ODD_TEXT) + "\n"
    elif op == 4:  # a duplicate key
        lines.insert(index, lines[index])
    elif op == 5:  # an anchor on one value, its alias on another; or a merge key
        a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
        if ": " in lines[a] and ": " in lines[b]:
            lines[a] = lines[a].replace(": ", ": &x ", 1)
            lines[b] = lines[b].split(": ", 1)[0] + (": *x\n" if rng.random() < 0.5 else ": {<<: *x}\n")
    elif op == 6:
        return text[:rng.randrange(len(text) + 1)]
    elif op == 7:
        raw = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.choice([1, 1, 3, 20])):
            raw[rng.randrange(len(raw) + 1):0] = rng.choice(BYTES)
        return bytes(raw)
    elif op == 8:
        return rng.choice(["", " ", "\n", "# nothing\n", "---\n", "...\n", "~\n", "[]\n", "{}\n", "- a\n", "a\n",
                           "\ufeff", "\t", "%YAML 1.2\n---\n", "%TAG ! tag:x,2000:\n--- !a\n"])
    elif op == 9:
        return "\r\n".join(text.splitlines()) if rng.random() < 0.5 else text.replace("  ", "\t")
    elif op == 10:
        return bytes(rng.randrange(256) for _ in range(rng.choice([1, 16, 512])))
    else:
        lines.append(rng.choice(["x: &b " + alias_bomb(key="b") + "\n", "---\nb: 2\n", "rules: []\n", "a: 1\n"]))
    return "".join(lines)


def generate(kind_bases: list[Any], index: int, kind: str) -> str | bytes:
    rng = random.Random(f"{SEED}-{kind}-{index}")
    data = json.loads(json.dumps(rng.choice(kind_bases)))  # a deep copy
    if rng.random() < 0.8:
        data = _mutate_tree(rng, data)
    text = _serialize(rng, data)
    return _mutate_text(rng, text) if rng.random() < 0.6 else text


# --- running config check -------------------------------------------------------------------------------------


def check_in_process(*args: str, command: str = "check") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["config", command, *args])
    return rc, out.getvalue(), err.getvalue()


def check_cli(*args: str) -> tuple[int, str, str]:
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "config", "check", *args], capture_output=True,
                            text=True, errors="backslashreplace", timeout=120)
    return result.returncode, result.stdout, result.stderr


def assert_ok_or_one_line(rc: int, out: str, err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 0:
        assert err == "" and out.endswith(": ok\n"), (out, err)
    else:
        assert rc == 2 and out == "", (rc, out, err)
        assert len(err.splitlines()) == 1 and ONE_LINE.fullmatch(err.rstrip("\n")), err


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    make_tls_files(directory)
    (directory / "web.yml").write_text("{}\n")
    return directory


KINDS: dict[str, tuple[Callable[[Path], list[Any]], Callable[[str], dict[str, Any]]]] = {
    # kind: (valid files to start from, the config that makes `config check` read the fuzzed file)
    "config": (_config_bases, lambda path: {}),
    "web_config": (_web_bases, lambda path: {**QUIET, "web_config": path}),
    "alert_rules": (lambda tls: _alert_rule_bases(), lambda path: {**QUIET, "alerting": {
        "default_rules": False, "rule_files": [path]}}),
    "kernel_log_rules": (lambda tls: _kernel_rule_bases(), lambda path: {**QUIET, "kernel_log": {
        "rules_dirs": [path]}}),
}


@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("kind", KINDS)
def test_fuzzed_files_are_accepted_or_refused_in_one_line(kind: str, part: int, tls: Path, tmp_path: Path) -> None:
    bases_of, referencing = KINDS[kind]
    bases = bases_of(tls)
    fuzzed, config = tmp_path / "fuzzed.yaml", tmp_path / "config.yaml"
    if kind != "config":
        config.write_text(yaml.safe_dump(referencing(str(fuzzed))))
    target = fuzzed if kind == "config" else config
    outcomes = {0: 0, 2: 0}
    cases = range(part, CASES, PARTS)
    for index in cases:
        case = generate(bases, index, kind)
        fuzzed.write_bytes(case if isinstance(case, bytes) else case.encode("utf-8", "surrogatepass"))
        where = f"TPUWATCH_FUZZ_SEED={SEED} {kind} case {index}: {case[:300]!r}"
        try:
            answer = check_in_process("--config", str(target))
            assert_ok_or_one_line(*answer)
            if index % SUBPROCESS_EVERY == 0:
                assert check_cli("--config", str(target)) == answer, "the command line answers otherwise"
            if kind == "config" and answer[0] == 0:  # what is accepted can be shown, and reads back
                rc, shown, err = check_in_process("--config", str(target), command="show")
                assert (rc, err) == (0, "") and isinstance(yamlfile.load(shown, "shown"), dict)
        except BaseException as exc:
            raise AssertionError(f"{where}\n{type(exc).__name__}: {exc}") from exc
        outcomes[answer[0]] += 1
    # The mutations reach both sides: some files stay valid, most are refused.
    assert outcomes[0] > len(cases) // 50 and outcomes[2] > len(cases) // 2, outcomes


# --- bombs, huge files, odd files -----------------------------------------------------------------------------


def test_an_alias_bomb_is_refused_after_bounded_work(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(f"log_level: {alias_bomb()}\n")  # 9**9 strings once expanded; 226 MB of message at 9**8 before
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as caught:
            config_module.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value).startswith(f"{path}: line 1, column ")
    assert str(caught.value).endswith(f"more than {yamlfile.MAX_NODES} values (an alias counts as all the values "
                                      "it stands for)")
    assert peak < 16 << 20, f"refusing the bomb took {peak} bytes"
    rc, out, err = check_cli("--config", str(path))
    assert (rc, out) == (2, "") and err == f"tpuwatch: config error: {caught.value}\n"


def _bytes_read() -> int:
    return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M).group(1))


def test_a_100_mb_file_is_refused_after_reading_1_mib(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as file:
        line = b"# " + b"x" * 1021 + b"\n"
        for _ in range(100 * 1024):
            file.write(line)
    before = _bytes_read()
    with pytest.raises(ConfigError) as caught:
        config_module.load(path)
    assert _bytes_read() - before < 2 * yamlfile.MAX_BYTES
    assert str(caught.value) == f"{path}: larger than 1048576 bytes (1 MiB)"
    assert check_cli("--config", str(path)) == (2, "", f"tpuwatch: config error: {caught.value}\n")
    web = tmp_path / "config.yaml"
    web.write_text(yaml.safe_dump({**QUIET, "web_config": str(path)}))
    assert check_cli("--config", str(web)) == (2, "", f"tpuwatch: config error: {caught.value}\n")


@pytest.mark.parametrize("make", ["directory", "/dev/zero", "/dev/null", "nul-escape", "deep"])
def test_odd_config_files_are_refused_in_one_line(tmp_path: Path, make: str) -> None:
    path = tmp_path / "c.yaml"
    if make == "directory":
        path.mkdir()
    elif make.startswith("/dev/"):
        path = Path(make)
    elif make == "nul-escape":
        path.write_text('state_dir: "/var/lib/\\0tpuwatch"\n')
    else:
        path.write_text("listen: " + "[" * 100_000 + "\n")
    rc, out, err = check_cli("--config", str(path))
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and ONE_LINE.fullmatch(err.rstrip("\n")), err
    assert check_in_process("--config", str(path)) == (rc, out, err)


def test_a_config_piped_on_stdin_is_read_up_to_the_bound() -> None:
    def check_stdin(text: str) -> tuple[int, str, str]:
        result = subprocess.run([sys.executable, "-m", "tpuwatch", "config", "check", "--config", "/dev/stdin"],
                                input=text, capture_output=True, text=True, timeout=120)
        return result.returncode, result.stdout, result.stderr
    assert check_stdin(yaml.safe_dump(QUIET)) == (0, "/dev/stdin: ok\n", "")
    assert check_stdin("#" * (100 << 20)) == (
        2, "", "tpuwatch: config error: /dev/stdin: larger than 1048576 bytes (1 MiB)\n")


# --- a reload with a bomb -------------------------------------------------------------------------------------


def _metric(url: str, name: str) -> float | None:
    for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _device_count(url: str) -> int:
    text = requests.get(f"{url}/metrics", timeout=5).text
    return len(re.findall(r"^tpuwatch_device_up\{", text, re.M))


def test_sighup_with_an_alias_bomb_is_refused_and_sampling_goes_on(start_daemon: Any) -> None:
    daemon: DaemonProcess = start_daemon({**SIM_FAST, **QUIET})
    daemon.wait_ready()
    url = daemon.url
    wait_until(lambda: _device_count(url) == 4, what="4 simulated chips")
    bomb = yaml.safe_dump({**SIM_FAST, **QUIET, "listen": f"127.0.0.1:{daemon.port}", "state_dir":
                           str(daemon.workdir / "state"), "devices": {"backend": "sim", "sim": {"count": 2}}})
    # In log_level, the old loader's bomb went into the error message: seconds of the GIL, gigabytes.
    daemon.config_path.write_text(bomb.replace("log_level: info\n", "") + f"log_level: {alias_bomb()}\n")
    daemon.signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in daemon.log(), what="the reload to be refused")
    wait_until(lambda: _metric(url, "tpuwatch_config_last_reload_successful") == 0, what="the refusal metric")
    refused = [line for line in daemon.log().splitlines() if "reload refused" in line]
    assert len(refused) == 1 and "more than 100000 values (an alias counts" in refused[0], refused
    # Sampling goes on under the running config: fresh cycles, still 4 chips (the refused file said 2).
    seen = [_metric(url, "tpuwatch_last_sample_timestamp_seconds")]
    for _ in range(3):
        seen.append(wait_until(lambda: (t := _metric(url, "tpuwatch_last_sample_timestamp_seconds")) is not None
                               and t > (seen[-1] or 0) and t, what="a newer sampling cycle"))
    assert seen == sorted(seen) and len(set(seen)) == 4
    assert _device_count(url) == 4
    assert requests.get(f"{url}/healthz", timeout=5).json()["checks"]["config"]["status"] == "reload_failed"
    assert daemon.proc.poll() is None and "Traceback" not in daemon.log()
