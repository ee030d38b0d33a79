"""The progress weight the planner uses: the loss curve given to [``coci.planning.planner.plan``][coci.plan]
resolved into a fit and a rate, and that rate normalised over the whole run (time-consistent
re-planning, see ``coci.planning.planner``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coci.errors import ConfigError
from coci.planning.arguments import CurveLike
from coci.planning.empirical import EmpiricalCurve
from coci.planning.fit import CurveFit, fit_curve
from coci.planning.objective import whole_run_mean_rate
from coci.planning.records import RateFunction

__all__ = ["fit_progress_weight", "observed_past_rate", "resolve_curve", "run_mean_rate"]


def _is_pair(curve: Any) -> bool:
    return (
        isinstance(curve, tuple)
        and len(curve) == 2
        and all(np.ndim(part) == 1 and np.size(part) > 2 for part in curve)
    )


def resolve_curve(
    curve: CurveLike | None,
) -> tuple[CurveFit | None, RateFunction | None, tuple[np.ndarray, np.ndarray] | None, str, list[str]]:
    """``(fit, progress_rate, raw (steps, losses), description, fallbacks)`` for a ``curve`` input."""
    if curve is None:
        return None, None, None, "none", []
    if isinstance(curve, EmpiricalCurve):  # a forecast of a run under way: its fit is recorded
        return None if curve.fit is None else _clean_fit(curve.fit), curve, None, curve.description, []
    if isinstance(curve, CurveFit):
        fit, raw, description = curve, None, f"CurveFit ({curve.family})"
    elif callable(curve):
        return None, curve, None, str(getattr(curve, "description", "progress-rate callable")), []
    else:
        steps, losses = _steps_and_losses(curve)
        fit = fit_curve(steps, losses)
        raw, description = (steps, losses), f"{losses.size} losses"
    fallbacks: list[str] = []
    if fit.dropped_points:
        fallbacks.append(f"curve: dropped {fit.dropped_points} NaN/inf losses")
    if not fit.usable:
        fallbacks.append(f"curve unusable ({fit.fallback}): planned for the time objective")
        return _clean_fit(fit), None, raw, description, fallbacks
    return _clean_fit(fit), fit.progress_rate, raw, description, fallbacks


def _steps_and_losses(curve: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, losses)`` from per-step losses or a ``(steps, losses)`` pair."""
    if _is_pair(curve):
        return np.asarray(curve[0], dtype=float), np.asarray(curve[1], dtype=float)
    losses = None if isinstance(curve, str) else np.asarray(curve, dtype=float)
    if losses is None or losses.ndim != 1:
        raise ConfigError("curve must be per-step losses, (steps, losses), a CurveFit or a progress-rate callable")
    return np.arange(1, losses.size + 1, dtype=float), losses


def _clean_fit(fit: CurveFit) -> CurveFit:
    """A copy whose float fields are JSON-safe (non-finite figures dropped)."""
    def finite(value: float | None) -> float | None:
        return value if value is not None and math.isfinite(value) else None

    return fit.model_copy(
        update={
            "candidates": {k: v for k, v in fit.candidates.items() if math.isfinite(v)},
            "holdout_error": finite(fit.holdout_error),
            "rmse": finite(fit.rmse),
            "drift": finite(fit.drift),
        }
    )


def observed_past_rate(fit: CurveFit, rate: RateFunction) -> RateFunction:
    """The fit's progress rate from its window on (before the first observed step: the rate there,
    not a law extrapolated towards a singularity); before the window (a recent-window fit after
    drift) the observed average ``(first_loss - L(window_start)) / (window_start - first_step)``
    instead of the law extrapolated backwards. Its integral over the run is the observed first loss
    minus the fitted loss at the horizon, the drop ``run_mean_rate`` normalises by."""
    start, first, first_loss = fit.window_start, fit.first_step, fit.first_loss
    if first is None or first_loss is None:
        return rate
    first = float(first)
    floor = _loss_floor(fit)
    if floor is not None:
        unfloored = rate

        def rate(steps: np.ndarray) -> np.ndarray:  # the fitted law stops falling at the floor
            s = np.asarray(steps, dtype=float)
            return np.where(fit.loss(s) > floor, unfloored(s), 0.0)

    def from_first(steps: np.ndarray) -> np.ndarray:  # before the first observed step: its rate
        return rate(np.maximum(np.asarray(steps, dtype=float), first))

    if start is None or not start > first + 1.0:
        return from_first
    average = (float(first_loss) - float(fit.loss(np.array([float(start)]))[0])) / (float(start) - first)
    if not (average > 0 and math.isfinite(average)):
        return from_first

    def hybrid(steps: np.ndarray) -> np.ndarray:
        s = np.asarray(steps, dtype=float)
        return np.where(s < start, average, rate(np.maximum(s, first)))

    return hybrid


def fit_progress_weight(fit: CurveFit, total_steps: int) -> RateFunction | None:
    """The progress weight ``w = v / v_bar`` the planner derives from a recorded fit over a run of
    ``total_steps`` steps (the observed average before a recent window, the floor at 0, the whole
    run's mean rate; see ``observed_past_rate`` and ``run_mean_rate``); None when the fit is
    unusable or the loss does not fall over the run."""
    if not fit.usable:
        return None
    rate = observed_past_rate(fit, fit.progress_rate)
    mean, _ = run_mean_rate(fit, rate, total_steps, [])
    if mean is None:
        return None
    return lambda steps: np.asarray(rate(np.asarray(steps, dtype=float)), dtype=float) / mean


def _loss_floor(fit: CurveFit) -> float | None:
    """0 when the loss is positive where it was observed (cross-entropy, MSE, any norm): a law
    extrapolated below 0 (a short, noisy trace fitted with a negative asymptote) would put most of
    the run's progress in the future and flatten the weight; the planner's curve stops at 0 instead.
    None otherwise."""
    if fit.first_loss is None or fit.last_step is None:
        return None
    observed = fit.loss(np.array([float(fit.last_step)]))[0]
    return 0.0 if fit.first_loss > 0 and observed > 0 else None


def run_mean_rate(
    fit: CurveFit | None, rate: RateFunction, total_steps: int, fallbacks: list[str]
) -> tuple[float | None, float]:
    """The whole run's mean progress rate ``v_bar`` and the step it is measured from.

    The mean is that of the planner's own curve (so ``w`` averages 1 over the run under it): for a
    fit that recorded its first observed point, ``(L(first) - L(H)) / (H - first step)`` with
    ``L(first)`` the observed first loss when the fit is a recent window (the rate before the window
    is the observed average, ``observed_past_rate``) and the fitted one otherwise; another fit:
    ``v`` integrated from its window's start; a callable: from step 0.
    """
    origin = 0.0
    drop = None
    if fit is not None and fit.first_step is not None and fit.first_loss is not None and fit.first_step < total_steps:
        origin = max(0.0, float(fit.first_step))
        windowed = fit.window_start is not None and fit.window_start > origin + 1.0
        level = float(fit.first_loss) if windowed else float(fit.loss(np.array([origin]))[0])
        end = float(fit.loss(np.array([float(total_steps)]))[0])
        floor = _loss_floor(fit)
        drop = level - (end if floor is None else max(end, floor))
        if not (drop > 0 and math.isfinite(drop)):
            drop = None
    if drop is None and fit is not None and fit.window_start is not None and fit.window_start < total_steps:
        origin = max(0.0, float(fit.window_start))
    try:
        return whole_run_mean_rate(rate, total_steps, origin_step=origin, loss_drop=drop), origin
    except ConfigError as exc:
        fallbacks.append(f"{exc}: planned for the time objective")
        return None, origin
