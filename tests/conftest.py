"""Shared pytest configuration: the external-data fixture, the tier markers and their guards.

Tiers are folders (markers declared in pyproject.toml): ``tests/unit/`` (in-process), ``tests/integration/``
(processes, SeaweedFS, Lightning / HF Trainer, kill tests) and ``tests/distributed/`` (torchrun, process
groups). Each test gets its folder's marker here, and ``quick`` when it is in ``tests/unit/`` and not
``slow``: the quick tier is ``pytest -m quick``. A test outside a tier folder, one carrying another
folder's marker, or a unit test whose module starts processes or sends signals stops the run; a unit
test that starts one at run time (through the code it calls) fails. Every integration or distributed
test that uses ``tmp_path`` fails when a run directory under it holds a ``resume_mismatch`` event
(coci's resume self-check found a resume that was not exact), unless it is marked ``inexact_resume``.
``tests/jobs/`` holds the scripts the tests launch, ``tests/helpers/`` the
in-process helpers; both are on ``pythonpath``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import multiprocessing.process
import os
import re
import signal
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The tier folders under ``tests/``; each is also the marker its tests get.
TIERS = ("unit", "integration", "distributed")

#: Added to every ``unit`` test not marked ``slow``.
QUICK = "quick"

TESTS = Path(__file__).resolve().parent

#: A test module whose source names one of these launches a torch.distributed job.
_DISTRIBUTED_LAUNCHERS = ("torchrun", "torch.distributed.run", "dist_job.py")

#: A module-level ``pytestmark`` whose first marker is ``slow`` (alone or first in a list).
_MODULE_MARKED_SLOW = re.compile(r"^pytestmark = \[?\s*pytest\.mark\.slow\b", re.MULTILINE)

#: Unit tests run in-process: a unit test module (or a helper of tests/helpers/, tests/jobs/ it
#: imports) that imports one of these modules, or calls one of these functions, starts processes or
#: sends signals, and belongs in tests/integration/. Checked on the source when the tests are
#: collected; ``_in_process_only`` refuses the same at run time, through whatever code the test calls.
_PROCESS_MODULES = ("subprocess", "multiprocessing", "pty", "concurrent.futures.process")
_PROCESS_CALLS = {
    "os": ("fork", "forkpty", "kill", "killpg", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnve"),
    "signal": ("raise_signal", "pthread_kill", "alarm", "setitimer"),
    "concurrent.futures": ("ProcessPoolExecutor",),
}

# Where PYTHONDONTWRITEBYTECODE is set (this machine's shells, some CI images) no process writes a
# bytecode cache, so every pytest worker compiles coci's modules and rewrites every test module again
# (4 of the 10 CPU seconds of each worker's collection) and every job a test starts compiles coci
# again (~0.3 s each). The suite writes the caches (__pycache__/, git-ignored) from its own
# processes; the processes it starts keep the environment they were given and read them.
sys.dont_write_bytecode = False

EXTERNAL_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "external-data")


@pytest.fixture
def external_data() -> str:
    """Path of ``../shared/external-data``; skips the test cleanly where it is absent."""
    path = os.path.abspath(EXTERNAL_DATA)
    if not os.path.isdir(path):
        pytest.skip("../shared/external-data is absent")
    return path


@pytest.fixture(autouse=True)
def _every_resume_exact(request: pytest.FixtureRequest) -> Iterator[None]:
    """After an integration or distributed test, no run directory under its ``tmp_path`` holds a
    ``resume_mismatch`` event: every kill test's resumes are checked by coci's own self-check."""
    checked = "tmp_path" in request.fixturenames and request.node.get_closest_marker("inexact_resume") is None
    checked = checked and _tier_of(request.node.path) in ("integration", "distributed")
    root = request.getfixturevalue("tmp_path") if checked else None  # set up first, so torn down after this check
    yield
    if root is None:
        return
    found = resume_mismatches(root)
    assert not found, f"coci's resume self-check found a resume that was not exact: {found[:3]}"


def resume_mismatches(root: Path) -> list[str]:
    """``resume_mismatch`` events in every event log under ``root`` (``path: step ...``)."""
    found = []
    for log in sorted(root.rglob("events*.jsonl")):
        if log.is_file() and not log.is_symlink():
            found += [f"{log}: {line[:300]}" for line in log.read_text(errors="replace").splitlines() if '"event":"resume_mismatch"' in line]
    return found


@functools.cache
def _launches_distributed(module_path: str) -> bool:
    source = Path(module_path).read_text(encoding="utf-8")
    return any(launcher in source for launcher in _DISTRIBUTED_LAUNCHERS)


@functools.cache
def _starts_processes(module_path: str) -> str | None:
    """What in ``module_path``'s source starts a process or sends a signal (an import of a process
    module, a call such as ``os.kill``, or a helper module of tests/helpers/ or tests/jobs/ that does
    either), or None. Read from the syntax tree: a name in a string or a comment does not count."""
    tree = ast.parse(Path(module_path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        found = _process_use(node)
        if found:
            return found
        for name in _imported_modules(node):
            helper = next((TESTS / folder / f"{name}.py" for folder in ("helpers", "jobs") if (TESTS / folder / f"{name}.py").is_file()), None)
            if helper is not None and (inner := _starts_processes(str(helper))):
                return f"{inner} (in {helper.relative_to(TESTS)})"
    return None


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return []


def _process_use(node: ast.AST) -> str | None:
    """``imports subprocess``, ``calls os.kill`` and the like for one syntax node, else None."""
    for name in _imported_modules(node):
        if name.split(".")[0] in _PROCESS_MODULES or name in _PROCESS_MODULES or (
            "." in name and name.rsplit(".", 1)[1] in _PROCESS_CALLS.get(name.rsplit(".", 1)[0], ())
        ):
            return f"imports {name}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        owner, name = node.func.value.id, node.func.attr
        if name in _PROCESS_CALLS.get(owner, ()):
            return f"calls {owner}.{name}"
    return None


def _tier_of(path: Path) -> str | None:
    """The tier folder a test file sits in, or None when it is not in one."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def _tier_problem(item: pytest.Item) -> str | None:
    """Why ``item`` breaks the tier rules, or None when it keeps them."""
    tier = _tier_of(item.path)
    if tier is None:
        return f"{item.nodeid}: put it in one of tests/{{{','.join(TIERS)}}}/"
    foreign = {mark.name for mark in item.iter_markers()} & ({*TIERS, QUICK} - {tier})
    if foreign:
        return f"{item.nodeid}: in tests/{tier}/ but marked {', '.join(sorted(foreign))} (the folder decides the tier)"
    if tier != "distributed" and item.path.suffix == ".py" and _launches_distributed(str(item.path)):
        return f"{item.nodeid}: its module launches torchrun, so it belongs in tests/distributed/"
    if tier == "unit" and item.path.suffix == ".py" and (use := _starts_processes(str(item.path))):
        return f"{item.nodeid}: its module {use}: a test that starts processes or sends signals belongs in tests/integration/"
    if tier == "unit" and item.path.suffix == ".py" and (lines := _unexplained_slow_marks(str(item.path))):
        return f"{item.nodeid}: its module marks a test slow without a comment saying what takes the time (line {', '.join(map(str, lines))})"
    return None


@functools.cache
def _unexplained_slow_marks(module_path: str) -> tuple[int, ...]:
    """Lines of ``module_path`` that mark a unit test ``slow`` (``pytest.mark.slow``) with no comment
    on the same line: every slow unit test says what makes it take seconds (CONTRIBUTING.md)."""
    with open(module_path, "rb") as source:
        tokens = list(tokenize.tokenize(source.readline))
    commented = {token.start[0] for token in tokens if token.type == tokenize.COMMENT}
    names = [(token.string, token.start[0]) for token in tokens if token.type in (tokenize.NAME, tokenize.OP)]
    marks = {row for i, (name, row) in enumerate(names) if [n for n, _ in names[i : i + 5]] == ["pytest", ".", "mark", ".", "slow"]}
    return tuple(sorted(marks - commented))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its folder's tier (and ``quick`` for a unit test not marked ``slow``) before
    ``-m`` selects, and stop the run on a test outside a tier folder, carrying another tier's marker, or
    launching torchrun outside ``tests/distributed/``: no test can slip into a faster tier."""
    problems = [problem for item in items if (problem := _tier_problem(item))]
    if problems:
        raise pytest.UsageError("tests outside their tier:\n  " + "\n  ".join(problems))
    for item in items:
        tier = _tier_of(item.path) or "unit"  # never None here: _tier_problem found none outside a tier
        item.add_marker(tier)
        if tier == "unit" and item.get_closest_marker("slow") is None:
            item.add_marker(QUICK)


class ProcessInUnitTest(AssertionError):
    """A unit test started a process or sent a signal (directly or through the code it calls)."""


@contextlib.contextmanager
def _in_process_only(nodeid: str) -> Iterator[None]:
    """While a unit test runs, starting a process (subprocess, multiprocessing, fork, spawn) or
    sending a signal (``os.kill`` other than the liveness probe ``kill(pid, 0)``, ``raise_signal``,
    ...) raises ProcessInUnitTest naming the test: it belongs in tests/integration/."""

    def refuse(what: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise ProcessInUnitTest(f"{nodeid}: {what} in a unit test: move it to tests/integration/ (unit tests run in-process)")

        return refused

    kill = os.kill

    def probe_only(pid: int, sig: int) -> None:
        if sig != 0:
            refuse(f"os.kill(..., {sig})")()
        kill(pid, sig)

    patches: list[tuple[Any, str, Any]] = [
        (os, "kill", probe_only),
        (subprocess.Popen, "__init__", refuse("subprocess.Popen")),
        (multiprocessing.process.BaseProcess, "start", refuse("a multiprocessing process (a DataLoader worker?)")),
        *((os, name, refuse(f"os.{name}")) for name in ("fork", "forkpty", "killpg", "posix_spawn", "posix_spawnp") if hasattr(os, name)),
        *((signal, name, refuse(f"signal.{name}")) for name in ("raise_signal", "pthread_kill", "alarm", "setitimer")),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A unit test runs with process starts and signals refused (``_in_process_only``)."""
    if _tier_of(item.path) != "unit":
        yield
        return
    with _in_process_only(item.nodeid):
        yield


def _selects_quick_only(expression: str) -> bool:
    """Whether a ``-m`` expression keeps quick tests only (``quick``, ``quick and ...``)."""
    return re.fullmatch(r"quick( and [\w ]+)?", expression.strip()) is not None and " or " not in expression


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Do not even import what the mark expression deselects as a whole: with ``-m quick`` the
    integration and distributed folders and unit modules marked slow, with ``-m "not slow ..."`` (no
    ``or``) modules marked slow. Their tests would all be deselected, and their imports (lightning,
    nbclient) cost seconds per xdist worker. Any other expression collects everything as usual."""
    expression = config.getoption("markexpr") or ""
    quick_only = _selects_quick_only(expression)
    if quick_only and collection_path.parent == TESTS and collection_path.name in TIERS and collection_path.name != "unit":
        return True
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not quick_only and ("not slow" not in expression or " or " in expression):
        return None
    if _MODULE_MARKED_SLOW.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None
