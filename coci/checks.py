"""Argument checks shared by every public entry point: each failure is a ``ConfigError`` that names
the field and shows the value it got. ``bool`` is never accepted where a number is asked for,
although Python counts it as an ``int``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coci.errors import ConfigError


def is_int(value: Any) -> bool:
    """True for a Python or NumPy integer, False for ``bool`` and everything else."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """True for a Python or NumPy integer or float, False for ``bool`` and everything else."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def integer(value: Any, field: str, *, minimum: int | None = None) -> int:
    """``value`` as an ``int`` at least ``minimum``; a ``ConfigError`` naming ``field`` otherwise."""
    if not is_int(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ConfigError(f"{field} must be an integer{bound}, got {value!r}")
    return int(value)


def optional_integer(value: Any, field: str, *, minimum: int | None = None) -> int | None:
    """Like :func:`integer`, with ``None`` passed through."""
    return None if value is None else integer(value, field, minimum=minimum)


def number(value: Any, field: str, *, positive: bool = False, allow_none: bool = False) -> float | None:
    """``value`` as a finite, non-negative ``float`` (positive where asked); ``None`` where allowed."""
    if value is None and allow_none:
        return None
    if not is_number(value):
        raise ConfigError(f"{field} must be a number{' or None' if allow_none else ''}, got {value!r}")
    result = float(value)
    if not math.isfinite(result) or result < 0 or (positive and result == 0):
        raise ConfigError(f"{field} must be {'positive' if positive else 'non-negative'} and finite, got {value!r}")
    return result
