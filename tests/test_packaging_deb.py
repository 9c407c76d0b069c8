"""The Debian package: built offline from this checkout, lintian-clean, and, in CI, installed, run and purged."""

from __future__ import annotations

import gzip
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
import requests
from test_packaging_systemd import require_root, setpriv_args, unit_settings

from conftest import free_port, require_tool, wait_until, write_selftest_rule

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "packaging" / "debian" / "build.sh"
PYLIB = Path("usr/lib/python3/dist-packages")
UNIT_PATH = Path("lib/systemd/system/tpuwatch.service")
WANTS_LINK = Path("/etc/systemd/system/multi-user.target.wants/tpuwatch.service")
CAP_SYSLOG = 34
# The packaged kernel-log collector, reading /dev/kmsg from this boot's start: "RULE COUNT" per rule that matched.
KERNEL_LOG_PROBE = """
import sys
from tpuwatch import config
from tpuwatch.kernel_log.collector import build_collector
from tpuwatch.schema import ConfigError
try:
    collector, _ = build_collector(config.parse(sys.argv[1]), lambda pci: None, persist=False)
except ConfigError as exc:
    sys.exit(f"config error: {exc}")
for s in collector.collect():
    if s.name == "tpuwatch_kernel_events_total" and s.value:
        print(dict(s.labels)["rule"], int(s.value))
"""
DEBIAN_DEPENDS = {"python3-apscheduler", "python3-bcrypt", "python3-numpy", "python3-prometheus-client",
                  "python3-psutil", "python3-requests", "python3-systemd", "python3-yaml"}


def _run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]


def _installed() -> bool:
    return _run("dpkg-query", "-W", "-f=${db:Status-Status}", "tpuwatch").stdout == "installed"


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The .deb built by packaging/debian/build.sh."""
    for tool in ("dpkg-buildpackage", "dh", "dh_python3", "dpkg-deb"):
        require_tool(tool)
    result = _run(str(BUILD), str(tmp_path_factory.mktemp("deb")))
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


@pytest.fixture(scope="module")
def unpacked(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's files, with its control files under DEBIAN/."""
    root = tmp_path_factory.mktemp("unpacked")
    _run("dpkg-deb", "--extract", str(deb), str(root), check=True)
    _run("dpkg-deb", "--control", str(deb), str(root / "DEBIAN"), check=True)
    return root


@pytest.fixture(scope="module")
def installed(deb: Path) -> Iterator[None]:
    """The package installed with apt-get on this machine (CI only, as root); purged afterwards."""
    if os.environ.get("TPUWATCH_REQUIRE_TOOLS") != "1":
        pytest.skip("installs a package on this machine: only in CI (TPUWATCH_REQUIRE_TOOLS=1)")
    require_root()
    apt = require_tool("apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = _run(apt, "install", "-y", "-q", str(deb), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    yield
    if _installed():
        _run(apt, "purge", "-y", "-q", "tpuwatch", env=env)


def test_lintian_clean(deb: Path) -> None:
    lintian = require_tool("lintian")
    result = _run(lintian, "--info", "--pedantic", "--fail-on", "error,warning,info,pedantic", str(deb))
    assert result.returncode == 0 and result.stdout == "", result.stdout


def test_ships_the_generated_man_page_and_completions(unpacked: Path, tmp_path: Path) -> None:
    # Generated at build time from the parser (tpuwatch.clidoc), as a fresh generation here makes them.
    from tpuwatch import clidoc

    clidoc.main(["--bash", str(tmp_path / "bash"), "--zsh", str(tmp_path / "zsh")])
    assert (unpacked / "usr/share/bash-completion/completions/tpuwatch").read_text() == (tmp_path / "bash").read_text()
    assert (unpacked / "usr/share/zsh/vendor-completions/_tpuwatch").read_text() == (tmp_path / "zsh").read_text()
    page = gzip.decompress((unpacked / "usr/share/man/man1/tpuwatch.1.gz").read_bytes()).decode()
    assert page == clidoc.man_page(date.fromisoformat(page.split('"')[1]))


def test_ships_unit_config_sysusers_and_tmpfiles_verbatim(unpacked: Path) -> None:
    shipped = {
        UNIT_PATH: REPO / "systemd/tpuwatch.service",
        Path("usr/lib/sysusers.d/tpuwatch.conf"): REPO / "systemd/tpuwatch.sysusers",
        Path("usr/lib/tmpfiles.d/tpuwatch.conf"): REPO / "systemd/tpuwatch.tmpfiles",
        Path("etc/tpuwatch/config.yaml"): REPO / "packaging/config.example.yaml",
    }
    for installed_path, source in shipped.items():
        assert (unpacked / installed_path).read_bytes() == source.read_bytes(), installed_path


def test_ships_the_docs_uncompressed_where_runbook_links_point(unpacked: Path) -> None:
    for doc in sorted((REPO / "docs").glob("*.md")):  # the fleet rules' runbook links
        assert (unpacked / "usr/share/doc/tpuwatch" / doc.name).read_bytes() == doc.read_bytes(), doc.name
    # The runbooks the endpoint serves: a copy in the package, not the source tree's link.
    runbooks = unpacked / PYLIB / "tpuwatch/alerting/runbooks.md"
    assert not runbooks.is_symlink() and runbooks.read_bytes() == (REPO / "docs/alerting.md").read_bytes()


def test_ships_every_file_of_the_package_and_no_bytecode(unpacked: Path) -> None:
    def tree(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    # Developer scripts (regenerating the generated stubs) stay in the source, as the wheel leaves them too; the
    # package is Python alone (Architecture: all), built for no interpreter in particular.
    shipped = tree(unpacked / PYLIB / "tpuwatch")
    assert shipped == {p for p in tree(REPO / "tpuwatch") if not p.endswith(".sh")}
    assert not [p for p in shipped if p.endswith((".so", ".c", ".h"))]
    assert not list((unpacked / PYLIB).rglob("*.pyc"))


def test_config_is_a_conffile_and_dependencies_come_from_debian(unpacked: Path) -> None:
    assert (unpacked / "DEBIAN/conffiles").read_text().split() == ["/etc/tpuwatch/config.yaml"]
    control = (unpacked / "DEBIAN/control").read_text()
    depends = next(line for line in control.splitlines() if line.startswith("Depends:"))
    names = {item.split()[0] for item in depends.removeprefix("Depends:").replace("|", ",").split(",")}
    assert DEBIAN_DEPENDS <= names and "python3:any" in names
    assert not any("jax" in name for name in names)  # jax is not packaged: canary.python names an interpreter with it
    postinst = (unpacked / "DEBIAN/postinst").read_text()
    for step in ("systemd-sysusers", "systemd-tmpfiles", "deb-systemd-helper enable", "py3compile -p tpuwatch"):
        assert step in postinst


def test_installed_check_runs_from_the_package(installed: None) -> None:
    where = _run("/usr/bin/python3", "-c", "import tpuwatch; print(tpuwatch.__file__)", cwd="/")
    assert where.stdout.startswith(f"/{PYLIB}/tpuwatch/"), where.stdout + where.stderr
    # The installed /etc/tpuwatch/config.yaml, whatever this host's kernel log holds: on a CI machine the
    # other tests have written Xid records to /dev/kmsg, and check rightly calls those critical.
    result = _run("/usr/bin/tpuwatch", "check", "--json", cwd="/")
    report = json.loads(result.stdout)
    kernel = [p for p in report["problems"] if p.startswith("kernel: ")]
    assert report["problems"] == kernel and result.returncode == (1 if kernel else 0), result.stdout + result.stderr
    assert report["backend"] == "none" and report["host"]["memory_total_bytes"] > 0


def test_installed_user_state_dir_enabled_unit(installed: None) -> None:
    user = pwd.getpwnam("tpuwatch")
    assert user.pw_uid != 0 and user.pw_shell == "/usr/sbin/nologin"
    state = Path("/var/lib/tpuwatch").stat()
    assert (state.st_uid, state.st_mode & 0o7777) == (user.pw_uid, 0o750)
    assert WANTS_LINK.resolve() == Path("/", UNIT_PATH).resolve()
    conffiles = _run("dpkg-query", "-W", "-f=${Conffiles}", "tpuwatch").stdout
    assert "/etc/tpuwatch/config.yaml" in conffiles
    verify = _run(require_tool("systemd-analyze"), "verify", str(Path("/", UNIT_PATH)))
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")


def test_installed_daemon_runs_as_its_user_with_only_the_units_capabilities(installed: None) -> None:
    """Sampling and the endpoint work for the tpuwatch user holding only CAP_SYSLOG, under Debian's libraries.

    kernel_log.source is kmsg.  The kernel-log collector is not wired into the daemon yet: until it is,
    the collector's reading of /dev/kmsg with these capabilities is proven by the kernel-log tests below.
    """
    settings = unit_settings(Path("/", UNIT_PATH).read_text())
    user = pwd.getpwnam(settings["User"][0])
    workdir = Path(tempfile.mkdtemp(prefix="tpuwatch-unprivileged-"))
    os.chown(workdir, user.pw_uid, user.pw_gid)
    workdir.chmod(0o755)
    port = free_port()
    (workdir / "config.yaml").write_text(
        f"listen: 127.0.0.1:{port}\ninterval: 500ms\nstate_dir: {workdir}/state\n"
        "devices: {backend: sim, sim: {count: 2, fault_after: 0s}}\nkernel_log: {source: kmsg}\n")
    log = (workdir / "stderr.log").open("wb")
    proc = subprocess.Popen([*setpriv_args(settings, settings["User"][0], settings["Group"][0]),
                             "/usr/bin/tpuwatch", "run", "--config", str(workdir / "config.yaml")],
                            stdout=log, stderr=subprocess.STDOUT, cwd="/")
    try:
        def healthy() -> bool:
            assert proc.poll() is None, (workdir / "stderr.log").read_text()
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200

        wait_until(healthy, timeout=30, what="the unprivileged daemon's /healthz")
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'tpuwatch_device_up{device="1"} 1.0' in metrics
        assert 'tpuwatch_collector_success{collector="host"} 1.0' in metrics
        status = dict(line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines())
        assert status["Uid"].split()[:2] == [str(user.pw_uid)] * 2
        for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
            assert int(status[key], 16) == 1 << CAP_SYSLOG, key
    finally:
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=15)
        log.close()
        shutil.rmtree(workdir)
    assert returncode == 0


def _kernel_log_probe(settings: dict[str, list[str]],
                      config: str = "kernel_log: {source: kmsg}") -> subprocess.CompletedProcess[str]:
    return _run(*setpriv_args(settings, settings["User"][0], settings["Group"][0]), "/usr/bin/python3", "-c",
                KERNEL_LOG_PROBE, config, cwd="/")


@pytest.mark.usefixtures("kmsg_ring")
def test_installed_kernel_log_collector_reads_kmsg_with_the_units_capabilities(installed: None) -> None:
    """The packaged collector, as the tpuwatch user with only CAP_SYSLOG, turns a new /dev/kmsg record into an event."""
    settings = unit_settings(Path("/", UNIT_PATH).read_text())
    tag = f"tpuwatch-packaging-{os.getpid()}"
    with tempfile.TemporaryDirectory(dir="/tmp") as rules:  # readable by the tpuwatch user
        os.chmod(rules, 0o755)
        config = f"kernel_log: {{source: kmsg, rules_dirs: [{write_selftest_rule(Path(rules), tag)}]}}"
        assert "selftest" not in _kernel_log_probe(settings, config).stdout
        Path("/dev/kmsg").write_text(f"<3>{tag}: device 0000:3b:00.0 failed\n")
        result = _kernel_log_probe(settings, config)
    assert result.returncode == 0, result.stderr
    assert dict(line.split() for line in result.stdout.splitlines())["selftest"] == "1"


def test_installed_kernel_log_refused_without_cap_syslog(installed: None) -> None:
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("kernel.dmesg_restrict is 0 here: anyone may read /dev/kmsg")
    settings = {key: value for key, value in unit_settings(Path("/", UNIT_PATH).read_text()).items()
                if key not in ("CapabilityBoundingSet", "AmbientCapabilities")}
    result = _kernel_log_probe(settings)
    assert result.returncode != 0 and "config error: kernel_log.source: kmsg" in result.stderr
    assert "Traceback" not in result.stderr


def test_purge_removes_config_state_and_unit(installed: None) -> None:
    config = Path("/etc/tpuwatch/config.yaml")
    config.write_text(config.read_text() + "# edited by the operator\n")
    result = _run(require_tool("apt-get"), "purge", "-y", "-q", "tpuwatch",
                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert not _installed()
    for gone in (config, Path("/var/lib/tpuwatch"), Path("/", UNIT_PATH), WANTS_LINK, Path("/usr/bin/tpuwatch")):
        assert not gone.exists() and not gone.is_symlink(), gone
