"""The man page and the shell completions say what the parser does: every subcommand, option and exit status."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpuwatch import __version__, clidoc
from tpuwatch.cli import COMMANDS

from conftest import require_tool, run_cli


def _flags() -> dict[str, list[str]]:
    return {sub.name: [flag for option in sub.options for flag in option.flags] for sub in clidoc.subcommands()}


def test_every_subcommand_has_its_options_listed() -> None:
    flags = _flags()
    assert set(flags) == {*COMMANDS.keys() - {"config"}, "config check", "config show"}
    assert "--simulate" in flags["run"] and "--inject" in flags["canary"] and "--prometheus" in flags["analyze"]
    assert all("--config" in found for found in flags.values())


def test_the_man_page_names_every_subcommand_option_and_exit_status(tmp_path: Path) -> None:
    page = tmp_path / "tpuwatch.1"
    assert clidoc.main(["--man", str(page)]) == 0
    text = page.read_text()
    plain = text.replace("\\-", "-")
    for name, flags in _flags().items():
        assert f".SS tpuwatch {name}" in plain
        assert all(flag in plain for flag in flags), name
    for name, command in COMMANDS.items():
        section = plain.split(f"Exit status of tpuwatch {name}:", 1)[1].split(".SS", 1)[0]
        for code, meaning in command.exits.items():
            assert f".B {code}\n{meaning}" in section, (name, code)
    assert f'"tpuwatch {__version__}"' in text
    groff = require_tool("groff")
    rendered = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True,
                              timeout=60)
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr


def _bash_complete(script: Path, *words: str) -> list[str]:
    line = " ".join(f"'{w}'" for w in words)
    program = f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _tpuwatch; " \
              'printf "%s\\n" "${COMPREPLY[@]}"'
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return result.stdout.split()


def test_bash_completes_subcommands_options_and_choices(tmp_path: Path) -> None:
    script = tmp_path / "tpuwatch.bash"
    clidoc.main(["--bash", str(script)])
    assert set(_bash_complete(script, "tpuwatch", "")) >= set(COMMANDS) | {"--version", "-V"}
    assert _bash_complete(script, "tpuwatch", "can") == ["canary"]
    for name, flags in _flags().items():
        assert set(_bash_complete(script, "tpuwatch", *name.split(), "--")) >= set(flags), name
    assert _bash_complete(script, "tpuwatch", "canary", "--inject", "") == [
        "bitflip", "scale", "nan", "hang", "crash", "matmul", "transcendental", "memory", "collective", "slow"]
    assert _bash_complete(script, "tpuwatch", "config", "") == ["check", "show"]
    assert _bash_complete(script, "tpuwatch", "--json", "run", "--simulate", "ecc") == ["ecc-errors"]


def test_zsh_completion_is_valid_zsh(tmp_path: Path) -> None:
    script = tmp_path / "_tpuwatch"
    clidoc.main(["--zsh", str(script)])
    text = script.read_text()
    assert text.startswith("#compdef tpuwatch\n")
    for name, flags in _flags().items():
        assert f"({name.replace(' ', '-')}) _arguments" in text
        assert all(f"'{flag}[" in text for flag in flags), name
    zsh = shutil.which("zsh") or require_tool("zsh")
    checked = subprocess.run([zsh, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag: str) -> None:
    result = run_cli(flag)
    assert (result.returncode, result.stdout) == (0, f"tpuwatch {__version__}\n")


def test_help_lists_exit_statuses() -> None:
    result = subprocess.run([sys.executable, "-m", "tpuwatch", "canary", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert "exit status:\n  0   every chip passed\n  1   wrong results on a chip\n" in result.stdout
