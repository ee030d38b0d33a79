"""Plans: from measured costs, a failure model and a loss curve to checkpoint steps
(profiler -> **plan** -> snapshot -> persist -> report).

:func:`plan` is the offline entry point (and what the CLI and the session call): it validates the
inputs, fits the curve, builds the one cost model of :mod:`coci.planning.objective`, runs the named policy
of :mod:`coci.planning.formulas` and returns a :class:`Plan` with the steps, the expected costs under both
metrics and every fallback taken. :func:`make_policy` wraps it for :class:`coci.Session`: a
:class:`PlanningPolicy` that plans after warm-up from the live profile and re-plans only when the
measured costs or the fit move by more than a threshold.

Fallbacks (recorded in ``Plan.fallbacks``, never silent):

* no curve, or a curve the fitter cannot use (too few points, loss not falling, ...) -> ``auto``
  uses the time objective; ``coci`` uses the time-optimal plan;
* a restarting (non-memoryless) failure model -> the expected hazard of the renewal process (see
  :mod:`coci.planning.objective`), and ``young``/``daly``/``coci`` use the long-run rate ``1 / MTBF``;
* ``coci``'s fitted loss running out of room before the horizon -> its last interval repeated;
* online: no stall / persist / restart measured yet -> assumed values (knobs), re-planned once
  measured.

Re-planning online (``start_step > 0``, what :class:`PlanningPolicy` does as the curve is
revealed) is time-consistent with the offline plan:

* the progress weight is normalised over the whole run, from the trace's first step to the horizon
  (:mod:`coci.planning.objective`), never over the remaining steps; before a recent-window fit's window the
  rate is the observed average (the law is not extrapolated backwards);
* the time budget belongs to the run: ``auto`` picks its mixture weight ``alpha`` on the whole run
  (from the fit's first step) under the current costs and fit, then plans the remaining steps with
  that ``alpha`` (the Lagrangian tail of the whole run's plan) instead of granting each re-plan a
  fresh 5% of the remaining time optimum;
* the segment already running counts: the first new checkpoint is placed from the last checkpoint,
  not from the re-plan's step;
* before its first plan (warm-up) ``auto``'s progress objective checkpoints at
  ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS`` (1, 2, 4, 8, 16): no costs or curve are known yet, but a
  run from scratch falls fastest there (measured on GPT-2 runs: nearly all of the online deficit
  against the offline plan was these steps, see benchmarks/README.md, "Schedule quality");
* while the loss trace holds fewer than ``knobs.FIT_MIN_POINTS`` points ``auto`` plans with the
  prior progress rate :data:`PRIOR_PROGRESS_RATE` (equal loss decrease per doubling of the step
  count); a trace the fitter finds flat or rising, or a run that records no loss, gets the
  time-optimal plan (Young/Daly generalised to the hazard); each recorded in ``fallbacks``;
* a loss observed positive never falls below 0 in the planner's curve (``knobs.PLAN_NONNEGATIVE_LOSS``):
  early, noisy fits often extrapolate to a negative asymptote, which would put most of the run's
  progress in the future and flatten the weight.

Open-ended runs (``total_steps=None`` in the session) are planned over
``max(knobs.PLAN_DEFAULT_HORIZON_STEPS, 2 * current step)`` steps and re-planned over a doubled
horizon once the run passes ``knobs.PLAN_HORIZON_EXTEND_AT`` of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

from coci import knobs
from coci.errors import ConfigError
from coci.planning.failures import Failures
from coci.planning.fit import CurveFit, fit_coci_exponential, fit_curve
from coci.planning.formulas import (
    auto_steps,
    checkfreq_interval,
    checkfreq_steps,
    coci_expected_progress,
    coci_minutes,
    daly_interval_seconds,
    max_interval_steps,
    min_interval_steps,
    periodic_steps,
    snap_to_steps,
    young_interval_seconds,
)
from coci.planning.objective import CostModel, ExpectedFailures, build_cost_model, expected_failures, whole_run_mean_rate
from coci.planning.policy import Observation
from coci.units import parse_duration

__all__ = [
    "OBJECTIVES", "POLICIES", "PRIOR_PROGRESS_RATE", "Plan", "PlanInputs", "PlanningPolicy", "make_policy", "plan",
]

logger = logging.getLogger(__name__)

#: Policy names :func:`plan` and :func:`make_policy` accept.
POLICIES: tuple[str, ...] = ("auto", "young", "daly", "checkfreq", "coci")
#: Objectives of ``auto``.
OBJECTIVES: tuple[str, ...] = ("progress", "time")


class PriorProgressRate:
    """The planner's prior progress rate ``v(s) = 1 / max(s, 1)`` (``s`` from the run's first step).

    Scale-free diminishing returns: the loss falls by the same amount per doubling of the step
    count, so ``w(s) = v(s) / v_bar`` is about ``H / (s ln H)`` over a horizon of ``H`` steps (large
    at the start, below 1 after ``H / ln H``). :class:`PlanningPolicy` plans with it while the loss
    trace is too short to fit (``knobs.PLAN_PRIOR_ENABLED``); :func:`plan` accepts it as ``curve``
    like any progress-rate callable.
    """

    description = "prior v(s) = 1/max(s, 1)"

    def __call__(self, steps: np.ndarray) -> np.ndarray:
        return 1.0 / np.maximum(np.asarray(steps, dtype=float), 1.0)

    def __repr__(self) -> str:
        return "PRIOR_PROGRESS_RATE"


#: The prior progress rate (see :class:`PriorProgressRate`).
PRIOR_PROGRESS_RATE = PriorProgressRate()

ProgressCurve = CurveFit | Callable[[np.ndarray], np.ndarray]


class PlanInputs(BaseModel):
    """Everything a plan was computed from (seconds, steps), for the record and the report."""

    model_config = ConfigDict(frozen=True)

    total_steps: int
    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    restart_seconds: float
    interference_seconds: float
    checkpoint_seconds: float
    max_overhead: float | None = None
    failures: Failures | None = None
    curve: str = "none"
    start_step: int = 0
    last_checkpoint_step: int = 0
    failure_origin_step: int = 0
    min_interval_steps: int = 1


class Plan(BaseModel):
    """A checkpoint plan: the steps, what they are expected to cost, and how they were chosen.

    ``expected`` holds the expected overhead of ``steps`` under the shared model of
    :mod:`coci.planning.objective`: ``wall_seconds`` (wall-clock), ``progress_seconds`` (progress-weighted),
    their parts, ``wall_fraction`` of the run, and for ``auto`` the ``time_optimal_wall_seconds``
    and ``budget_wall_seconds`` the budget was measured against. ``mu`` is the mixture weight of
    ``auto`` (0: pure progress; None: pure time). ``details`` holds policy figures (intervals,
    COCI's thetas and P_e); ``notes`` what a reader should know that is not a fallback.
    """

    model_config = ConfigDict(frozen=True)

    policy: str
    objective: str
    time_budget: float | None
    inputs: PlanInputs
    fit: CurveFit | None = None
    steps: list[int]
    expected: dict[str, float] = Field(default_factory=dict)
    fallbacks: list[str] = Field(default_factory=list)
    mu: float | None = None
    details: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(steps, steps[1:])) or (steps and steps[0] < 1):
            raise ValueError("steps must be strictly increasing positive integers")
        return steps

    @property
    def intervals(self) -> list[int]:
        """Steps between consecutive checkpoints (the first counted from the plan's start)."""
        previous = [self.inputs.start_step, *self.steps[:-1]]
        return [b - a for a, b in zip(previous, self.steps)]

    def to_frame(self) -> pd.DataFrame:
        """One row per planned checkpoint: step, interval (steps and seconds), progress time."""
        steps = np.asarray(self.steps, dtype=np.int64)
        intervals = np.asarray(self.intervals, dtype=np.int64)
        t = self.inputs.step_seconds
        return pd.DataFrame(
            {
                "step": steps,
                "interval_steps": intervals,
                "interval_seconds": intervals * t,
                "progress_seconds": steps * t,
            }
        )


# --- validation --------------------------------------------------------------------------------


def _choice(value: Any, valid: tuple[str, ...], field: str) -> str:
    if not isinstance(value, str) or value not in valid:
        raise ConfigError(f"{field} must be one of {', '.join(repr(v) for v in valid)}; got {value!r}")
    return value


def _seconds(value: Any, field: str, *, positive: bool) -> float:
    return parse_duration(value, field=field, positive=positive)


def _fraction(value: Any, field: str, *, allow_none: bool, positive: bool) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ConfigError(f"{field} must be a number{' or None' if allow_none else ''}, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ConfigError(f"{field} must be {'positive' if positive else 'non-negative'} and finite, got {value!r}")
    return number


def _steps_count(value: Any, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _failure_model(failures: Any, required: bool, policy: str) -> Failures | None:
    if failures is None:
        if required:
            raise ConfigError(f"failures is required for policy {policy!r} (e.g. coci.Failures.exponential('8h'))")
        return None
    if isinstance(failures, Failures):
        return failures
    if isinstance(failures, (str, int, float)) and not isinstance(failures, bool):
        try:
            return Failures.exponential(mtbf=failures)
        except ConfigError as exc:  # name the argument the user actually passed
            raise ConfigError(str(exc).replace("mtbf", "failures", 1)) from None
    raise ConfigError(f"failures must be a coci.Failures or an MTBF such as '8h', got {failures!r}")


# --- the curve ---------------------------------------------------------------------------------


def _is_pair(curve: Any) -> bool:
    return (
        isinstance(curve, tuple)
        and len(curve) == 2
        and all(np.ndim(part) == 1 and np.size(part) > 2 for part in curve)
    )


def _resolve_curve(
    curve: Any,
) -> tuple[CurveFit | None, Callable[[np.ndarray], np.ndarray] | None, tuple[np.ndarray, np.ndarray] | None, str, list[str]]:
    """``(fit, progress_rate, raw (steps, losses), description, fallbacks)`` for a ``curve`` input."""
    if curve is None:
        return None, None, None, "none", []
    if isinstance(curve, CurveFit):
        fit, raw, description = curve, None, f"CurveFit ({curve.family})"
    elif callable(curve):
        return None, curve, None, str(getattr(curve, "description", "progress-rate callable")), []
    else:
        if _is_pair(curve):
            steps = np.asarray(curve[0], dtype=float)
            losses = np.asarray(curve[1], dtype=float)
        else:
            losses = np.asarray(curve, dtype=float) if not isinstance(curve, str) else None
            if losses is None or losses.ndim != 1:
                raise ConfigError("curve must be per-step losses, (steps, losses), a CurveFit or a progress-rate callable")
            steps = np.arange(1, losses.size + 1, dtype=float)
        fit = fit_curve(steps, losses)
        raw, description = (steps, losses), f"{losses.size} losses"
    fallbacks: list[str] = []
    if fit.dropped_points:
        fallbacks.append(f"curve: dropped {fit.dropped_points} NaN/inf losses")
    if not fit.usable:
        fallbacks.append(f"curve unusable ({fit.fallback}): planned for the time objective")
        return _clean_fit(fit), None, raw, description, fallbacks
    return _clean_fit(fit), fit.progress_rate, raw, description, fallbacks


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


# --- plan --------------------------------------------------------------------------------------


def plan(
    policy: str = "auto",
    *,
    failures: Failures | str | float | None,
    total_steps: int,
    step_seconds: float,
    stall_seconds: float,
    persist_seconds: float,
    restart_seconds: float = 0.0,
    interference_seconds: float = 0.0,
    curve: Any = None,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    max_overhead: float | None = None,
    start_step: int = 0,
    last_checkpoint_step: int = 0,
    failure_origin_step: int = 0,
) -> Plan:
    """Plan checkpoint steps for a run of ``total_steps`` steps (see DESIGN, "The math").

    Args:
        policy: ``"auto"`` (default), ``"young"``, ``"daly"``, ``"checkfreq"`` or ``"coci"``.
        failures: a :class:`coci.Failures`, or an MTBF (``"8h"`` or seconds) for an exponential
            model. Optional only for ``checkfreq`` (which ignores it; expected costs are then
            not computed).
        total_steps: the horizon in steps (>= 1).
        step_seconds, stall_seconds, persist_seconds: clean step time, snapshot stall and background
            persist time (seconds, positive; durations such as ``"6s"`` are accepted).
        restart_seconds: cost of a restart (restore + relaunch), >= 0.
        interference_seconds: extra training time one background persist costs, >= 0; the
            checkpoint cost is ``C = stall + interference``.
        curve: per-step losses, ``(steps, losses)``, a :class:`coci.planning.fit.CurveFit`, or a callable
            ``v(steps)`` giving the progress rate directly. Needed by ``auto``'s progress
            objective and by ``coci``.
        objective: ``"progress"`` (default) or ``"time"`` (``auto`` only).
        time_budget: ``auto``: allowed extra expected wall-clock overhead over the time-optimal
            plan (0.05 = 5%); None = pure progress optimum.
        max_overhead: cap on checkpoint cost as a share of run time (every policy; CheckFreq's
            growth threshold, 5% when None).
        start_step, last_checkpoint_step, failure_origin_step: for re-planning mid-run: plan steps
            after ``start_step``; failures before the first new commit roll back to
            ``last_checkpoint_step``; the failure clock (re)started at ``failure_origin_step``.
    """
    policy = _choice(policy, POLICIES, "policy")
    objective = _choice(objective, OBJECTIVES, "objective")
    time_budget = _fraction(time_budget, "time_budget", allow_none=True, positive=False)
    max_overhead = _fraction(max_overhead, "max_overhead", allow_none=True, positive=True)
    total_steps = _steps_count(total_steps, "total_steps", 1)
    start_step = _steps_count(start_step, "start_step", 0)
    last_checkpoint_step = _steps_count(last_checkpoint_step, "last_checkpoint_step", 0)
    failure_origin_step = _steps_count(failure_origin_step, "failure_origin_step", 0)
    if start_step >= total_steps:
        raise ConfigError(f"start_step must be below total_steps ({total_steps}), got {start_step}")
    step = _seconds(step_seconds, "step_seconds", positive=True)
    stall = _seconds(stall_seconds, "stall_seconds", positive=True)
    persist = _seconds(persist_seconds, "persist_seconds", positive=True)
    restart = _seconds(restart_seconds, "restart_seconds", positive=False)
    interference = _seconds(interference_seconds, "interference_seconds", positive=False)
    model_failures = _failure_model(failures, policy != "checkfreq", policy)
    cost = stall + interference
    min_steps = min_interval_steps(step, persist, cost, max_overhead)

    fit, rate, raw, description, fallbacks = _resolve_curve(curve)
    if fit is not None and rate is not None:
        rate = _observed_past_rate(fit, rate)
    notes: list[str] = []
    details: dict[str, float] = {"min_interval_steps": float(min_steps)}

    model: CostModel | None = None
    mean_rate, weight_origin = _mean_rate(fit, rate, total_steps, fallbacks) if rate is not None else (None, 0.0)
    if mean_rate is None:
        rate = None
    else:
        details.update(mean_progress_rate=mean_rate, weight_origin_step=weight_origin)
    if model_failures is not None:
        horizon = total_steps * step
        origin = failure_origin_step * step
        hazard = expected_failures(model_failures, horizon - origin, origin)
        if not model_failures.is_memoryless:
            fallbacks.append(
                "failures restart at each (re)start: planned with the expected (renewal) hazard; "
                "young/daly/coci use the long-run rate 1/MTBF"
            )
        model = _cost_model(
            total_steps, step, cost, persist, restart, hazard, rate, start_step, last_checkpoint_step, fallbacks,
            mean_rate,
        )

    inputs = PlanInputs(
        total_steps=total_steps,
        step_seconds=step,
        stall_seconds=stall,
        persist_seconds=persist,
        restart_seconds=restart,
        interference_seconds=interference,
        checkpoint_seconds=cost,
        max_overhead=max_overhead,
        failures=model_failures,
        curve=description,
        start_step=start_step,
        last_checkpoint_step=min(last_checkpoint_step, start_step),
        failure_origin_step=failure_origin_step,
        min_interval_steps=min_steps,
    )
    mu: float | None = None
    effective_objective = objective
    expected_extra: dict[str, float] = {}

    if policy in ("young", "daly"):
        assert model_failures is not None
        if policy == "young":
            seconds = young_interval_seconds(cost, model_failures.rate)
        else:
            seconds = daly_interval_seconds(cost, model_failures.mean_seconds)
        interval = max(int(round(seconds / step)), 1)
        details.update(interval_seconds=seconds, interval_steps_formula=float(interval))
        if interval < min_steps:
            notes.append(f"{policy} interval raised from {interval} to {min_steps} steps (persist / max_overhead)")
            interval = min_steps
        details["interval_steps"] = float(interval)
        steps = periodic_steps(interval, start_step, total_steps, anchor=min(start_step, last_checkpoint_step))
        effective_objective = "time"
    elif policy == "checkfreq":
        threshold = knobs.CHECKFREQ_MAX_OVERHEAD if max_overhead is None else max_overhead
        first = checkfreq_interval(stall, persist, step)
        steps, final = checkfreq_steps(
            first, checkpoint_seconds=cost, step_seconds=step, max_overhead=threshold,
            start_step=start_step, total_steps=total_steps, anchor=max(start_step, last_checkpoint_step),
        )
        details.update(interval_steps=float(first), final_interval_steps=float(final), max_overhead=threshold)
        effective_objective = "time"
    elif policy == "coci":
        assert model is not None and model_failures is not None
        steps, coci_details, coci_fallbacks = _coci_plan(fit, raw, model, model_failures, min_steps)
        details.update(coci_details)
        fallbacks.extend(coci_fallbacks)
        effective_objective = "progress" if "theta1_per_minute" in coci_details else "time"
    else:  # auto
        assert model is not None
        if objective == "progress" and not model.has_progress:
            if curve is None:
                fallbacks.append("no curve given: planned for the time objective")
            effective_objective = "time"
        max_steps = max_interval_steps(model, min_steps)
        details["max_interval_steps"] = float(max_steps)
        whole_alpha = None
        if effective_objective == "progress" and time_budget is not None and model.has_progress:
            assert model_failures is not None and rate is not None
            whole_alpha = _whole_run_alpha(
                model, model_failures, rate, mean_rate, weight_origin, time_budget, min_steps, fit
            )
        if whole_alpha is not None:
            details["whole_run_alpha"] = whole_alpha
            notes.append(
                "re-plan: the time budget applies to the whole run; its mixture weight "
                f"(alpha {whole_alpha:.3g}) was chosen there and the remaining steps planned with it"
            )
        result = auto_steps(
            model, objective=effective_objective, time_budget=time_budget, min_steps=min_steps,
            max_steps=max_steps, alpha=whole_alpha,
        )
        steps = result.steps
        mu = result.mu if effective_objective == "progress" else None
        expected_extra["time_optimal_wall_seconds"] = result.time_optimal_wall_seconds
        if result.budget_wall_seconds is not None:
            expected_extra["budget_wall_seconds"] = result.budget_wall_seconds

    expected: dict[str, float] = {}
    if model is not None:
        expected = model.expected(steps).as_dict()
        expected.update(expected_extra)
    else:
        expected = {"checkpoints": float(len(steps)), "checkpoint_seconds": len(steps) * cost}
        notes.append("no failure model: only checkpoint costs are expected")
    return Plan(
        policy=policy,
        objective=effective_objective,
        time_budget=time_budget,
        inputs=inputs,
        fit=fit,
        steps=[int(s) for s in steps],
        expected=expected,
        fallbacks=fallbacks,
        mu=mu,
        details=details,
        notes=notes,
    )


def _cost_model(
    total_steps: int,
    step: float,
    cost: float,
    persist: float,
    restart: float,
    hazard: ExpectedFailures,
    rate: Callable[[np.ndarray], np.ndarray] | None,
    start_step: int,
    last_checkpoint_step: int,
    fallbacks: list[str],
    mean_rate: float | None = None,
) -> CostModel:
    common = dict(
        total_steps=total_steps, step_seconds=step, checkpoint_seconds=cost, persist_seconds=persist,
        restart_seconds=restart, failures=hazard, start_step=start_step,
        last_checkpoint_step=last_checkpoint_step,
    )
    if rate is not None:
        try:
            return build_cost_model(progress_rate=rate, mean_rate=mean_rate, **common)
        except ConfigError as exc:
            fallbacks.append(f"{exc}: planned for the time objective")
    return build_cost_model(progress_rate=None, **common)


def _observed_past_rate(
    fit: CurveFit, rate: Callable[[np.ndarray], np.ndarray]
) -> Callable[[np.ndarray], np.ndarray]:
    """The fit's progress rate from its window on (before the first observed step: the rate there,
    not a law extrapolated towards a singularity); before the window (a recent-window fit after
    drift) the observed average ``(first_loss - L(window_start)) / (window_start - first_step)``
    instead of the law extrapolated backwards. Its integral over the run is the observed first loss
    minus the fitted loss at the horizon, the drop :func:`_mean_rate` normalises by."""
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


def _loss_floor(fit: CurveFit) -> float | None:
    """0 when the loss is positive where it was observed (cross-entropy, MSE, any norm): a law
    extrapolated below 0 (a short, noisy trace fitted with a negative asymptote) would put most of
    the run's progress in the future and flatten the weight; the planner's curve stops at 0 instead
    (``knobs.PLAN_NONNEGATIVE_LOSS``). None otherwise."""
    if not knobs.PLAN_NONNEGATIVE_LOSS or fit.first_loss is None or fit.last_step is None:
        return None
    observed = fit.loss(np.array([float(fit.last_step)]))[0]
    return 0.0 if fit.first_loss > 0 and observed > 0 else None


def _mean_rate(
    fit: CurveFit | None, rate: Callable[[np.ndarray], np.ndarray], total_steps: int, fallbacks: list[str]
) -> tuple[float | None, float]:
    """The whole run's mean progress rate ``v_bar`` and the step it is measured from.

    The mean is that of the planner's own curve (so ``w`` averages 1 over the run under it): for a
    fit that recorded its first observed point, ``(L(first) - L(H)) / (H - first step)`` with
    ``L(first)`` the observed first loss when the fit is a recent window (the rate before the window
    is the observed average, :func:`_observed_past_rate`) and the fitted one otherwise; another fit:
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


def _whole_run_alpha(
    model: CostModel,
    failures: Failures,
    rate: Callable[[np.ndarray], np.ndarray],
    mean_rate: float | None,
    weight_origin: float,
    time_budget: float,
    min_steps: int,
    fit: CurveFit | None,
) -> float | None:
    """For a re-plan (``start_step > 0``): the mixture weight ``alpha`` that ``auto`` picks for the
    whole run, i.e. the span from the curve's first step (or its fit window's start, where the law
    holds) to the horizon, planned fresh under the same costs and curve.

    The budget is a property of the run: measuring it against the time optimum of the *remaining*
    steps would grant each re-plan a fresh budget and let the plan spend it again and again at its
    front. With a fixed Lagrange weight the remaining plan is the tail of the whole run's optimum
    (principle of optimality), so re-planning keeps the run's trade-off. None when the plan starts
    at the whole span's start (the ordinary bisection applies).
    """
    start = max(weight_origin, fit.window_start if fit is not None and fit.window_start else 0.0)
    start = int(math.ceil(start))
    if start >= model.start_step or start >= model.total_steps - 1:
        return None
    whole = build_cost_model(
        total_steps=model.total_steps, step_seconds=model.step_seconds,
        checkpoint_seconds=model.checkpoint_seconds, persist_seconds=model.persist_seconds,
        restart_seconds=model.restart_seconds,
        failures=expected_failures(failures, model.horizon_seconds - start * model.step_seconds, start * model.step_seconds),
        progress_rate=rate, start_step=start, mean_rate=mean_rate,
    )
    result = auto_steps(
        whole, objective="progress", time_budget=time_budget, min_steps=min_steps,
        max_steps=max_interval_steps(whole, min_steps),
    )
    return float(result.alpha)


def _coci_thetas(
    fit: CurveFit | None, raw: tuple[np.ndarray, np.ndarray] | None, step: float, total_steps: int
) -> tuple[float, float] | None:
    """COCI's (theta1 per minute, theta2) from raw losses against minutes, as the authors fit."""
    if raw is not None and (fit is None or fit.usable):
        steps, losses = raw
        finite = np.isfinite(steps) & np.isfinite(losses) & (losses > 0)
        if np.count_nonzero(finite) >= 2:
            return fit_coci_exponential(steps[finite] * step / 60.0, losses[finite])
    if fit is not None and fit.usable:
        if fit.family == "coci_exp":
            return fit.params["theta1"] * 60.0 / step, fit.params["theta2"]
        start = fit.window_start or 1.0
        end = fit.last_step if fit.last_step and fit.last_step > start else float(total_steps)
        grid = np.linspace(start, end, 200)
        losses = fit.loss(grid)
        if np.all(np.isfinite(losses)) and np.all(losses > 0):
            return fit_coci_exponential(grid * step / 60.0, losses)
    return None


def _coci_plan(
    fit: CurveFit | None, raw: tuple[np.ndarray, np.ndarray] | None, model: CostModel,
    failures: Failures, min_steps: int,
) -> tuple[np.ndarray, dict[str, float], list[str]]:
    step = model.step_seconds
    thetas = _coci_thetas(fit, raw, step, model.total_steps)
    if thetas is None or not thetas[0] < 0:
        reason = "no usable falling curve" if thetas is None else f"fitted theta1 {thetas[0]:.3g} >= 0"
        result = auto_steps(model, objective="time", min_steps=min_steps)
        return result.steps, {}, [f"coci needs a falling loss curve ({reason}): used the time-optimal plan"]
    theta1, theta2 = thetas
    pe = coci_expected_progress(theta1, model.checkpoint_seconds / 60.0, failures.rate * 60.0)
    minutes, repeated = coci_minutes(
        theta1, theta2, pe, now_minutes=model.start_step * step / 60.0,
        end_minutes=model.total_steps * step / 60.0,
    )
    fallbacks = []
    if repeated:
        fallbacks.append("coci: the fitted loss cannot fall by another P_e before the horizon; last interval repeated")
    steps = snap_to_steps(minutes * 60.0, model, min_steps)
    details = {"theta1_per_minute": theta1, "theta2": theta2, "pe": pe}
    return steps, details, fallbacks


# --- the session's planning policy ---------------------------------------------------------------


def make_policy(
    policy: str,
    *,
    failures: Failures | str | float | None,
    total_steps: int | None,
    restart_seconds: float | None = None,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    max_overhead: float | None = None,
) -> PlanningPolicy:
    """The :class:`coci.planning.policy.CheckpointPolicy` the session uses for a policy name."""
    return PlanningPolicy(
        policy,
        failures=failures,
        total_steps=total_steps,
        restart_seconds=restart_seconds,
        objective=objective,
        time_budget=time_budget,
        max_overhead=max_overhead,
    )


class PlanningPolicy:
    """Plans online from the live profile (see :func:`make_policy`).

    Before its first plan (warm-up) only ``auto`` with the progress objective checkpoints, at
    ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS`` (:attr:`warming_up`: the session skips one that would wait
    for a persist in flight); the other policies wait. Each ``observe`` reads the
    profile (step time, stall, persist, interference, restore) and the loss trace; it re-plans
    from the current step when there is no plan yet, when a cost moved by more than
    ``knobs.PLAN_REPLAN_COST_CHANGE``, when the fitted progress weight moved by more than
    ``knobs.PLAN_REPLAN_FIT_CHANGE`` (the relative change of the planned checkpoint density
    ``sqrt(w_alpha)`` on the remaining steps, old fit against new; or the fit's family changed), when an open-ended horizon
    needs extending, or (``checkfreq``) when its interval grew. :meth:`should_checkpoint` is a set
    lookup. ``state_dict`` keeps CheckFreq's grown interval and the current plan.

    The failure clock of a restarting hazard is taken to have (re)started
    ``knobs.PLAN_WARMUP_STEPS`` steps before this object's first observation (an approximation:
    the policy does not see the restore itself).
    """

    def __init__(
        self,
        policy: str,
        *,
        failures: Failures | str | float | None,
        total_steps: int | None,
        restart_seconds: float | None = None,
        objective: str = "progress",
        time_budget: float | None = 0.05,
        max_overhead: float | None = None,
    ) -> None:
        self.policy = _choice(policy, POLICIES, "policy")
        self.objective = _choice(objective, OBJECTIVES, "objective")
        self.time_budget = _fraction(time_budget, "time_budget", allow_none=True, positive=False)
        self.max_overhead = _fraction(max_overhead, "max_overhead", allow_none=True, positive=True)
        self.total_steps = None if total_steps is None else _steps_count(total_steps, "total_steps", 1)
        self.restart_seconds = None if restart_seconds is None else _seconds(restart_seconds, "restart_seconds", positive=False)
        self.failures = _failure_model(failures, self.policy != "checkfreq", self.policy)
        self.plan: Plan | None = None
        self._steps: frozenset[int] = self._warmup_steps()
        self._basis: tuple[float, float, float] | None = None
        self._fit: ProgressCurve | None = None
        self._fit_family: str | None = None
        self._origin: int | None = None
        self._horizon: int | None = None
        self._checkfreq_k: int | None = None
        self._checkfreq_seen = 0
        self.replans = 0

    # -- CheckpointPolicy ----------------------------------------------------------------------

    def should_checkpoint(self, step: int) -> bool:
        return step in self._steps

    @property
    def warming_up(self) -> bool:
        """True before the first plan: a due checkpoint is then a warm-up one
        (``knobs.PLAN_WARMUP_CHECKPOINT_STEPS``), which the session skips rather than wait for a
        persist still in flight (costs are not known yet, so the gap may be shorter than a persist)."""
        return self.plan is None

    def observe(self, observation: Observation) -> None:
        profile = observation.profile
        step_seconds = profile.step_seconds.value
        if step_seconds is None or not step_seconds > 0 or not math.isfinite(step_seconds):
            return
        now = int(observation.step)
        if self._origin is None:
            self._origin = max(0, now - knobs.PLAN_WARMUP_STEPS)
        horizon = self._horizon_for(now)
        if horizon is None:
            return
        fallbacks: list[str] = []
        stall, persist, interference, restart = self._costs(profile, step_seconds, fallbacks)
        cost = stall + interference
        basis = (step_seconds, cost, persist)
        last_checkpoint = max((s for s in observation.checkpoint_steps if s <= now), default=0)

        grew = self._checkfreq_grow(observation, cost, step_seconds)
        curve = self._curve(observation, fallbacks)
        reasons = self._moved(basis, curve, now, horizon, grew)
        if not reasons:
            return
        try:
            new_plan = plan(
                self.policy,
                failures=self.failures,
                total_steps=horizon,
                step_seconds=step_seconds,
                stall_seconds=stall,
                persist_seconds=persist,
                restart_seconds=restart,
                interference_seconds=interference,
                curve=curve,
                objective=self.objective,
                time_budget=self.time_budget,
                max_overhead=self.max_overhead,
                start_step=now,
                last_checkpoint_step=last_checkpoint,
                failure_origin_step=min(self._origin, now),
            )
        except ConfigError as exc:  # a measured figure out of range: keep the current plan
            logger.warning("re-planning at step %d failed, keeping the current plan: %s", now, exc)
            return
        if self.policy == "checkfreq":
            new_plan = self._checkfreq_plan(new_plan, now, horizon, last_checkpoint, cost, step_seconds)
        if fallbacks or self.total_steps is None:
            extra = list(fallbacks)
            if self.total_steps is None:
                extra.append(f"total_steps unknown: planned over a horizon of {horizon} steps")
            new_plan = new_plan.model_copy(update={"fallbacks": [*new_plan.fallbacks, *extra]})
        self._install(new_plan, basis, curve, now, horizon)
        logger.info("planned at step %d (%s): %d checkpoints", now, ", ".join(reasons), len(new_plan.steps))

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "checkfreq_k": self._checkfreq_k,
            "checkfreq_seen": self._checkfreq_seen,
            "horizon": self._horizon,
            "plan": None if self.plan is None else self.plan.model_dump_json(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != self.policy:
            logger.warning("policy state for %r ignored by policy %r", state.get("policy"), self.policy)
            return
        self._checkfreq_k = state.get("checkfreq_k")
        self._checkfreq_seen = int(state.get("checkfreq_seen") or 0)
        self._horizon = state.get("horizon")
        raw = state.get("plan")
        if raw:
            self.plan = Plan.model_validate_json(raw)
            self._steps = frozenset(self.plan.steps)
        self._basis = None  # re-plan at the first observation of the resumed run

    # -- internals -----------------------------------------------------------------------------

    @property
    def _weights_progress(self) -> bool:
        return self.policy == "auto" and self.objective == "progress"

    def _warmup_steps(self) -> frozenset[int]:
        """Checkpoints before the first plan (see ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS``)."""
        if not self._weights_progress:
            return frozenset()
        end = self.total_steps if self.total_steps is not None else math.inf
        return frozenset(int(s) for s in knobs.PLAN_WARMUP_CHECKPOINT_STEPS if 1 <= s < end)

    def _horizon_for(self, now: int) -> int | None:
        if self.total_steps is not None:
            return self.total_steps if now < self.total_steps else None
        horizon = self._horizon or knobs.PLAN_DEFAULT_HORIZON_STEPS
        if now >= knobs.PLAN_HORIZON_EXTEND_AT * horizon:
            horizon = max(2 * horizon, 2 * now)
        return max(horizon, now + 1)

    def _costs(self, profile: Any, step_seconds: float, fallbacks: list[str]) -> tuple[float, float, float, float]:
        floor = knobs.PLAN_MIN_COST_SECONDS
        stall = profile.stall_seconds.value
        if stall is None:
            stall = knobs.PLAN_ASSUMED_STALL_STEPS * step_seconds
            fallbacks.append(f"stall not measured yet: assumed {stall:.3g} s")
        persist = profile.persist_seconds.value
        if persist is None:
            persist = knobs.PLAN_ASSUMED_PERSIST_STEPS * step_seconds
            fallbacks.append(f"persist not measured yet: assumed {persist:.3g} s")
        interference = float(getattr(profile, "interference_seconds", 0.0) or 0.0)
        restart = self.restart_seconds
        if restart is None:
            restart = profile.restore_seconds.value
            if restart is None:
                restart = 0.0
                fallbacks.append("restart_seconds unknown: assumed 0 (changes expected costs, not the plan)")
        return max(float(stall), floor), max(float(persist), floor), max(interference, 0.0), max(float(restart), 0.0)

    def _curve(self, observation: Observation, fallbacks: list[str]) -> ProgressCurve | None:
        """The fit of the loss trace so far, or (``auto``) the prior while the trace is too short.

        A trace with fewer than ``knobs.FIT_MIN_POINTS`` points (but at least one) gets
        :data:`PRIOR_PROGRESS_RATE` for ``auto``; a longer one its fit, which ``plan`` turns into the
        time-optimal plan when the fitter finds it unusable (flat, rising). Even a fit of the first
        few dozen steps is used: measured on GPT-2 and synthetic curves, waiting for the trace to
        cover 1% of the horizon lost more (the steepest, most valuable stretch passes meanwhile)
        than the extrapolation error cost."""
        needs = self.policy == "coci" or self._weights_progress
        points = int(np.count_nonzero(np.isfinite(np.asarray(observation.losses, dtype=float))))
        if not needs or points == 0:
            return None
        if self._weights_progress and knobs.PLAN_PRIOR_ENABLED and points < knobs.FIT_MIN_POINTS:
            fallbacks.append(
                f"loss trace has {points} point(s), fewer than {knobs.FIT_MIN_POINTS} to fit: planned with "
                f"the prior progress rate {PRIOR_PROGRESS_RATE.description}"
            )
            return PRIOR_PROGRESS_RATE
        if points < 2:
            return None
        return fit_curve(np.asarray(observation.loss_steps, dtype=float), np.asarray(observation.losses, dtype=float))

    @staticmethod
    def _family(curve: ProgressCurve | None) -> str | None:
        if curve is None:
            return None
        return curve.family if isinstance(curve, CurveFit) else "prior"

    @staticmethod
    def _probe(curve: ProgressCurve | None, now: int, horizon: int) -> np.ndarray | None:
        """The curve's progress weight (whole-run normalisation, as planned) at 17 remaining steps."""
        if curve is None or (isinstance(curve, CurveFit) and not curve.usable):
            return None
        fit = curve if isinstance(curve, CurveFit) else None
        rate = curve.progress_rate if isinstance(curve, CurveFit) else curve
        rates = rate(np.linspace(now, horizon, 17))
        mean, _ = _mean_rate(fit, rate, horizon, [])
        if mean is None or not np.all(np.isfinite(rates)):
            return None
        return rates / mean

    def _moved(
        self, basis: tuple[float, float, float], fit: ProgressCurve | None, now: int, horizon: int, grew: bool
    ) -> list[str]:
        if self.plan is None or self._basis is None:
            return ["first plan"]
        reasons = []
        if horizon != self._horizon:
            reasons.append(f"horizon {horizon}")
        if grew:
            reasons.append(f"checkfreq interval grew to {self._checkfreq_k}")
        if self.policy != "checkfreq":
            for name, new, old in zip(("step time", "checkpoint cost", "persist"), basis, self._basis):
                if abs(new - old) > knobs.PLAN_REPLAN_COST_CHANGE * max(abs(old), 1e-12):
                    reasons.append(f"{name} {old:.3g} -> {new:.3g} s")
            family = self._family(fit)
            if family != self._fit_family:
                reasons.append(f"fit {self._fit_family} -> {family}")
            else:
                probe = self._probe(fit, now, horizon)
                old = self._probe(self._fit, now, horizon)  # the planned fit, on the same steps
                if (probe is None) != (old is None):
                    reasons.append("fit usability changed")
                elif probe is not None and old is not None:
                    # what the plan responds to: the density sqrt(w_alpha) of the planned mixture
                    mu = None if self.plan is None else self.plan.mu
                    alpha = 1.0 if mu is None else 1.0 / (1.0 + mu)
                    new_density = np.sqrt(alpha * probe + 1.0 - alpha)
                    old_density = np.sqrt(alpha * old + 1.0 - alpha)
                    change = float(np.max(np.abs(new_density - old_density) / np.maximum(old_density, 1e-12)))
                    if change > knobs.PLAN_REPLAN_FIT_CHANGE:
                        reasons.append(f"progress weight moved by {change:.0%}")
        return reasons

    def _install(
        self, new_plan: Plan, basis: tuple[float, float, float], fit: ProgressCurve | None, now: int, horizon: int
    ) -> None:
        self.plan = new_plan
        self._steps = frozenset(new_plan.steps)
        self._basis = basis
        self._fit_family = self._family(fit)
        self._fit = fit
        self._horizon = horizon
        self.replans += 1

    def _checkfreq_grow(self, observation: Observation, cost: float, step_seconds: float) -> bool:
        """CheckFreq's online rule: after each new checkpoint, k += 2 if C / (k t) > max_overhead."""
        if self.policy != "checkfreq" or self._checkfreq_k is None:
            return False
        threshold = knobs.CHECKFREQ_MAX_OVERHEAD if self.max_overhead is None else self.max_overhead
        grew = False
        for step in sorted(observation.checkpoint_steps):
            if step <= self._checkfreq_seen:
                continue
            self._checkfreq_seen = step
            if cost / (self._checkfreq_k * step_seconds) > threshold:
                self._checkfreq_k += 2
                grew = True
        return grew

    def _checkfreq_plan(
        self, offline: Plan, now: int, horizon: int, last_checkpoint: int, cost: float, step_seconds: float
    ) -> Plan:
        """Online CheckFreq: a fixed k (set once, grown by measurement), from the last checkpoint."""
        if self._checkfreq_k is None:
            self._checkfreq_k = int(offline.details.get("interval_steps", 1))
        steps = periodic_steps(self._checkfreq_k, now, horizon, anchor=last_checkpoint)
        details = {**offline.details, "interval_steps": float(self._checkfreq_k)}
        details.pop("final_interval_steps", None)
        if self.failures is not None:
            expected = _rescore(offline, steps, self.failures)
        else:
            expected = {"checkpoints": float(steps.size), "checkpoint_seconds": steps.size * cost}
        return offline.model_copy(update={"steps": [int(s) for s in steps], "details": details, "expected": expected})


def _rescore(reference: Plan, steps: np.ndarray, failures: Failures) -> dict[str, float]:
    """Expected costs of ``steps`` under the inputs of ``reference`` (time metric)."""
    inputs = reference.inputs
    origin = inputs.failure_origin_step * inputs.step_seconds
    hazard = expected_failures(failures, (inputs.total_steps - inputs.failure_origin_step) * inputs.step_seconds, origin)
    model = build_cost_model(
        total_steps=inputs.total_steps, step_seconds=inputs.step_seconds,
        checkpoint_seconds=inputs.checkpoint_seconds, persist_seconds=inputs.persist_seconds,
        restart_seconds=inputs.restart_seconds, failures=hazard, start_step=inputs.start_step,
        last_checkpoint_step=inputs.last_checkpoint_step,
    )
    return model.expected(steps).as_dict()

