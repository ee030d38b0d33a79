"""The tier rules of tests/conftest.py: a test's folder decides its tier, and ``-m quick`` skips
importing the integration and distributed folders."""

from __future__ import annotations

import importlib
import os
import signal
import tomllib
from pathlib import Path

import pytest
from conftest import QUICK, TESTS, TIERS, ProcessInUnitTest, _selects_quick_only, _starts_processes, _tier_of, _unexplained_slow_marks

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_module_sits_in_a_tier_folder() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    assert modules
    assert [m for m in modules if _tier_of(m) is None] == []
    assert _tier_of(TESTS / "test_stray.py") is None
    assert _tier_of(TESTS / "jobs" / "train_job.py") is None
    assert _tier_of(ROOT / "coci" / "unit" / "test_x.py") is None


def test_this_module_is_a_quick_unit_test(request: pytest.FixtureRequest) -> None:
    names = {mark.name for mark in request.node.iter_markers()}
    assert {"unit", QUICK} <= names
    assert not names & {"integration", "distributed"}


def test_only_quick_selections_skip_the_slower_folders() -> None:
    assert _selects_quick_only("quick")
    assert _selects_quick_only("quick and not cuda")
    assert not _selects_quick_only("not quick")
    assert not _selects_quick_only("quick or integration")
    assert not _selects_quick_only("")


def test_the_tier_markers_are_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0] for line in config["markers"]}
    assert {*TIERS, QUICK, "slow"} <= registered
    assert "--strict-markers" in config["addopts"]


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import subprocess\n", "imports subprocess"),
        ("from multiprocessing import Pool\n", "imports multiprocessing"),
        ("from concurrent.futures import ProcessPoolExecutor\n", "imports concurrent.futures.ProcessPoolExecutor"),
        ("import os\n\ndef test_x():\n    os.kill(123, 9)\n", "calls os.kill"),
        ("import signal\n\ndef test_x():\n    signal.raise_signal(signal.SIGTERM)\n", "calls signal.raise_signal"),
        ("from seaweed import start\n", "imports subprocess (in helpers/seaweed.py)"),
        ('"""Not subprocess, not os.kill(1, 9): words in a docstring."""\nimport os  # subprocess\n', None),
        ("import signal\n\nSIGNALS = (signal.SIGUSR1,)\n", None),
    ],
)
def test_a_unit_module_that_starts_processes_or_sends_signals_is_found(tmp_path: Path, source: str, found: str | None) -> None:
    module = tmp_path / "test_module.py"
    module.write_text(source)
    assert _starts_processes(str(module)) == found


def test_every_unit_module_runs_in_process() -> None:
    """The rule the collection enforces, over the tree as it is (tests/integration/ holds the rest)."""
    assert {m.name: use for m in sorted((TESTS / "unit").glob("test_*.py")) if (use := _starts_processes(str(m)))} == {}


def test_a_slow_mark_without_a_comment_saying_why_is_found(tmp_path: Path) -> None:
    """The rule of CONTRIBUTING.md's tier table: a unit test marked slow says, on the mark's line, what
    takes it seconds; the collection refuses one that does not."""
    module = tmp_path / "test_module.py"
    module.write_text(
        "import pytest\n@pytest.mark.slow\ndef test_a(): pass\n@pytest.mark.slow  # a full plan (~2 s)\ndef test_b(): pass\n"
        "CASES = [pytest.param(1, marks=pytest.mark.slow)]\nTEXT = 'pytest.mark.slow'\n"
    )
    assert _unexplained_slow_marks(str(module)) == (2, 6)
    assert {m.name: lines for m in sorted((TESTS / "unit").glob("test_*.py")) if (lines := _unexplained_slow_marks(str(m)))} == {}


def test_a_unit_test_that_starts_a_process_or_sends_a_signal_fails() -> None:
    """At run time, through whatever code the test calls (here the guard of this very test)."""
    with pytest.raises(ProcessInUnitTest, match="subprocess.Popen in a unit test"):
        importlib.import_module("subprocess").run(["true"])
    kill = os.kill
    with pytest.raises(ProcessInUnitTest, match="os.kill"):
        kill(os.getpid(), signal.SIGUSR1)
    kill(os.getpid(), 0)  # the liveness probe sends nothing
    worker = importlib.import_module("multiprocessing").get_context("spawn").Process(target=print)
    with pytest.raises(ProcessInUnitTest, match="multiprocessing"):
        worker.start()
