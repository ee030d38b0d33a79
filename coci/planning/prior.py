"""Warm start: an earlier run's loss curve as the prior of this run's plan.

A rerun (a sweep, a restart of a recipe) need not start blind: ``load_prior`` reads the earlier
run's curve (a run directory written by [``coci.Session``][coci.Session], a curve file, a loss array or
``(steps, losses)``), and ``WarmStart`` maps it onto this run by its fraction of the run (the
earlier run's step ``s`` of ``N0`` becomes ``s N / N0``) and turns it into the progress rate the
planner uses from step 0. As this run's own losses arrive the rate is corrected: up to the newest
loss it is this run's own smoothed curve; after it the prior's shape, scaled by how fast this run's
loss fell against the prior over the recent half of the trace (``WarmStart.rate``); once the
trace is long enough to backtest, the online forecast weighs that scaled shape against the trace's
own extensions by their errors on its held-back tail (``coci.planning.empirical.forecast_curve``).
A prior that
cannot be read or used is refused with a [``coci.ConfigError``][coci.ConfigError] naming ``prior`` (the policy
then plans cold and records why); one whose shape this run's losses contradict (they fell more than
``_PRIOR_MISMATCH_FACTOR`` times faster or slower) is dropped the same way.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from coci import knobs
from coci.curves import read_curve, run_loss_trace
from coci.errors import ConfigError
from coci.events import read_run_file
from coci.planning.empirical import smoothed_trace
from coci.planning.fit import LossCurve

__all__ = ["PriorCurve", "PriorLike", "WarmStart", "load_prior"]

#: Warm start (``prior=``): this run's loss may fall at most this many times faster or slower than
#: the earlier run's (rescaled) over the recent half of its trace; beyond it the prior is dropped.
_PRIOR_MISMATCH_FACTOR: float = 4.0

#: Warm start: the recent half of the trace must span this many steps before it corrects the prior's
#: future rate (or contradicts it); shorter, the prior is used as recorded.
_PRIOR_MIN_CORRECTION_STEPS: int = 100


@dataclass(frozen=True)
class PriorCurve:
    """An earlier run's loss curve: its steps, losses, length in steps and where it came from."""

    steps: np.ndarray
    losses: np.ndarray
    total_steps: float
    source: str


#: What ``prior=`` takes: an earlier run's directory or curve file, its losses, or a loaded prior.
PriorLike: TypeAlias = str | os.PathLike[str] | LossCurve | PriorCurve


def load_prior(source: PriorLike, total_steps: float | None = None) -> PriorCurve:
    """The earlier run's curve from ``source``: a run directory (its ``loss_curve.json`` or the
    profiler trace in its newest checkpoint; its length from ``plan.json``), a ``.csv`` curve file
    (as ``coci plan --curve`` reads), a ``.json`` file ``{"steps": [...], "losses": [...]}``,
    per-step losses, or ``(steps, losses)``. ``total_steps``: the earlier run's length (default: its
    plan's horizon, else its last step). Raises [``ConfigError``][coci.ConfigError] (field ``prior``) when the curve
    cannot be read, holds fewer than ``knobs.FIT_MIN_POINTS`` finite points, or does not fall."""
    if isinstance(source, (str, Path)):
        steps, losses, length, text = _read_path(Path(source))
    else:
        steps, losses = _arrays(source)
        length, text = None, f"{losses.size} losses"
    finite = np.isfinite(steps) & np.isfinite(losses) & (steps >= 0)
    steps, losses = steps[finite], losses[finite]
    if steps.size < knobs.FIT_MIN_POINTS:
        raise ConfigError(f"prior: {text} holds {steps.size} finite point(s), fewer than {knobs.FIT_MIN_POINTS}")
    try:
        smoothed_trace(steps, losses)
    except ConfigError as exc:
        raise ConfigError(f"prior: {text}: {str(exc).removeprefix('curve: ')}") from None
    length = total_steps if total_steps is not None else (length or float(steps.max()))
    if not (length > 0 and math.isfinite(length)) or length < 0.5 * float(steps.max()):
        raise ConfigError(f"prior: run length {length!r} does not match its curve (last step {steps.max():.0f})")
    return PriorCurve(steps, losses, float(length), text)


def _arrays(source: Any) -> tuple[np.ndarray, np.ndarray]:
    try:
        if isinstance(source, tuple) and len(source) == 2:
            steps, losses = (np.asarray(part, dtype=float) for part in source)
        else:
            losses = np.asarray(source, dtype=float)
            steps = np.arange(1, losses.size + 1, dtype=float)
    except (TypeError, ValueError, ArithmeticError) as exc:  # ArithmeticError: an integer no float holds
        raise ConfigError(f"prior: not a loss array or (steps, losses): {exc}") from None
    if steps.ndim != 1 or steps.shape != losses.shape:
        raise ConfigError(f"prior: steps and losses must be 1-D of the same length, got {steps.shape} and {losses.shape}")
    return steps, losses


def _read_path(path: Path) -> tuple[np.ndarray, np.ndarray, float | None, str]:
    """``(steps, losses, run length or None, description)`` of a run directory or curve file."""
    if path.is_dir():
        steps, losses, found = run_loss_trace(path)
        return steps, losses, _planned_length(path / "plan.json"), f"run {str(path)!r} ({found})"
    if not path.is_file():
        raise ConfigError(f"prior: {str(path)!r} is neither a run directory nor a curve file")
    if path.suffix == ".json":
        try:
            raw = json.loads(path.read_text())
            pair = (raw["steps"], raw["losses"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: nesting too deep
            raise ConfigError(f"prior: {str(path)!r} is not a {{steps, losses}} JSON file ({type(exc).__name__})") from None
        steps, losses = _arrays(pair)
        return steps, losses, None, f"file {str(path)!r}"
    try:
        steps, losses = read_curve(path)
    except ConfigError as exc:
        raise ConfigError(f"prior: {exc}") from None
    return steps, losses, None, f"file {str(path)!r}"


def _planned_length(path: Path) -> float | None:
    """The horizon of a run's ``plan.json`` (None when absent or unreadable)."""
    try:
        total = json.loads(read_run_file(path))["inputs"]["total_steps"]
    except (OSError, ConfigError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return float(total) if isinstance(total, (int, float)) and total > 0 else None


class WarmStart:
    """The prior rescaled to a run of ``total_steps`` steps, as a progress rate the planner uses;
    ``rate`` corrects it with this run's losses so far."""

    def __init__(self, prior: PriorCurve, total_steps: int) -> None:
        self.prior = prior
        self.total_steps = int(total_steps)
        self.scale = self.total_steps / prior.total_steps
        centres, self.levels = smoothed_trace(prior.steps, prior.losses)  # smoothed as recorded, then rescaled
        self.centres = centres * self.scale
        self.description = (
            f"prior {prior.source}, {prior.total_steps:.0f} steps rescaled x{self.scale:.3g} to {self.total_steps}"
        )

    def loss(self, steps: Any) -> np.ndarray:
        """The rescaled prior's smoothed loss (held at its ends)."""
        return np.interp(np.asarray(steps, dtype=float), self.centres, self.levels)

    def prior_rate(self, steps: Any) -> np.ndarray:
        """The rescaled prior's progress rate (0 past its last point)."""
        s = np.asarray(steps, dtype=float)
        slopes = -np.diff(self.levels) / np.diff(self.centres)
        index = np.clip(np.searchsorted(self.centres, s, side="right") - 1, 0, slopes.size - 1)
        return np.where(s > self.centres[-1], 0.0, slopes[index])

    def factor(self, loss_steps: Any, losses: Any) -> float:
        """How many times as fast this run's loss fell as the prior's over the recent half of its
        trace (1 while too short to judge; as ``rate``, which raises for a contradiction)."""
        return self.rate(loss_steps, losses).factor

    def rate(self, loss_steps: Any, losses: Any) -> CorrectedRate:
        """The progress rate given this run's losses so far (see the module docstring). Raises
        [``ConfigError``][coci.ConfigError] (field ``prior``) when they contradict the prior's shape."""
        steps = np.asarray(loss_steps, dtype=float)
        values = np.asarray(losses, dtype=float)
        finite = np.isfinite(steps) & np.isfinite(values)
        steps, values = steps[finite], values[finite]
        if steps.size < knobs.FIT_MIN_POINTS:
            return CorrectedRate(self, None, None, 1.0)
        try:
            centres, levels = smoothed_trace(steps, values)
        except ConfigError:
            return CorrectedRate(self, None, None, 1.0)  # not falling yet: the prior alone
        now = float(centres[-1])
        recent = np.array([max(float(centres[0]), 0.5 * now), now])
        own = float(np.diff(-np.interp(recent, centres, levels))[0])
        expected = float(np.diff(-self.loss(recent))[0])
        factor = own / expected if expected > 0 else math.inf
        limit = _PRIOR_MISMATCH_FACTOR
        if recent[1] - recent[0] >= _PRIOR_MIN_CORRECTION_STEPS and not (1.0 / limit <= factor <= limit):
            raise ConfigError(
                f"prior: this run's loss fell {factor:.3g}x as fast as the prior's over steps "
                f"{recent[0]:.0f}-{recent[1]:.0f} (outside 1/{limit:g}..{limit:g}x): prior dropped"
            )
        if not (1.0 / limit <= factor <= limit):
            factor = 1.0  # too short a stretch to judge: the prior as recorded
        return CorrectedRate(self, centres, levels, factor)


@dataclass(frozen=True)
class CorrectedRate:
    """``v(s)``: this run's smoothed curve up to its newest loss, then ``factor`` times the prior's
    rate (the prior alone when ``centres`` is None)."""

    warm: WarmStart
    centres: np.ndarray | None
    levels: np.ndarray | None
    factor: float

    @property
    def description(self) -> str:
        return f"{self.warm.description}; future rate x{self.factor:.3g} from this run's losses"

    def __call__(self, steps: Any) -> np.ndarray:
        s = np.asarray(steps, dtype=float)
        future = self.factor * self.warm.prior_rate(s)
        if self.centres is None or self.levels is None:
            return future
        slopes = -np.diff(self.levels) / np.diff(self.centres)
        index = np.clip(np.searchsorted(self.centres, s, side="right") - 1, 0, slopes.size - 1)
        return np.where(s > self.centres[-1], future, slopes[index])
