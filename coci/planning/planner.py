"""Plans: from measured costs, a failure model and a loss curve to checkpoint steps.

:func:`plan` is the offline entry point (and what the CLI and the session call): a pure function
that validates the inputs, fits the curve, builds the one cost model of
:mod:`coci.planning.objective`, runs the chosen policy (one small function per policy name in
:data:`POLICY_PLANNERS`, built on :mod:`coci.planning.formulas`) and returns a :class:`Plan` with the
steps, the expected costs under both metrics and every fallback taken. :func:`make_policy` wraps it
for :class:`coci.Session`: a :class:`PlanningPolicy` that plans after warm-up from the live profile
and re-plans only when the measured costs or the fit move by more than a threshold.

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
* the time budget belongs to the run: the whole run's expected wall-clock overhead (from step 0,
  the checkpoints already taken, ``taken_steps``, followed by the new plan; warm-up checkpoints and
  earlier plans' included) must stay within ``1 + time_budget`` times the whole run's time
  optimum, under the current costs and curve; ``auto`` plans the remaining steps with the largest
  progress weight ``alpha`` that keeps it there, instead of granting each re-plan a fresh 5% of the
  remaining time optimum (planning time itself is capped apart, ``knobs.PLANNING_TIME_FRACTION``);
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
* a loss observed positive never falls below 0 in the planner's curve: early, noisy fits often
  extrapolate to a negative asymptote, which would put most of the run's progress in the future
  and flatten the weight.

Open-ended runs (``total_steps=None`` in the session) are planned over
``max(knobs.PLAN_DEFAULT_HORIZON_STEPS, 2 * current step)`` steps and re-planned over a doubled
horizon once the run passes ``knobs.PLAN_HORIZON_EXTEND_AT`` of it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from coci import checks, knobs
from coci.errors import ConfigError
from coci.planning.config import OBJECTIVES, POLICIES, PlanConfig, changed_arguments
from coci.planning.empirical import EmpiricalCurve, empirical_curve
from coci.planning.failures import Failures
from coci.planning.fit import CurveFit, fit_coci_exponential, fit_curve
from coci.planning.formulas import (
    AutoResult,
    auto_steps,
    auto_steps_within_run_budget,
    check_plan_size,
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
from coci.planning.levels import auto_two_level, min_promote_steps
from coci.planning.objective import (
    CostModel,
    ExpectedFailures,
    TwoLevelCostModel,
    build_cost_model,
    expected_failures,
    whole_run_mean_rate,
)
from coci.planning.policy import Observation
from coci.planning.prior import CorrectedRate, PriorCurve, WarmStart, load_prior
from coci.units import parse_duration

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "OBJECTIVES",
    "POLICIES",
    "POLICY_PLANNERS",
    "PRIOR_PROGRESS_RATE",
    "CheckFreqAdaptation",
    "Plan",
    "PlanConfig",
    "PlanInputs",
    "PlanningPolicy",
    "fit_progress_weight",
    "make_policy",
    "plan",
]

logger = logging.getLogger(__name__)

RateFunction = Callable[[np.ndarray], np.ndarray]


class PriorProgressRate:
    """The planner's prior progress rate ``v(s) = 1 / max(s, 1)`` (``s`` from the run's first step).

    Scale-free diminishing returns: the loss falls by the same amount per doubling of the step
    count, so ``w(s) = v(s) / v_bar`` is about ``H / (s ln H)`` over a horizon of ``H`` steps (large
    at the start, below 1 after ``H / ln H``). :class:`PlanningPolicy` plans with it while the loss
    trace is too short to fit; :func:`plan` accepts it as ``curve`` like any progress-rate callable.
    """

    description = "prior v(s) = 1/max(s, 1)"

    def __call__(self, steps: np.ndarray) -> np.ndarray:
        return 1.0 / np.maximum(np.asarray(steps, dtype=float), 1.0)

    def __repr__(self) -> str:
        return "PRIOR_PROGRESS_RATE"


#: The prior progress rate (see :class:`PriorProgressRate`).
PRIOR_PROGRESS_RATE = PriorProgressRate()

ProgressCurve = CurveFit | RateFunction


class PlanInputs(BaseModel):
    """Everything a plan was computed from (seconds, steps), for the record and the report."""

    model_config = ConfigDict(frozen=True, defer_build=True)

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
    upload_seconds: float | None = None
    upload_interference_seconds: float | None = None
    remote_restart_seconds: float | None = None
    last_promoted_step: int | None = None

    @property
    def has_remote_tier(self) -> bool:
        """True when the plan was given a remote tier's costs (``upload_seconds``)."""
        return self.upload_seconds is not None

    def planned_failures(self) -> Failures | None:
        """The failures periodic checkpoints must cover: those without a warning that a
        checkpoint (stall + persist) fits in (:meth:`Failures.unwarned`)."""
        if self.failures is None:
            return None
        return self.failures.unwarned(self.stall_seconds + self.persist_seconds)

    def measured_costs(self) -> MeasuredCosts:
        """The measured costs as :func:`plan` keyword arguments (step, stall, persist, interference)."""
        return {
            "step_seconds": self.step_seconds,
            "stall_seconds": self.stall_seconds,
            "persist_seconds": self.persist_seconds,
            "interference_seconds": self.interference_seconds,
        }


class MeasuredCosts(TypedDict):
    """What a run measured, as :func:`plan` keyword arguments."""

    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    interference_seconds: float


class Plan(BaseModel):
    """A checkpoint plan: the steps, what they are expected to cost, and how they were chosen.

    ``expected`` holds the expected overhead of ``steps`` under the shared model of
    :mod:`coci.planning.objective`: ``wall_seconds`` (wall-clock), ``progress_seconds`` (progress-weighted),
    their parts, ``wall_fraction`` of the run, and for ``auto`` the ``time_optimal_wall_seconds``
    and ``budget_wall_seconds`` the budget was measured against. ``mu`` is the mixture weight of
    ``auto`` (0: pure progress; None: pure time). ``details`` holds policy figures (intervals,
    COCI's thetas and P_e); ``notes`` what a reader should know that is not a fallback.
    ``promote_steps`` is the subset of ``steps`` whose checkpoints are also promoted to the remote
    tier; None (a single-level plan) promotes every checkpoint when a remote tier is configured.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

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
    promote_steps: list[int] | None = None

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
        import pandas as pd  # here, not at import: ``import coci`` stays light

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


# --- the curve ---------------------------------------------------------------------------------


def _is_pair(curve: Any) -> bool:
    return (
        isinstance(curve, tuple)
        and len(curve) == 2
        and all(np.ndim(part) == 1 and np.size(part) > 2 for part in curve)
    )


def _resolve_curve(
    curve: Any,
) -> tuple[CurveFit | None, RateFunction | None, tuple[np.ndarray, np.ndarray] | None, str, list[str]]:
    """``(fit, progress_rate, raw (steps, losses), description, fallbacks)`` for a ``curve`` input."""
    if curve is None:
        return None, None, None, "none", []
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


# --- plan --------------------------------------------------------------------------------------


def plan(
    policy: str = "auto",
    *,
    config: PlanConfig | None = None,
    failures: Failures | str | float | None = None,
    total_steps: int | None = None,
    step_seconds: float | str,
    stall_seconds: float | str,
    persist_seconds: float | str,
    restart_seconds: float | str | None = 0.0,
    interference_seconds: float | str = 0.0,
    curve: Any = None,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    max_overhead: float | None = None,
    start_step: int = 0,
    last_checkpoint_step: int = 0,
    failure_origin_step: int = 0,
    taken_steps: Iterable[int] | None = None,
    upload_seconds: float | str | None = None,
    upload_interference_seconds: float | str | None = None,
    remote_restart_seconds: float | str | None = None,
    last_promoted_step: int | None = None,
) -> Plan:
    """Plan checkpoint steps for a run of ``total_steps`` steps.

    The planning choices come either as ``config`` (a :class:`PlanConfig`) or as the keywords
    ``policy``, ``failures``, ``total_steps``, ``restart_seconds``, ``objective``,
    ``time_budget`` and ``max_overhead`` (documented on :class:`PlanConfig`), not both.

    Args:
        step_seconds, stall_seconds, persist_seconds: clean step time, snapshot stall and background
            persist time (seconds, positive; durations such as ``"6s"`` are accepted).
        interference_seconds: extra training time one background persist costs, >= 0; the
            checkpoint cost is ``C = stall + interference``.
        curve: per-step losses, ``(steps, losses)``, a :class:`coci.planning.fit.CurveFit`, or a callable
            ``v(steps)`` giving the progress rate directly. Needed by ``auto``'s progress
            objective and by ``coci``.
        start_step, last_checkpoint_step, failure_origin_step: for re-planning mid-run: plan steps
            after ``start_step``; failures before the first new commit roll back to
            ``last_checkpoint_step``; the failure clock (re)started at ``failure_origin_step``.
        taken_steps: for re-planning mid-run: the checkpoints the run has already taken (default:
            ``last_checkpoint_step`` alone); ``auto`` charges them to the whole run's time budget.
        upload_seconds, upload_interference_seconds, remote_restart_seconds: a remote tier's costs:
            seconds from a local commit to the remote commit, the training time one upload costs
            (default 0) and the restart from the remote tier (default ``restart_seconds``). With
            ``upload_seconds`` and a failure class that destroys the local tier
            (:meth:`coci.Failures.compose`), ``auto`` plans two levels (``Plan.promote_steps``, see
            :mod:`coci.planning.levels`); None (the default) plans exactly as without a remote tier.
        last_promoted_step: for re-planning mid-run: the newest promoted checkpoint (default
            ``last_checkpoint_step``).
    """
    choices: dict[str, Any] = dict(
        policy=policy, failures=failures, total_steps=total_steps, restart_seconds=restart_seconds,
        objective=objective, time_budget=time_budget, max_overhead=max_overhead,
    )
    if config is None:
        config = PlanConfig(**choices)
    elif changed_arguments(plan, choices):
        raise ConfigError("pass either config= or the planning choices (policy, failures, total_steps, ...), not both")
    problem = _problem(
        config, curve,
        step_seconds=step_seconds, stall_seconds=stall_seconds, persist_seconds=persist_seconds,
        interference_seconds=interference_seconds, start_step=start_step,
        last_checkpoint_step=last_checkpoint_step, failure_origin_step=failure_origin_step,
        taken_steps=taken_steps,
        remote=_remote_costs(upload_seconds, upload_interference_seconds, remote_restart_seconds, last_promoted_step),
    )
    return _finish(problem, POLICY_PLANNERS[config.policy](problem))


@dataclass
class _Problem:
    """One validated planning problem: the choices, the recorded inputs, the curve, the cost model,
    and the fallbacks, notes and details gathered while planning."""

    config: PlanConfig
    inputs: PlanInputs
    last_checkpoint_step: int  # as given (``inputs`` records it clipped to ``start_step``)
    curve_given: bool
    fit: CurveFit | None
    rate: RateFunction | None
    raw: tuple[np.ndarray, np.ndarray] | None
    mean_rate: float | None
    weight_origin: float
    model: CostModel | None
    fallbacks: list[str]
    details: dict[str, float]
    notes: list[str] = field(default_factory=list)
    taken_steps: tuple[int, ...] = ()  # checkpoints already taken, at or before start_step
    two_level: TwoLevelCostModel | None = None  # with a remote tier and a class that destroys the local one

    @property
    def failures(self) -> Failures:
        """The failures the plan covers (every policy but ``checkfreq`` requires a model): the
        unwarned ones, see :meth:`PlanInputs.planned_failures`."""
        failures = self.inputs.planned_failures()
        assert failures is not None
        return failures

    @property
    def cost_model(self) -> CostModel:
        """The cost model (built whenever there is a failure model)."""
        assert self.model is not None
        return self.model


@dataclass(frozen=True)
class _Placement:
    """What a policy function chose: the steps, the objective they optimise, auto's mixture weight."""

    steps: np.ndarray
    objective: str
    mu: float | None = None
    expected: dict[str, float] = field(default_factory=dict)
    promote: np.ndarray | None = None  # the promoted subset of ``steps`` (None: single level)


def _remote_costs(upload: Any, interference: Any, restart: Any, last_promoted: Any) -> dict[str, Any]:
    """The remote tier's costs, validated (all None without a remote tier)."""
    if upload is None:
        if interference is not None or restart is not None:
            raise ConfigError("upload_seconds is required with upload_interference_seconds or remote_restart_seconds")
        return {}
    return {
        "upload_seconds": parse_duration(upload, field="upload_seconds", positive=True),
        "upload_interference_seconds": 0.0 if interference is None else parse_duration(
            interference, field="upload_interference_seconds", positive=False),
        "remote_restart_seconds": None if restart is None else parse_duration(
            restart, field="remote_restart_seconds", positive=False),
        "last_promoted_step": checks.optional_integer(last_promoted, "last_promoted_step", minimum=0),
    }


def _problem(
    config: PlanConfig,
    curve: Any,
    *,
    step_seconds: Any,
    stall_seconds: Any,
    persist_seconds: Any,
    interference_seconds: Any,
    start_step: Any,
    last_checkpoint_step: Any,
    failure_origin_step: Any,
    taken_steps: Iterable[int] | None = None,
    remote: dict[str, Any] | None = None,
) -> _Problem:
    """Validate the measurements, resolve the curve and build the cost model."""
    total_steps = checks.integer(config.total_steps, "total_steps", minimum=1)
    start = checks.integer(start_step, "start_step", minimum=0)
    last_checkpoint = checks.integer(last_checkpoint_step, "last_checkpoint_step", minimum=0)
    origin = checks.integer(failure_origin_step, "failure_origin_step", minimum=0)
    if start >= total_steps:
        raise ConfigError(f"start_step must be below total_steps ({total_steps}), got {start}")
    step = parse_duration(step_seconds, field="step_seconds", positive=True)
    stall = parse_duration(stall_seconds, field="stall_seconds", positive=True)
    persist = parse_duration(persist_seconds, field="persist_seconds", positive=True)
    interference = parse_duration(interference_seconds, field="interference_seconds", positive=False)
    cost = stall + interference
    remote = remote or {}
    min_steps = min_interval_steps(step, persist, cost, config.max_overhead)
    if remote:  # a single-level plan promotes every checkpoint: one upload in flight
        min_steps = min_promote_steps(step, remote["upload_seconds"], min_steps)

    fit, rate, raw, description, fallbacks = _resolve_curve(curve)
    details: dict[str, float] = {"min_interval_steps": float(min_steps)}
    notes: list[str] = []
    empirical = _empirical(raw, fit, total_steps, details, notes) if rate is not None else None
    if empirical is not None:
        rate, description = empirical, f"{description}, {empirical.description}"
    elif fit is not None and rate is not None:
        rate = _observed_past_rate(fit, rate)
    law = None if empirical is not None else fit
    mean_rate, weight_origin = _mean_rate(law, rate, total_steps, fallbacks) if rate is not None else (None, 0.0)
    if mean_rate is None:
        rate = None
    else:
        details.update(mean_progress_rate=mean_rate, weight_origin_step=weight_origin)
    inputs = PlanInputs(
        total_steps=total_steps, step_seconds=step, stall_seconds=stall, persist_seconds=persist,
        restart_seconds=0.0 if config.restart_seconds is None else config.restart_seconds,
        interference_seconds=interference, checkpoint_seconds=cost, max_overhead=config.max_overhead,
        failures=config.failures, curve=description, start_step=start,
        last_checkpoint_step=min(last_checkpoint, start), failure_origin_step=origin, min_interval_steps=min_steps,
        **remote,
    )
    model = _cost_model(inputs, last_checkpoint, rate, mean_rate, fallbacks)
    weighted = rate if model is not None and model.has_progress else None
    return _Problem(
        config=config, inputs=inputs, last_checkpoint_step=last_checkpoint, curve_given=curve is not None,
        fit=fit, rate=rate, raw=raw, mean_rate=mean_rate, weight_origin=weight_origin, model=model,
        fallbacks=fallbacks, details=details, notes=notes,
        taken_steps=_taken(taken_steps, start, last_checkpoint),
        two_level=_two_level_model(inputs, last_checkpoint, weighted, mean_rate, notes),
    )


def _taken(taken_steps: Iterable[int] | None, start: int, last_checkpoint: int) -> tuple[int, ...]:
    """The checkpoints already taken at or before ``start`` (sorted, unique; default: the last one)."""
    if taken_steps is None:
        taken_steps = [last_checkpoint]
    steps = {checks.integer(step, "taken_steps", minimum=0) for step in taken_steps}
    return tuple(sorted(step for step in steps if 1 <= step <= start))


def _empirical(
    raw: tuple[np.ndarray, np.ndarray] | None, fit: CurveFit | None, total_steps: int,
    details: dict[str, float], notes: list[str],
) -> EmpiricalCurve | None:
    """For a recorded trace (not a fit or a callable): the curve it shows
    (:func:`coci.planning.empirical.empirical_curve`), the extension past its end chosen by held-out
    forecast error and recorded in ``details`` and ``notes``; None when the trace cannot be smoothed."""
    if raw is None:
        return None
    try:
        curve = empirical_curve(raw[0], raw[1], total_steps, fit)
    except ConfigError as exc:
        notes.append(f"{exc}: planned on the parametric fit")
        return None
    for name, error in curve.holdout_errors.items():
        if math.isfinite(error):
            details[f"extension_holdout_error_{name.replace(' ', '_')}"] = error
    scores = ", ".join(f"{name} {error:.3g}" for name, error in curve.holdout_errors.items() if math.isfinite(error))
    notes.append(
        f"curve: planned on what the trace shows, a monotone smoothing of its progress rate over "
        f"{curve.centres.size} points to step {curve.last_step:.0f}; past it: {curve.extension}"
        + (f" (held-out forecast error, loss units: {scores})" if scores else "")
    )
    return curve


def _single_level_cost(inputs: PlanInputs) -> float:
    """What one checkpoint of a single-level plan costs training: with a remote tier every
    checkpoint is promoted, so the upload's interference is added to the local cost."""
    return inputs.checkpoint_seconds + float(inputs.upload_interference_seconds or 0.0)


def _cost_model(
    inputs: PlanInputs, last_checkpoint_step: int, rate: RateFunction | None, mean_rate: float | None,
    fallbacks: list[str],
) -> CostModel | None:
    """The cost model of :mod:`coci.planning.objective` (None without a failure model); the
    progress weight is dropped, with a fallback, when the curve cannot give one."""
    failures = inputs.planned_failures()
    if failures is None:
        return None
    step = inputs.step_seconds
    origin = inputs.failure_origin_step * step
    hazard = expected_failures(failures, inputs.total_steps * step - origin, origin)
    if not failures.is_memoryless:
        fallbacks.append(
            "failures restart at each (re)start: planned with the expected (renewal) hazard; "
            "young/daly/coci use the long-run rate 1/MTBF"
        )

    def build(progress_rate: RateFunction | None) -> CostModel:
        return build_cost_model(
            total_steps=inputs.total_steps, step_seconds=step, checkpoint_seconds=_single_level_cost(inputs),
            persist_seconds=inputs.persist_seconds, restart_seconds=inputs.restart_seconds, failures=hazard,
            progress_rate=progress_rate, start_step=inputs.start_step, last_checkpoint_step=last_checkpoint_step,
            mean_rate=mean_rate if progress_rate is not None else None,
        )

    if rate is not None:
        try:
            return build(rate)
        except ConfigError as exc:
            fallbacks.append(f"{exc}: planned for the time objective")
    return build(None)


def _two_level_model(
    inputs: PlanInputs, last_checkpoint_step: int, rate: RateFunction | None, mean_rate: float | None, notes: list[str]
) -> TwoLevelCostModel | None:
    """The two-level cost model (:class:`coci.planning.objective.TwoLevelCostModel`), or None without a
    remote tier, a failure model, or a failure class that destroys the local tier (then a note)."""
    failures = inputs.planned_failures()
    if failures is None or not inputs.has_remote_tier:
        if failures is not None and failures.destroying("local") is not None:
            notes.append("failure classes destroy the local tier but no remote tier is given: planned as if every failure restored locally")
        return None
    assert inputs.failures is not None
    unwarned = inputs.failures.model_copy(update={"warned_fraction": 0.0, "warning_seconds": None})
    destroying = unwarned.destroying("local")  # a notice checkpoint is local: no warning protects these
    if destroying is None:
        notes.append("no failure class destroys the local tier: a single-level plan (every checkpoint promoted)")
        return None
    if inputs.failures.warned_fraction > 0:
        notes.append("warned failures that destroy the local tier are planned as unwarned (a checkpoint taken on a notice is local)")
    step = inputs.step_seconds
    origin = inputs.failure_origin_step * step
    span = inputs.total_steps * step - origin
    sparing = failures.sparing("local")
    upload = float(inputs.upload_seconds or 0.0)
    remote_restart = inputs.restart_seconds if inputs.remote_restart_seconds is None else inputs.remote_restart_seconds
    last_promoted = last_checkpoint_step if inputs.last_promoted_step is None else inputs.last_promoted_step

    def build(group: Failures | None, cost: float, persist: float, restart: float, last: int) -> CostModel:
        hazard = ExpectedFailures.none(origin) if group is None else expected_failures(group, span, origin)
        return build_cost_model(
            total_steps=inputs.total_steps, step_seconds=step, checkpoint_seconds=cost, persist_seconds=persist,
            restart_seconds=restart, failures=hazard, progress_rate=rate, start_step=inputs.start_step,
            last_checkpoint_step=last, mean_rate=mean_rate if rate is not None else None,
        )

    return TwoLevelCostModel(
        local=build(sparing, inputs.checkpoint_seconds, inputs.persist_seconds, inputs.restart_seconds, last_checkpoint_step),
        remote=build(destroying, float(inputs.upload_interference_seconds or 0.0), inputs.persist_seconds + upload,
                     remote_restart, min(last_promoted, last_checkpoint_step)),
    )


def _finish(problem: _Problem, placement: _Placement) -> Plan:
    """The :class:`Plan` of ``placement``, with its expected costs (two-level: with every checkpoint
    promoted unless the placement chose the promotions). Every policy's plan ends here: its size
    is checked once more against the cap (:func:`coci.planning.formulas.check_plan_size`)."""
    steps = placement.steps
    check_plan_size(len(steps))
    if problem.two_level is not None:
        promote = steps if placement.promote is None else placement.promote
        expected = problem.two_level.as_dict(steps, promote)
        expected.update(placement.expected)
        local_only = {**expected, "failures": expected["local_failures"]}  # warnings spare local-tier failures only
        expected.update(warned_expected(problem.inputs, local_only, problem.notes))
    elif problem.model is not None:
        expected = problem.model.expected(steps).as_dict()
        expected.update(placement.expected)
        expected.update(warned_expected(problem.inputs, expected, problem.notes))
    else:
        expected = {"checkpoints": float(len(steps)), "checkpoint_seconds": len(steps) * problem.inputs.checkpoint_seconds}
        problem.notes.append("no failure model: only checkpoint costs are expected")
    restart_note = _restart_note(problem.inputs)
    if restart_note is not None:
        problem.notes.append(restart_note)
    return Plan(
        policy=problem.config.policy,
        objective=placement.objective,
        time_budget=problem.config.time_budget,
        inputs=problem.inputs,
        fit=problem.fit,
        steps=[int(s) for s in steps],
        expected=expected,
        fallbacks=problem.fallbacks,
        mu=placement.mu,
        details=problem.details,
        notes=problem.notes,
        promote_steps=None if placement.promote is None else [int(s) for s in placement.promote],
    )


def _restart_note(inputs: PlanInputs) -> str | None:
    """Why the expected costs understate the wall time when a restart is long against the MTBF.

    The expected costs count failures over the run's progress only (first order: each failure
    costs one restart and the work since the last commit). Failures during a restart or during the
    re-done work are left out, which is negligible while the restart is short against the MTBF
    and not beyond ``knobs.PLAN_RESTART_MTBF_NOTE`` of it (a toy MTBF of seconds, for example)."""
    failures = inputs.failures
    restart = inputs.restart_seconds
    if failures is None or restart <= 0:
        return None
    mtbf = float(failures.mean_seconds)
    if not math.isfinite(mtbf) or mtbf <= 0 or restart <= knobs.PLAN_RESTART_MTBF_NOTE * mtbf:
        return None
    exponent = restart / mtbf
    memoryless = math.expm1(exponent) * mtbf if exponent < 700 else math.inf
    return (
        f"the restart ({restart:.3g} s) is {exponent:.2g} of the job's MTBF ({mtbf:.3g} s): the expected costs "
        f"count failures over the run's progress only, not during restarts and re-done work, so they understate "
        f"the wall time (with memoryless failures a restart that must run {restart:.3g} s without a failure takes "
        f"{memoryless:.3g} s on average)"
    )


# --- one function per policy ---------------------------------------------------------------------


def _plan_young(problem: _Problem) -> _Placement:
    """Young: ``T = sqrt(2 C / lambda)``, periodic."""
    seconds = young_interval_seconds(_single_level_cost(problem.inputs), problem.failures.rate)
    return _periodic(problem, seconds)


def _plan_daly(problem: _Problem) -> _Placement:
    """Daly's exact optimum for exponential failures, periodic."""
    seconds = daly_interval_seconds(_single_level_cost(problem.inputs), problem.failures.mean_seconds)
    return _periodic(problem, seconds)


def _periodic(problem: _Problem, seconds: float) -> _Placement:
    """Every ``seconds`` of training (rounded to steps, at least the minimum interval)."""
    inputs, name = problem.inputs, problem.config.policy
    interval = max(int(round(seconds / inputs.step_seconds)), 1)
    problem.details.update(interval_seconds=seconds, interval_steps_formula=float(interval))
    if interval < inputs.min_interval_steps:
        problem.notes.append(
            f"{name} interval raised from {interval} to {inputs.min_interval_steps} steps (persist / max_overhead)"
        )
        interval = inputs.min_interval_steps
    problem.details["interval_steps"] = float(interval)
    steps = periodic_steps(interval, inputs.start_step, inputs.total_steps, anchor=inputs.last_checkpoint_step)
    return _Placement(steps, "time")


def _checkfreq_threshold(max_overhead: float | None) -> float:
    return knobs.CHECKFREQ_MAX_OVERHEAD if max_overhead is None else max_overhead


def _plan_checkfreq(problem: _Problem) -> _Placement:
    """CheckFreq: the interval the persist allows, grown by 2 while ``C / (k t)`` exceeds the threshold."""
    inputs = problem.inputs
    threshold = _checkfreq_threshold(inputs.max_overhead)
    first = checkfreq_interval(inputs.stall_seconds, inputs.persist_seconds, inputs.step_seconds)
    steps, final = checkfreq_steps(
        first, checkpoint_seconds=inputs.checkpoint_seconds, step_seconds=inputs.step_seconds,
        max_overhead=threshold, start_step=inputs.start_step, total_steps=inputs.total_steps,
        anchor=max(inputs.start_step, problem.last_checkpoint_step),
    )
    problem.details.update(interval_steps=float(first), final_interval_steps=float(final), max_overhead=threshold)
    return _Placement(steps, "time")


def _plan_coci(problem: _Problem) -> _Placement:
    """COCI as published (the time-optimal plan when the curve does not fall)."""
    steps, details, fallbacks = _coci_plan(
        problem.fit, problem.raw, problem.cost_model, problem.failures, problem.inputs.min_interval_steps
    )
    problem.details.update(details)
    problem.fallbacks.extend(fallbacks)
    return _Placement(steps, "progress" if "theta1_per_minute" in details else "time")


def _plan_auto(problem: _Problem) -> _Placement:
    """``auto``: the convergence-aware optimum (progress objective within the time budget), or the
    time optimum for ``objective="time"`` or without a usable curve. A re-plan (``start_step > 0``)
    keeps the whole run within the budget (:func:`_plan_rest_within_run_budget`)."""
    model, config = problem.cost_model, problem.config
    objective = config.objective
    if objective == "progress" and not model.has_progress:
        if not problem.curve_given:
            problem.fallbacks.append("no curve given: planned for the time objective")
        objective = "time"
    min_steps = problem.inputs.min_interval_steps
    if problem.two_level is not None:
        return _plan_two_levels(problem, problem.two_level, objective)
    max_steps = max_interval_steps(model, min_steps)
    problem.details["max_interval_steps"] = float(max_steps)
    if objective == "progress" and config.time_budget is not None and model.start_step > 0:
        result = _plan_rest_within_run_budget(problem, config.time_budget, max_steps)
    else:
        result = auto_steps(
            model, objective=objective, time_budget=config.time_budget, min_steps=min_steps, max_steps=max_steps,
        )
    problem.notes.extend(result.notes)
    expected = {"time_optimal_wall_seconds": result.time_optimal_wall_seconds}
    if result.budget_wall_seconds is not None:
        expected["budget_wall_seconds"] = result.budget_wall_seconds
    return _Placement(result.steps, objective, result.mu if objective == "progress" else None, expected)


def _plan_two_levels(problem: _Problem, model: TwoLevelCostModel, objective: str) -> _Placement:
    """``auto`` with a remote tier: local steps and their promoted subset (:func:`auto_two_level`).
    A re-plan measures the time budget against the remaining steps' two-level time optimum."""
    inputs, config = problem.inputs, problem.config
    local_min = min_interval_steps(inputs.step_seconds, inputs.persist_seconds, inputs.checkpoint_seconds, config.max_overhead)
    min_promote = min_promote_steps(inputs.step_seconds, float(inputs.upload_seconds or 0.0), local_min)
    result = auto_two_level(
        model, objective=objective, time_budget=config.time_budget, min_steps=local_min, min_promote=min_promote,
    )
    problem.details.update(min_interval_steps=float(local_min), min_promote_steps=float(min_promote))
    problem.notes.append(
        f"two levels: {len(result.promote)} of {len(result.steps)} checkpoints promoted to the remote tier"
    )
    if model.local.start_step > 0 and objective == "progress" and config.time_budget is not None:
        problem.notes.append("re-plan with a remote tier: the time budget is measured on the remaining steps")
    expected = {"time_optimal_wall_seconds": result.time_optimal_wall_seconds}
    if result.budget_wall_seconds is not None:
        expected["budget_wall_seconds"] = result.budget_wall_seconds
    mu = result.mu if objective == "progress" else None
    return _Placement(result.steps, objective, mu, expected, promote=result.promote)


def _plan_rest_within_run_budget(problem: _Problem, time_budget: float, max_steps: int) -> AutoResult:
    """A re-plan's remaining steps, the whole run (from step 0, the checkpoints already taken
    included) within the time budget (:func:`coci.planning.formulas.auto_steps_within_run_budget`).

    The budget is a property of the run: measured against the time optimum of the *remaining* steps
    it would be granted afresh at each re-plan, and the warm-up checkpoints and early plans' dense
    checkpoints would sit outside it. ``time_optimal_wall_seconds`` and ``budget_wall_seconds`` of
    the plan are then the whole run's, and ``details['run_alpha']`` the mixture weight chosen."""
    model, inputs = problem.cost_model, problem.inputs
    whole = build_cost_model(
        total_steps=model.total_steps, step_seconds=model.step_seconds,
        checkpoint_seconds=model.checkpoint_seconds, persist_seconds=model.persist_seconds,
        restart_seconds=model.restart_seconds,
        failures=expected_failures(problem.failures, model.horizon_seconds),
        progress_rate=problem.rate, start_step=0, mean_rate=problem.mean_rate,
    )
    taken = np.asarray(problem.taken_steps, dtype=np.int64)
    result = auto_steps_within_run_budget(
        model, whole, taken, time_budget=time_budget, min_steps=inputs.min_interval_steps, max_steps=max_steps,
    )
    problem.details["run_alpha"] = float(result.alpha)
    problem.details["taken_checkpoints"] = float(taken.size)
    problem.notes.append(
        f"re-plan: the time budget holds for the whole run, its {taken.size} checkpoint(s) already taken "
        f"included (alpha {result.alpha:.3g})"
    )
    return result


#: The function that places the checkpoints of each policy name.
POLICY_PLANNERS: dict[str, Callable[[_Problem], _Placement]] = {
    "auto": _plan_auto,
    "young": _plan_young,
    "daly": _plan_daly,
    "checkfreq": _plan_checkfreq,
    "coci": _plan_coci,
}


# --- the progress rate the planner uses ------------------------------------------------------------


def _observed_past_rate(fit: CurveFit, rate: RateFunction) -> RateFunction:
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


def fit_progress_weight(fit: CurveFit, total_steps: int) -> RateFunction | None:
    """The progress weight ``w = v / v_bar`` the planner derives from a recorded fit over a run of
    ``total_steps`` steps (the observed average before a recent window, the floor at 0, the whole
    run's mean rate; see :func:`_observed_past_rate` and :func:`_mean_rate`); None when the fit is
    unusable or the loss does not fall over the run."""
    if not fit.usable:
        return None
    rate = _observed_past_rate(fit, fit.progress_rate)
    mean, _ = _mean_rate(fit, rate, total_steps, [])
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


def _mean_rate(
    fit: CurveFit | None, rate: RateFunction, total_steps: int, fallbacks: list[str]
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


# --- COCI as published -----------------------------------------------------------------------------


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


def make_policy(config: PlanConfig | str = "auto", *, prior: Any = None, **choices: Any) -> PlanningPolicy:
    """The :class:`coci.planning.policy.CheckpointPolicy` the session uses: a :class:`PlanningPolicy`
    for ``config``, or for a policy name and the other :class:`PlanConfig` fields as keywords;
    ``prior``: an earlier run's curve to warm-start from (:meth:`PlanningPolicy.use_prior`)."""
    policy = PlanningPolicy(config, **choices)
    if prior is not None:
        policy.use_prior(prior)
    return policy


class CheckFreqAdaptation:
    """CheckFreq's online rule: a fixed interval ``k`` (set from the first plan, kept across
    re-plans and restarts), grown by 2 after each new checkpoint whose cost ``C / (k t)`` exceeds
    the overhead threshold (``max_overhead``, CheckFreq's 5% when None); never shrunk."""

    def __init__(self, max_overhead: float | None) -> None:
        self.max_overhead = max_overhead
        self.interval: int | None = None
        self.seen_step = 0  # the newest checkpoint already judged

    def observe(self, checkpoint_steps: Iterable[int], cost: float, step_seconds: float) -> bool:
        """Judge the checkpoints taken since the last call; True when ``k`` grew."""
        if self.interval is None:
            return False
        threshold = _checkfreq_threshold(self.max_overhead)
        grew = False
        for step in sorted(checkpoint_steps):
            if step <= self.seen_step:
                continue
            self.seen_step = step
            if cost / (self.interval * step_seconds) > threshold:
                self.interval += 2
                grew = True
        return grew

    def plan(self, offline: Plan, last_checkpoint: int) -> Plan:
        """``offline`` with its steps replaced by every ``k`` steps from the last checkpoint (``k``
        taken from ``offline`` the first time) and its expected costs recomputed for them."""
        inputs = offline.inputs
        if self.interval is None:
            self.interval = int(offline.details.get("interval_steps", 1))
        steps = periodic_steps(self.interval, inputs.start_step, inputs.total_steps, anchor=last_checkpoint)
        details = {**offline.details, "interval_steps": float(self.interval)}
        details.pop("final_interval_steps", None)
        if inputs.failures is not None:
            expected = _rescore(offline, steps, inputs.failures)
        else:
            expected = {"checkpoints": float(steps.size), "checkpoint_seconds": steps.size * inputs.checkpoint_seconds}
        return offline.model_copy(update={"steps": [int(s) for s in steps], "details": details, "expected": expected})

    def state_dict(self) -> dict[str, Any]:
        return {"checkfreq_k": self.interval, "checkfreq_seen": self.seen_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.interval = state.get("checkfreq_k")
        self.seen_step = int(state.get("checkfreq_seen") or 0)


class PlanningPolicy:
    """Plans online from the live profile (see :func:`make_policy`).

    Before its first plan (warm-up) only ``auto`` with the progress objective checkpoints, at
    ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS`` (:attr:`warming_up`: the session skips one that would wait
    for a persist in flight); the other policies wait. Each ``observe`` reads the
    profile (step time, stall, persist, interference, restore) and the loss trace; it re-plans
    from the current step when there is no plan yet, when a cost moved by more than
    ``knobs.PLAN_REPLAN_COST_CHANGE``, when the fitted progress weight moved by more than
    ``knobs.PLAN_REPLAN_FIT_CHANGE`` (the relative change of the planned checkpoint density
    ``sqrt(w_alpha)`` on the remaining steps, old fit against new; or the fit's family changed),
    when an open-ended horizon needs extending, or (``checkfreq``) when its interval grew
    (:class:`CheckFreqAdaptation`). :meth:`should_checkpoint` is a set lookup. ``state_dict`` keeps
    CheckFreq's grown interval and the current plan.

    The failure clock of a restarting hazard is taken to have (re)started
    ``knobs.PLAN_WARMUP_STEPS`` steps before this object's first observation (an approximation:
    the policy does not see the restore itself).
    """

    def __init__(self, config: PlanConfig | str = "auto", **choices: Any) -> None:
        if isinstance(config, PlanConfig):
            if choices:
                raise ConfigError(f"pass either a PlanConfig or its fields, not both (got {sorted(choices)})")
            self.config = config
        else:
            self.config = PlanConfig(policy=config, **choices)
        self.plan: Plan | None = None
        self.replans = 0
        self._steps: frozenset[int] = self._warmup_steps()
        self._basis: tuple[float, ...] | None = None
        self._fit: ProgressCurve | None = None
        self._fit_family: str | None = None
        self._origin: int | None = None
        self._horizon: int | None = None
        self._checkfreq = CheckFreqAdaptation(self.config.max_overhead) if self.policy == "checkfreq" else None
        self._prior: PriorCurve | None = None
        self._warm: WarmStart | None = None
        self._prior_notes: list[str] = []
        self._fitted: tuple[np.ndarray, np.ndarray, CurveFit] | None = None  # the last trace fitted and its fit

    def use_prior(self, source: Any) -> None:
        """Warm start: plan from step 0 with an earlier run's curve (see :mod:`coci.planning.prior`;
        ``source`` as :func:`coci.planning.prior.load_prior` takes it, or a
        :class:`~coci.planning.prior.PriorCurve`). A prior that cannot be used (unreadable, too
        short, not falling; a policy other than ``auto`` with the progress objective) is recorded in
        every plan's ``fallbacks`` and the run plans cold."""
        if not self._weights_progress:
            self._prior_notes.append(f"prior ignored: policy {self.policy!r} ({self.objective}) does not weigh progress")
            return
        try:
            self._prior = source if isinstance(source, PriorCurve) else load_prior(source)
        except ConfigError as exc:
            self._drop_prior(str(exc))
        except (ValueError, TypeError, ArithmeticError, RecursionError, OSError) as exc:  # whatever else the source holds
            self._drop_prior(f"prior: unreadable ({type(exc).__name__}: {exc})")

    def _drop_prior(self, reason: str) -> None:
        logger.warning("warm start refused, planning cold: %s", reason)
        self._prior, self._warm = None, None
        self._prior_notes.append(f"{reason}: planned without it (cold start)")

    @property
    def policy(self) -> str:
        """The policy name."""
        return self.config.policy

    @property
    def objective(self) -> str:
        """The objective asked for (``auto``)."""
        return self.config.objective

    @property
    def total_steps(self) -> int | None:
        """The planning horizon (None: open-ended)."""
        return self.config.total_steps

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
        remote = self._remote_costs(observation, restart, fallbacks)
        basis = (step_seconds, cost, persist, float(remote.get("upload_seconds") or 0.0))
        last_checkpoint = max((s for s in observation.checkpoint_steps if s <= now), default=0)
        grew = self._checkfreq is not None and self._checkfreq.observe(observation.checkpoint_steps, cost, step_seconds)
        curve = self._curve(observation, fallbacks)
        reasons = self._moved(basis, curve, now, horizon, grew)
        if not reasons:
            return
        try:
            new_plan = plan(
                config=self.config.replace(total_steps=horizon, restart_seconds=restart), curve=curve,
                step_seconds=step_seconds, stall_seconds=stall, persist_seconds=persist,
                interference_seconds=interference, start_step=now, last_checkpoint_step=last_checkpoint,
                failure_origin_step=min(self._origin, now), taken_steps=observation.checkpoint_steps, **remote,
            )
        except ConfigError as exc:  # a measured figure out of range: keep the current plan
            logger.warning("re-planning at step %d failed, keeping the current plan: %s", now, exc)
            return
        if self._checkfreq is not None:
            new_plan = self._checkfreq.plan(new_plan, last_checkpoint)
        fallbacks.extend(self._prior_notes)
        if fallbacks or self.total_steps is None:
            if self.total_steps is None:
                fallbacks.append(f"total_steps unknown: planned over a horizon of {horizon} steps")
            new_plan = new_plan.model_copy(update={"fallbacks": [*new_plan.fallbacks, *fallbacks]})
        self._install(new_plan, basis, curve, horizon)
        logger.info("planned at step %d (%s): %d checkpoints", now, ", ".join(reasons), len(new_plan.steps))

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        checkfreq = CheckFreqAdaptation(None) if self._checkfreq is None else self._checkfreq
        return {
            "policy": self.policy,
            **checkfreq.state_dict(),
            "horizon": self._horizon,
            "plan": None if self.plan is None else self.plan.model_dump_json(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != self.policy:
            logger.warning("policy state for %r ignored by policy %r", state.get("policy"), self.policy)
            return
        if self._checkfreq is not None:
            self._checkfreq.load_state_dict(state)
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
        restart = self.config.restart_seconds
        if restart is None:  # the restart cost (measured, else start-up + restore) beats a bare restore
            measured = getattr(profile, "restart_seconds", None)
            restart = measured.value if measured is not None and measured.known else profile.restore_seconds.value
            if restart is None:
                restart = 0.0
                fallbacks.append("restart_seconds unknown: assumed 0 (changes expected costs, not the plan)")
        return max(float(stall), floor), max(float(persist), floor), max(interference, 0.0), max(float(restart), 0.0)

    @staticmethod
    def _remote_costs(observation: Observation, restart: float, fallbacks: list[str]) -> dict[str, Any]:
        """The remote tier's measured costs as :func:`plan` keywords; empty (a single-level plan that
        promotes every checkpoint) without a remote tier or before the first upload is measured.

        A restart from the remote costs the local restart plus the extra time a remote restore took
        over a local one; until a remote restore is measured, plus one upload's time (a download of
        the same bytes), recorded as a fallback."""
        profile = observation.profile
        measured = getattr(profile, "upload_seconds", None)
        if observation.last_promoted_step is None or measured is None or not measured.known:
            return {}
        upload = float(measured.value)
        remote_restore = profile.remote_restore_seconds.value
        if remote_restore is None:
            extra = upload
            fallbacks.append(f"remote restore not measured yet: assumed one upload's time ({upload:.3g} s)")
        else:
            extra = max(float(remote_restore) - float(profile.restore_seconds.value or 0.0), 0.0)
        return {
            "upload_seconds": upload,
            "upload_interference_seconds": float(profile.upload_interference_seconds),
            "remote_restart_seconds": restart + extra,
            "last_promoted_step": observation.last_promoted_step,
        }

    def _curve(self, observation: Observation, fallbacks: list[str]) -> ProgressCurve | None:
        """The fit of the loss trace so far, or (``auto``) the prior while the trace is too short.

        A trace with fewer than ``knobs.FIT_MIN_POINTS`` points (but at least one) gets
        :data:`PRIOR_PROGRESS_RATE` for ``auto``; a longer one its fit, which ``plan`` turns into the
        time-optimal plan when the fitter finds it unusable (flat, rising). Even a fit of the first
        few dozen steps is used: measured on GPT-2 and synthetic curves, waiting for the trace to
        cover 1% of the horizon lost more (the steepest, most valuable stretch passes meanwhile)
        than the extrapolation error cost."""
        needs = self.policy == "coci" or self._weights_progress
        warm = self._warm_rate(observation, fallbacks)
        if warm is not None:
            return warm
        points = int(np.count_nonzero(np.isfinite(np.asarray(observation.losses, dtype=float))))
        if not needs or points == 0:
            return None
        if self._weights_progress and points < knobs.FIT_MIN_POINTS:
            fallbacks.append(
                f"loss trace has {points} point(s), fewer than {knobs.FIT_MIN_POINTS} to fit: planned with "
                f"the prior progress rate {PRIOR_PROGRESS_RATE.description}"
            )
            return PRIOR_PROGRESS_RATE
        if points < 2:
            return None
        return self._fit_of(np.asarray(observation.loss_steps, dtype=float), np.asarray(observation.losses, dtype=float))

    def _fit_of(self, steps: np.ndarray, losses: np.ndarray) -> CurveFit:
        """``fit_curve(steps, losses)``, reused when the trace equals the one fitted last: the fit is
        deterministic, so a trace that has not changed since (losses logged less often than the
        policy observes: evaluation curves, sparse logging) gives the same fit without refitting."""
        last = self._fitted
        if last is not None and np.array_equal(last[0], steps) and np.array_equal(last[1], losses):
            return last[2]
        fit = fit_curve(steps, losses)
        self._fitted = (steps.copy(), losses.copy(), fit)
        return fit

    def _warm_rate(self, observation: Observation, fallbacks: list[str]) -> CorrectedRate | None:
        """The warm start's progress rate, corrected by this run's losses so far (None: no prior)."""
        if self._prior is None:
            return None
        horizon = self.total_steps or int(self._prior.total_steps)
        if self._warm is None or self._warm.total_steps != horizon:
            try:
                self._warm = WarmStart(self._prior, horizon)
            except ConfigError as exc:
                self._drop_prior(str(exc))
                return None
            if self.total_steps is None:
                fallbacks.append("total_steps unknown: the prior is used at its own length, not rescaled")
        try:
            return self._warm.rate(observation.loss_steps, observation.losses)
        except ConfigError as exc:
            self._drop_prior(str(exc))
            return None

    @staticmethod
    def _family(curve: ProgressCurve | None) -> str | None:
        if curve is None:
            return None
        if isinstance(curve, CorrectedRate):
            return "warm start"
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
        self, basis: tuple[float, ...], fit: ProgressCurve | None, now: int, horizon: int, grew: bool
    ) -> list[str]:
        """Why the current plan is out of date (empty: keep it)."""
        if self.plan is None or self._basis is None:
            return ["first plan"]
        reasons = []
        if horizon != self._horizon:
            reasons.append(f"horizon {horizon}")
        if grew and self._checkfreq is not None:
            reasons.append(f"checkfreq interval grew to {self._checkfreq.interval}")
        if self.policy != "checkfreq":
            for name, new, old in zip(("step time", "checkpoint cost", "persist", "upload"), basis, self._basis):
                if abs(new - old) > knobs.PLAN_REPLAN_COST_CHANGE * max(abs(old), 1e-12):
                    reasons.append(f"{name} {old:.3g} -> {new:.3g} s")
            reasons.extend(self._fit_moved(fit, now, horizon))
        return reasons

    def _fit_moved(self, fit: ProgressCurve | None, now: int, horizon: int) -> list[str]:
        """Why the new fit calls for a re-plan: another family or usability, or a planned checkpoint
        density ``sqrt(w_alpha)`` (the mixture of the current plan) moved by more than the threshold."""
        family = self._family(fit)
        if family != self._fit_family:
            return [f"fit {self._fit_family} -> {family}"]
        probe = self._probe(fit, now, horizon)
        planned = self._probe(self._fit, now, horizon)  # the planned fit, on the same steps
        if (probe is None) != (planned is None):
            return ["fit usability changed"]
        if probe is None or planned is None:
            return []
        mu = None if self.plan is None else self.plan.mu
        alpha = 1.0 if mu is None else 1.0 / (1.0 + mu)
        new_density = np.sqrt(alpha * probe + 1.0 - alpha)
        old_density = np.sqrt(alpha * planned + 1.0 - alpha)
        change = float(np.max(np.abs(new_density - old_density) / np.maximum(old_density, 1e-12)))
        return [f"progress weight moved by {change:.0%}"] if change > knobs.PLAN_REPLAN_FIT_CHANGE else []

    def _install(self, new_plan: Plan, basis: tuple[float, ...], fit: ProgressCurve | None, horizon: int) -> None:
        self.plan = new_plan
        self._steps = frozenset(new_plan.steps)
        self._basis = basis
        self._fit_family = self._family(fit)
        self._fit = fit
        self._horizon = horizon
        self.replans += 1


def _rescore(reference: Plan, steps: np.ndarray, failures: Failures) -> dict[str, float]:
    """Expected costs of ``steps`` under the inputs of ``reference`` (time metric)."""
    inputs = reference.inputs
    origin = inputs.failure_origin_step * inputs.step_seconds
    failures = failures.unwarned(inputs.stall_seconds + inputs.persist_seconds)
    hazard = expected_failures(failures, (inputs.total_steps - inputs.failure_origin_step) * inputs.step_seconds, origin)
    model = build_cost_model(
        total_steps=inputs.total_steps, step_seconds=inputs.step_seconds,
        checkpoint_seconds=inputs.checkpoint_seconds, persist_seconds=inputs.persist_seconds,
        restart_seconds=inputs.restart_seconds, failures=hazard, start_step=inputs.start_step,
        last_checkpoint_step=inputs.last_checkpoint_step,
    )
    expected = model.expected(steps).as_dict()
    expected.update(warned_expected(inputs, expected, []))
    return expected


def warned_expected(inputs: PlanInputs, expected: dict[str, float], notes: list[str]) -> dict[str, float]:
    """The warned failures' share of the expected overhead (empty when no warning fits): each
    costs one checkpoint taken on its notice (stall + persist, training stopped) and a restart,
    and loses no work. ``expected`` holds the unwarned failures' figures; the warned ones are
    added to its ``wall_seconds`` and ``progress_seconds`` so both cover every failure."""
    failures = inputs.failures
    emergency = inputs.stall_seconds + inputs.persist_seconds
    if failures is None or failures.warned_fraction == 0:
        return {}
    if not failures.warning_fits(emergency):
        notes.append(
            f"warned failures: a checkpoint (stall + persist {emergency:.3g} s) does not fit their "
            f"{failures.warning_seconds:.3g} s warning, so they are planned for like unwarned ones"
        )
        return {}
    keep = failures.unwarned_fraction(emergency)
    count = expected.get("failures", 0.0) * (1.0 - keep) / keep
    seconds = count * (inputs.restart_seconds + emergency)
    notes.append(
        f"{100 * (1 - keep):.3g}% of failures are warned {failures.warning_seconds:.3g} s ahead and a checkpoint "
        f"fits: periodic checkpoints planned for the unwarned {100 * keep:.3g}% only"
    )
    wall = expected.get("wall_seconds", 0.0) + seconds
    run = expected.get("run_seconds", 0.0)
    return {
        "warned_failures": count,
        "warned_seconds": seconds,
        "wall_seconds": wall,
        "progress_seconds": expected.get("progress_seconds", 0.0) + seconds,
        "wall_fraction": wall / run if run > 0 else 0.0,
    }
