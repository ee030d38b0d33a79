"""One planning problem: the validated inputs turned into the cost model the policies place
checkpoints with, and a placement turned into a [``coci.planning.records.Plan``][coci.Plan] with its
expected costs and notes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coci import checks
from coci.errors import ConfigError
from coci.planning.arguments import CurveLike
from coci.planning.config import PlanConfig
from coci.planning.empirical import EmpiricalCurve, empirical_curve
from coci.planning.failures import Failures, check_survivable
from coci.planning.fit import CurveFit
from coci.planning.formulas import check_plan_size, min_interval_steps
from coci.planning.levels import Level, LevelCosts, min_promote_steps
from coci.planning.objective import CostModel, ExpectedFailures, TwoLevelCostModel, build_cost_model, expected_failures
from coci.planning.progress import observed_past_rate, resolve_curve, run_mean_rate
from coci.planning.records import Plan, PlanInputs, RateFunction
from coci.planning.three_levels import ThreeLevelCostModel, chain_levels, three_level_model
from coci.units import parse_duration

#: A plan notes that its expected costs understate the wall time when the restart takes more than
#: this fraction of the job's MTBF (failures during restarts and re-done work are not counted).
_PLAN_RESTART_MTBF_NOTE: float = 0.1


@dataclass
class Problem:
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
    three_level: ThreeLevelCostModel | None = None  # with a peer level and a class that destroys the local tier

    @property
    def failures(self) -> Failures:
        """The failures the plan covers (every policy but ``checkfreq`` and ``continuous`` requires a model): the
        unwarned ones, see ``PlanInputs.planned_failures``."""
        failures = self.inputs.planned_failures()
        assert failures is not None
        return failures

    @property
    def cost_model(self) -> CostModel:
        """The cost model (built whenever there is a failure model)."""
        assert self.model is not None
        return self.model


@dataclass(frozen=True)
class Placement:
    """What a policy function chose: the steps, the objective they optimise, auto's mixture weight."""

    steps: np.ndarray
    objective: str
    mu: float | None = None
    expected: dict[str, float] = field(default_factory=dict)
    promote: np.ndarray | None = None  # the promoted subset of ``steps`` (None: single level)
    peer: np.ndarray | None = None  # the subset of ``steps`` copied to a peer (None: no peer level planned)
    higher: tuple[np.ndarray, ...] = ()  # each level above the remote tier's subset (empty: every upload goes on up)


def build_problem(
    config: PlanConfig,
    curve: CurveLike | None,
    *,
    step_seconds: Any,
    stall_seconds: Any,
    persist_seconds: Any,
    interference_seconds: Any,
    start_step: Any,
    last_checkpoint_step: Any,
    failure_origin_step: Any,
    taken_steps: Iterable[int] | None = None,
    levels: tuple[LevelCosts, ...] = (),
) -> Problem:
    """Validate the measurements, resolve the curve and build the cost model."""
    total_steps = checks.integer(config.total_steps, "total_steps", minimum=1)
    check_survivable(config.failures, max((level.rank for level in levels), default=int(Level.LOCAL)))
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
    min_steps = min_interval_steps(step, persist, cost, config.max_overhead)
    for level in levels:  # a single-level plan sends every checkpoint to every level, one transfer in flight
        min_steps = min_promote_steps(step, level.transfer_seconds, min_steps)

    fit, rate, raw, description, fallbacks = resolve_curve(curve)
    details: dict[str, float] = {"min_interval_steps": float(min_steps)}
    notes: list[str] = []
    given = rate if isinstance(rate, EmpiricalCurve) else None  # a forecast curve (online), used as it is
    empirical = given or (_empirical(raw, fit, total_steps, details, notes) if rate is not None else None)
    if given is not None:
        notes.append(f"curve: planned on the trace so far, then its forecast ({given.description})")
    elif empirical is not None:
        rate, description = empirical, f"{description}, {empirical.description}"
    elif fit is not None and rate is not None:
        rate = observed_past_rate(fit, rate)
    law = None if empirical is not None else fit
    mean_rate, weight_origin = run_mean_rate(law, rate, total_steps, fallbacks) if rate is not None else (None, 0.0)
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
        levels=levels,
    )
    model = _cost_model(inputs, last_checkpoint, rate, mean_rate, fallbacks)
    weighted = rate if model is not None and model.has_progress else None
    three = three_level_model(inputs, last_checkpoint, weighted, mean_rate, notes)
    return Problem(
        config=config, inputs=inputs, last_checkpoint_step=last_checkpoint, curve_given=curve is not None,
        fit=fit, rate=rate, raw=raw, mean_rate=mean_rate, weight_origin=weight_origin, model=model,
        fallbacks=fallbacks, details=details, notes=notes,
        taken_steps=_taken(taken_steps, start, last_checkpoint),
        two_level=None if three is not None else _two_level_model(inputs, last_checkpoint, weighted, mean_rate, notes),
        three_level=three,
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
    (``coci.planning.empirical.empirical_curve``), the extension past its end chosen by held-out
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


def single_level_cost(inputs: PlanInputs) -> float:
    """What one checkpoint of a single-level plan costs training: with a remote tier every
    checkpoint is promoted (and copied to a peer), so those interferences are added to the local cost."""
    extra = sum((level.interference for level in inputs.levels), 0.0)
    return inputs.checkpoint_seconds + extra


def _cost_model(
    inputs: PlanInputs, last_checkpoint_step: int, rate: RateFunction | None, mean_rate: float | None,
    fallbacks: list[str],
) -> CostModel | None:
    """The cost model of ``coci.planning.objective`` (None without a failure model); the
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
            total_steps=inputs.total_steps, step_seconds=step, checkpoint_seconds=single_level_cost(inputs),
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
    """The two-level cost model (``coci.planning.objective.TwoLevelCostModel``), or None without a
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
    tier = inputs.level(Level.REMOTE)
    assert tier is not None
    last_promoted = last_checkpoint_step if tier.last_step is None else tier.last_step

    def build(group: Failures | None, cost: float, persist: float, restart: float, last: int) -> CostModel:
        hazard = ExpectedFailures.none(origin) if group is None else expected_failures(group, span, origin)
        return build_cost_model(
            total_steps=inputs.total_steps, step_seconds=step, checkpoint_seconds=cost, persist_seconds=persist,
            restart_seconds=restart, failures=hazard, progress_rate=rate, start_step=inputs.start_step,
            last_checkpoint_step=last, mean_rate=mean_rate if rate is not None else None,
        )

    return TwoLevelCostModel(
        local=build(sparing, inputs.checkpoint_seconds, inputs.persist_seconds, inputs.restart_seconds, last_checkpoint_step),
        remote=build(destroying, tier.interference, inputs.persist_seconds + tier.transfer_seconds,
                     tier.restart_seconds(inputs.restart_seconds), min(last_promoted, last_checkpoint_step)),
    )


def whole_run_levels(problem: Problem) -> tuple[TwoLevelCostModel | ThreeLevelCostModel, list[np.ndarray]] | None:
    """A multi-level re-plan's model of the whole run (from step 0, as ``problem.two_level`` or
    ``problem.three_level`` is of the remaining steps) and the steps already taken at each of its
    levels (local first, each a subset of the one below); None for a first plan, or unless every
    level's copy history is known (``LevelCosts.taken_steps``)."""
    inputs = problem.inputs
    start = inputs.start_step
    if start == 0 or not inputs.levels or any(level.taken_steps is None for level in inputs.levels):
        return None
    whole = inputs.model_copy(update={
        "start_step": 0, "last_checkpoint_step": 0, "failure_origin_step": 0,
        "levels": tuple(level.model_copy(update={"last_step": None}) for level in inputs.levels),
    })
    rate = problem.rate if problem.model is not None and problem.model.has_progress else None
    histories = [level.taken_steps or () for level in inputs.levels]
    model: TwoLevelCostModel | ThreeLevelCostModel | None
    if problem.three_level is not None:
        model = three_level_model(whole, 0, rate, problem.mean_rate, [])
        if len(chain_levels(inputs)) > len(inputs.levels):  # the empty remote chain above the peer level
            histories.append(())
    else:
        model = _two_level_model(whole, 0, rate, problem.mean_rate, [])
    if model is None:
        return None
    past = [np.asarray(problem.taken_steps, dtype=np.int64)]
    for history in histories:
        sent = np.asarray(sorted({int(s) for s in history if 1 <= s <= start}), dtype=np.int64)
        past.append(np.intersect1d(sent, past[-1]))
    return model, past


def _higher_steps(problem: Problem, placement: Placement) -> dict[str, list[int]] | None:
    """``Plan.higher_steps``: each level above the remote tier's steps, by name (None without such
    a level; a placement that chose none sends every upload on up)."""
    higher = problem.inputs.higher_levels
    if problem.three_level is None or not higher:
        return None
    if not placement.higher:
        return None
    return {record.name: [int(s) for s in steps] for record, steps in zip(higher, placement.higher)}


def chain_steps(problem: Problem, placement: Placement) -> tuple[np.ndarray, ...]:
    """Each chain level's steps of ``placement`` (``problem.three_level``'s levels, local first):
    those it chose, else every step of the level below (the empty remote chain above a lone peer
    level: none)."""
    chosen = {"peer": placement.peer, "remote": placement.promote}
    chosen.update(zip((record.name for record in problem.inputs.higher_levels), placement.higher))
    levels = [placement.steps]
    for record in chain_levels(problem.inputs):
        picked = chosen.get(record.name)
        if picked is None:
            picked = levels[-1] if record.seconds is not None else levels[-1][:0]
        levels.append(picked)
    return tuple(levels)


def finish_plan(problem: Problem, placement: Placement) -> Plan:
    """The [``Plan``][coci.Plan] of ``placement``, with its expected costs (two-level: with every checkpoint
    promoted unless the placement chose the promotions). Every policy's plan ends here: its size
    is checked once more against the cap (``coci.planning.formulas.check_plan_size``)."""
    steps = placement.steps
    check_plan_size(len(steps))
    if problem.three_level is not None:
        expected = problem.three_level.as_dict(*chain_steps(problem, placement))
        expected.update(placement.expected)
        local_only = {**expected, "failures": expected["local_failures"]}  # warnings spare local-tier failures only
        expected.update(warned_expected(problem.inputs, local_only, problem.notes))
    elif problem.two_level is not None:
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
    higher_steps = _higher_steps(problem, placement)
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
        peer_steps=None if placement.peer is None else [int(s) for s in placement.peer],
        higher_steps=higher_steps,
    )


def _restart_note(inputs: PlanInputs) -> str | None:
    """Why the expected costs understate the wall time when a restart is long against the MTBF.

    The expected costs count failures over the run's progress only (first order: each failure
    costs one restart and the work since the last commit). Failures during a restart or during the
    re-done work are left out, which is negligible while the restart is short against the MTBF
    and not beyond ``_PLAN_RESTART_MTBF_NOTE`` of it (a toy MTBF of seconds, for example)."""
    failures = inputs.failures
    restart = inputs.restart_seconds
    if failures is None or restart <= 0:
        return None
    mtbf = float(failures.mean_seconds)
    if not math.isfinite(mtbf) or mtbf <= 0 or restart <= _PLAN_RESTART_MTBF_NOTE * mtbf:
        return None
    exponent = restart / mtbf
    memoryless = math.expm1(exponent) * mtbf if exponent < 700 else math.inf
    return (
        f"the restart ({restart:.3g} s) is {exponent:.2g} of the job's MTBF ({mtbf:.3g} s): the expected costs "
        f"count failures over the run's progress only, not during restarts and re-done work, so they understate "
        f"the wall time (with memoryless failures a restart that must run {restart:.3g} s without a failure takes "
        f"{memoryless:.3g} s on average)"
    )


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
