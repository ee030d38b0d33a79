"""Shared pytest configuration: the external-data fixture and the marker guard.

Markers (declared in pyproject.toml): ``slow`` for tests that spawn or kill processes, run the
notebook or a long soak; ``distributed`` for tests that launch ``torchrun`` / several
``torch.distributed`` processes. The quick tier is ``pytest -m "not slow and not distributed"``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

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


@functools.cache
def _launches_distributed(module_path: str) -> bool:
    source = Path(module_path).read_text(encoding="utf-8")
    return any(launcher in source for launcher in _DISTRIBUTED_LAUNCHERS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a test from a module that launches torchrun (or ``tests/dist_job.py``) unless it
    carries the ``distributed`` marker, so the quick tier can never start a distributed job."""
    unmarked = [
        item.nodeid
        for item in items
        if item.path.suffix == ".py"
        and _launches_distributed(str(item.path))
        and item.get_closest_marker("distributed") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests from modules that launch torchrun must be marked @pytest.mark.distributed: " + ", ".join(unmarked)
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m "not slow ..."`` (no ``or``), do not even import a module marked slow as a whole:
    every test in it would be deselected, and its imports (lightning, nbclient) cost seconds per
    xdist worker. Any other mark expression collects everything as usual."""
    expression = config.getoption("markexpr") or ""
    if "not slow" not in expression or " or " in expression or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    if _MODULE_MARKED_SLOW.search(collection_path.read_text(encoding="utf-8")):
        return True
    return None
