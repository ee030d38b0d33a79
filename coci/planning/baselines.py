"""The classical and published baselines: Young's and Daly's periodic intervals, CheckFreq's
overhead-bounded interval, ``CheckFreqAdaptation`` (CheckFreq's online adaptation of it), and
continuous checkpointing (the next checkpoint as soon as the previous one is durable, as Orbax and
MaxText do)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from coci.planning.failures import Failures
from coci.planning.formulas import checkfreq_interval, checkfreq_steps, daly_interval_seconds, periodic_steps, young_interval_seconds
from coci.planning.objective import build_cost_model, expected_failures
from coci.planning.problem import Placement, Problem, single_level_cost, warned_expected
from coci.planning.records import Plan

__all__ = ["CheckFreqAdaptation", "baseline_candidates", "plan_checkfreq", "plan_continuous", "plan_daly", "plan_young"]

#: CheckFreq's overhead threshold (its authors' 5%) when max_overhead is not given.
_CHECKFREQ_MAX_OVERHEAD: float = 0.05

#: Fixed intervals ``auto`` compares itself with: a geometric grid this many per doubling, from the
#: shortest admissible interval to ``_FIXED_GRID_YOUNG_MULTIPLE`` times Young's (and the round
#: numbers 1, 2, 5 x 10^k a user picks for ``save_steps`` in that range).
_FIXED_GRID_PER_DOUBLING: int = 2
_FIXED_GRID_YOUNG_MULTIPLE: float = 4.0

#: Fixed-interval candidates holding more checkpoints than this are not compared (memory and time).
_FIXED_GRID_MAX_CHECKPOINTS: int = 200_000


def plan_young(problem: Problem) -> Placement:
    """Young: ``T = sqrt(2 C / lambda)``, periodic."""
    seconds = young_interval_seconds(single_level_cost(problem.inputs), problem.failures.rate)
    return _periodic(problem, seconds)


def plan_daly(problem: Problem) -> Placement:
    """Daly's exact optimum for exponential failures, periodic."""
    seconds = daly_interval_seconds(single_level_cost(problem.inputs), problem.failures.mean_seconds)
    return _periodic(problem, seconds)


def plan_continuous(problem: Problem) -> Placement:
    """Continuous checkpointing: a checkpoint every ``min_interval_steps`` steps, the densest any
    plan may be (the next snapshot as soon as the previous persist commits; with ``max_overhead``,
    no denser than that cap). Blind to failures and to the loss; every checkpoint costs training
    ``C = stall + interference``, so with a persist always in flight training runs slowed the
    whole run, and the expected costs count that."""
    inputs = problem.inputs
    interval = inputs.min_interval_steps
    problem.details.update(interval_steps=float(interval), interval_seconds=interval * inputs.step_seconds)
    problem.notes.append(
        f"continuous: a checkpoint every {interval} steps (as soon as the previous persist of "
        f"{inputs.persist_seconds:.3g} s commits), each costing training {single_level_cost(inputs):.3g} s"
    )
    steps = periodic_steps(interval, inputs.start_step, inputs.total_steps, anchor=inputs.last_checkpoint_step)
    return Placement(steps, "time")


def _periodic(problem: Problem, seconds: float) -> Placement:
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
    return Placement(steps, "time")


def baseline_candidates(problem: Problem) -> dict[str, np.ndarray]:
    """The plans a user would pick instead of ``auto``, over the problem's remaining steps: continuous
    checkpointing, Young, Daly, CheckFreq and fixed intervals on a grid (see
    ``_FIXED_GRID_PER_DOUBLING``); ``auto`` compares them under its own objective and budget
    (``coci.planning.formulas.auto_steps``), so none of them within the budget beats it there."""
    inputs = problem.inputs
    step, least, span = inputs.step_seconds, inputs.min_interval_steps, inputs.total_steps - inputs.start_step
    cost, failures = single_level_cost(inputs), problem.failures
    young = max(least, int(round(young_interval_seconds(cost, failures.rate) / step)))
    named = {
        "continuous": least,
        "young": young,
        # Daly's interval to first order, sqrt(2 C M) - C (the exact one imports scipy.special on the planner thread)
        "daly": max(least, int(round((math.sqrt(2.0 * cost * failures.mean_seconds) - cost) / step))),
    }
    ratio = 2.0 ** (1.0 / _FIXED_GRID_PER_DOUBLING)
    longest = max(least, int(_FIXED_GRID_YOUNG_MULTIPLE * young))
    grid = {int(round(least * ratio**k)) for k in range(int(math.log(longest / least, ratio)) + 2)}
    grid |= {m * 10**e for e in range(int(math.log10(longest)) + 1) for m in (1, 2, 5) if least <= m * 10**e <= longest}
    named.update({f"every {k} steps": k for k in sorted(grid) if k not in named.values()})
    plans = {
        name: periodic_steps(k, inputs.start_step, inputs.total_steps, anchor=inputs.last_checkpoint_step)
        for name, k in named.items() if span / k <= _FIXED_GRID_MAX_CHECKPOINTS
    }
    first = checkfreq_interval(inputs.stall_seconds, inputs.persist_seconds, step)
    if span / first <= _FIXED_GRID_MAX_CHECKPOINTS:
        plans["checkfreq"], _ = checkfreq_steps(
            max(first, least), checkpoint_seconds=inputs.checkpoint_seconds, step_seconds=step,
            max_overhead=_checkfreq_threshold(inputs.max_overhead), start_step=inputs.start_step,
            total_steps=inputs.total_steps, anchor=max(inputs.start_step, problem.last_checkpoint_step),
        )
    return plans


def _checkfreq_threshold(max_overhead: float | None) -> float:
    return _CHECKFREQ_MAX_OVERHEAD if max_overhead is None else max_overhead


def plan_checkfreq(problem: Problem) -> Placement:
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
    return Placement(steps, "time")


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
