"""What a loss curve shows: the monotone smoothing of its empirical progress rate.

``empirical_progress_rate`` is the slope of an isotonic (non-increasing) fit to the binned
trace, with no fitted law: the simulator scores plans with it, and ``empirical_curve`` gives the
planner the same curve for a recorded trace, extended past the trace's end (when the run is longer)
by whichever forecast predicted a held-back tail of the trace best: no further progress ("flat"),
the trace's recent slope ("end slope"), the parametric fit ("parametric") or, warm-started, an
earlier run's shape ("prior"). A law fitted to a
recent window is what the planner can use while a run is under way; once the whole curve is known
its own shape is better evidence than any law (learning-rate decay makes the last stretch fall
faster than every diminishing-returns family), so an offline plan weighs lost work by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from coci import knobs
from coci.errors import ConfigError
from coci.planning.fit import CurveFit, bin_trace, fit_curve
from coci.planning.objective import RateFunction

__all__ = ["BLEND", "EXTENSIONS", "PRIOR_EXTENSION", "EmpiricalCurve", "PriorShape", "curve_pair", "empirical_curve", "empirical_progress_rate", "forecast_curve", "smoothed_trace"]

#: The simulator's "true" progress rate of a raw loss trace is the slope of an isotonic
#: (non-increasing) fit to at most this many bins of the trace (half log-, half linearly spaced).
_SIMULATE_TRUTH_POINTS: int = 200

#: How an empirical curve continues past its last point, in the order tried.
EXTENSIONS: tuple[str, ...] = ("flat", "end slope", "parametric")

#: The extension of ``forecast_curve``: the extensions blended by their held-out forecast errors.
BLEND: str = "blend"

#: The warm start's extension of ``forecast_curve``: an earlier run's shape, scaled to this run's fall.
PRIOR_EXTENSION: str = "prior"


class PriorShape(Protocol):
    """An earlier run's curve on this run's steps (``coci.planning.prior.WarmStart``): its loss, its
    progress rate, and how many times as fast this run's loss fell as it over a trace's recent half."""

    description: str

    def loss(self, steps: Any) -> np.ndarray: ...

    def prior_rate(self, steps: Any) -> np.ndarray: ...

    def factor(self, steps: Any, losses: Any) -> float: ...


def curve_pair(steps: Any, losses: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, losses)`` as float arrays from a pair, a loss array (steps 1..n) or two arrays."""
    if losses is None:
        if isinstance(steps, tuple) and len(steps) == 2:
            return np.asarray(steps[0], dtype=float).ravel(), np.asarray(steps[1], dtype=float).ravel()
        y = np.asarray(steps, dtype=float).ravel()
        return np.arange(1, y.size + 1, dtype=float), y
    s, y = np.asarray(steps, dtype=float).ravel(), np.asarray(losses, dtype=float).ravel()
    if s.size != y.size:
        raise ConfigError(f"curve: steps and losses must have the same length, got {s.size} and {y.size}")
    return s, y


def smoothed_trace(steps: Any, losses: Any = None, *, max_points: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, levels)``: the trace binned (half log-, half linearly-spaced bins, the median loss of
    each; at most ``max_points`` bins, default ``_SIMULATE_TRUTH_POINTS``) and made
    non-increasing by isotonic regression (pool-adjacent-violators weighted by bin counts), one
    point per pooled block. Raises [``ConfigError``][coci.ConfigError] (field ``curve``) for fewer than two finite
    points at distinct steps or a trace that does not fall."""
    s, y = curve_pair(steps, losses)
    finite = np.isfinite(s) & np.isfinite(y)
    s, y = s[finite], y[finite]
    order = np.argsort(s, kind="stable")
    s, y = s[order], y[order]
    if s.size < 2 or s[-1] <= s[0]:
        raise ConfigError("curve: the true curve needs at least two finite points at distinct steps")
    centres, levels, counts = _binned(s, y, _SIMULATE_TRUTH_POINTS if max_points is None else max_points)
    centres, levels = _isotonic_decreasing(centres, levels, counts)
    if centres.size < 2 or levels[0] <= levels[-1]:
        raise ConfigError("curve: the true curve does not fall (no progress to weight)")
    return centres, levels


def empirical_progress_rate(steps: Any, losses: Any = None, *, max_points: int | None = None) -> RateFunction:
    """``v(s) = -dL/ds`` of a loss trace without a fitted law: the slope of the linear interpolation
    of ``smoothed_trace`` (constant before the first and after the last point: the end slopes).
    Raises [``ConfigError``][coci.ConfigError] (field ``curve``) for fewer than two finite points or a trace that
    does not fall."""
    centres, levels = smoothed_trace(steps, losses, max_points=max_points)
    slopes = -np.diff(levels) / np.diff(centres)

    def rate(query: np.ndarray) -> np.ndarray:
        q = np.asarray(query, dtype=float)
        index = np.clip(np.searchsorted(centres, q, side="right") - 1, 0, slopes.size - 1)
        return slopes[index]

    return rate


def _binned(s: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fitter's bins of a sorted trace (``coci.planning.fit.bin_trace``: mean step, median
    loss) and how many points each bin holds."""
    centres, levels = bin_trace(s, y, max_points)
    if centres.size == s.size:
        return centres, levels, np.ones_like(s)
    # Bins are runs of consecutive points; one holding points a..b-1 has median index (a + b - 1) / 2,
    # so binning the indices gives each bin's end from its start.
    _, middles = bin_trace(s, np.arange(s.size, dtype=float), max_points)
    counts = np.empty(middles.size)
    start = 0.0
    for index, middle in enumerate(middles.tolist()):
        counts[index] = 2.0 * (middle - start) + 1.0
        start += counts[index]
    return centres, levels, counts


def _isotonic_decreasing(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool-adjacent-violators for a non-increasing fit; one point per pooled block."""
    blocks: list[list[float]] = []  # [weighted sum y, weight, weighted sum x]
    for xi, yi, wi in zip(x.tolist(), y.tolist(), w.tolist()):
        blocks.append([yi * wi, wi, xi * wi])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] <= blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            for k in range(3):
                blocks[-1][k] += last[k]
    centres = np.array([b[2] / b[1] for b in blocks])
    levels = np.array([b[0] / b[1] for b in blocks])
    return centres, levels


# --- the planner's curve for a recorded trace ---------------------------------------------------------


@dataclass(frozen=True)
class EmpiricalCurve:
    """A progress-rate callable ``v(s)``: the smoothed trace's slope up to its last point, then the
    chosen ``extension`` (none when the trace reaches the run's end: its last segment's slope, as
    ``empirical_progress_rate``; ``"flat"``: 0; ``"end slope"``: the mean slope of the trace's last
    ``knobs.FIT_HOLDOUT_FRACTION``; ``"parametric"``: the fit's rate), stopping where the extended
    loss would fall below 0 for a positive loss. ``holdout_errors`` holds each extension's mean
    absolute error forecasting the held-back tail (loss units; empty when none was needed)."""

    centres: np.ndarray
    levels: np.ndarray
    extension: str
    end_slope: float
    fit: CurveFit | None = None
    holdout_errors: dict[str, float] = field(default_factory=dict)
    blend: dict[str, float] = field(default_factory=dict)  # extension: weight, for extension "blend"
    prior: PriorShape | None = None  # the "prior" extension's earlier run (a warm start)
    prior_factor: float = 1.0  # this run's fall against the prior's over the trace's recent half

    @property
    def last_step(self) -> float:
        """The trace's last smoothed step (beyond it the curve is the extension)."""
        return float(self.centres[-1])

    @property
    def description(self) -> str:
        span = f"steps {self.centres[0]:.0f}-{self.centres[-1]:.0f}"
        past = self.extension
        if self.extension == BLEND:
            past = "blend of " + ", ".join(f"{name} {weight:.2f}" for name, weight in self.blend.items())
        if self.prior is not None:
            past += f"; {self.prior.description}, its fall x{self.prior_factor:.3g}"
        return f"empirical ({self.centres.size} smoothed points, {span}; past the end: {past})"

    def loss(self, steps: Any) -> np.ndarray:
        """The curve's loss at ``steps`` (interpolated; the extension past the end)."""
        s = np.asarray(steps, dtype=float)
        inside = np.interp(s, self.centres, self.levels)
        return np.where(s > self.last_step, self._extended_loss(s), inside)

    def __call__(self, steps: Any) -> np.ndarray:
        s = np.asarray(steps, dtype=float)
        slopes = -np.diff(self.levels) / np.diff(self.centres)
        index = np.clip(np.searchsorted(self.centres, s, side="right") - 1, 0, slopes.size - 1)
        if not self._extends:
            return slopes[index]
        return np.where(s > self.last_step, self._extended_rate(s), slopes[index])

    @property
    def _extends(self) -> bool:
        return self.extension in EXTENSIONS or self.extension in (BLEND, PRIOR_EXTENSION)

    def _extended_loss(self, s: np.ndarray) -> np.ndarray:
        if not self._extends:  # the trace covers the run: its last segment continues
            slope = float((self.levels[-2] - self.levels[-1]) / (self.centres[-1] - self.centres[-2]))
            return self.levels[-1] - slope * np.maximum(s - self.last_step, 0.0)
        if self.extension == BLEND:
            return sum((weight * self._loss_of(name, s) for name, weight in self.blend.items()), np.zeros_like(s))
        return self._loss_of(self.extension, s)

    def _extended_rate(self, s: np.ndarray) -> np.ndarray:
        if self.extension == BLEND:
            return sum((weight * self._rate_of(name, s) for name, weight in self.blend.items()), np.zeros_like(s))
        return self._rate_of(self.extension, s)

    def _loss_of(self, extension: str, s: np.ndarray) -> np.ndarray:
        """One extension's loss past the trace's end (0 at the most, for a positive loss)."""
        beyond = np.maximum(s - self.last_step, 0.0)
        level = float(self.levels[-1])
        if extension == "end slope":
            raw = level - self.end_slope * beyond
        elif extension == "parametric" and self.fit is not None:
            raw = level + self.fit.loss(np.maximum(s, self.last_step)) - float(self.fit.loss(np.array([self.last_step]))[0])
        elif extension == PRIOR_EXTENSION and self.prior is not None:
            drop = float(self.prior.loss(np.array([self.last_step]))[0]) - self.prior.loss(np.maximum(s, self.last_step))
            raw = level - self.prior_factor * drop
        else:
            raw = np.full_like(s, level)
        return np.maximum(raw, 0.0) if level > 0 else raw

    def _rate_of(self, extension: str, s: np.ndarray) -> np.ndarray:
        """One extension's progress rate past the trace's end (0 where its loss reached 0)."""
        if extension == "end slope":
            rate = np.full_like(s, self.end_slope)
        elif extension == "parametric" and self.fit is not None:
            rate = self.fit.progress_rate(s)
        elif extension == PRIOR_EXTENSION and self.prior is not None:
            rate = self.prior_factor * self.prior.prior_rate(s)
        else:
            return np.zeros_like(s)
        floor_reached = (self._loss_of(extension, s) <= 0.0) & (float(self.levels[-1]) > 0)
        return np.where(floor_reached, 0.0, rate)


def empirical_curve(steps: Any, losses: Any, total_steps: int, fit: CurveFit | None = None) -> EmpiricalCurve:
    """The planner's curve for a recorded trace over a run of ``total_steps`` (see the module
    docstring). ``fit``: the parametric fit of the whole trace (fitted here when None). The extension
    is chosen only when the run goes past the trace's last point. Raises [``ConfigError``][coci.ConfigError] as
    ``smoothed_trace`` does."""
    s, y = curve_pair(steps, losses)
    centres, levels = smoothed_trace(s, y)
    end_slope = _recent_slope(centres, levels)
    if total_steps <= np.nanmax(s):
        return EmpiricalCurve(centres, levels, "none needed (the trace covers the run)", end_slope, fit)
    errors = _holdout_errors(s, y)
    usable = {name: err for name, err in errors.items() if math.isfinite(err)}
    if fit is None:
        fit = fit_curve(s, y)
    if not fit.usable:
        usable.pop("parametric", None)
    extension = min(usable, key=lambda name: (usable[name], EXTENSIONS.index(name))) if usable else "flat"
    return EmpiricalCurve(centres, levels, extension, end_slope, fit, errors)


def forecast_curve(steps: Any, losses: Any, fit: CurveFit, prior: PriorShape | None = None) -> EmpiricalCurve:
    """The online planner's curve of a run under way: the loss trace so far as it is, then the
    future as a blend of the extensions.

    The past is known exactly: up to its last point the curve is the trace's own monotone
    smoothing (``smoothed_trace``, the simulator's truth on the same points), so the early fall
    keeps its full weight (a law fitted over a recent window flattens it to the window's average).
    The future is uncertain, and the planner's objective is linear in the progress weight, so the
    expected rate is what a plan should weigh: each extension (``"flat"``, ``"end slope"``,
    ``"parametric"``: ``fit``, the law of the whole trace) gets a weight proportional to the inverse
    square of its error forecasting the trace's held-back last ``knobs.FIT_HOLDOUT_FRACTION`` from the
    rest (the parametric one: ``fit.holdout_error``, its own backtest, so nothing is fitted twice).
    Without a usable backtest (a short trace) the parametric fit continues it, or the end slope
    without a usable fit: never "flat" by default, which would put the whole run's progress in the
    past. Raises [``ConfigError``][coci.ConfigError] (field ``curve``) for a trace that does not fall: one the
    fitter finds flat, rising or too short (``fit``'s fallback), or that ``smoothed_trace`` refuses.

    Warm-started (``prior``: an earlier run's shape on this run's steps), the earlier run is one more
    extension, ``"prior"``: its fall from the trace's end on, scaled by how fast this run fell against
    it over the trace's recent half, weighed by the same backtest (the scale taken from the held-in
    head only). So an earlier run that forecasts this one better than the trace's own extensions
    carries the future, and one that forecasts it worse (another recipe, another seed's late fall)
    fades as the trace grows; without any usable backtest (a short trace) the prior continues it.

    Chosen over the alternatives measured on the project's curves and the GPT-2 runs (the
    recent-window law alone, the single best extension): see ``docs/evidence/plan-quality.md``.
    """
    if not fit.usable and not _falls_without_law(fit):
        raise ConfigError(f"curve: no forecast of a trace that does not fall ({fit.fallback})")
    s, y = curve_pair(steps, losses)
    centres, levels = smoothed_trace(s, y)
    end_slope = _recent_slope(centres, levels)
    errors = _simple_holdout_errors(s, y)
    errors["parametric"] = (
        float(fit.holdout_error) if fit.usable and fit.holdout_error is not None and math.isfinite(fit.holdout_error) else math.inf
    )
    if prior is None:
        return EmpiricalCurve(centres, levels, BLEND, end_slope, fit, errors, _blend_weights(errors, fit.usable))
    errors[PRIOR_EXTENSION] = _prior_holdout_error(s, y, prior)
    weights = _blend_weights(errors, fit.usable, fallback=PRIOR_EXTENSION)
    return EmpiricalCurve(centres, levels, BLEND, end_slope, fit, errors, weights, prior, prior.factor(s, y))


def _falls_without_law(fit: CurveFit) -> bool:
    """True when the fitter found the trace falling (beyond its noise) but no law to fit it."""
    return fit.n_points >= knobs.FIT_MIN_POINTS and (fit.fallback or "").startswith(("no family", "refitting"))


def _blend_weights(errors: dict[str, float], parametric: bool, fallback: str | None = None) -> dict[str, float]:
    """Weights proportional to ``1 / error**2`` over the extensions with a finite error (an exact
    forecast takes all the weight); without any, ``fallback`` when given, else the parametric law
    (else the end slope)."""
    finite = {name: max(error, 0.0) for name, error in errors.items() if math.isfinite(error)}
    if not finite:
        if fallback is not None:
            return {fallback: 1.0}
        return {"parametric": 1.0} if parametric else {"end slope": 1.0}
    exact = [name for name, error in finite.items() if error <= 1e-12]
    if exact:
        return {name: 1.0 / len(exact) for name in exact}
    inverse = {name: 1.0 / error**2 for name, error in finite.items()}
    total = sum(inverse.values())
    return {name: value / total for name, value in inverse.items()}


def _simple_holdout_errors(s: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """``"flat"`` and ``"end slope"`` forecasting the held-back tail, as ``_holdout_errors``
    (no parametric refit)."""
    split = _holdout_split(s, y)
    errors = {"flat": math.inf, "end slope": math.inf}
    if split is None:
        return errors
    centres, levels, bins_s, bins_y = split
    for name in errors:
        forecast = EmpiricalCurve(centres, levels, name, _recent_slope(centres, levels)).loss(bins_s)
        error = np.abs(forecast - bins_y)
        errors[name] = float(np.mean(error)) if np.all(np.isfinite(error)) else math.inf
    return errors


def _prior_holdout_error(s: np.ndarray, y: np.ndarray, prior: PriorShape) -> float:
    """The prior extension's mean absolute error forecasting the held-back tail (as
    ``_simple_holdout_errors``), scaled by the held-in head's fall against the prior; inf when the
    split is too short or the head contradicts the prior (``ConfigError``)."""
    split = _holdout_split(s, y)
    if split is None:
        return math.inf
    centres, levels, bins_s, bins_y = split
    head = _held_in(s, y)
    try:
        factor = prior.factor(s[head], y[head])
    except ConfigError:
        return math.inf
    curve = EmpiricalCurve(centres, levels, PRIOR_EXTENSION, 0.0, prior=prior, prior_factor=factor)
    error = np.abs(curve.loss(bins_s) - bins_y)
    return float(np.mean(error)) if np.all(np.isfinite(error)) else math.inf


def _held_in(s: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The finite points before the held-back tail (the last ``knobs.FIT_HOLDOUT_FRACTION`` of the
    trace's span): what a backtest forecasts from."""
    finite = np.isfinite(s) & np.isfinite(y)
    first, last = float(np.min(s[finite])), float(np.max(s[finite]))
    return finite & (s <= last - knobs.FIT_HOLDOUT_FRACTION * (last - first))


def _holdout_split(s: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The smoothed head of a trace and the binned held-back tail (its last
    ``knobs.FIT_HOLDOUT_FRACTION``); None when either is too short or the head does not fall."""
    finite = np.isfinite(s) & np.isfinite(y)
    s, y = s[finite], y[finite]
    order = np.argsort(s, kind="stable")
    s, y = s[order], y[order]
    head = _held_in(s, y)
    bins_s, bins_y = bin_trace(s[~head], y[~head], knobs.FIT_MAX_POINTS)
    if np.count_nonzero(head) < knobs.FIT_MIN_POINTS or bins_s.size < knobs.FIT_MIN_HOLDOUT_POINTS:
        return None
    try:
        centres, levels = smoothed_trace(s[head], y[head])
    except ConfigError:
        return None
    return centres, levels, bins_s, bins_y


def _recent_slope(centres: np.ndarray, levels: np.ndarray) -> float:
    """Mean loss decrease per step over the last ``knobs.FIT_HOLDOUT_FRACTION`` of the smoothed trace."""
    start = centres[-1] - knobs.FIT_HOLDOUT_FRACTION * (centres[-1] - centres[0])
    first = min(int(np.searchsorted(centres, start)), centres.size - 2)
    return max(float((levels[first] - levels[-1]) / (centres[-1] - centres[first])), 0.0)


def _holdout_errors(s: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Each extension's mean absolute error forecasting the last ``knobs.FIT_HOLDOUT_FRACTION`` of
    the trace (its binned points) from the curve of the rest (inf when the rest cannot be smoothed)."""
    finite = np.isfinite(s) & np.isfinite(y)
    s, y = s[finite], y[finite]
    order = np.argsort(s, kind="stable")
    s, y = s[order], y[order]
    head = _held_in(s, y)
    bins_s, bins_y = bin_trace(s[~head], y[~head], knobs.FIT_MAX_POINTS)
    errors = dict.fromkeys(EXTENSIONS, math.inf)
    if np.count_nonzero(head) < knobs.FIT_MIN_POINTS or bins_s.size < knobs.FIT_MIN_HOLDOUT_POINTS:
        return errors
    try:
        centres, levels = smoothed_trace(s[head], y[head])
    except ConfigError:
        return errors
    head_fit = fit_curve(s[head], y[head])
    for name in EXTENSIONS:
        if name == "parametric" and not head_fit.usable:
            continue
        forecast = EmpiricalCurve(centres, levels, name, _recent_slope(centres, levels), head_fit).loss(bins_s)
        error = np.abs(forecast - bins_y)
        errors[name] = float(np.mean(error)) if np.all(np.isfinite(error)) else math.inf
    return errors
