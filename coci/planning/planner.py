"""Plans: from measured costs, a failure model and a loss curve to checkpoint steps.

[``plan``][coci.plan] is the offline entry point (and what the CLI and the session call): a pure function
that validates the inputs, fits the curve, builds the one cost model of
``coci.planning.objective``, runs the chosen policy (one small function per policy name in
``POLICY_PLANNERS``, built on ``coci.planning.formulas``) and returns a [``Plan``][coci.Plan] with the
steps, the expected costs under both metrics and every fallback taken. ``coci.planning.online.make_policy`` wraps it
for [``coci.Session``][coci.Session] (``coci.planning.online``). The records it reads and returns are in
``coci.planning.records``; the classical and published baselines in ``coci.planning.baselines``.

Fallbacks (recorded in ``Plan.fallbacks``, never silent):

* no curve, or a curve the fitter cannot use (too few points, loss not falling, ...) -> ``auto``
  uses the time objective; ``coci`` uses the time-optimal plan;
* a restarting (non-memoryless) failure model -> the expected hazard of the renewal process (see
  ``coci.planning.objective``), and ``young``/``daly``/``coci`` use the long-run rate ``1 / MTBF``;
* ``coci``'s fitted loss running out of room before the horizon -> its last interval repeated;
* online: no stall / persist / restart measured yet -> assumed values (knobs), re-planned once
  measured.

Re-planning online (``start_step > 0``, what ``PlanningPolicy`` does as the curve is
revealed) is time-consistent with the offline plan:

* the progress weight is normalised over the whole run, from the trace's first step to the horizon
  (``coci.planning.objective``), never over the remaining steps; before a recent-window fit's window the
  rate is the observed average (the law is not extrapolated backwards); ``auto``'s policy online
  plans on the trace so far as it is and a forecast of the rest
  (``coci.planning.empirical.forecast_curve``), not on a law;
* the time budget belongs to the run: the whole run's expected wall-clock overhead (from step 0,
  the checkpoints already taken, ``taken_steps``, followed by the new plan; warm-up checkpoints and
  earlier plans' included) must stay within ``1 + time_budget`` times the whole run's time
  optimum, under the current costs and curve; ``auto`` plans the remaining steps with the largest
  progress weight ``alpha`` that keeps it there, instead of granting each re-plan a fresh 5% of the
  remaining time optimum (planning time itself is capped apart, ``knobs.PLANNING_TIME_FRACTION``);
  with levels the same holds when every level's copy history is given (``LevelCosts.taken_steps``:
  the steps already copied and uploaded, followed by the new plan's, in the whole run's chain model);
* the segment already running counts: the first new checkpoint is placed from the last checkpoint,
  not from the re-plan's step;
* before its first plan (warm-up) ``auto``'s progress objective checkpoints at
  ``knobs.PLAN_WARMUP_CHECKPOINT_STEPS`` (1, 2, 4, 8, 16): no costs or curve are known yet, but a
  run from scratch falls fastest there (measured on GPT-2 runs: nearly all of the online deficit
  against the offline plan was these steps, see benchmarks/results/2026-11-22.md, "Schedule quality");
* while the loss trace holds fewer than ``knobs.FIT_MIN_POINTS`` points ``auto`` plans with the
  prior progress rate ``PRIOR_PROGRESS_RATE`` (equal loss decrease per doubling of the step
  count); a trace the fitter finds flat or rising, or a run that records no loss, gets the
  time-optimal plan (Young/Daly generalised to the hazard); each recorded in ``fallbacks``;
* ``auto`` compares the plans a user would pick instead (continuous checkpointing, Young, Daly,
  CheckFreq, fixed intervals on a grid: ``coci.planning.baselines.baseline_candidates``) under
  its own objective and budget, so none within the budget has a lower progress-weighted overhead
  (a baseline that wins is planned, with a note);
* a loss observed positive never falls below 0 in the planner's curve: early, noisy fits often
  extrapolate to a negative asymptote, which would put most of the run's progress in the future
  and flatten the weight.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from coci.errors import ConfigError
from coci.planning.arguments import CurveLike
from coci.planning.baselines import baseline_candidates, plan_checkfreq, plan_continuous, plan_daly, plan_young
from coci.planning.config import PlanConfig, changed_arguments
from coci.planning.failures import Failures
from coci.planning.fit import CurveFit, fit_coci_exponential
from coci.planning.formulas import (
    AutoResult,
    auto_steps,
    auto_steps_within_run_budget,
    coci_expected_progress,
    coci_minutes,
    max_interval_steps,
    min_interval_steps,
    snap_to_steps,
)
from coci.planning.levels import (
    Level,
    LevelCosts,
    TwoLevelResult,
    WholeRun,
    auto_two_level,
    charged,
    check_levels,
    level_named,
    levels_from_keywords,
    min_promote_steps,
)
from coci.planning.objective import CostModel, Overhead, TwoLevelCostModel, build_cost_model, expected_failures
from coci.planning.problem import Placement, Problem, build_problem, finish_plan, whole_run_levels
from coci.planning.records import Plan, PlanInputs
from coci.planning.three_levels import ThreeLevelCostModel, ThreeLevelResult, auto_levels, chain_levels

__all__ = ["POLICY_PLANNERS", "plan"]


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
    curve: CurveLike | None = None,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    max_overhead: float | None = None,
    start_step: int = 0,
    last_checkpoint_step: int = 0,
    failure_origin_step: int = 0,
    taken_steps: Iterable[int] | None = None,
    levels: Iterable[LevelCosts] | None = None,
    upload_seconds: float | str | None = None,
    upload_interference_seconds: float | str | None = None,
    remote_restart_seconds: float | str | None = None,
    last_promoted_step: int | None = None,
    peer_seconds: float | str | None = None,
    peer_interference_seconds: float | str | None = None,
    peer_restart_seconds: float | str | None = None,
    last_peer_step: int | None = None,
) -> Plan:
    """Plan checkpoint steps for a run of ``total_steps`` steps.

    The planning choices come either as ``config`` (a [``PlanConfig``][coci.PlanConfig]) or as the keywords
    ``policy``, ``failures``, ``total_steps``, ``restart_seconds``, ``objective``,
    ``time_budget`` and ``max_overhead`` (documented on [``PlanConfig``][coci.PlanConfig]), not both.

    Args:
        policy: ``"auto"`` (default), ``"young"``, ``"daly"``, ``"checkfreq"`` or ``"coci"``.
        config: all planning choices as one [``PlanConfig``][coci.PlanConfig], instead of the keywords.
        failures: the failure model (a [``Failures``][coci.Failures], an MTBF such as ``"8h"``, or seconds).
        total_steps: the planning horizon in steps (>= 1).
        step_seconds: the clean step time (seconds, positive; durations such as ``"6s"`` are accepted).
        stall_seconds: the snapshot stall (seconds, positive).
        persist_seconds: the background persist time (seconds, positive).
        restart_seconds: the cost of one restart (relaunch + restore), >= 0 (default 0).
        interference_seconds: extra training time one background persist costs, >= 0; the
            checkpoint cost is ``C = stall + interference``.
        curve: per-step losses, ``(steps, losses)``, a [``coci.planning.fit.CurveFit``][coci.CurveFit], or a callable
            ``v(steps)`` giving the progress rate directly. Needed by ``auto``'s progress
            objective and by ``coci``.
        objective: ``auto``'s objective: ``"progress"`` (the default; needs a loss curve) or ``"time"``.
        time_budget: ``auto``: extra expected wall-clock overhead allowed over the time-optimal plan
            (0.05 = 5%, the default); None: no cap.
        max_overhead: a cap on checkpoint cost as a share of run time, or None.
        start_step: for re-planning mid-run: plan steps after this one.
        last_checkpoint_step: for re-planning mid-run: failures before the first new commit roll back
            to this step.
        failure_origin_step: for re-planning mid-run: the step the failure clock (re)started at.
        taken_steps: for re-planning mid-run: the checkpoints the run has already taken (default:
            ``last_checkpoint_step`` alone); ``auto`` charges them to the whole run's time budget.
        levels: the storage levels above the local one, each a [``LevelCosts``][coci.LevelCosts]
            (its transfer's seconds, interference, restart and newest step). With a remote tier
            (``Level.REMOTE``) and a failure class that destroys the local tier
            ([``coci.Failures.compose``][coci.Failures.compose]), ``auto`` plans two levels
            (``Plan.promote_steps``, ``coci.planning.levels``); with a peer level too
            (``Level.PEER``), three (``Plan.peer_steps``, ``coci.planning.three_levels``); a level
            above the remote tier (``LevelCosts(level=4, ...)``) is one more (``Plan.higher_steps``;
            planned and simulated, not yet run by a session). None or empty plans a single level.
        upload_seconds: compatibility keyword, ``LevelCosts(level=Level.REMOTE, seconds=...)``
            (with ``upload_interference_seconds``, ``remote_restart_seconds`` and
            ``last_promoted_step``: its ``interference``, ``restart`` and ``last_step``).
        upload_interference_seconds: compatibility keyword (see ``upload_seconds``).
        remote_restart_seconds: compatibility keyword (see ``upload_seconds``).
        last_promoted_step: compatibility keyword (see ``upload_seconds``).
        peer_seconds: compatibility keyword, ``LevelCosts(level=Level.PEER, seconds=...)`` (with
            ``peer_interference_seconds``, ``peer_restart_seconds`` and ``last_peer_step``).
        peer_interference_seconds: compatibility keyword (see ``peer_seconds``).
        peer_restart_seconds: compatibility keyword (see ``peer_seconds``).
        last_peer_step: compatibility keyword (see ``peer_seconds``).

    Returns:
        The [``Plan``][coci.Plan]: the checkpoint steps and the numbers behind them.
    """
    choices: dict[str, Any] = dict(
        policy=policy, failures=failures, total_steps=total_steps, restart_seconds=restart_seconds,
        objective=objective, time_budget=time_budget, max_overhead=max_overhead,
    )
    if config is None:
        config = PlanConfig(**choices)
    elif changed_arguments(plan, choices):
        raise ConfigError("pass either config= or the planning choices (policy, failures, total_steps, ...), not both")
    problem = build_problem(
        config, curve,
        step_seconds=step_seconds, stall_seconds=stall_seconds, persist_seconds=persist_seconds,
        interference_seconds=interference_seconds, start_step=start_step,
        last_checkpoint_step=last_checkpoint_step, failure_origin_step=failure_origin_step,
        taken_steps=taken_steps,
        levels=_levels(levels, {
            Level.REMOTE: (upload_seconds, upload_interference_seconds, remote_restart_seconds, last_promoted_step),
            Level.PEER: (peer_seconds, peer_interference_seconds, peer_restart_seconds, last_peer_step),
        }),
    )
    return finish_plan(problem, POLICY_PLANNERS[config.policy](problem))


def _levels(levels: Iterable[LevelCosts] | None, keywords: dict[Level, tuple[Any, Any, Any, Any]]) -> tuple[LevelCosts, ...]:
    """``levels``, or the levels of the compatibility keywords; not both."""
    if levels is None:
        return levels_from_keywords(keywords)
    if any(value is not None for values in keywords.values() for value in values):
        raise ConfigError("pass either levels= or the flat level keywords (upload_seconds, peer_seconds, ...), not both")
    return check_levels(levels)


def _plan_coci(problem: Problem) -> Placement:
    """COCI as published (the time-optimal plan when the curve does not fall)."""
    steps, details, fallbacks = _coci_plan(
        problem.fit, problem.raw, problem.cost_model, problem.failures, problem.inputs.min_interval_steps
    )
    problem.details.update(details)
    problem.fallbacks.extend(fallbacks)
    return Placement(steps, "progress" if "theta1_per_minute" in details else "time")


def _plan_auto(problem: Problem) -> Placement:
    """``auto``: the convergence-aware optimum (progress objective within the time budget), or the
    time optimum for ``objective="time"`` or without a usable curve. A re-plan (``start_step > 0``)
    keeps the whole run within the budget (``_plan_rest_within_run_budget``)."""
    model, config = problem.cost_model, problem.config
    objective = config.objective
    if objective == "progress" and not model.has_progress:
        if not problem.curve_given:
            problem.fallbacks.append("no curve given: planned for the time objective")
        objective = "time"
    min_steps = problem.inputs.min_interval_steps
    if problem.three_level is not None:
        return _plan_three_levels(problem, problem.three_level, objective)
    if problem.two_level is not None:
        return _plan_two_levels(problem, problem.two_level, objective)
    max_steps = max_interval_steps(model, min_steps)
    problem.details["max_interval_steps"] = float(max_steps)
    baselines = baseline_candidates(problem) if objective == "progress" and config.time_budget is not None else None
    if objective == "progress" and config.time_budget is not None and model.start_step > 0:
        result = _plan_rest_within_run_budget(problem, config.time_budget, max_steps, baselines)
    else:
        result = auto_steps(
            model, objective=objective, time_budget=config.time_budget, min_steps=min_steps, max_steps=max_steps,
            baselines=baselines,
        )
    problem.notes.extend(result.notes)
    _record_density_bound(problem, model, result.alpha, min_steps)
    return _mixture_placement(result, objective)


def _density_bound_name(inputs: PlanInputs, min_steps: int) -> str:
    """What sets the shortest admissible interval: the persist, ``max_overhead``, or a transfer to an
    upper level (an upload or a peer copy, one in flight at a time)."""
    if math.ceil(inputs.persist_seconds / inputs.step_seconds - 1e-9) >= min_steps:
        return f"the persist ({inputs.persist_seconds:.3g} s: one in flight at a time)"
    if inputs.max_overhead is not None and math.ceil(
        inputs.checkpoint_seconds / (inputs.max_overhead * inputs.step_seconds) - 1e-9
    ) >= min_steps:
        return f"max_overhead ({inputs.max_overhead:g})"
    return "a transfer to an upper level (an upload or a peer copy: one in flight at a time)"


def _bound_share(chain: CostModel, alpha: float, min_steps: int) -> tuple[float, float]:
    """The share of ``chain``'s remaining run where the first-order optimal density
    ``sqrt(h w / 2C)`` exceeds one checkpoint per ``min_steps`` steps, and the most it exceeds it by."""
    weight = alpha * chain.weight + (1.0 - alpha)
    wanted = np.sqrt(chain.hazard * weight / (2.0 * max(chain.checkpoint_seconds, 1e-12))) * (min_steps * chain.step_seconds)
    widths = np.diff(chain.edges)
    share = float(np.dot(widths, wanted > 1.0) / widths.sum()) if widths.sum() > 0 else 0.0
    return share, float(wanted.max()) if wanted.size else 0.0


def _record_density_bound(problem: Problem, model: CostModel, alpha: float, min_steps: int) -> None:
    """Say where the shortest admissible interval (one persist in flight, or ``max_overhead``)
    holds the plan sparser than its objective asks: ``details['density_bound_share']`` is the share
    of the remaining run where the first-order optimal density ``sqrt(h w / 2C)`` exceeds one
    checkpoint per ``min_steps`` steps, ``details['density_bound_steps']`` that interval, and a
    note names the bound (the persist's seconds, or the overhead cap)."""
    share, densest = _bound_share(model, alpha, min_steps)
    problem.details.update(density_bound_share=share, density_bound_steps=float(min_steps))
    if share <= 0.0:
        return
    bound = _density_bound_name(problem.inputs, min_steps)
    problem.notes.append(
        f"density bound: {bound} allows at most one checkpoint every {min_steps} steps; over {100 * share:.2g}% of the "
        f"remaining run the plan would checkpoint more often (up to {densest:.2g}x as often), so no plan can "
        f"save the work lost there; a faster persist (a cheaper local level first) is what would"
    )


def _record_level_density_bounds(
    problem: Problem, local: CostModel, alpha: float, local_min: int, levels: list[tuple[str, CostModel, int, str]],
) -> None:
    """``_record_density_bound`` for a multi-level plan: the local chain against its persist, and
    each upper level's chain (``(name, chain, fewest steps between its copies, what sets that)``,
    each copy charged the checkpoint it needs) against the transfer one in flight at a time allows.
    ``details['density_bound_share']`` / ``['density_bound_steps']`` are the most bound level's and
    ``details['density_bound_level']`` its index (1 local, 2 peer, 3 remote, as ``Level``); a note
    names each bound level and the room the plan uses below it (the local level's checkpoints)."""
    _record_density_bound(problem, local, alpha, local_min)
    problem.details["density_bound_level"] = float(Level.LOCAL)
    most = problem.details["density_bound_share"]
    for name, chain, min_steps, bound in levels:
        share, densest = _bound_share(chain, alpha, min_steps)
        problem.details[f"{name}_density_bound_share"] = share
        if share <= 0.0:
            continue
        if share > most:
            most = share
            problem.details.update(density_bound_share=share, density_bound_steps=float(min_steps),
                                   density_bound_level=float(level_named(name)))
        problem.notes.append(
            f"density bound: {bound} allows at most one {name} copy every {min_steps} steps; over {100 * share:.2g}% "
            f"of the remaining run the {name} level would be denser (up to {densest:.2g}x as often); the plan "
            f"checkpoints locally between them (at most one every {local_min} steps) instead"
        )


def _mixture_placement(
    result: AutoResult | TwoLevelResult | ThreeLevelResult, objective: str,
    promote: np.ndarray | None = None, peer: np.ndarray | None = None,
) -> Placement:
    """An ``auto`` result as a placement: its mixture weight (progress objective only), the time
    optimum and, where bisected, the budget."""
    expected = {"time_optimal_wall_seconds": result.time_optimal_wall_seconds}
    if result.budget_wall_seconds is not None:
        expected["budget_wall_seconds"] = result.budget_wall_seconds
    return Placement(result.steps, objective, result.mu if objective == "progress" else None, expected, promote, peer)


def _plan_two_levels(problem: Problem, model: TwoLevelCostModel, objective: str) -> Placement:
    """``auto`` with a remote tier: local steps and their promoted subset (``auto_two_level``).
    A re-plan measures the time budget against the remaining steps' two-level time optimum."""
    inputs, config = problem.inputs, problem.config
    local_min = min_interval_steps(inputs.step_seconds, inputs.persist_seconds, inputs.checkpoint_seconds, config.max_overhead)
    min_promote = min_promote_steps(inputs.step_seconds, _transfer(inputs, Level.REMOTE), local_min)
    def time_optimum(whole: Any) -> float:
        return auto_two_level(whole, objective="time", min_steps=local_min, min_promote=min_promote).time_optimal_wall_seconds

    whole_run = _whole_run(problem, objective, time_optimum)
    result = auto_two_level(
        model, objective=objective, time_budget=config.time_budget, min_steps=local_min, min_promote=min_promote,
        whole_run=whole_run,
    )
    problem.details.update(min_interval_steps=float(local_min), min_promote_steps=float(min_promote))
    upload = f"the upload ({_transfer(inputs, Level.REMOTE):.3g} s: one in flight at a time)"
    _record_level_density_bounds(problem, model.local, result.alpha, local_min, [
        ("remote", charged(model.remote, model.local.checkpoint_seconds), min_promote, upload)])
    problem.notes.append(
        f"two levels: {len(result.promote)} of {len(result.steps)} checkpoints promoted to the remote tier"
    )
    _note_spent(problem, whole_run, (result.steps, result.promote))
    if model.local.start_step > 0 and objective == "progress" and config.time_budget is not None and whole_run is None:
        problem.notes.append("re-plan with a remote tier: the time budget is measured on the remaining steps")
    return _mixture_placement(result, objective, promote=result.promote)


def _whole_run(problem: Problem, objective: str, time_optimum: Callable[[Any], float]) -> WholeRun | None:
    """A multi-level re-plan's whole run (``coci.planning.levels.auto_mixture``): the checkpoints
    already taken at each level followed by the new plan, within ``1 + time_budget`` of the whole
    run's time optimum (``time_optimum`` of the whole-run model); None unless a re-plan weighing
    progress within a budget knows every level's copy history (``problem.whole_run_levels``)."""
    budget = problem.config.time_budget
    weighs = objective == "progress" and problem.model is not None and problem.model.has_progress
    found = whole_run_levels(problem) if weighs and budget is not None else None
    if found is None or budget is None:
        return None
    whole, past = found
    time_wall = time_optimum(whole)

    def expected(*plan: np.ndarray) -> Overhead:
        return whole.expected(*(np.union1d(taken, steps).astype(np.int64) for taken, steps in zip(past, plan)))

    problem.details["run_time_optimal_wall_seconds"] = time_wall
    problem.notes.append(
        f"re-plan: the time budget holds for the whole run, the {past[0].size} checkpoint(s) already taken and "
        f"{', '.join(str(steps.size) for steps in past[1:])} sent to the levels above included"
    )
    return WholeRun(expected, time_wall, (1.0 + budget) * time_wall)


def _note_spent(problem: Problem, whole_run: WholeRun | None, levels: tuple[np.ndarray, ...]) -> None:
    """A note when the copies already taken spent the whole run's budget (the rest is then time-optimal)."""
    if whole_run is not None and whole_run.expected(*levels).wall_seconds > whole_run.budget:
        problem.notes.append("the checkpoints and copies already taken spent the run's time budget: the rest is time-optimal")


def _plan_three_levels(problem: Problem, model: ThreeLevelCostModel, objective: str) -> Placement:
    """``auto`` over a chain of levels (a peer level, or a level above the remote tier): local steps
    and each level's subset of the one below (``coci.planning.three_levels.auto_levels``). A
    re-plan measures the time budget against the whole run's chain time optimum when it knows
    every level's copy history (``_whole_run``), else against the remaining steps'."""
    inputs, config = problem.inputs, problem.config
    local_min = min_interval_steps(inputs.step_seconds, inputs.persist_seconds, inputs.checkpoint_seconds, config.max_overhead)
    uppers = chain_levels(inputs)
    spacings = (local_min, *(min_promote_steps(inputs.step_seconds, record.transfer_seconds, local_min) for record in uppers))

    def time_optimum(whole: Any) -> float:
        return auto_levels(whole, spacings, objective="time").time_optimal_wall_seconds

    whole_run = _whole_run(problem, objective, time_optimum)
    result = auto_levels(model, spacings, objective=objective, time_budget=config.time_budget, whole_run=whole_run)
    _note_spent(problem, whole_run, result.levels)
    _record_chain_bounds(problem, model, uppers, spacings, result.alpha)
    steps_of = dict(zip((record.name for record in uppers), result.levels[1:]))
    parts = [f"{len(steps_of['peer'])} of {len(result.steps)} checkpoints copied to a peer"] if "peer" in steps_of else []
    if "remote" in steps_of:
        parts.append(f"{len(steps_of['remote'])} uploaded" if parts else f"{len(steps_of['remote'])} of {len(result.steps)} checkpoints uploaded")
    parts += [f"{len(steps_of[record.name])}{'' if parts else f' of {len(result.steps)} checkpoints'} sent to {record.name}"
              for record in inputs.higher_levels]
    problem.notes.append(f"{_count_word(len(result.levels))} levels: {', '.join(parts)}")
    placement = _mixture_placement(result, objective, promote=steps_of.get("remote"), peer=steps_of.get("peer"))
    return dataclasses.replace(placement, higher=tuple(steps_of[record.name] for record in inputs.higher_levels))


def _record_chain_bounds(
    problem: Problem, model: ThreeLevelCostModel, uppers: tuple[LevelCosts, ...], spacings: tuple[int, ...], alpha: float,
) -> None:
    """A chain plan's spacings in ``details`` (``min_peer_steps``, ``min_promote_steps``,
    ``min_<level>_steps``) and its density bounds (``_record_level_density_bounds``), each level's
    chain charged the levels below it."""
    keys = {"peer": "min_peer_steps", "remote": "min_promote_steps"}
    problem.details.update(min_interval_steps=float(spacings[0]))
    problem.details.update({keys.get(record.name, f"min_{record.name}_steps"): float(spacing)
                            for record, spacing in zip(uppers, spacings[1:])})
    bounds = []
    for position, (record, spacing) in enumerate(zip(uppers, spacings[1:]), start=1):
        below = sum(chain.checkpoint_seconds for chain in model.chains[:position])
        what = {"peer": "the peer copy", "remote": "the upload"}.get(record.name, f"the transfer to {record.name}")
        bound = f"{what} ({record.transfer_seconds:.3g} s: one in flight at a time)"
        bounds.append((record.name, charged(model.chains[position], below), spacing, bound))
    _record_level_density_bounds(problem, model.local, alpha, spacings[0], bounds)


def _count_word(count: int) -> str:
    """``count`` in words up to nine (a plan's note names its number of levels), else in digits."""
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    return words[count] if 0 <= count < len(words) else str(count)


def _transfer(inputs: PlanInputs, level: Level) -> float:
    """One transfer's seconds to ``level`` (0 without it)."""
    record = inputs.level(level)
    return 0.0 if record is None else record.transfer_seconds


def _plan_rest_within_run_budget(
    problem: Problem, time_budget: float, max_steps: int, baselines: dict[str, np.ndarray] | None = None
) -> AutoResult:
    """A re-plan's remaining steps, the whole run (from step 0, the checkpoints already taken
    included) within the time budget (``coci.planning.formulas.auto_steps_within_run_budget``).

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
        baselines=baselines,
    )
    problem.details["run_alpha"] = float(result.alpha)
    problem.details["taken_checkpoints"] = float(taken.size)
    problem.notes.append(
        f"re-plan: the time budget holds for the whole run, its {taken.size} checkpoint(s) already taken "
        f"included (alpha {result.alpha:.3g})"
    )
    return result


#: The function that places the checkpoints of each policy name.
POLICY_PLANNERS: dict[str, Callable[[Problem], Placement]] = {
    "auto": _plan_auto,
    "young": plan_young,
    "daly": plan_daly,
    "checkfreq": plan_checkfreq,
    "continuous": plan_continuous,
    "coci": _plan_coci,
}


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
