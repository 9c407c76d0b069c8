"""tpuwatch's layers: no import cycle between its parts nor between its modules, every part imports only parts
of its layer or below, and the bottom layer (``tpuwatch.hw``) is the standard library's alone.

A part is a subpackage (``tpuwatch/devices/``) or a top-level module (``tpuwatch/store.py``); the package
itself (``__version__``) is a part of the bottom layer.  A cycle within a part is a cycle between its modules:
a package's ``__init__`` is a module, so one that imports its submodules while a submodule imports a name from
it is a cycle (importing a submodule loads its package first; that alone is not counted as an import).
Every import is read from the source with ``ast``: at module level, inside functions (an import put in a
function hides a cycle, it does not remove it), under ``TYPE_CHECKING``, and, in a module that calls
``importlib.import_module``, the tpuwatch module names its strings hold (the command line's subcommands).
docs/architecture.md describes the layers.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tpuwatch"
ROOT = "tpuwatch"  # the package's own __init__.py
DECLARATION = "*.plugin"  # a plugin's declaration, tpuwatch/PACKAGE/plugin.py: a part of its own, a layer low

# Bottom first.  A part may import the parts of its own layer and of the layers below; a new part gets a line.
LAYERS: list[tuple[str, set[str]]] = [
    ("the bottom: hardware and host facts, readings, how quantities read, the backends by name",
     {ROOT, "hw", "samples", "units", "backends", "probewire"}),
    ("plumbing", {"syntax", "schema", "yamlfile", "statefile", "metricspec", "pluginspec", "logsetup", "sdnotify",
                  "httpd", "malloc"}),
    ("plugin declarations: each plugin's plugin.py (its config section, metrics, conditions, drills)",
     {DECLARATION}),
    ("config, the registered plugins, the metric catalogue, the store, the state directory, the web config, "
     "the receiver types", {"config", "plugins", "catalog", "store", "statedir", "webconfig", "notifiers"}),
    ("pod attribution: cgroups and the kubelet's PodResources API", {"pods"}),
    ("the pipeline's frame: the collector protocol, the guard, the sampler", {"collectors", "sampler"}),
    ("collectors and plugins", {"devices", "host", "kernel_log", "canary", "cloud", "jobreports", "plugincontext"}),
    ("libraries for other programs: the in-job probe (jax)", {"probe"}),
    ("analysis", {"analysis"}),
    ("fire drills: what --simulate changes, what each drill needs, the simulated state and past", {"drills"}),
    ("alerting", {"alerting"}),
    ("actions", {"kubernetes"}),
    ("what a config builds: the registry of collectors, the assembly of parts", {"registry", "assembly"}),
    ("views of the store", {"exporter", "web", "health", "report", "views"}),
    ("the lifecycle and the commands", {"daemon", "cli", "clidoc", "__main__"}),
]
_RANKS = {part: rank for rank, (_, parts) in enumerate(LAYERS) for part in parts}


class _Ranks(dict[str, int]):
    """Part -> layer; every plugin's declaration (``cloud.plugin``) in the declarations' layer, and a plugin's
    folder not listed in LAYERS among the collectors and plugins."""

    def __missing__(self, part: str) -> int:
        if part.endswith(".plugin"):
            return _RANKS[DECLARATION]
        if (PACKAGE / part / "plugin.py").is_file():  # a plugin's folder, with no line here
            return _RANKS["devices"]
        raise KeyError(part)

    def __contains__(self, part: object) -> bool:
        return isinstance(part, str) and (part in _RANKS or part.endswith(".plugin")
                                          or (PACKAGE / part / "plugin.py").is_file())


RANK = _Ranks(_RANKS)
# Modules that must run with the standard library alone (and the bottom layer): the canary worker imports
# canary/holds.py before jax, in whatever interpreter canary.python names; the in-job probe talks to the daemon
# with the standard library alone.
STDLIB_ONLY = ["hw/*.py", "canary/holds.py", "probewire.py", "probe/channel.py", "probe/chips.py"]
STDLIB_TOO = ("tpuwatch.hw", "tpuwatch.probewire")  # the tpuwatch modules that are standard library only
_MODULE_NAME = re.compile(r"tpuwatch(\.[A-Za-z_][A-Za-z0-9_]*)+")

Edge = tuple[str, str, int]  # (imported module, file, line)


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _part(module: str) -> str:
    """The part a tpuwatch module belongs to: ``tpuwatch.devices.tpu`` -> ``devices``."""
    names = module.split(".")
    if len(names) == 3 and names[2] == "plugin":
        return f"{names[1]}.plugin"
    return names[1] if len(names) > 1 else ROOT


def imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in one source file, names resolved to absolute module names."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    text = path.read_text(encoding="utf-8")
    dynamic = "import_module" in text  # then a string naming a tpuwatch module is a module it may import
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # ``from tpuwatch import statefile`` imports the module tpuwatch.statefile
                submodule = f"{base}.{alias.name}"
                found.append((submodule if _is_module(submodule) else base, node.lineno))
        elif dynamic and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _MODULE_NAME.fullmatch(node.value) and _is_module(node.value):
                found.append((node.value, node.lineno))
    return found


def _module(module: str) -> str:
    """The node of the module-level graph: the module itself."""
    return module


def graph(node: Callable[[str], str] = _part) -> dict[str, dict[str, Edge]]:
    """Part -> imported part -> one import that makes the edge; with ``node=_module``, module -> imported module."""
    edges: dict[str, dict[str, Edge]] = defaultdict(dict)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = node(_module_of(path))
        for module, line in imports(path):
            if module == ROOT or module.startswith(ROOT + "."):
                target = node(module)
                if target != source:
                    edges[source].setdefault(target, (module, str(path.relative_to(PACKAGE.parent)), line))
    return edges


def cycles(edges: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """One cycle (a, b, ..., a) through each strongly connected group of nodes (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(part: str) -> None:
        index[part] = low[part] = len(index)
        stack.append(part)
        for target in edges.get(part, {}):
            if target not in index:
                visit(target)
                low[part] = min(low[part], low[target])
            elif target in stack:
                low[part] = min(low[part], index[target])
        if low[part] == index[part]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == part:
                    break
            if len(group) > 1:
                groups.append(group)

    for part in sorted(edges):
        if part not in index:
            visit(part)
    return [_cycle_through(min(group), group, edges) for group in groups]


def _cycle_through(start: str, group: set[str], edges: dict[str, dict[str, Edge]]) -> list[str]:
    """The shortest way from ``start`` back to it within ``group`` (breadth first)."""
    paths = {start: [start]}
    queue = deque([start])
    while queue:
        part = queue.popleft()
        for target in sorted(edges.get(part, {})):
            if target == start:
                return [*paths[part], start]
            if target in group and target not in paths:
                paths[target] = [*paths[part], target]
                queue.append(target)
    raise AssertionError(f"no way back to {start} in {sorted(group)}")


def _describe(path: list[str], edges: dict[str, dict[str, Edge]]) -> str:
    steps = [f"{a} -> {b} ({edges[a][b][1]}:{edges[a][b][2]} imports {edges[a][b][0]})" for a, b in zip(path, path[1:])]
    return "; ".join(steps)


@pytest.mark.parametrize("node", [_part, _module], ids=["parts", "modules"])
def test_no_import_cycle_between(node: Callable[[str], str]) -> None:
    edges = graph(node)
    found = cycles(edges)
    assert not found, "import cycles: " + " | ".join(_describe(cycle, edges) for cycle in found)


def test_every_part_imports_only_its_layer_and_below() -> None:
    edges = graph()
    parts = {_part(_module_of(path)) for path in PACKAGE.rglob("*.py")}
    unplaced = sorted(part for part in parts if part not in RANK)
    assert not unplaced, f"parts in no layer (add them to LAYERS): {unplaced}"
    upward = [f"{source} ({LAYERS[RANK[source]][0]}) imports {target} ({LAYERS[RANK[target]][0]}): "
              f"{file}:{line} imports {module}"
              for source, targets in sorted(edges.items()) for target, (module, file, line) in sorted(targets.items())
              if RANK[target] > RANK[source]]
    assert not upward, "imports up the layers: " + "; ".join(upward)


@pytest.mark.parametrize("pattern", STDLIB_ONLY)
def test_the_bottom_layer_needs_the_standard_library_alone(pattern: str) -> None:
    files = sorted(PACKAGE.glob(pattern))
    assert files
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}" for path in files
             for module, line in imports(path)
             if not (module.split(".")[0] in allowed or module in STDLIB_TOO or module.startswith("tpuwatch.hw."))]
    assert not wrong, "; ".join(wrong)


def test_the_checks_see_a_cycle_and_an_import_up_the_layers() -> None:
    edges = {"devices": {"collectors": ("tpuwatch.collectors.guard", "tpuwatch/devices/tpu.py", 184)},
             "collectors": {"devices": ("tpuwatch.devices", "tpuwatch/collectors/__init__.py", 13)},
             "samples": {"store": ("tpuwatch.store", "tpuwatch/samples.py", 1)},
             "store": {"samples": ("tpuwatch.samples", "tpuwatch/store.py", 10)}}
    found = sorted(cycles(edges))
    assert found == [["collectors", "devices", "collectors"], ["samples", "store", "samples"]]
    assert _describe(found[0], edges) == (
        "collectors -> devices (tpuwatch/collectors/__init__.py:13 imports tpuwatch.devices); "
        "devices -> collectors (tpuwatch/devices/tpu.py:184 imports tpuwatch.collectors.guard)")
    assert cycles({"a": {"b": ("", "", 0)}, "b": {"c": ("", "", 0)}}) == []
    three = {"a": {"b": ("", "", 0)}, "b": {"c": ("", "", 0)}, "c": {"a": ("", "", 0)}}
    assert cycles(three) == [["a", "b", "c", "a"]]


def test_imports_in_functions_from_the_package_and_named_for_importlib_are_read() -> None:
    cli = {module: line for module, line in imports(PACKAGE / "cli.py")}
    # ``from tpuwatch import statedir``, ``from tpuwatch.daemon import Daemon`` in a function, and a subcommand's
    # module named in a string
    assert {"tpuwatch", "tpuwatch.statedir", "tpuwatch.daemon", "tpuwatch.canary.cli"} <= set(cli)
    assert graph()["cli"]["daemon"][1:] == ("tpuwatch/cli.py", cli["tpuwatch.daemon"])


def test_the_module_check_sees_a_cycle_within_a_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = {
        "__init__.py": "",
        "notifiers/__init__.py": "from tpuwatch.notifiers import base\n\n\nclass ReceiverConfig: ...\n",
        "notifiers/base.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                             "    from tpuwatch.notifiers import ReceiverConfig\n",
        "kernel_log/__init__.py": "",
        "kernel_log/matcher.py": "def match() -> None:\n    from . import rules\n",
        "kernel_log/rules.py": "from tpuwatch.kernel_log.matcher import match\n",
        "store.py": "import tpuwatch.notifiers.base\n",  # loads tpuwatch.notifiers first: not an edge back to it
    }
    for name, text in sources.items():
        (tmp_path / "tpuwatch" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tpuwatch" / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "tpuwatch")
    assert cycles(graph()) == []  # each cycle lies within one part
    edges = graph(_module)
    assert [_describe(cycle, edges) for cycle in sorted(cycles(edges))] == [
        "tpuwatch.kernel_log.matcher -> tpuwatch.kernel_log.rules "
        "(tpuwatch/kernel_log/matcher.py:2 imports tpuwatch.kernel_log.rules); "
        "tpuwatch.kernel_log.rules -> tpuwatch.kernel_log.matcher "
        "(tpuwatch/kernel_log/rules.py:1 imports tpuwatch.kernel_log.matcher)",
        "tpuwatch.notifiers -> tpuwatch.notifiers.base (tpuwatch/notifiers/__init__.py:1 imports "
        "tpuwatch.notifiers.base); tpuwatch.notifiers.base -> tpuwatch.notifiers "
        "(tpuwatch/notifiers/base.py:4 imports tpuwatch.notifiers)"]
