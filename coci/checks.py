"""Argument checks shared by every public entry point: each failure is a ``ConfigError`` that names
the field and shows the value it got. ``bool`` is never accepted where a number is asked for,
although Python counts it as an ``int``."""

from __future__ import annotations

import math
from typing import Any

from coci.errors import ConfigError
from coci.profiler.checks import is_int, is_number

__all__ = ["integer", "is_int", "is_number", "number", "optional_integer", "optional_number"]


def integer(value: Any, field: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``; a ``ConfigError`` naming ``field`` otherwise."""
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = "" if minimum is None else f" >= {minimum}"
        bound += "" if maximum is None else f" <= {maximum}"
        raise ConfigError(f"{field} must be an integer{bound}, got {value!r}")
    return int(value)


def optional_integer(value: Any, field: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
    """Like ``integer``, with ``None`` passed through."""
    return None if value is None else integer(value, field, minimum=minimum, maximum=maximum)


def number(value: Any, field: str, *, positive: bool = False) -> float:
    """``value`` as a finite, non-negative ``float`` (positive where asked); a ``ConfigError``
    naming ``field`` otherwise."""
    if not is_number(value):
        raise ConfigError(f"{field} must be a number, got {value!r}")
    return _finite(_as_float(value), value, field, positive)


def optional_number(value: Any, field: str, *, positive: bool = False) -> float | None:
    """Like ``number``, with ``None`` passed through."""
    if value is None:
        return None
    if not is_number(value):
        raise ConfigError(f"{field} must be a number or None, got {value!r}")
    return _finite(_as_float(value), value, field, positive)


def _as_float(value: Any) -> float:
    """``float(value)``; an integer too large for a float is infinite (refused by ``_finite``)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _finite(result: float, value: Any, field: str, positive: bool) -> float:
    if not math.isfinite(result) or result < 0 or (positive and result == 0):
        raise ConfigError(f"{field} must be {'positive' if positive else 'non-negative'} and finite, got {value!r}")
    return result
