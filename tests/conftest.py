"""Shared pytest configuration: deterministic torch on CPU, small thread counts."""

from __future__ import annotations

import os

import pytest

EXTERNAL_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "external-data")


@pytest.fixture
def external_data() -> str:
    """Path of ``../shared/external-data``; skips the test cleanly where it is absent."""
    path = os.path.abspath(EXTERNAL_DATA)
    if not os.path.isdir(path):
        pytest.skip("../shared/external-data is absent")
    return path
