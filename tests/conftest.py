"""Shared pytest configuration: the external-data fixture, the tier markers and their guards.

Tiers are folders (markers declared in pyproject.toml): ``tests/unit/`` (in-process), ``tests/integration/``
(processes, SeaweedFS, Lightning / HF Trainer, kill tests) and ``tests/distributed/`` (torchrun, process
groups). Each test gets its folder's marker here, and ``quick`` when it is in ``tests/unit/`` and not
``slow``: the quick tier is ``pytest -m quick``. A test outside a tier folder, or one carrying another
folder's marker, stops the run. Every integration or distributed test that uses ``tmp_path`` fails when
a run directory under it holds a ``resume_mismatch`` event (coci's resume self-check found a resume
that was not exact), unless it is marked ``inexact_resume``. ``tests/jobs/`` holds the scripts the tests launch, ``tests/helpers/`` the
in-process helpers; both are on ``pythonpath``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

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
    return None


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
