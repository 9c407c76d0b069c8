"""Mutation testing: how much of a module's behaviour its tests would notice breaking.

Usage::

    python benchmarks/mutation.py MODULE... [--budget SECONDS] [--tests FILE...] [--exclude-tests FILE...]
                                            [--jobs N] [--json FILE] [--before FILE] [--output BENCHMARKS.md | --no-write]

Each MODULE (a path such as ``tpuwatch/alerting/dispatch.py`` or a dotted name such as
``tpuwatch.alerting.dispatch``) is mutated by mutmut 3 (``pip install 'mutmut==3.8.1'``; it is not part of the
README's test command) and each mutant is run against the test files that import the module: every
``tests/test_*.py`` that imports it itself, not through a helper of ``tests/`` (``--tests`` names files instead;
``--exclude-tests`` leaves some out, and the report names the files run).  mutmut runs, for each mutant,
only the tests that reached the mutated function.

mutmut copies the project into ``./mutants`` and reads its settings from ``pyproject.toml``; so that neither
touches the checkout, each module is run in a private copy of the checkout in a temporary directory (the package,
``tests/``, the other top-level folders tests read, and ``pyproject.toml`` with a ``[tool.mutmut]`` section
added), removed on exit, on Ctrl-C and on SIGTERM.  mutmut runs under ``nice -n 19`` with ``--jobs`` worker
processes (default 1).

``--budget`` (default 3600) is the wall-clock time of the whole command: each module gets what is left divided
by the modules left.  A module whose time runs out is stopped and reported as partial: mutants run of total.

Per module it reports mutants, run, killed, survived, timeouts (killed by mutmut's CPU limit: counted as
caught, as an infinite loop is), mutants no test reached, and the score, caught / run, and lists each survivor
(mutmut's name, its line, the line as mutated).  ``--json`` saves the figures; ``--before`` takes such a file
and puts its scores beside this run's.  The report goes to stdout and, unless ``--no-write``, to the
``mutation`` section of ``--output``; the equivalent mutants left are discussed in docs/mutation.md.

Exit status: 0 when every module ran, 1 when mutmut failed, 2 on bad arguments (one line on stderr).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCHMARKS_MD, cpu_model, machine_and_command, write_section  # noqa: E402

PACKAGE = "tpuwatch"
# Top-level folders the tests read (rule files, packaging, the benchmark generators...); never .git, .venv, build.
COPY_IGNORE = {".git", ".venv", "build", "dist", "mutants", ".pytest_cache", ".mypy_cache", ".ruff_cache",
               ".benchmarks", "__pycache__"}
# mutmut's exit codes as it classifies them (mutmut.stats.status_by_exit_code), reduced to what is reported.
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152, 255}
NO_TESTS = {5, 33}


class UsageError(Exception):
    """A bad argument: reported on one line, exit status 2."""


@dataclass
class Survivor:
    name: str
    line: int | None
    source: str
    mutated: str


@dataclass
class Result:
    module: str
    tests: list[str]
    total: int = 0
    run: int = 0
    killed: int = 0
    survived: int = 0
    timeouts: int = 0
    no_tests: int = 0
    other: int = 0
    seconds: float = 0.0
    partial: bool = False
    survivors: list[Survivor] = field(default_factory=list)

    @property
    def score(self) -> float | None:
        checked = self.killed + self.timeouts + self.survived
        return None if checked == 0 else 100.0 * (self.killed + self.timeouts) / checked


def module_path(name: str) -> str:
    """``name`` (a path or a dotted module name) as a path relative to the checkout; UsageError if no such module
    of the package."""
    path = Path(name.replace(".", "/") + ".py" if not name.endswith(".py") and "/" not in name else name)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(REPO_ROOT)
        except ValueError:
            raise UsageError(f"{name}: not inside this checkout ({REPO_ROOT})") from None
    if path.parts[:1] != (PACKAGE,) or path.suffix != ".py" or not (REPO_ROOT / path).is_file():
        raise UsageError(f"{name}: no such module of {PACKAGE} (give e.g. tpuwatch/alerting/dispatch.py)")
    return path.as_posix()


def dotted(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _imports(text: str, module: str) -> bool:
    """Whether Python source ``text`` imports ``module`` (``import a.b``, ``from a.b import x``, ``from a import
    b``)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    parent, _, leaf = module.rpartition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == module or a.name.startswith(module + ".")
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == module or node.module.startswith(module + "."):
                return True
            if node.module == parent and any(a.name == leaf for a in node.names):
                return True
    return False


def importing_tests(path: str) -> list[str]:
    """The test files (``tests/test_*.py``) that import the module at ``path`` themselves."""
    module = dotted(path)
    return [p.relative_to(REPO_ROOT).as_posix() for p in sorted((REPO_ROOT / "tests").glob("test_*.py"))
            if _imports(p.read_text(errors="replace"), module)]


def _copy_checkout(into: Path) -> None:
    for entry in REPO_ROOT.iterdir():
        if entry.name in COPY_IGNORE or entry.name.endswith(".egg-info") or entry.name == "pyproject.toml":
            continue
        if entry.is_dir():
            shutil.copytree(entry, into / entry.name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        elif entry.is_file():
            shutil.copy2(entry, into / entry.name)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _write_config(into: Path, path: str, tests: list[str]) -> None:
    also = sorted(e.name for e in into.iterdir() if e.is_dir() and e.name not in {PACKAGE, "tests"})
    text = (REPO_ROOT / "pyproject.toml").read_text()
    if "[tool.mutmut]" in text:
        raise UsageError("pyproject.toml already has a [tool.mutmut] section; this script writes its own")
    text += ("\n[tool.mutmut]\n"
             f"source_paths = [\"{PACKAGE}\"]\n"
             f"only_mutate = {_toml_list([path])}\n"
             f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
             "pytest_add_cli_args = [\"-p\", \"no:cacheprovider\"]\n"
             f"also_copy = {_toml_list(also)}\n"
             "use_git_change_detection = false\n"
             "use_setproctitle = false\n")
    (into / "pyproject.toml").write_text(text)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop mutmut and its workers (its own process group): SIGTERM, then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _source_line(source_lines: list[str], path_name: str, key: str, diff: str) -> tuple[int | None, str, str]:
    """The checkout's line a mutant changed, that line, and the line as mutated, from mutmut's diff."""
    removed = [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    old = removed[0].strip() if removed else ""
    new = added[0].strip() if added else ""
    mangled = key[len(dotted(path_name)) + 1:].rsplit("__mutmut_", 1)[0]
    cls, func = (mangled.split("ǁ")[1:3] if mangled.startswith("xǁ") else (None, mangled.removeprefix("x_")))
    span = (1, len(source_lines))
    tree = ast.parse("\n".join(source_lines))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and cls is not None and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == func:
                    span = (item.lineno, item.end_lineno or item.lineno)
        elif cls is None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func \
                and node.col_offset == 0:
            span = (node.lineno, node.end_lineno or node.lineno)
    # The lines of the function before the changed one, as the diff shows them (up to 3): where they and the changed
    # line stand in the function is the line (the function's text may appear twice, e.g. two "return True").
    body = diff.split("\n@@", 1)[-1].splitlines()[1:]
    before = []
    for ln in body:
        if ln.startswith("-"):
            break
        before.append(ln[1:].strip())
    want = [*before, old]
    low, high = span
    matches = [n for n in range(low, high + 1) if old and source_lines[n - 1].strip() == old]
    exact = [n for n in matches if n - len(before) >= 1
             and [s.strip() for s in source_lines[n - 1 - len(before):n]] == want]
    line = (exact or matches)[0] if exact or matches else None
    return line, old, new


_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = sys.argv[1], json.loads(sys.stdin.read())
print(json.dumps({n: get_diff_for_mutant(n, path=path) for n in names}))
"""


def run_module(path: str, tests: list[str], budget: float, jobs: int, log: Path) -> Result:
    result = Result(path, tests)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tpuwatch-mutation-"))
    try:
        _copy_checkout(work)
        _write_config(work, path, tests)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        cmd = ["nice", "-n", "19", sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)]
        with open(log, "ab") as out:
            out.write(f"\n==> {path} ({len(tests)} test files), budget {budget:.0f} s\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait(max(1.0, budget))
            except subprocess.TimeoutExpired:
                _stop(proc)
                result.partial, code = True, 0
            except BaseException:
                _stop(proc)
                raise
        meta = work / "mutants" / (path + ".meta")
        if not meta.exists():
            raise RuntimeError(f"mutmut made no mutants of {path} (exit {code}); its output is in {log}")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        result.total = len(codes)
        for value in codes.values():
            if value is None:
                continue
            if value in NO_TESTS:
                result.no_tests += 1
                continue
            result.run += 1
            if value in KILLED:
                result.killed += 1
            elif value in SURVIVED:
                result.survived += 1
            elif value in TIMEOUT:
                result.timeouts += 1
            else:
                result.other += 1
        if code != 0 and not result.partial:
            raise RuntimeError(f"mutmut exited {code} on {path}; its output is in {log}")
        result.partial = result.partial or any(v is None for v in codes.values())
        survivors = sorted(k for k, v in codes.items() if v in SURVIVED)
        if survivors:
            found = subprocess.run([sys.executable, "-c", _DIFFS, path], cwd=work, env=env, check=True,
                                   input=json.dumps(survivors), capture_output=True, text=True)
            diffs = json.loads(found.stdout)
            source_lines = (REPO_ROOT / path).read_text().splitlines()
            for name in survivors:
                line, old, new = _source_line(source_lines, path, name, diffs[name])
                result.survivors.append(Survivor(name.rsplit(".", 1)[-1], line, old, new))
            result.survivors.sort(key=lambda s: (s.line or 0, s.name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        result.seconds = time.monotonic() - started
    return result


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def report(results: list[Result], before: dict[str, dict[str, object]], command: str, started: datetime,
           excluded: list[str] | None = None) -> str:
    lines = ["## Mutation testing", "",
             "mutmut 3 on each module, against the test files that import it (`benchmarks/mutation.py`). "
             "Score: mutants caught (killed, or stopped by the time limit) of those run; mutants no test reaches "
             "are counted apart. The surviving mutants left, and why each is equivalent, are in "
             "[docs/mutation.md](docs/mutation.md).", ""]
    head = "| Module | Mutants | Run | Killed | Timeouts | Survived | No test | Score |"
    if before:
        head += " Before |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        run = f"{r.run} of {r.total} (partial)" if r.partial else str(r.run)
        row = (f"| `{r.module}` | {r.total} | {run} | {r.killed} | {r.timeouts} | {r.survived} | {r.no_tests} "
               f"| {_pct(r.score)} |")
        if before:
            b = before.get(r.module)
            if b is None:
                row += " - |"
            else:
                partial = ", partial" if b["partial"] else ""
                row += f" {_pct(b['score'])} ({b['run']} of {b['total']} run{partial}) |"  # type: ignore[arg-type]
        lines.append(row)
    lines.append("")
    if excluded:
        lines += [f"Left out of every module's tests (`--exclude-tests`): {', '.join(f'`{t}`' for t in excluded)}.", ""]
    for r in results:
        lines += [f"### `{r.module}`", "",
                  f"Tests: {', '.join(f'`{t}`' for t in r.tests)}. Time: {r.seconds:.0f} s.", ""]
        if r.other:
            lines += [f"{r.other} mutants ended otherwise (mutmut: suspicious or segfault).", ""]
        if not r.survivors:
            lines += ["No survivors.", ""]
            continue
        lines += ["| Line | Mutant | Was | Became |", "|---|---|---|---|"]
        for s in r.survivors:
            lines.append(f"| {s.line or '?'} | `{s.name}` | `{_cell(s.source)}` | `{_cell(s.mutated)}` |")
        lines.append("")
    facts = {"CPU": f"{cpu_model()} ({os.cpu_count()} cores, shared; mutmut under nice -n 19)",
             "Python": sys.version.split()[0], "mutmut": _mutmut_version()}
    return "\n".join(lines + machine_and_command(facts, started, command))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _mutmut_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mutmut")
    except PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", metavar="MODULE")
    parser.add_argument("--budget", type=float, default=3600.0, help="wall-clock seconds for the whole command")
    parser.add_argument("--tests", nargs="+", metavar="FILE", help="test files to run instead of the importers")
    parser.add_argument("--exclude-tests", nargs="+", metavar="FILE", default=[],
                        help="test files not to run (e.g. one too slow for the budget): said in the report")
    parser.add_argument("--jobs", type=int, default=1, help="mutmut worker processes (default 1)")
    parser.add_argument("--json", type=Path, help="save the figures to this file")
    parser.add_argument("--before", type=Path, help="a --json file of an earlier run, shown beside this one")
    parser.add_argument("--output", type=Path, default=BENCHMARKS_MD)
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    parser.add_argument("--log", type=Path, help="mutmut's output (default: a file in the temp directory)")
    args = parser.parse_args(argv)
    started = datetime.now(timezone.utc)
    try:
        if args.budget <= 0 or args.jobs < 1:
            raise UsageError("--budget must be positive and --jobs at least 1")
        paths = list(dict.fromkeys(module_path(m) for m in args.modules))
        if args.tests:
            for t in args.tests:
                if not (REPO_ROOT / t).is_file():
                    raise UsageError(f"{t}: no such test file")
        try:
            import mutmut  # noqa: F401
        except ImportError:
            raise UsageError("mutmut is not installed: pip install 'mutmut==3.8.1'") from None
        before = json.loads(args.before.read_text()) if args.before else {}
        tests = {p: [t for t in args.tests or importing_tests(p) if t not in args.exclude_tests] for p in paths}
        for p, t in tests.items():
            if not t:
                raise UsageError(f"{p}: no test file imports it (name some with --tests)")
    except (UsageError, OSError, ValueError) as e:
        print(f"mutation.py: {e}", file=sys.stderr)
        return 2

    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)
    signal.signal(signal.SIGTERM, terminate)

    log = args.log or Path(tempfile.gettempdir()) / f"tpuwatch-mutation-{os.getpid()}.log"
    deadline = time.monotonic() + args.budget
    results = []
    try:
        for i, p in enumerate(paths):
            budget = (deadline - time.monotonic()) / (len(paths) - i)
            print(f"{p}: {len(tests[p])} test files, {budget:.0f} s ...", file=sys.stderr, flush=True)
            r = run_module(p, tests[p], budget, args.jobs, log)
            print(f"{p}: {r.run} of {r.total} run, score {_pct(r.score)}{' (partial)' if r.partial else ''}",
                  file=sys.stderr, flush=True)
            results.append(r)
    except KeyboardInterrupt:
        print("mutation.py: interrupted; the temporary copies are removed", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"mutation.py: {e}", file=sys.stderr)
        return 1
    command = "python benchmarks/mutation.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    text = report(results, before, command, started, args.exclude_tests)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({r.module: {**asdict(r), "score": r.score} for r in results}, indent=1))
    if not args.no_write:
        write_section("mutation", text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
