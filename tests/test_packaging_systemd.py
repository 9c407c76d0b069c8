"""The systemd unit, sysusers.d and tmpfiles.d files: verified, scored, and their privileges exercised for real."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import require_tool

SYSTEMD_DIR = Path(__file__).resolve().parent.parent / "systemd"
UNIT = SYSTEMD_DIR / "tpuwatch.service"
MAX_EXPOSURE = 2.0
NOBODY = "65534"  # nobody / nogroup
KMSG_PROBE = """
import os, sys
fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
os.lseek(fd, 0, os.SEEK_SET)
records = []
while True:
    try:
        records.append(os.read(fd, 8192))
    except BlockingIOError:
        break
    except BrokenPipeError:
        continue
print(b"".join(records).decode(errors="replace"))
"""


def unit_settings(text: str) -> dict[str, list[str]]:
    """``Key=value`` settings of a unit file, every value of a repeated key in order (sections merged)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def setpriv_args(settings: dict[str, list[str]], user: str, group: str) -> list[str]:
    """A setpriv command prefix giving a process ``user``, ``group`` and nothing but the unit's capabilities."""
    def caps(key: str) -> str:
        names = " ".join(settings.get(key, [])).split()
        return ",".join(["-all", *(f"+{name.lower().removeprefix('cap_')}" for name in names)])

    args = [require_tool("setpriv"), f"--reuid={user}", f"--regid={group}", "--clear-groups",
            f"--inh-caps={caps('AmbientCapabilities')}", f"--bounding-set={caps('CapabilityBoundingSet')}"]
    ambient = caps("AmbientCapabilities").removeprefix("-all").lstrip(",")
    if ambient:
        args.append(f"--ambient-caps={ambient}")
    if settings.get("NoNewPrivileges") == ["yes"]:
        args.append("--no-new-privs")
    return args


def require_root() -> None:
    """Skip unless root (CI runs as root, so there it never skips)."""
    if os.geteuid() != 0:
        if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail("CI must run as root")
        pytest.skip("needs root")


def test_unit_settings_parses_repeated_keys() -> None:
    settings = unit_settings("[Service]\n# comment\nDeviceAllow=/dev/kmsg r\nDeviceAllow=char-accel rw\nUser = x\n")
    assert settings == {"DeviceAllow": ["/dev/kmsg r", "char-accel rw"], "User": ["x"]}


def test_setpriv_args_keep_only_the_units_capabilities() -> None:
    settings = unit_settings("CapabilityBoundingSet=CAP_SYSLOG CAP_NET_BIND_SERVICE\n"
                             "AmbientCapabilities=CAP_SYSLOG\nNoNewPrivileges=yes\n")
    assert setpriv_args(settings, "tpuwatch", "tpuwatch")[1:] == [
        "--reuid=tpuwatch", "--regid=tpuwatch", "--clear-groups", "--inh-caps=-all,+syslog",
        "--bounding-set=-all,+syslog,+net_bind_service", "--ambient-caps=+syslog", "--no-new-privs"]
    assert "--ambient-caps" not in " ".join(setpriv_args(unit_settings(""), "nobody", "nogroup"))


def test_unit_speaks_notify_watchdog_reload_and_restart() -> None:
    settings = unit_settings(UNIT.read_text())
    assert settings["Type"] == ["notify"]
    assert settings["NotifyAccess"] == ["main"]
    assert settings["WatchdogSec"] and settings["Restart"] == ["on-failure"]
    assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert settings["ExecStart"] == ["/usr/bin/tpuwatch run --config /etc/tpuwatch/config.yaml"]
    assert settings["User"] == ["tpuwatch"] and settings["StateDirectory"] == ["tpuwatch"]


def test_unit_respects_what_the_chips_and_the_canary_need() -> None:
    """Each of these hardening options would break a part of tpuwatch (docs/packaging.md, "What it keeps")."""
    settings = unit_settings(UNIT.read_text())
    for key in ("MemoryDenyWriteExecute", "PrivateTmp", "PrivateDevices", "ProtectKernelLogs", "PrivateNetwork"):
        assert settings.get(key, ["no"]) == ["no"], f"{key} must stay off"
    assert settings["ReadWritePaths"] == ["/tmp"]  # libtpu's lockfile
    assert settings["CapabilityBoundingSet"] == ["CAP_SYSLOG"] == settings["AmbientCapabilities"]
    allowed = {entry.split()[0] for entry in settings["DeviceAllow"]}
    assert {"/dev/kmsg", "char-accel", "char-vfio*", "/dev/vfio/vfio", "char-nvidia*"} <= allowed
    assert settings["DevicePolicy"] == ["closed"]


def test_unit_verifies_clean() -> None:
    tool = require_tool("systemd-analyze")
    result = subprocess.run([tool, "verify", "--man=no", str(UNIT)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    if not Path("/usr/bin/tpuwatch").exists():  # the package installs it; its test verifies the installed unit
        problems = [p for p in problems if "Command /usr/bin/tpuwatch is not executable" not in p]
    assert problems == []


def test_unit_exposure_at_most_two() -> None:
    tool = require_tool("systemd-analyze")
    result = subprocess.run([tool, "security", "--offline=true", str(UNIT)], capture_output=True, text=True,
                            timeout=60)
    match = re.search(r"Overall exposure level for tpuwatch\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_sysusers_and_tmpfiles_create_the_user_and_its_state_dir(tmp_path: Path) -> None:
    require_root()
    sysusers, tmpfiles = require_tool("systemd-sysusers"), require_tool("systemd-tmpfiles")
    for sub, name in (("usr/lib/sysusers.d", "sysusers"), ("usr/lib/tmpfiles.d", "tmpfiles")):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "tpuwatch.conf").write_text((SYSTEMD_DIR / f"tpuwatch.{name}").read_text())
    (tmp_path / "etc").mkdir()
    (tmp_path / "var/lib").mkdir(parents=True)
    subprocess.run([sysusers, f"--root={tmp_path}"], check=True, capture_output=True, timeout=60)
    subprocess.run([tmpfiles, f"--root={tmp_path}", "--create"], check=True, capture_output=True, timeout=60)
    entry = next(line for line in (tmp_path / "etc/passwd").read_text().splitlines()
                 if line.startswith("tpuwatch:")).split(":")
    uid, gid, home, shell = int(entry[2]), int(entry[3]), entry[5], entry[6]
    assert 0 < uid < 1000 and home == "/var/lib/tpuwatch" and shell == "/usr/sbin/nologin"
    state = (tmp_path / "var/lib/tpuwatch").stat()
    assert (state.st_uid, state.st_gid, state.st_mode & 0o7777) == (uid, gid, 0o750)


def test_kmsg_readable_with_the_units_capabilities_only() -> None:
    """An unprivileged user holding exactly the unit's capabilities reads a record root just wrote to /dev/kmsg."""
    require_root()
    token = f"tpuwatch-packaging-test {uuid.uuid4().hex}"
    Path("/dev/kmsg").write_text(f"<6>{token}\n")
    settings = unit_settings(UNIT.read_text())
    result = subprocess.run([*setpriv_args(settings, NOBODY, NOBODY), "/usr/bin/python3", "-c", KMSG_PROBE],
                            capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    assert token in result.stdout


def test_kmsg_refused_without_cap_syslog_when_dmesg_is_restricted() -> None:
    """The reason the unit keeps CAP_SYSLOG: with kernel.dmesg_restrict=1 an unprivileged reader is refused."""
    require_root()
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0 here: anyone may read /dev/kmsg")
    settings = {key: value for key, value in unit_settings(UNIT.read_text()).items()
                if key not in ("CapabilityBoundingSet", "AmbientCapabilities")}
    result = subprocess.run([*setpriv_args(settings, NOBODY, NOBODY), "/usr/bin/python3", "-c", KMSG_PROBE],
                            capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode != 0 and "Operation not permitted" in result.stderr


def test_the_readmes_venv_install_gets_a_unit_that_runs_the_venvs_tpuwatch(tmp_path: Path) -> None:
    """The shipped unit runs the .deb's /usr/bin/tpuwatch; the README's venv commands must install one that runs
    /opt/tpuwatch/bin/tpuwatch, and say nothing else about the unit's path."""
    readme = (SYSTEMD_DIR.parent / "README.md").read_text(encoding="utf-8")
    (shipped,) = unit_settings(UNIT.read_text())["ExecStart"]
    assert shipped.startswith("/usr/bin/tpuwatch run ")
    (install,) = [line for line in readme.splitlines() if "systemd/tpuwatch.service >" in line]
    target = tmp_path / "tpuwatch.service"
    command = install.replace("/etc/systemd/system/tpuwatch.service", str(target))
    subprocess.run(["bash", "-c", command], cwd=SYSTEMD_DIR.parent, check=True, timeout=30)
    (installed,) = unit_settings(target.read_text())["ExecStart"]
    assert installed == shipped.replace("/usr/bin/tpuwatch", "/opt/tpuwatch/bin/tpuwatch", 1)
    # Wherever the README names the unit's ExecStart, it is one of these two.
    for said in re.findall(r"ExecStart=(\S+)", readme):
        assert said in ("/usr/bin/tpuwatch", "/opt/tpuwatch/bin/tpuwatch"), said


def test_the_readme_names_the_build_tools_before_the_systemd_extra() -> None:
    """systemd-python has no wheel on PyPI: wherever the README installs the ``systemd`` extra, the compiler and
    headers it builds with are named first (in the same block, or once in the prose before the install table)."""
    readme = (SYSTEMD_DIR.parent / "README.md").read_text(encoding="utf-8")
    tools = ("gcc", "pkg-config", "libsystemd-dev", "python3-dev")
    first = readme.index("[systemd]")
    named = [line for line in readme.splitlines() if all(tool in line for tool in tools)]
    assert named, "the README never names systemd-python's build tools"
    # The install table names the extra first; the tools follow right under it, before any shell block uses it.
    assert readme.index(named[0]) < readme.index("```", first)
    for block in readme.split("```")[1::2]:
        if "[systemd]" in block:
            assert all(tool in block.split("[systemd]")[0] for tool in tools), block
