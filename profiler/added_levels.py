"""The measured costs of the storage levels a user adds above the built-in ones (``level4``, ...).

Each added level's transfers (``seconds`` and ``bytes`` from its listener) and restores from it
(``restore_seconds``) are kept by the level's name, as the profile's
[``LevelEstimates``][coci.profiler.profile.LevelEstimates] of that name. Unlike the peer and remote
levels, the steps overlapping an added level's transfer are not timed apart: its ``interference``
stays unmeasured (a planner reads it as 0), which keeps the per-step path as it is.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from .checks import non_negative_number, optional_integer
from .profile import LevelEstimates
from .stats import robust_estimate

_SERIES = ("seconds", "bytes", "restore_seconds")


class AddedLevelCosts:
    """Every added level's samples, by name (thread-safe: transfers end on a level's own thread)."""

    def __init__(self, window: int) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._series: dict[str, dict[str, deque[float]]] = {}

    def _of(self, name: str) -> dict[str, deque[float]]:
        """The series of level ``name`` (created empty); called under the lock."""
        return self._series.setdefault(name, {series: deque(maxlen=self._window) for series in _SERIES})

    def listener(self, name: str) -> LevelTransfers:
        """What level ``name`` reports its transfers to."""
        return LevelTransfers(self, name)

    def record(self, name: str, series: str, value: float) -> None:
        """One sample of ``series`` (``_SERIES``) for level ``name``."""
        with self._lock:
            self._of(name)[series].append(float(value))

    def estimates(self) -> tuple[LevelEstimates, ...]:
        """The levels that measured something, by name."""
        with self._lock:
            samples = {name: {series: list(values) for series, values in found.items()} for name, found in self._series.items()}
        return tuple(
            LevelEstimates(name=name, **{series: robust_estimate(values) for series, values in found.items()})
            for name, found in sorted(samples.items()) if any(found.values())
        )

    def state_dict(self) -> dict[str, dict[str, np.ndarray]]:
        with self._lock:
            return {name: {series: np.asarray(values, dtype=np.float64) for series, values in found.items()} for name, found in self._series.items()}

    def load_state_dict(self, state: Any) -> None:
        """What ``state_dict`` saved (absent from older checkpoints: nothing); ValueError when it is not that."""
        if not isinstance(state, dict):
            raise ValueError(f"profiler state field 'added_levels' must be a dict, got {type(state).__name__}")
        loaded: dict[str, dict[str, list[float]]] = {}
        for name, found in state.items():
            if not isinstance(name, str) or not isinstance(found, dict) or set(found) - set(_SERIES):
                raise ValueError(f"profiler state field 'added_levels' holds an unknown level entry {name!r}")
            loaded[name] = {}
            for series, values in found.items():
                array = np.asarray(values, dtype=np.float64).reshape(-1)
                if not np.all(np.isfinite(array)) or np.any(array < 0):
                    raise ValueError(f"profiler state field 'added_levels.{name}.{series}' holds a negative, NaN or infinite sample")
                loaded[name][series] = array.tolist()
        with self._lock:
            self._series.clear()
            for name, found in loaded.items():
                for series, values in found.items():
                    self._of(name)[series].extend(values)


class LevelTransfers:
    """One added level's transfer listener (``coci.checkpoint.storage_level.TransferListener``)."""

    def __init__(self, costs: AddedLevelCosts, name: str) -> None:
        self._costs = costs
        self.name = name

    def upload_started(self) -> None:
        return None

    def upload_finished(self, seconds: float, nbytes: int | None = None) -> None:
        """A copy committed on the level after ``seconds``, ``nbytes`` long (any thread)."""
        self._costs.record(self.name, "seconds", non_negative_number(seconds, "seconds"))
        size = optional_integer(nbytes, "nbytes")
        if size is not None:
            self._costs.record(self.name, "bytes", float(size))

    def upload_aborted(self) -> None:
        return None
