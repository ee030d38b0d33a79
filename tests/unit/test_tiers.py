"""The tier rules of tests/conftest.py: a test's folder decides its tier, and ``-m quick`` skips
importing the integration and distributed folders."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from conftest import QUICK, TESTS, TIERS, _selects_quick_only, _tier_of

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
