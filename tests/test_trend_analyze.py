"""``tpuwatch analyze``: CSV and query_range JSON files, a real Prometheus, and bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tpuwatch import cli
from tpuwatch.analysis import analyze
from tpuwatch.analysis.inputs import InputError, csv_points, parse_prometheus
from tpuwatch.analysis.leak import LeakParams
from tpuwatch.config import Config

from conftest import free_port, require_tool, wait_until

DATA = Path(__file__).parent / "testdata" / "trend"
GIB = 1 << 30
LEAK_START = 1_767_225_600 + 4 * 3600


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    analyze.add_arguments(parser)
    code = analyze.run(parser.parse_args(list(argv)), Config())
    out, err = capsys.readouterr()
    return code, out, err


def test_csv_with_capacity_is_a_leak_with_eta(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DATA / "leak.csv"), "--json")
    assert code == 1
    [series] = json.loads(out)["series"]
    assert series["labels"] == {"source": str(DATA / "leak.csv")}
    assert series["verdict"] == "leak" and series["reason"] is None
    assert LEAK_START < series["first_alert_at"] <= LEAK_START + 2 * 3600
    # The whole series' own slope: flat for 4 h, then 0.2 GiB/h for 6 h.
    assert 0.05 * GIB / 3600 < series["slope_bytes_per_second"] < 0.2 * GIB / 3600
    # 16 GiB, about 10 GiB in use at the peak at the end, growing 0.2 GiB/h: about 1.5 days.
    assert 20 * 3600 < series["exhaustion_eta_seconds"] < 50 * 3600


def test_csv_with_a_step_is_ok_and_table_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DATA / "ok.csv"), "--capacity", str(16 * GIB))
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split() == ["SERIES", "VERDICT", "FIRST", "ALERT", "(UTC)", "GROWTH", "EXHAUSTED", "IN"]
    assert row.split()[:3] == [str(DATA / "ok.csv"), "ok", "-"]
    # The whole series' own slope: one 1.5 GiB step at 4 h of 10 h.
    assert float(row.split()[3]) > 0 and row.split()[4] == "MiB/h"
    assert out.rstrip().endswith("no leak in 1 series")


def test_query_range_json_with_two_series(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DATA / "query_range.json"), "--capacity", str(16 * GIB), "--json")
    assert code == 1
    verdicts = {s["labels"]["device"]: s for s in json.loads(out)["series"]}
    assert verdicts["0"]["verdict"] == "leak" and verdicts["0"]["exhaustion_eta_seconds"] > 0
    assert verdicts["1"] == {**verdicts["1"], "verdict": "ok", "first_alert_at": None,
                             "exhaustion_eta_seconds": None}
    code, out, _ = run(capsys, str(DATA / "query_range.json"))
    assert 'tpuwatch_device_memory_used_bytes{device="0"}  leak' in out
    assert out.rstrip().endswith("1 of 2 series leaking")


@pytest.mark.parametrize(("minutes", "capacity", "reason"), [
    (60, None, "2 h of data needed for a slow leak, 1 h given; no capacity, so no fast one judged either"),
    (60, "64GiB", "2 h of data needed for a slow leak, 1 h given; no fast one (filling the chip within 20 min) found"),
    (18, "64GiB", "2 h of data needed for a slow leak, 18 min given"),  # too short for the fast check too
    (19, "64GiB",
     "2 h of data needed for a slow leak, 19 min given; no fast one (filling the chip within 20 min) found"),
])
def test_a_series_shorter_than_the_learning_period_is_insufficient_not_ok(
        minutes: int, capacity: str | None, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Perfectly linear growth of 2.4 GiB/h, with a header row of other names.
    rate = 2.4 * GIB / 3600
    rows = "\n".join(f"{1_767_225_600 + 10 * k},{8 * GIB + rate * 10 * k:.0f}" for k in range(6 * minutes + 1))
    path = tmp_path / "short.csv"
    path.write_text(f"time,bytes\n{rows}\n")
    given = ("--capacity", capacity) if capacity else ()
    code, out, _ = run(capsys, str(path), *given, "--json")
    [series] = json.loads(out)["series"]
    assert (code, series["verdict"], series["reason"]) == (0, "insufficient", reason)
    assert series["samples"] == 6 * minutes + 1 and series["span_seconds"] == 60 * minutes
    assert series["slope_bytes_per_second"] == pytest.approx(rate, rel=1e-6)
    code, out, _ = run(capsys, str(path), *given)
    assert code == 0
    assert out.splitlines()[1].split()[1:4] == ["insufficient", "-", "-"]  # no growth figure it cannot stand by
    assert f"{path}: insufficient: {reason}" in out


@pytest.mark.parametrize(("step", "capacity", "noted"), [
    (60, "64GiB", True), (31, "64GiB", True), (30, "64GiB", False), (60, None, False),
])
def test_readings_too_sparse_for_the_fast_check_are_noted(step: int, capacity: str | None, noted: bool,
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Most readings further apart than 30 s, on a series the fast check judges (one with a capacity): the note
    says it pages later there; a one-hour gap in 10 s readings is no such series."""
    rows = "\n".join(f"{1_767_225_600 + step * k},{8 * GIB}" for k in range(3 * 3600 // step))
    path = tmp_path / "sparse.csv"
    path.write_text(f"{rows}\n")
    given = ("--capacity", capacity) if capacity else ()
    code, out, _ = run(capsys, str(path), *given, "--json")
    [series] = json.loads(out)["series"]
    note = ("most readings over 30 s apart: the fast check (a chip full within 20 min) pages later there, and more "
            "warm-ups (docs/trend.md, Limits)")
    assert (code, series["verdict"], series["note"]) == (0, "ok", note if noted else None)
    code, out, _ = run(capsys, str(path), *given)
    assert (f"{path}: note: {note}" in out) is noted
    gap = "\n".join(f"{1_767_225_600 + 10 * k + (3600 if k >= 540 else 0)},{8 * GIB}" for k in range(1080))
    path.write_text(f"{gap}\n")
    code, out, _ = run(capsys, str(path), "--capacity", "64GiB", "--json")
    assert json.loads(out)["series"][0]["note"] is None


@pytest.mark.parametrize(("text", "size"), [
    ("17179869184", 16 * GIB), ("16GiB", 16 * GIB), ("16Gi", 16 * GIB), (" 16 GiB ", 16 * GIB),
    ("1.5TiB", 1.5 * 1024 * GIB), ("17GB", 17e9), ("17G", 17e9), ("512B", 512.0), ("64KiB", 65536.0), ("2MB", 2e6)])
def test_capacity_takes_the_units_people_write(text: str, size: float, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(DATA / "ok.csv"), "--capacity", text, "--json")
    assert code == 0 and analyze.parse_bytes(text) == size


@pytest.mark.parametrize("text", ["16XB", "GiB", "16 Gib", "-16GiB", "1e400", "16GiBs"])
def test_a_capacity_that_is_no_size_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["analyze", str(DATA / "ok.csv"), f"--capacity={text}"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "--capacity: invalid size" in err and "16GiB" in err and len(err.strip().splitlines()) <= 2


def _progress_lines(argv: list[str], tty: bool) -> str:
    """What ``tpuwatch analyze`` writes on stderr, to a terminal (a pty) or to a pipe."""
    import os
    import pty

    command = [sys.executable, "-m", "tpuwatch", "analyze", *argv]
    if not tty:
        return subprocess.run(command, capture_output=True, text=True, timeout=120).stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(leader)
    return b"".join(chunks).decode()


def test_a_progress_line_on_a_terminal_only(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("".join(f"{1_767_225_600 + 10 * k},{GIB + k}\n" for k in range(50_000)))
    shown = _progress_lines([str(path)], tty=True)
    assert "analyze: " in shown and "% of 1.1 MB, 4,096 samples" in shown and shown.rstrip(" ").endswith("\r")
    assert _progress_lines([str(path)], tty=False) == ""
    assert _progress_lines([str(path), "--json"], tty=False) == ""


@pytest.mark.parametrize(("text", "message"), [
    ("", "x.csv: no data rows (expected timestamp,value[,capacity])"),
    ("timestamp,value\n", "x.csv: no data rows (expected timestamp,value[,capacity])"),
    ("time,bytes\n10,abc\n", "x.csv: line 2: value 'abc' is not a number"),
    ("10,1\n5,2\n", "x.csv: line 2: unsorted timestamp 5 (previous 10); timestamps must strictly increase"),
    ("10,1\n10,2\n", "x.csv: line 2: duplicate timestamp 10 (previous 10); timestamps must strictly increase"),
    ("10,1\n20,nan\n", "x.csv: line 2: value is nan, not a finite number"),
    ("10,1\n20,abc\n", "x.csv: line 2: value 'abc' is not a number"),
    ("time,used,cap,host\n", "x.csv: line 1: expected timestamp,value[,capacity], got 4 column(s)"),
    ("10\n", "x.csv: line 1: expected timestamp,value[,capacity], got 1 column(s)"),
    ("10,-1\n", "x.csv: line 1: value -1 is negative"),
    ("10,1,0\n", "x.csv: line 1: capacity 0 is not positive"),
])
def test_bad_csv(text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        list(csv_points(text.splitlines(), "x.csv"))
    assert str(info.value) == message


@pytest.mark.parametrize(("text", "message"), [
    ("{", "q.json: not JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
    ('{"status": "error", "errorType": "bad_data", "error": "parse error"}',
     "q.json: Prometheus error: bad_data: parse error"),
    ('{"status": "success", "data": {"resultType": "vector", "result": []}}',
     "q.json: expected a range query result (resultType matrix), got vector"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": []}}',
     "q.json: the query result holds no samples"),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"a": "1"}, '
     '"values": [[2, "1"], [1, "2"]]}]}}',
     'q.json: series {a="1"} point 2: unsorted timestamp 1 (previous 2); timestamps must strictly increase'),
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, '
     '"values": [[1, "NaN"]]}]}}', "q.json: series {} point 1: value is nan, not a finite number"),
])
def test_bad_query_range_json(text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        for _, points in parse_prometheus(text, "q.json"):
            list(points)
    assert str(info.value) == message


@pytest.mark.parametrize(("argv", "message"), [
    ([], "give FILE, or --prometheus URL --query EXPR --range DURATION"),
    (["missing.csv"], "cannot read missing.csv: No such file or directory"),
    (["--prometheus", "http://127.0.0.1:1"], "--prometheus needs --query EXPR and --range DURATION"),
    (["f.csv", "--range", "1h"], "--query, --range and --step go with --prometheus"),
    (["--prometheus", "http://127.0.0.1:1", "--query", "up", "--range", "soon"],
     "--range: invalid duration 'soon' (use a number and ms, s, m, h or d, like 10s)"),
])
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", f"tpuwatch analyze: {message}\n")


def test_prometheus_down_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--prometheus", url, "--query", "up", "--range", "1h")
    assert (code, out) == (2, "")
    assert err == f"tpuwatch analyze: cannot query Prometheus at {url}: ConnectionError\n"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    """A real Prometheus whose TSDB holds 10 h of two HBM series backfilled with promtool."""
    promtool = require_tool("promtool")
    server = require_tool("prometheus")
    end = int(time.time()) - 120
    lines = ["# HELP tpuwatch_device_memory_used_bytes HBM in use.",
             "# TYPE tpuwatch_device_memory_used_bytes gauge"]
    for device in ("0", "1"):
        for k in range(0, 10 * 3600, 30):
            t = end - 10 * 3600 + k
            used = 6 * GIB + 2 * GIB * ((k % 180) / 180) + (0.4 * GIB * max(0, k - 4 * 3600) / 3600
                                                              if device == "0" else 0)
            lines.append(f'tpuwatch_device_memory_used_bytes{{device="{device}"}} {used:.0f} {t}')
    (tmp_path / "data.om").write_text("\n".join(lines) + "\n# EOF\n")
    storage = tmp_path / "tsdb"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "data.om"),
                    str(storage)], check=True, capture_output=True, timeout=60)
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([server, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={storage}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: requests.get(f"{url}/-/ready", timeout=2).status_code == 200, timeout=30,
                   what="prometheus ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_live_prometheus_query(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--prometheus", prometheus, "--query", "tpuwatch_device_memory_used_bytes",
                       "--range", "10h", "--step", "30s", "--capacity", str(16 * GIB), "--json")
    assert code == 1
    series = {s["labels"]["device"]: s for s in json.loads(out)["series"]}
    assert series["0"]["verdict"] == "leak"
    # The whole series' own slope: flat for 4 h, then 0.4 GiB/h for 6 h.
    assert 0.1 * GIB / 3600 < series["0"]["slope_bytes_per_second"] < 0.4 * GIB / 3600
    assert series["1"]["verdict"] == "ok"
    code, out, err = run(capsys, "--prometheus", prometheus, "--query", "rate(", "--range", "1h")
    assert (code, out) == (2, "")
    assert err.startswith(f"tpuwatch analyze: {prometheus}: Prometheus error: bad_data: ")
    assert err.count("\n") == 1


def test_long_ranges_are_fetched_in_chunks(prometheus: str) -> None:
    [first] = analyze.fetch(prometheus, 'tpuwatch_device_memory_used_bytes{device="1"}', 10 * 3600, 1.0,
                            LeakParams())
    # Every 1 s point of 10 h once, the pieces joined without repeats (each replay checks time order).
    assert first.count > analyze.MAX_POINTS_PER_QUERY and first.result()["verdict"] == "ok"
