"""coci's imports point down a fixed order of layers, and no import cycle joins coci's modules.

Read from the source with ``ast`` (nothing is imported), every import counts: at module level,
inside a function (lazy), and under ``if TYPE_CHECKING``. The layers, lowest first (docs/concepts/architecture.md
draws the same order):

0. measurement: ``coci.profiler`` (the repository's ``profiler/`` folder; it imports nothing else of coci)
1. foundation: ``coci._version``, ``coci.errors``, ``coci.knobs``, ``coci.checks`` (built on the
   profiler's checks), ``coci.units``
2. the process and the run directory's own files: ``coci.safe_files``, ``coci.events``,
   ``coci.distributed``, ``coci.overhead``, ``coci.preemption``
3. checkpoints: ``coci.checkpoint`` and its subpackages
4. earlier runs' loss curves: ``coci.curves``
5. planning: ``coci.planning``
6. analysis: ``coci.analysis`` (the report, the simulator)
7. the training loop's objects: ``coci.config`` (the session's configuration), ``coci.session``, ``coci.loader`` (and its order, ``coci.sample_order``)
8. framework integrations: ``coci.integrations``
9. the command line: ``coci.cli`` (and ``coci.__main__``, ``python -m coci``)
10. the package's public names: ``coci`` (its ``__init__``)

A module may import its own layer or any lower one; ``from coci import knobs`` imports the module
``coci.knobs``, not the package's public names. A new module of ``coci/`` must be given a layer here.
"""

from __future__ import annotations

import ast
import functools
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: tuple[tuple[str, ...], ...] = (
    ("coci.profiler",),
    ("coci._version", "coci.errors", "coci.knobs", "coci.checks", "coci.units"),
    ("coci.safe_files", "coci.events", "coci.distributed", "coci.overhead", "coci.preemption", "coci.resume_check"),
    ("coci.checkpoint",),
    ("coci.curves",),
    ("coci.planning",),
    ("coci.analysis",),
    ("coci.config", "coci.session", "coci.loader", "coci.sample_order"),
    ("coci.integrations",),
    ("coci.cli", "coci.__main__"),
)


def _files() -> dict[str, tuple[Path, bool]]:
    """Every module of coci: name -> (file, is a package). ``profiler/`` is ``coci.profiler``."""
    found: dict[str, tuple[Path, bool]] = {}
    for base, prefix in ((ROOT / "coci", ("coci",)), (ROOT / "profiler", ("coci", "profiler"))):
        for folder, dirs, names in os.walk(base):  # does not follow coci/profiler, the link to profiler/
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            parts = prefix + Path(folder).relative_to(base).parts
            for name in names:
                if name.endswith(".py"):
                    package = name == "__init__.py"
                    found[".".join(parts if package else (*parts, name[:-3]))] = (Path(folder) / name, package)
    return found


@functools.cache
def _tree(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per test process (four tests walk every module)."""
    return ast.parse(path.read_text(), str(path))


def _targets(module: str, package: bool, node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The coci modules ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module.split(".") if package else module.split(".")[:-1]
        if node.level:
            base = base[: len(base) - node.level + 1]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules]
        names = submodules if len(submodules) == len(node.names) else [source, *submodules]
    targets = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("coci") and name != module:
            targets.add(name)
    return targets


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported coci module: line of the first such import}."""
    files = _files()
    graph: dict[str, dict[str, int]] = {}
    for module, (path, package) in files.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, package, node, set(files)):
                    edges.setdefault(target, node.lineno)
    return graph


def _layer(module: str) -> int:
    if module == "coci":
        return len(LAYERS)
    for index, prefixes in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    raise AssertionError(f"{module} has no layer: add it to tests/unit/test_layers.py's LAYERS (and docs/concepts/architecture.md)")


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_lazy_and_type_checking_imports() -> None:
    graph = _graph()
    assert "coci.errors" in graph["coci.checks"]
    assert "coci.analysis.report" in graph["coci"]  # a lazy import of the package's __getattr__
    assert "coci.profiler.knobs" in graph["coci.profiler.stats"]  # a relative import of the profiler


def test_every_import_points_down_the_layers() -> None:
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)}) at line {line}"
        for module, edges in sorted(_graph().items())
        for target, line in sorted(edges.items())
        if _layer(target) > _layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle_among_cocis_modules() -> None:
    assert not _cycles(_graph())


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_no_coci_module_imports_the_top_level_profiler() -> None:
    """Only ``coci.profiler``: a top-level ``profiler`` is what a user's own ``profiler.py`` shadows."""
    for module, (path, _) in _files().items():
        for node in ast.walk(_tree(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not [n for n in names if n == "profiler" or n.startswith("profiler.")], module


def test_the_distribution_lists_every_package_folder() -> None:
    """pyproject.toml lists coci's packages (a mapped folder is invisible to setuptools' finder):
    a package folder missing there would be missing from every installed copy."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {module for module, (_, package) in _files().items() if package}
    assert set(config["packages"]) == packages
    assert config["package-dir"] == {"coci.profiler": "profiler"}
    assert (ROOT / "coci" / "profiler").resolve() == (ROOT / "profiler").resolve()  # a checkout on sys.path: the same folder
