"""The one definition of what a checkpoint plan costs.

The planner (``coci.planning.formulas``, ``coci.planning.planner``), the exact check (``exact_optimum``) and
the simulator all score a plan with the functions here, so "expected overhead" means the same thing
everywhere.

Notation: step time ``t``; checkpoint cost ``C`` (stall + interference: what one
checkpoint costs training); persist time ``P`` (background; a checkpoint *commits* ``P`` seconds after
its snapshot); restart cost ``R``; progress rate ``v(s) = -dL/ds`` of the fitted loss curve.

Progress weight
---------------
``w(s) = v(s) / v_bar`` with ``v_bar`` the mean progress rate over the **whole run**, from its first
step (step 0, or the first observed step) to the horizon: ``v_bar = (L(origin) - L(H)) / (H - origin)``
(``whole_run_mean_rate``). ``w`` averages 1 over the run and a second of work lost where
``w = 2`` costs as much as two average seconds. The normalisation never depends on where a plan
starts: an online re-plan at step ``s`` scores the remaining steps with the same weights as the
offline plan (they average below 1 late in a decaying run), so re-planning is time-consistent
(normalised over the remaining steps only, every re-plan would see a steep front and checkpoint
densely "now" again and again). ``mixture_weight`` gives the mixture
``w_mu = (w + mu) / (1 + mu)``; internally the planner uses ``alpha = 1 / (1 + mu)`` (the weight on
progress) because it stays finite: ``w_alpha = alpha w + (1 - alpha)``, alpha = 1 is pure progress,
alpha = 0 pure time.

The expected-value model (first order, shared by planner and DP)
-----------------------------------------------------------------
Positions ``x`` are seconds of *progress* (``x = step * t``); the plan covers ``[x0, H]`` with
``x0 = start_step * t`` and ``H = total_steps * t``. Failures arrive along the progress axis with
the expected count ``M(x)`` of ``ExpectedFailures`` (``M(x) = lambda x`` for a constant hazard).
A failure at ``x`` costs ``R`` plus the work since the last *committed* checkpoint: checkpoint ``i``
(snapshot at ``x_i``) is committed from ``e_i = min(x_i + P, H)`` on, so a failure in
``[e_i, e_{i+1})`` rolls back to ``x_i`` (and one before ``e_1`` to the last committed checkpoint
before the plan, step 0 for a fresh run). With ``W`` the cumulative weight,

    wall-clock     = n C + R (M(H) - M(x0)) + sum_j int_{e_j}^{e_{j+1}} (x - x_j)          dM(x)
    progress       = n C + R (M(H) - M(x0)) + sum_j int_{e_j}^{e_{j+1}} (W(x) - W(x_j))    dM(x)

"First order" means: failures during overhead (checkpoint stalls, restarts, re-executed work) are
not counted and re-executed work does not shift later failures. This is Young's model generalised
to a time-varying hazard and weight; it is accurate while ``M`` over an interval is small, and it is
exactly what ``exact_optimum`` minimises, so planner and DP agree on the objective. Checkpoints that
do not commit before ``H`` still cost ``C``.

Discretisation: ``build_cost_model`` cuts ``[x0, H]`` into cells at integer steps (one per step
for short horizons, a log + linear grid for long ones) and takes the hazard ``dM/dx`` and the weight
as constant per cell (the hazard as the cell's exact average, the weight by Simpson's rule). All
integrals above are then *exact* for the cell model: ``M`` and ``W`` are piecewise linear and
``int h W dx`` is piecewise quadratic, evaluated in closed form at any position.

Two levels
----------
With a remote tier and failure classes ([``coci.Failures.compose``][coci.Failures.compose]) a plan is the local steps
``x`` and the promoted subset ``y`` of them. A failure of a class that spares the local tier (hazard
``M_p``) rolls back to the last *local* commit and costs the restart ``R``; one that destroys it
(``M_n``) rolls back to the last *remote* commit, ``U`` (upload seconds) after the local commit
``x_k + P``, and costs the remote restart ``R_r``. Each promotion costs training ``C_u`` (the upload's
interference). The objective is the sum of two single-level objectives on the same weight,

    J(x, y) = J_local(x; C, P, R, M_p) + J_remote(y; C_u, P + U, R_r, M_n),     y a subset of x,

so ``TwoLevelCostModel`` is two ``CostModel`` s and the one-level model is the case
``M_n = 0`` (a single class destroys nothing). First order as above: an upload lost with a failure,
and a failure during a restore, are second-order effects. For restarting hazards each class's
``M`` is its own renewal function (its clock taken to restart at its own failures only).

Restarting hazards
------------------
For a Weibull (or any non-memoryless) model whose clock restarts at each (re)start, the plan uses the
*expected* hazard at progress position ``x``: the renewal density ``m(x) = E[h(age at x)]`` of the
failure process started at the plan's origin (the latest (re)start), solved from the renewal
equation ``M = F + M * dF`` on a grid (``coci._RENEWAL_GRID_POINTS`` points over at most
``coci._RENEWAL_MAX_MEANS`` MTBFs; beyond that ``M`` grows at the long-run rate ``1/MTBF``).
Approximation: as in the first-order model the renewal clock runs on progress time (overheads and
re-executed work ignored). With shape < 1 this front-loads the hazard (short intervals right after a
(re)start); with shape > 1 it defers it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coci import checks
from coci.errors import ConfigError

__all__ = [
    "CostModel",
    "ExpectedFailures",
    "TwoLevelCostModel",
    "Overhead",
    "build_cost_model",
    "expected_failures",
    "mixture_weight",
    "progress_weight",
    "whole_run_mean_rate",
]

#: Horizons up to this many steps are modelled with one cost cell per step (exact per-step hazard
#: and weight); longer ones with a linear + log-spaced grid of integer-step cells.
_PLAN_PER_STEP_CELLS_MAX: int = 4096

#: Linearly spaced cells of the long-horizon grid (resolution late in the run).
_PLAN_LINEAR_CELLS: int = 2048

#: Log-spaced cells of the long-horizon grid (resolution early, where the loss moves fast).
_PLAN_LOG_CELLS: int = 1024

#: Grid points of the renewal-equation solve for restarting (non-memoryless) hazards.
_RENEWAL_GRID_POINTS: int = 1024

#: The renewal grid spans at most this many MTBFs; beyond, failures arrive at the long-run rate.
_RENEWAL_MAX_MEANS: float = 20.0

#: A function of steps (an array) giving a value per step: a progress rate, a cumulative hazard.
#: Defined once here, the planning package's lowest module; the others import it.
RateFunction = Callable[[np.ndarray], np.ndarray]


# --- weights -------------------------------------------------------------------------------------


def progress_weight(rates: Any, widths: Any = None, mean_rate: float | None = None) -> np.ndarray:
    """``w = v / v_bar``: the progress rate normalised by the whole run's mean rate.

    ``rates`` are ``v`` on cells; ``widths`` the cells' lengths (equal cells when omitted).
    ``mean_rate`` is ``v_bar`` (``whole_run_mean_rate``); when omitted the cells are taken to
    cover the whole run and ``v_bar`` is their width-weighted mean (``w`` then averages 1). Raises
    [``ConfigError``][coci.ConfigError] (field ``curve``) when ``v`` is negative, not finite or zero everywhere:
    such a curve carries no progress information.
    """
    v = np.asarray(rates, dtype=float)
    if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ConfigError("curve: the progress rate must be finite and non-negative over the horizon")
    if mean_rate is not None:
        mean = float(mean_rate)
    elif widths is None:
        mean = float(v.mean())
    else:
        width = np.asarray(widths, dtype=float)
        mean = float(np.dot(v, width) / width.sum())
    if not (mean > 0 and math.isfinite(mean)):
        raise ConfigError("curve: the fitted loss does not fall over the horizon (progress rate 0)")
    return v / mean


def whole_run_mean_rate(
    progress_rate: RateFunction | None,
    total_steps: int,
    *,
    origin_step: float = 0.0,
    loss_drop: float | None = None,
) -> float:
    """``v_bar``: the mean progress rate over the whole run ``[origin_step, total_steps]``.

    ``v_bar = (L(origin) - L(H)) / (H - origin)``. With ``loss_drop`` (``L(origin) - L(H)``, e.g. the
    first observed loss minus the fitted loss at the horizon) it is that over the span; otherwise
    ``v`` is integrated numerically over the span (the grid of ``cell_edges``, Simpson per
    cell). Raises [``ConfigError``][coci.ConfigError] (field ``curve``) when the result is not positive and finite.
    """
    span = float(total_steps) - float(origin_step)
    if not span > 0:
        raise ConfigError(f"curve: the run's first step {origin_step!r} must lie before total_steps {total_steps!r}")
    if loss_drop is None:
        if progress_rate is None:
            raise ConfigError("curve: a progress rate or a loss drop is needed for the mean progress rate")
        start = int(math.floor(origin_step))
        edges = cell_edges(start, int(total_steps))
        edges[0] = float(origin_step)
        left, right = edges[:-1], edges[1:]
        samples = [np.asarray(progress_rate(s), dtype=float) for s in (left, 0.5 * (left + right), right)]
        rate = (samples[0] + 4.0 * samples[1] + samples[2]) / 6.0
        loss_drop = float(np.dot(rate, right - left))
    mean = float(loss_drop) / span
    if not (mean > 0 and math.isfinite(mean)):
        raise ConfigError("curve: the loss does not fall over the run (mean progress rate 0)")
    return mean


def mixture_weight(weight: Any, mu: float | None) -> np.ndarray:
    """The mixture weight ``w_mu = (w + mu) / (1 + mu)``; ``mu = None`` or ``inf`` gives the time weight 1."""
    w = np.asarray(weight, dtype=float)
    if mu is None or math.isinf(mu):
        return np.ones_like(w)
    if not (mu >= 0):
        raise ConfigError(f"mu must be non-negative, got {mu!r}")
    return (w + mu) / (1.0 + mu)


def alpha_from_mu(mu: float | None) -> float:
    """Weight on progress ``alpha = 1 / (1 + mu)`` (0 for ``mu = None``/inf: pure time)."""
    return 0.0 if mu is None or math.isinf(mu) else 1.0 / (1.0 + mu)


def mu_from_alpha(alpha: float) -> float | None:
    """Inverse of ``alpha_from_mu``; ``None`` stands for ``mu = inf`` (pure time)."""
    return None if alpha <= 0 else (1.0 - alpha) / alpha


# --- failures along the progress axis ------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedFailures:
    """``M(x)``: expected failures in the first ``x`` seconds of progress after ``origin_seconds``.

    Tabulated on ``grid`` (seconds after the origin, starting at 0) with ``values`` (``M`` there)
    and continued linearly at ``tail_rate`` beyond the grid. ``M`` is 0 before the origin. For a
    renewal process ``first`` is the CDF of the first failure and ``values`` hold ``M - F`` (smooth
    even where ``F`` is steep, e.g. a Weibull of shape < 1 right after the start), so ``M`` is exact
    to first order inside the first grid cell too.
    """

    grid: np.ndarray
    values: np.ndarray
    tail_rate: float
    origin_seconds: float = 0.0
    description: str = ""
    first: RateFunction | None = None

    @classmethod
    def constant(cls, rate: float, origin_seconds: float = 0.0) -> ExpectedFailures:
        """Memoryless failures at ``rate`` per second."""
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"failure rate must be positive and finite, got {rate!r}")
        return cls(np.array([0.0, 1.0]), np.array([0.0, rate]), rate, origin_seconds, "constant")

    @classmethod
    def none(cls, origin_seconds: float = 0.0) -> ExpectedFailures:
        """No failures at all (a failure class group that is empty)."""
        return cls(np.array([0.0, 1.0]), np.array([0.0, 0.0]), 0.0, origin_seconds, "none")

    @classmethod
    def renewal(
        cls,
        cumulative_hazard: RateFunction,
        mean_seconds: float,
        horizon_seconds: float,
        origin_seconds: float = 0.0,
    ) -> ExpectedFailures:
        """Renewal function of a hazard that restarts at each failure (see the module docstring)."""
        span = min(max(horizon_seconds, mean_seconds), _RENEWAL_MAX_MEANS * mean_seconds)
        points = _RENEWAL_GRID_POINTS
        grid = np.linspace(0.0, span, points + 1)
        cdf = -np.expm1(-np.asarray(cumulative_hazard(grid), dtype=float))
        values = _solve_renewal(cdf) - cdf

        def first(x: np.ndarray) -> np.ndarray:
            return -np.expm1(-np.asarray(cumulative_hazard(np.maximum(x, 0.0)), dtype=float))

        return cls(grid, values, 1.0 / mean_seconds, origin_seconds, "renewal", first)

    @classmethod
    def from_hazard(
        cls, hazard: RateFunction, horizon_seconds: float, origin_seconds: float = 0.0
    ) -> ExpectedFailures:
        """Integrate a plain hazard callable ``h(x)`` (1/s, x seconds after the origin; no restarts)."""
        points = _RENEWAL_GRID_POINTS
        span = max(horizon_seconds, 1e-9)
        grid = np.unique(np.concatenate([np.linspace(0, span, points + 1), np.geomspace(span * 1e-6, span, points)]))
        mids = 0.5 * (grid[1:] + grid[:-1])  # midpoints avoid a singular h(0)
        rates = np.asarray(hazard(mids), dtype=float)
        if rates.shape != mids.shape or not np.all(np.isfinite(rates)) or np.any(rates < 0):
            raise ConfigError("failures: the hazard must return finite, non-negative rates")
        values = np.concatenate([[0.0], np.cumsum(rates * np.diff(grid))])
        return cls(grid, values, float(rates[-1]), origin_seconds, "hazard")

    def __call__(self, x_seconds: Any) -> np.ndarray:
        u = np.asarray(x_seconds, dtype=float) - self.origin_seconds
        inside = np.interp(u, self.grid, self.values)
        end = self.values[-1]
        if self.first is not None:
            inside = inside + self.first(np.minimum(u, self.grid[-1]))
            end = end + float(self.first(self.grid[-1:])[0])
        beyond = end + (u - self.grid[-1]) * self.tail_rate
        return np.where(u <= 0, 0.0, np.where(u > self.grid[-1], beyond, inside))


def _solve_renewal(cdf: np.ndarray) -> np.ndarray:
    """Renewal function ``M = F + int M(x - y) dF(y)`` on a uniform grid (trapezoidal Stieltjes sum)."""
    d_cdf = np.diff(cdf)
    values = np.zeros_like(cdf)
    half_first = 0.5 * d_cdf[0] if d_cdf.size else 0.0
    for n in range(1, cdf.size):
        # M_n = F_n + sum_{k=1..n} dF_k (M_{n-k} + M_{n-k+1}) / 2; the k = 1 term holds M_n itself.
        previous = values[n - 1 :: -1][:n]  # M_{n-1}, ..., M_0   (index k-1 -> M_{n-k})
        later = values[n::-1][:n]  # M_n (unknown, 0 here), M_{n-1}, ..., M_1
        total = cdf[n] + 0.5 * np.dot(d_cdf[:n], previous) + 0.5 * np.dot(d_cdf[1:n], later[1:])
        values[n] = total / (1.0 - half_first)
    return values


def expected_failures(
    failures: Any, horizon_seconds: float, origin_seconds: float = 0.0
) -> ExpectedFailures:
    """``M(x)`` for a failure model: a [``coci.Failures``][coci.Failures], an object with ``hazard`` and
    ``cumulative_hazard``, an ``ExpectedFailures``, a plain hazard callable ``h(tau)``, or a
    positive number (a constant rate per second)."""
    if isinstance(failures, ExpectedFailures):
        return failures
    if checks.is_number(failures):
        return ExpectedFailures.constant(float(failures), origin_seconds)
    if getattr(failures, "is_memoryless", False):
        return ExpectedFailures.constant(float(failures.rate), origin_seconds)
    cumulative = getattr(failures, "cumulative_hazard", None)
    if callable(cumulative):
        return ExpectedFailures.renewal(cumulative, float(failures.mean_seconds), horizon_seconds, origin_seconds)
    if callable(failures):
        return ExpectedFailures.from_hazard(failures, horizon_seconds, origin_seconds)
    raise ConfigError(f"failures must be a coci.Failures, a hazard callable or a rate, got {failures!r}")


# --- the cost model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Overhead:
    """Expected fault-tolerance overhead of one plan, by metric and by part (seconds)."""

    checkpoints: int
    checkpoint_seconds: float
    failures: float
    restart_seconds: float
    lost_seconds: float
    lost_progress_seconds: float
    run_seconds: float

    @property
    def wall_seconds(self) -> float:
        """Expected wall-clock overhead: checkpoints + restarts + lost work."""
        return self.checkpoint_seconds + self.restart_seconds + self.lost_seconds

    @property
    def progress_seconds(self) -> float:
        """Expected progress-weighted overhead: checkpoints + restarts + weighted lost work."""
        return self.checkpoint_seconds + self.restart_seconds + self.lost_progress_seconds

    @property
    def exposed_wall_seconds(self) -> float:
        """Expected wall-clock overhead with the failures that strike during the overhead itself
        (restarts, re-done work, stalls) counted: ``wall / (1 - f)``, ``f = (restart + lost) / run``.

        The first-order ``wall_seconds`` counts failures over the run's progress only. Failures
        arrive over the whole wall time ``H + O``, each costing on average ``(restart + lost) /
        failures``, so ``O = n C + f (H + O)``. The correction grows with the share of the run
        failures cost: negligible at 1% (an 8 h MTBF, a 2 min restart), about 13% of the overhead
        for a 3 h MTBF, a 10 min restart and a 5 min persist, and larger for the plan whose
        rollbacks are longer, which is what the time budget must see."""
        share = (self.restart_seconds + self.lost_seconds) / self.run_seconds if self.run_seconds > 0 else 0.0
        return self.wall_seconds / (1.0 - share) if share < 1.0 else math.inf

    def mixture(self, alpha: float) -> float:
        """``alpha * progress + (1 - alpha) * wall`` (= the ``w_mu`` objective, alpha = 1/(1+mu))."""
        return alpha * self.progress_seconds + (1.0 - alpha) * self.wall_seconds

    def as_dict(self) -> dict[str, float]:
        return {
            "wall_seconds": self.wall_seconds,
            "progress_seconds": self.progress_seconds,
            "wall_fraction": self.wall_seconds / self.run_seconds if self.run_seconds > 0 else 0.0,
            "exposed_wall_seconds": self.exposed_wall_seconds,
            "checkpoints": float(self.checkpoints),
            "checkpoint_seconds": self.checkpoint_seconds,
            "failures": self.failures,
            "restart_seconds": self.restart_seconds,
            "lost_seconds": self.lost_seconds,
            "lost_progress_seconds": self.lost_progress_seconds,
            "run_seconds": self.run_seconds,
        }


@dataclass(frozen=True)
class CostModel:
    """Per-cell hazard and weight over ``[start_step, total_steps]`` plus the cost figures.

    ``edges`` are cell boundaries in seconds of progress; ``hazard`` (failures/s) and ``weight``
    (progress weight, mean 1 over the whole run) are constant per cell. ``has_progress`` is False when no curve
    was given (``weight`` is then 1 and both metrics coincide).
    """

    step_seconds: float
    checkpoint_seconds: float
    persist_seconds: float
    restart_seconds: float
    total_steps: int
    start_step: int
    last_checkpoint_step: int
    edges: np.ndarray
    hazard: np.ndarray
    weight: np.ndarray
    has_progress: bool
    cum_failures: np.ndarray
    cum_weight: np.ndarray
    cum_time_integral: np.ndarray
    cum_progress_integral: np.ndarray

    @property
    def start_seconds(self) -> float:
        return float(self.edges[0])

    @property
    def horizon_seconds(self) -> float:
        return float(self.edges[-1])

    # -- cumulative functions, exact for the cell model -----------------------------------------

    def _locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cell = np.searchsorted(self.edges[1:-1], x, side="right")  # in [0, cells - 1]
        return cell, x - self.edges[cell]

    def failures_until(self, x: Any) -> np.ndarray:
        """``M(x) - M(x0)``: expected failures between the plan's start and ``x``."""
        cell, d = self._locate(np.asarray(x, dtype=float))
        return self.cum_failures[cell] + self.hazard[cell] * d

    def weight_until(self, x: Any, alpha: float = 1.0) -> np.ndarray:
        """``W_alpha(x) - W_alpha(x0)``; extends linearly below ``x0`` (first cell's weight)."""
        x = np.asarray(x, dtype=float)
        cell, d = self._locate(x)
        progress = self.cum_weight[cell] + self.weight[cell] * d
        return alpha * progress + (1.0 - alpha) * (x - self.start_seconds)

    def hazard_integral(self, x: Any, alpha: float = 1.0) -> np.ndarray:
        """``int_{x0}^{x} W_alpha dM``, piecewise quadratic in ``x``."""
        x = np.asarray(x, dtype=float)
        cell, d = self._locate(x)
        h = self.hazard[cell]
        time_part = self.cum_time_integral[cell] + h * ((self.edges[cell] - self.start_seconds) * d + 0.5 * d * d)
        if alpha == 0.0:
            return time_part
        progress_part = self.cum_progress_integral[cell] + h * (
            self.cum_weight[cell] * d + 0.5 * self.weight[cell] * d * d
        )
        return alpha * progress_part + (1.0 - alpha) * time_part

    # -- the objective ----------------------------------------------------------------------------

    def segments(self, steps: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, ref)`` per failure segment of a sorted step list: failures in ``[lo, hi)``
        roll back to ``ref`` (all in seconds of progress)."""
        x = np.asarray(steps, dtype=float) * self.step_seconds
        commit = np.minimum(x + self.persist_seconds, self.horizon_seconds)
        lo = np.concatenate([[self.start_seconds], commit])
        hi = np.concatenate([commit, [self.horizon_seconds]])
        ref = np.concatenate([[self.last_checkpoint_step * self.step_seconds], x])
        return lo, hi, ref

    def lost_work(self, steps: Any, alpha: float) -> float:
        """Expected weighted lost work of a plan under ``w_alpha``."""
        lost_time, lost_progress = self._lost(steps, progress=alpha != 0.0)
        return alpha * lost_progress + (1.0 - alpha) * lost_time

    def _lost(self, steps: Any, *, progress: bool = True) -> tuple[float, float]:
        """Expected lost work (time metric, progress metric) of a step list, one pass.

        Per segment ``[lo, hi)`` rolling back to ``ref``: ``I(hi) - I(lo) - W(ref) (M(hi) - M(lo))``
        with ``I = int W dM``; every position is located in the cell grid once.
        """
        lo, hi, ref = self.segments(steps)
        x0 = self.start_seconds
        (c_lo, d_lo), (c_hi, d_hi), (c_ref, d_ref) = self._locate(lo), self._locate(hi), self._locate(ref)
        h_lo, h_hi = self.hazard[c_lo], self.hazard[c_hi]
        failures = (self.cum_failures[c_hi] + h_hi * d_hi) - (self.cum_failures[c_lo] + h_lo * d_lo)
        e_lo, e_hi = self.edges[c_lo] - x0, self.edges[c_hi] - x0
        time_hi = self.cum_time_integral[c_hi] + h_hi * (e_hi * d_hi + 0.5 * d_hi * d_hi)
        time_lo = self.cum_time_integral[c_lo] + h_lo * (e_lo * d_lo + 0.5 * d_lo * d_lo)
        lost_time = float(np.sum(time_hi - time_lo - (ref - x0) * failures))
        if not (progress and self.has_progress):
            return lost_time, lost_time
        w_lo, w_hi = self.weight[c_lo], self.weight[c_hi]
        prog_hi = self.cum_progress_integral[c_hi] + h_hi * (self.cum_weight[c_hi] * d_hi + 0.5 * w_hi * d_hi * d_hi)
        prog_lo = self.cum_progress_integral[c_lo] + h_lo * (self.cum_weight[c_lo] * d_lo + 0.5 * w_lo * d_lo * d_lo)
        w_ref = self.cum_weight[c_ref] + self.weight[c_ref] * d_ref
        return lost_time, float(np.sum(prog_hi - prog_lo - w_ref * failures))

    def expected(self, steps: Any) -> Overhead:
        """Expected overhead of a sorted list of checkpoint steps, both metrics (see module doc)."""
        checked = self.check_steps(steps)
        failures = float(self.failures_until(self.horizon_seconds))
        lost_time, lost_progress = self._lost(checked)
        return Overhead(
            checkpoints=int(checked.size),
            checkpoint_seconds=checked.size * self.checkpoint_seconds,
            failures=failures,
            restart_seconds=failures * self.restart_seconds,
            lost_seconds=lost_time,
            lost_progress_seconds=lost_progress,
            run_seconds=self.horizon_seconds - self.start_seconds,
        )

    def objective(self, steps: Any, alpha: float) -> float:
        """The ``w_alpha`` objective (what the planner and the DP minimise)."""
        checked = self.check_steps(steps)
        failures = float(self.failures_until(self.horizon_seconds))
        return checked.size * self.checkpoint_seconds + failures * self.restart_seconds + self.lost_work(checked, alpha)

    def check_steps(self, steps: Any) -> np.ndarray:
        """``steps`` as an int array; raises [``ConfigError``][coci.ConfigError] unless strictly increasing in
        ``(start_step, total_steps]``."""
        array = np.asarray(steps)
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ConfigError("steps must be a 1-D list of integers")
        if array[0] <= self.start_step or array[-1] > self.total_steps or np.any(np.diff(array) <= 0):
            raise ConfigError(
                f"steps must be strictly increasing within ({self.start_step}, {self.total_steps}]"
            )
        return array.astype(np.int64, copy=False)


def level_figures(local: Overhead, uppers: Sequence[tuple[str, str, str, Overhead]]) -> dict[str, float]:
    """What a multi-level plan adds to ``Overhead.as_dict``: each upper level's transfers and
    their seconds, each level's failures, each upper level's restart and lost seconds. ``uppers``:
    ``(level, transfers name, transfer seconds name, its part)`` from the lowest up."""
    figures: dict[str, float] = {}
    for _, transfers, seconds, part in uppers:
        figures.update({transfers: float(part.checkpoints), seconds: part.checkpoint_seconds})
    figures["local_failures"] = local.failures
    figures.update({f"{level}_failures": part.failures for level, _, _, part in uppers})
    for level, _, _, part in uppers:
        figures.update({f"{level}_restart_seconds": part.restart_seconds, f"{level}_lost_seconds": part.lost_seconds})
    return figures


@dataclass(frozen=True)
class TwoLevelCostModel:
    """The two-level objective (module docstring, "Two levels"): ``local`` scores the local steps
    against the failures that spare the local tier, ``remote`` the promoted steps against those that
    destroy it (its ``checkpoint_seconds`` is the upload's interference, its ``persist_seconds`` the
    persist plus the upload, its ``restart_seconds`` the restore from the remote tier)."""

    local: CostModel
    remote: CostModel

    @property
    def upload_seconds(self) -> float:
        return self.remote.persist_seconds - self.local.persist_seconds

    def parts(self, steps: Any, promote: Any) -> tuple[Overhead, Overhead]:
        """Expected overhead of the local chain and of the promoted chain; ``promote`` must be a
        subset of ``steps`` (raises [``ConfigError``][coci.ConfigError] otherwise)."""
        local, remote = self.local.check_steps(steps), self.remote.check_steps(promote)
        if not np.all(np.isin(remote, local)):
            raise ConfigError("promote_steps must be a subset of steps")
        return self.local.expected(local), self.remote.expected(remote)

    def expected(self, steps: Any, promote: Any) -> Overhead:
        """Expected overhead of a two-level plan, the two chains added (``checkpoints`` counts the
        local ones; promotions are in ``as_dict``)."""
        local, remote = self.parts(steps, promote)
        return Overhead(
            checkpoints=local.checkpoints,
            checkpoint_seconds=local.checkpoint_seconds + remote.checkpoint_seconds,
            failures=local.failures + remote.failures,
            restart_seconds=local.restart_seconds + remote.restart_seconds,
            lost_seconds=local.lost_seconds + remote.lost_seconds,
            lost_progress_seconds=local.lost_progress_seconds + remote.lost_progress_seconds,
            run_seconds=local.run_seconds,
        )

    def as_dict(self, steps: Any, promote: Any) -> dict[str, float]:
        """``Overhead.as_dict`` of the plan, with the promotions and each class group's part."""
        local, remote = self.parts(steps, promote)
        figures = self.expected(steps, promote).as_dict()
        figures.update(level_figures(local, [("remote", "promotions", "promotion_seconds", remote)]))
        return figures

    def objective(self, steps: Any, promote: Any, alpha: float) -> float:
        """The ``w_alpha`` objective of a two-level plan (what its planner and DP minimise)."""
        return self.local.objective(steps, alpha) + self.remote.objective(promote, alpha)


def cell_edges(start_step: int, total_steps: int, per_step: bool | None = None) -> np.ndarray:
    """Integer cell edges over ``[start_step, total_steps]``: every step for short spans (or when
    ``per_step``), else a union of a linear and a log-spaced grid (detail early and late)."""
    span = total_steps - start_step
    if per_step or (per_step is None and span <= _PLAN_PER_STEP_CELLS_MAX):
        return np.arange(start_step, total_steps + 1, dtype=float)
    linear = np.linspace(start_step, total_steps, _PLAN_LINEAR_CELLS + 1)
    log = start_step + np.geomspace(1.0, span, _PLAN_LOG_CELLS)
    return np.unique(np.rint(np.concatenate([[start_step, total_steps], linear, log])))


def build_cost_model(
    *,
    total_steps: int,
    step_seconds: float,
    checkpoint_seconds: float,
    persist_seconds: float,
    restart_seconds: float,
    failures: ExpectedFailures,
    progress_rate: RateFunction | None = None,
    start_step: int = 0,
    last_checkpoint_step: int | None = None,
    per_step: bool | None = None,
    mean_rate: float | None = None,
) -> CostModel:
    """Tabulate hazard and weight on cells and precompute the cumulative integrals.

    ``progress_rate(steps)`` is ``v(s)`` (loss decrease per step, vectorised); None means time only.
    ``mean_rate`` is the whole run's ``v_bar`` that normalises the weight (default:
    ``whole_run_mean_rate`` of ``progress_rate`` over ``[0, total_steps]``, whatever
    ``start_step`` is). Raises [``ConfigError``][coci.ConfigError] (field ``curve``) when ``v`` is unusable over
    the horizon.
    """
    if not 0 <= start_step < total_steps:
        raise ConfigError(f"start_step must lie in [0, total_steps), got {start_step!r}")
    last = start_step if last_checkpoint_step is None else int(last_checkpoint_step)
    step_edges = cell_edges(start_step, total_steps, per_step)
    edges = step_edges * step_seconds
    width = np.diff(edges)
    failures_at_edges = failures(edges)
    hazard = np.maximum(np.diff(failures_at_edges), 0.0) / width
    if progress_rate is None:
        weight = np.ones_like(width)
    else:
        left, right = step_edges[:-1], step_edges[1:]
        samples = [np.asarray(progress_rate(s), dtype=float) for s in (left, 0.5 * (left + right), right)]
        rate = (samples[0] + 4.0 * samples[1] + samples[2]) / 6.0
        if mean_rate is None:
            mean_rate = whole_run_mean_rate(progress_rate, total_steps) if start_step > 0 else None
        weight = progress_weight(rate, width, mean_rate)
    cum_failures = _cumulative(hazard * width)
    cum_weight = _cumulative(weight * width)
    offset = edges[:-1] - edges[0]
    cum_time = _cumulative(hazard * (offset * width + 0.5 * width * width))
    cum_progress = _cumulative(hazard * (cum_weight[:-1] * width + 0.5 * weight * width * width))
    return CostModel(
        step_seconds=float(step_seconds),
        checkpoint_seconds=float(checkpoint_seconds),
        persist_seconds=float(persist_seconds),
        restart_seconds=float(restart_seconds),
        total_steps=int(total_steps),
        start_step=int(start_step),
        last_checkpoint_step=min(last, int(start_step)),
        edges=edges,
        hazard=hazard,
        weight=weight,
        has_progress=progress_rate is not None,
        cum_failures=cum_failures,
        cum_weight=cum_weight,
        cum_time_integral=cum_time,
        cum_progress_integral=cum_progress,
    )


def _cumulative(parts: np.ndarray) -> np.ndarray:
    out = np.empty(parts.size + 1)
    out[0] = 0.0
    np.cumsum(parts, out=out[1:])
    return out
