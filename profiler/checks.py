"""Argument checks of the profiler: each failure is a ``ValueError`` naming the field and the value.

``bool`` is never accepted where a number is asked for, although Python counts it as an ``int``.
The profiler is the lower layer and imports nothing of ``coci`` outside ``coci.profiler``; ``coci.checks`` builds on
``is_int`` and ``is_number`` from here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """True for a Python or NumPy integer, False for ``bool`` and everything else."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """True for a Python or NumPy integer or float, False for ``bool`` and everything else."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def integer(value: Any, field: str, *, positive: bool = False) -> int:
    """``value`` as a non-negative ``int`` (at least 1 where ``positive``); a ``ValueError`` otherwise."""
    if not is_int(value) or value < (1 if positive else 0):
        raise ValueError(f"{field} must be a {'positive' if positive else 'non-negative'} integer, got {value!r}")
    return int(value)


def optional_integer(value: Any, field: str) -> int | None:
    """Like ``integer`` (non-negative), with ``None`` passed through."""
    return None if value is None else integer(value, field)


def non_negative_number(value: Any, field: str) -> float:
    """``value`` as a finite, non-negative ``float``; a ``ValueError`` otherwise."""
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} must be a non-negative finite number, got {value!r}")
    return float(value)
