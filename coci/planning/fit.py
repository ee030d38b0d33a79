"""Convergence-curve fits for planning: laws fitted to the loss trace, and their progress rate.

The planner weighs lost work by how much training progress it represents, which needs the slope of
the loss against the step, now and in the future. [``fit_curve``][coci.fit_curve] fits a small set of
diminishing-returns laws to the loss trace and returns a [``CurveFit``][coci.CurveFit] with vectorised
``loss``, ``slope`` and ``progress_rate``.

Families (``s`` is the step):

* ``"power"``: ``c + a (s + s0) ** -b`` (``a, b > 0``);
* ``"exp_floor"``: ``c + a exp(-k (s - s_ref))`` (``a, k > 0``; ``s_ref`` is a fixed reference
  step, the start of the fitted window, kept for numerical range: it is ``c + a' exp(-k s)`` with
  ``a' = a exp(k s_ref)``);
* ``"coci_exp"``: COCI's ``exp(theta1 s + theta2)`` (``theta1 < 0``), fitted as COCI's code does:
  a least-squares line through ``log(loss)``.

How a fit is made
-----------------
1. Input checks: mismatched lengths, empty, non-numeric or non-1-D input raise
   [``ConfigError``][coci.ConfigError]; NaN/inf points are dropped and counted
   (``dropped_points``). Everything else that makes a curve unusable (too few points, a flat or
   rising loss, no family fitting) returns a ``CurveFit`` with ``family="none"`` and a
   ``fallback`` saying why: the planner then uses the time objective. ``fit_curve`` never raises
   for those.
2. Smoothing: long traces are cut into bins spaced half logarithmically (detail early, where the
   loss moves fast) and half linearly (enough points late, where the forecast matters); each bin
   gives its mean step and median loss (robust to spikes).
3. Family choice: each family is fitted (variable projection, the linear parameters solved
   exactly and the nonlinear ones searched from a grid, then Nelder-Mead / a bounded scalar search,
   ``coci.planning.minimize``)
   on the trace without its last ``knobs.FIT_HOLDOUT_FRACTION`` of steps and scored by its mean
   absolute error forecasting that held-back tail (``holdout_error``, loss units).
4. Drift and the recent window: learning-rate decay makes the last stretch fall faster (or, after a
   schedule change, slower) than any global diminishing-returns law. ``drift`` is the mean residual
   (data minus forecast) of the best global law on the held-back tail in standard errors. When
   ``|drift| > _FIT_DRIFT_SIGMA`` the global law is stale, and "fit the last ``f`` of the
   trace" for ``f`` in ``_FIT_WINDOW_FRACTIONS`` is backtested the same way (fitted on the
   last ``f`` of the trace as it was at the holdout start, scored on the tail) for the families
   with a floor (``power``, ``exp_floor``; ``coci_exp`` only when it is the one family asked
   for); the best (family, ``f``) wins. The chosen family is then refitted on the last ``f`` of the
   whole trace (``f = 1`` without drift), whose first step is ``window_start``.
5. Quality: ``holdout_error`` (the backtest error of the choice), ``rmse`` of the final fit,
   ``candidates`` (each family's best backtest error) and ``drift``.

The fit is meant for steps at and after ``window_start``; ``loss`` before it is extrapolation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from coci import knobs
from coci.errors import ConfigError
from coci.planning.minimize import bounded_scalar, nelder_mead

__all__ = ["CurveFit", "FAMILIES", "LossCurve", "Losses", "bin_trace", "fit_coci_exponential", "fit_curve"]

#: One loss per step (steps 1, 2, ...).
Losses: TypeAlias = Sequence[float] | np.ndarray
#: Per-step losses, or ``(steps, losses)``.
LossCurve: TypeAlias = Losses | tuple[Losses, Losses]

logger = logging.getLogger(__name__)

#: Drift is declared when the global law's residuals on the held-back tail (data minus forecast)
#: average below zero by more than this many standard errors: the loss falls faster than the law.
_FIT_DRIFT_SIGMA: float = 2.0

#: Recent windows tried when the global fit drifts, as fractions of the step range (from the end).
_FIT_WINDOW_FRACTIONS: tuple[float, ...] = (0.6, 0.45, 0.3)

#: Least-squares polishes started from the best grid points of each family.
_FIT_STARTS: int = 3

#: A curve counts as falling when its first fifth's median exceeds its last fifth's by more than
#: this many noise standard deviations ...
_FIT_MIN_DROP_SIGMA: float = 3.0

#: ... and by more than this fraction of the loss level.
_FIT_MIN_DROP_RELATIVE: float = 1e-3

#: A recent window is fitted only when it holds at least (family parameters + this) points.
_FIT_WINDOW_EXTRA_POINTS: int = 2

Family = Literal["power", "exp_floor", "coci_exp", "none"]
#: The fitted families, in the order they are tried.
FAMILIES: tuple[str, ...] = ("power", "exp_floor", "coci_exp")
#: Free parameters per family (a family needs more points than this to be fitted).
_N_PARAMS = {"power": 4, "exp_floor": 3, "coci_exp": 2}


class CurveFit(BaseModel):
    """A fitted convergence curve, or ``family="none"`` with the reason in ``fallback``.

    Fields: ``params`` in step units (see the module docstring for each family's formula);
    ``holdout_error`` mean absolute error (loss units) of the chosen family and window forecasting
    the held-back tail; ``rmse`` of the final fit on the smoothed points of its window;
    ``window_start`` first step of the window fitted; ``n_points`` finite points received;
    ``dropped_points`` NaN/inf points dropped; ``n_fit_points`` smoothed points in the final fit;
    ``candidates`` each family's best holdout error; ``drift`` mean residual of the best global law
    forecasting the held-back tail, in standard errors (negative: falling faster than the law);
    ``last_step`` the last finite step seen; ``first_step`` / ``first_loss`` the first smoothed point
    of the trace (mean step and median loss of its first bin), from which the planner measures the
    whole run's loss drop (``coci.planning.objective.whole_run_mean_rate``).
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    family: Family
    params: dict[str, float] = Field(default_factory=dict)
    holdout_error: float | None = None
    rmse: float | None = None
    window_start: float | None = None
    n_points: int = 0
    dropped_points: int = 0
    fallback: str | None = None
    n_fit_points: int = 0
    candidates: dict[str, float] = Field(default_factory=dict)
    drift: float | None = None
    last_step: float | None = None
    first_step: float | None = None
    first_loss: float | None = None

    @property
    def usable(self) -> bool:
        """True when a family was fitted (the planner may weight by progress)."""
        return self.family != "none"

    def loss(self, steps: Any) -> np.ndarray:
        """Fitted loss at ``steps`` (vectorised). For ``"none"``: the last observed level, or NaN."""
        s = np.asarray(steps, dtype=float)
        if self.family == "none":
            return np.full_like(s, self.params.get("level", math.nan))
        return _evaluate(self.family, self.params, s)

    def slope(self, steps: Any) -> np.ndarray:
        """dL/ds per step at ``steps`` (vectorised; negative while the loss falls; 0 for "none")."""
        s = np.asarray(steps, dtype=float)
        if self.family == "none":
            return np.zeros_like(s)
        return _derivative(self.family, self.params, s)

    def progress_rate(self, steps: Any) -> np.ndarray:
        """Loss decrease per step, ``max(-slope, 0)`` (vectorised)."""
        return np.maximum(-self.slope(steps), 0.0)


# --- the families -------------------------------------------------------------------------------


def _power_base(params: dict[str, float], s: np.ndarray) -> np.ndarray:
    # Clamp so steps before the law's origin give a finite (large) value rather than NaN.
    return np.maximum(s + params["s0"], 1e-12)


def _evaluate(family: str, params: dict[str, float], s: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        if family == "power":
            return params["c"] + params["a"] * np.power(_power_base(params, s), -params["b"])
        if family == "exp_floor":
            return params["c"] + params["a"] * np.exp(-params["k"] * (s - params["s_ref"]))
        if family == "coci_exp":
            return np.exp(params["theta1"] * s + params["theta2"])
    raise ConfigError(f"family must be one of {FAMILIES}, got {family!r}")


def _derivative(family: str, params: dict[str, float], s: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        if family == "power":
            a, b = params["a"], params["b"]
            return -a * b * np.power(_power_base(params, s), -b - 1.0)
        if family == "exp_floor":
            a, k = params["a"], params["k"]
            return -a * k * np.exp(-k * (s - params["s_ref"]))
        if family == "coci_exp":
            theta1 = params["theta1"]
            return theta1 * np.exp(theta1 * s + params["theta2"])
    raise ConfigError(f"family must be one of {FAMILIES}, got {family!r}")


@dataclass(frozen=True)
class _Target:
    """The losses a variable-projection fit solves for, with their mean and centred values computed
    once per fit (the objective runs hundreds of times on the same losses)."""

    y: np.ndarray
    mean: np.floating[Any]
    centered: np.ndarray

    @classmethod
    def of(cls, y: np.ndarray) -> _Target:
        mean = y.mean()
        return cls(y, mean, y - mean)


def _linear_ac(phi: np.ndarray, target: _Target) -> tuple[float, float, float] | None:
    """Least squares for ``y = c + a * phi``; returns (a, c, sse) or None when degenerate/a <= 0."""
    phi_mean = np.add.reduce(phi) / phi.size  # phi.mean(), without its Python overhead (same float)
    dphi = phi - phi_mean
    denom = float(dphi @ dphi)
    if not math.isfinite(denom) or denom <= 1e-300:
        return None
    a = float(dphi @ target.centered) / denom
    if not math.isfinite(a) or a <= 0:
        return None
    c = float(target.mean - a * phi_mean)
    resid = target.y - c - a * phi
    return a, c, float(resid @ resid)


def _power_sse(log_b: float, log_shift: float, x: np.ndarray, target: _Target, x0_low: float):
    """Variable projection for the power law: (a, c) solved exactly for given (b, x0)."""
    b, x0 = math.exp(log_b), x0_low + math.exp(log_shift)
    return _linear_ac(np.power(x + x0, -b), target), b, x0


def _fit_power(x: np.ndarray, y: np.ndarray) -> dict[str, float] | None:
    """``c + a (x + x0) ** -b`` in scaled units.

    Variable projection: for fixed (b, x0) the best (a, c) is a linear least-squares solve, so the
    search is two-dimensional: a grid over (log b, log(x0 - x0_low)), then Nelder-Mead from the
    best ``_FIT_STARTS`` grid points. Overflow in the search only makes a probe unusable, so
    floating-point warnings are silenced for the whole search (once, not per probe).
    """
    with np.errstate(all="ignore"):
        return _fit_power_quietly(x, _Target.of(y))


def _fit_power_quietly(x: np.ndarray, target: _Target) -> dict[str, float] | None:
    span = max(x[-1] - x[0], 1e-12)
    x0_low = -x[0] + 1e-4 * span  # the law's origin stays just before the first point
    grid: list[tuple[float, float, float]] = []
    for log_b in np.log([0.1, 0.25, 0.5, 1.0, 2.0, 4.0]):
        for log_shift in np.log(np.geomspace(1e-3, 3.0, 10) * span):
            solved, _, _ = _power_sse(log_b, log_shift, x, target, x0_low)
            if solved is not None:
                grid.append((solved[2], log_b, log_shift))
    if not grid:
        return None
    grid.sort()
    log_b_bounds = (math.log(1e-3), math.log(20.0))
    log_shift_bounds = (math.log(1e-6 * span), math.log(1e3 * span))

    def objective(theta: np.ndarray) -> float:
        log_b = min(max(theta[0], log_b_bounds[0]), log_b_bounds[1])
        log_shift = min(max(theta[1], log_shift_bounds[0]), log_shift_bounds[1])
        solved, _, _ = _power_sse(log_b, log_shift, x, target, x0_low)
        return math.inf if solved is None else solved[2]

    best: tuple[float, np.ndarray] | None = None
    for sse, log_b, log_shift in grid[: _FIT_STARTS]:
        x_best, f_best = nelder_mead(
            objective, np.array([log_b, log_shift]), xatol=1e-4, fatol=1e-12 + 1e-9 * sse, maxiter=300
        )
        if math.isfinite(f_best) and (best is None or f_best < best[0]):
            best = (f_best, x_best)
    if best is None:
        return None
    log_b = min(max(best[1][0], log_b_bounds[0]), log_b_bounds[1])
    log_shift = min(max(best[1][1], log_shift_bounds[0]), log_shift_bounds[1])
    solved, b, x0 = _power_sse(log_b, log_shift, x, target, x0_low)
    if solved is None:
        return None
    a, c, _ = solved
    return {"a": a, "b": b, "x0": x0, "c": c}


def _fit_exp_floor(x: np.ndarray, y: np.ndarray) -> dict[str, float] | None:
    """``c + a exp(-k (x - x_ref))`` in scaled units.

    Variable projection: (a, c) exact for each k; a grid over log k, then a bounded scalar search
    around the best grid point.
    """
    span = max(x[-1] - x[0], 1e-12)
    x_ref = float(x[0])
    dx = x - x_ref

    target = _Target.of(y)

    def solve(log_k_span: float):
        with np.errstate(all="ignore"):
            return _linear_ac(np.exp(-math.exp(log_k_span) * dx / span), target)

    grid = np.log(np.geomspace(0.02, 100.0, 24))  # k * span: from almost linear to very curved
    sse = [(solved[2] if (solved := solve(g)) is not None else math.inf) for g in grid]
    best_index = int(np.argmin(sse))
    if not math.isfinite(sse[best_index]):
        return None
    low, high = grid[max(best_index - 1, 0)], grid[min(best_index + 1, grid.size - 1)]
    if high > low:
        x_best, f_best = bounded_scalar(
            lambda g: (solved[2] if (solved := solve(g)) is not None else math.inf), float(low), float(high), xatol=1e-5
        )
        log_k_span = x_best if math.isfinite(f_best) and f_best <= sse[best_index] else grid[best_index]
    else:
        log_k_span = grid[best_index]
    solved = solve(log_k_span)
    if solved is None:
        return None
    a, c, _ = solved
    return {"a": a, "k": math.exp(log_k_span) / span, "c": c, "x_ref": x_ref}


def _fit_coci(x: np.ndarray, y: np.ndarray) -> dict[str, float] | None:
    """COCI's law as its code fits it: a least-squares line through ``log(y)``; needs y > 0."""
    if np.any(y <= 0):
        return None
    theta1, theta2 = np.polyfit(x, np.log(y), 1)
    if not (math.isfinite(theta1) and math.isfinite(theta2)) or theta1 >= 0:
        return None
    return {"theta1": float(theta1), "theta2": float(theta2)}


def _to_step_units(family: str, p: dict[str, float], scale: float) -> dict[str, float]:
    """Convert scaled-unit parameters (x = s / scale) into step units."""
    if family == "power":
        # a (x + x0)^-b = a scale^b (s + x0 scale)^-b; keep it in log space until the end
        log_a = math.log(p["a"]) + p["b"] * math.log(scale)
        return {"a": math.exp(min(log_a, 700.0)), "b": p["b"], "s0": p["x0"] * scale, "c": p["c"]}
    if family == "exp_floor":
        return {"a": p["a"], "k": p["k"] / scale, "c": p["c"], "s_ref": p["x_ref"] * scale}
    if family == "coci_exp":
        return {"theta1": p["theta1"] / scale, "theta2": p["theta2"]}
    raise ConfigError(f"family must be one of {FAMILIES}, got {family!r}")


_FITTERS: dict[str, Callable[[np.ndarray, np.ndarray], dict[str, float] | None]] = {
    "power": _fit_power,
    "exp_floor": _fit_exp_floor,
    "coci_exp": _fit_coci,
}


def _fit_family(family: str, x: np.ndarray, y: np.ndarray, scale: float) -> dict[str, float] | None:
    if x.size <= _N_PARAMS[family] or x[-1] <= x[0]:
        return None
    scaled = _FITTERS[family](x, y)
    if scaled is None:
        return None
    params = _to_step_units(family, scaled, scale)
    if not all(math.isfinite(v) for v in params.values()):
        return None
    return params


# --- input handling and smoothing ---------------------------------------------------------------


def _as_float_array(values: Any, field: str, allow_empty: bool = False) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise ConfigError(f"{field} must be a sequence of numbers, got a string")
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{field} must be numeric, got {type(values).__name__}") from None
    if array.ndim != 1:
        raise ConfigError(f"{field} must be one-dimensional, got shape {array.shape}")
    if array.size == 0 and not allow_empty:
        raise ConfigError(f"{field} is empty")
    return array


def _split_input(steps_or_losses: Any, losses: Any) -> tuple[np.ndarray, np.ndarray]:
    if losses is None:
        if (
            isinstance(steps_or_losses, tuple)
            and len(steps_or_losses) == 2
            and all(np.ndim(part) == 1 for part in steps_or_losses)
        ):
            steps_or_losses, losses = steps_or_losses  # a (steps, losses) pair
        else:
            values = _as_float_array(steps_or_losses, "losses", allow_empty=True)  # fallback, not error
            return np.arange(1, values.size + 1, dtype=float), values
    steps = _as_float_array(steps_or_losses, "steps", allow_empty=True)
    values = _as_float_array(losses, "losses", allow_empty=True)
    if steps.size != values.size:
        raise ConfigError(
            f"steps and losses must have the same length, got {steps.size} and {values.size}"
        )
    return steps, values


def bin_trace(steps: np.ndarray, values: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin a sorted trace into at most about ``max_points`` bins (half log-, half linearly-spaced
    edges): mean step, median loss per bin. A trace that short already is returned as is."""
    if steps.size <= max_points:
        return steps, values
    offset = steps - steps[0] + 1.0
    half = max(max_points // 2, 2)
    edges = np.unique(
        np.concatenate((np.geomspace(1.0, offset[-1], half + 1), np.linspace(1.0, offset[-1], half + 1)))
    )
    index = np.clip(np.searchsorted(edges, offset, side="right") - 1, 0, edges.size - 2)
    starts = np.flatnonzero(np.diff(index, prepend=-1))
    stops = np.append(starts[1:], steps.size)
    mean_steps = np.add.reduceat(steps, starts) / (stops - starts)
    medians = np.array([np.median(values[a:b]) for a, b in zip(starts, stops)])
    return mean_steps, medians


def _noise_sd(values: np.ndarray) -> float:
    """Robust point-to-point noise of a trace: MAD of first differences / (0.6745 sqrt 2)."""
    if values.size < 3:
        return 0.0
    diffs = np.diff(values)
    return float(np.median(np.abs(diffs - np.median(diffs))) / (0.6745 * math.sqrt(2.0)))


def _mae(family: str, params: dict[str, float], s: np.ndarray, y: np.ndarray) -> float:
    error = np.abs(_evaluate(family, params, s) - y)
    return float(np.mean(error)) if np.all(np.isfinite(error)) else math.inf


def _finite_or_none(value: float | None) -> float | None:
    """Keep JSON round trips exact: non-finite quality figures are recorded as None."""
    return value if value is not None and math.isfinite(value) else None


def _none(reason: str, *, n_points: int, dropped: int, level: float | None, last: float | None) -> CurveFit:
    logger.info("convergence fit unusable: %s", reason)
    params = {} if level is None or not math.isfinite(level) else {"level": float(level)}
    return CurveFit(
        family="none",
        params=params,
        n_points=n_points,
        dropped_points=dropped,
        fallback=reason,
        last_step=last,
    )


def _window_mask(s: np.ndarray, end: float, fraction: float) -> np.ndarray:
    """Points in the last ``fraction`` of the step range ``[s[0], end]`` (and not after ``end``)."""
    start = end - fraction * (end - float(s[0]))
    return (s >= start - 1e-9 * max(abs(start), 1.0)) & (s <= end)


def _fit_on(family: str, s: np.ndarray, y: np.ndarray, mask: np.ndarray, scale: float, extra: int):
    """Fit ``family`` on the masked points when they are enough (parameters + ``extra``)."""
    if np.count_nonzero(mask) < _N_PARAMS[family] + extra:
        return None
    return _fit_family(family, s[mask] / scale, y[mask], scale)


# --- public entry points ------------------------------------------------------------------------


def fit_curve(
    steps_or_losses: Any,
    losses: Any = None,
    *,
    families: Sequence[str] | None = None,
    window: bool = True,
) -> CurveFit:
    """Fit a convergence law to a loss trace; see the module docstring for the procedure.

    ``fit_curve(losses)`` takes per-step losses (steps 1, 2, ...); ``fit_curve(steps, losses)`` or
    ``fit_curve((steps, losses))`` takes explicit steps. ``families`` restricts the families tried
    (default: all of ``FAMILIES``); ``window=False`` disables the recent-window refit.
    """
    steps, values = _split_input(steps_or_losses, losses)
    tried = tuple(FAMILIES if families is None else families)
    unknown = [f for f in tried if f not in FAMILIES]
    if unknown or not tried:
        raise ConfigError(f"families must be a non-empty subset of {FAMILIES}, got {families!r}")
    steps, values, dropped = _finite_sorted(steps, values)
    n_points = int(steps.size)
    last = float(steps[-1]) if n_points else None
    level = float(np.median(values[-max(1, n_points // 10):])) if n_points else None

    def unusable(reason: str) -> CurveFit:
        return _none(reason, n_points=n_points, dropped=dropped, level=level, last=last)

    if n_points < knobs.FIT_MIN_POINTS:
        return unusable(
            f"too few points: {n_points} finite (dropped {dropped} NaN/inf), need at least "
            f"{knobs.FIT_MIN_POINTS}"
        )
    if steps[-1] <= steps[0]:
        return unusable("all points are at the same step")
    s, y = bin_trace(steps, values, knobs.FIT_MAX_POINTS)
    if s.size < knobs.FIT_MIN_POINTS:
        return unusable(f"too few distinct points after smoothing: {s.size}")
    noise = max(_noise_sd(values), 1e-12)
    not_falling = _not_falling(y, noise)
    if not_falling is not None:
        return unusable(not_falling)
    backtest = _Backtest.of(s, y)
    best, candidates, drift = _choose_law(backtest, tried, window, noise)
    if best is None:
        return unusable("no family could be fitted to the trace")
    holdout_error, family, fraction = best
    chosen = _window_mask(s, float(s[-1]), fraction)
    extra = 1 if fraction == 1.0 else _FIT_WINDOW_EXTRA_POINTS
    params = _fit_on(family, s, y, chosen, backtest.scale, extra)
    if params is None:  # cannot happen in practice: the final window has more points than the backtest
        return unusable(f"refitting {family} on the whole window failed")
    resid = y[chosen] - _evaluate(family, params, s[chosen])
    return CurveFit(
        family=family,  # type: ignore[arg-type]
        params=params,
        holdout_error=_finite_or_none(holdout_error),
        rmse=_finite_or_none(float(np.sqrt(np.mean(resid**2)))),
        window_start=float(s[chosen][0]),
        n_points=n_points,
        dropped_points=dropped,
        fallback=None,
        n_fit_points=int(np.count_nonzero(chosen)),
        candidates={f: err for f, err in candidates.items() if math.isfinite(err)},
        drift=_finite_or_none(drift),
        last_step=last,
        first_step=float(s[0]),
        first_loss=float(y[0]),
    )


def _finite_sorted(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The finite points sorted by step (stable), and how many were dropped."""
    finite = np.isfinite(steps) & np.isfinite(values)
    steps, values = steps[finite], values[finite]
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order], int(np.count_nonzero(~finite))


def _not_falling(y: np.ndarray, noise: float) -> str | None:
    """Why the binned loss ``y`` does not fall enough to fit (None when it does): the median of
    its last fifth must lie below that of its first fifth by more than the noise and a margin."""
    head = float(np.median(y[: max(2, y.size // 5)]))
    tail = float(np.median(y[-max(2, y.size // 5):]))
    required = max(_FIT_MIN_DROP_SIGMA * noise, _FIT_MIN_DROP_RELATIVE * abs(head))
    if head - tail > required:
        return None
    verb = "rising" if tail - head > required else "not falling"
    return (
        f"loss {verb}: median of the first fifth {head:.6g}, of the last fifth {tail:.6g} "
        f"(needs a drop above {required:.3g})"
    )


@dataclass(frozen=True)
class _Backtest:
    """The binned trace split into a fitting part and a held-back tail (at least
    ``knobs.FIT_MIN_HOLDOUT_POINTS`` points) that scores each candidate law."""

    s: np.ndarray
    y: np.ndarray
    scale: float
    in_holdout: np.ndarray
    end: float  # last step before the holdout
    fits: dict[tuple[str, float, int], Any] = field(default_factory=dict)  # each fit made once (drift reuses one)

    @classmethod
    def of(cls, s: np.ndarray, y: np.ndarray) -> _Backtest:
        holdout_start = float(s[-1] - knobs.FIT_HOLDOUT_FRACTION * (s[-1] - s[0]))
        in_holdout = s > holdout_start
        if np.count_nonzero(in_holdout) < knobs.FIT_MIN_HOLDOUT_POINTS:
            in_holdout = np.zeros_like(in_holdout)
            in_holdout[-knobs.FIT_MIN_HOLDOUT_POINTS:] = True
        scale = float(max(abs(s[-1]), abs(s[0]), 1.0))
        return cls(s, y, scale, in_holdout, float(s[~in_holdout][-1]))

    def fit(self, family: str, fraction: float, extra: int) -> Any:
        """Parameters of "fit the last ``fraction`` of the trace" as it was at the holdout start."""
        key = (family, fraction, extra)
        if key not in self.fits:
            self.fits[key] = _fit_on(family, self.s, self.y, _window_mask(self.s, self.end, fraction), self.scale, extra)
        return self.fits[key]

    def error(self, family: str, fraction: float, extra: int) -> float:
        """That fit's mean absolute error forecasting the held-back tail (inf when it cannot fit)."""
        params = self.fit(family, fraction, extra)
        if params is None:
            return math.inf
        return _mae(family, params, self.s[self.in_holdout], self.y[self.in_holdout])

    def drift(self, family: str, noise: float) -> float | None:
        """How far (in standard errors) the held-back tail lies from the global law's forecast."""
        params = self.fit(family, 1.0, 1)
        if params is None:
            return None
        resid = self.y[self.in_holdout] - _evaluate(family, params, self.s[self.in_holdout])
        spread = max(float(np.std(resid, ddof=1)) if resid.size > 1 else 0.0, noise, 1e-12)
        return float(np.mean(resid) / (spread / math.sqrt(resid.size)))


Choice = tuple[float, str, float]  # (holdout error, family, window fraction)


def _choose_law(
    backtest: _Backtest, tried: tuple[str, ...], window: bool, noise: float
) -> tuple[Choice | None, dict[str, float], float | None]:
    """The best (error, family, window) by backtest, every family's error, and the drift.

    1. Global fit: the family is chosen by its error forecasting the held-back tail.
    2. Drift: does the loss on the held-back tail fall below what the global law forecast?
    3. On drift the global law is stale: the best recent window wins (same backtest).
    """
    candidates = {family: backtest.error(family, 1.0, 1) for family in tried}
    best: Choice | None = None
    for family, err in candidates.items():
        if math.isfinite(err) and (best is None or err < best[0]):
            best = (err, family, 1.0)
    drift = backtest.drift(best[1], noise) if best is not None and window else None
    if drift is None or abs(drift) <= _FIT_DRIFT_SIGMA:
        return best, candidates, drift
    windowed: Choice | None = None
    for family in [f for f in tried if f != "coci_exp"] or list(tried):
        for fraction in _FIT_WINDOW_FRACTIONS:
            err = backtest.error(family, fraction, _FIT_WINDOW_EXTRA_POINTS)
            if math.isfinite(err) and (windowed is None or err < windowed[0]):
                windowed = (err, family, fraction)
            candidates[family] = min(candidates.get(family, math.inf), err)
    return (windowed if windowed is not None else best), candidates, drift


def fit_coci_exponential(minutes: Any, losses: Any) -> tuple[float, float]:
    """COCI's convergence fit: ``L(t) = exp(theta1 t + theta2)``, ``t`` in minutes.

    As the authors' code does it: an ordinary least-squares line through ``(t, log L)``; returns
    ``(theta1, theta2)`` (theta1 per minute, negative for a falling loss). Raises
    [``ConfigError``][coci.ConfigError] when the inputs mismatch, hold fewer than two finite points, or a loss is
    not positive (its logarithm is undefined).
    """
    t = _as_float_array(minutes, "minutes")
    values = _as_float_array(losses, "losses")
    if t.size != values.size:
        raise ConfigError(f"minutes and losses must have the same length, got {t.size} and {values.size}")
    finite = np.isfinite(t) & np.isfinite(values)
    t, values = t[finite], values[finite]
    if t.size < 2 or np.ptp(t) == 0:
        raise ConfigError("minutes must hold at least two distinct finite times")
    if np.any(values <= 0):
        raise ConfigError("losses must be positive for COCI's exponential fit (it fits log loss)")
    theta1, theta2 = np.polyfit(t, np.log(values), 1)
    return float(theta1), float(theta2)
