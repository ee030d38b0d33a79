"""Online re-planning in the simulator (see ``coci.analysis.simulate``): the schedule a policy
object produces when replayed step by step as [``coci.Session``][coci.Session] drives it, seeing only the past.

With storage levels above the local one (``Job.levels``) the replay sends the copies as a session
does: each checkpoint goes to each level the plan in effect sends it to
([``Plan.level_steps``][coci.Plan.level_steps]; before the first plan, every level), and each
observation carries every level's measured costs (``Profile.levels``) and its copy history
(``LevelCosts.taken_steps``: every step sent to it so far; ``last_step`` the newest, its transfer
committed or in flight), so a re-plan places the next copies from the last one made and holds the
whole run, every level's copies included, to the time budget. The trials then play the copies'
transfers and their interference (``coci.analysis.simulate_levels``). Both matter
(``benchmarks/level_budget.py --online``, the budget test's curve shapes, expected wall over the
time optimum): with ``last_step`` the newest *committed* copy a re-plan made while an upload is in
flight places another one at once (up to 1.163); without ``taken_steps`` each re-plan measures the
budget on the remaining steps only (up to 1.072); with both, at most 1.050. A session's
observation carries the same values (``coci.planning.policy.sent_levels`` of each level's
``StorageLevel.sent_steps``, with what the run's earlier processes sent, saved in each
checkpoint: ``coci.checkpoint.storage_level.LevelHistories``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coci import checks, knobs
from coci.analysis.simulated_job import Job
from coci.errors import ConfigError
from coci.planning.arguments import warming_up
from coci.planning.cadence import Cadence, ElapsedClock
from coci.planning.empirical import curve_pair
from coci.planning.fit import CurveFit
from coci.planning.levels import LevelCosts
from coci.planning.online import make_policy
from coci.planning.policy import Observation
from coci.planning.records import Plan, PlanInputs
from coci.profiler import Estimate, LevelEstimates, Profile
from coci.profiler import knobs as profiler_knobs
from coci.profiler.loss_trace import LossTrace

__all__ = ["OnlineRun", "online_policy", "online_run", "online_schedule", "online_trace"]


class _RevealedTrace:
    """A loss trace revealed as training goes: a point at step ``s`` is seen from step ``s`` on."""

    def __init__(self, losses: Any) -> None:
        steps, values = (np.zeros(0), np.zeros(0)) if losses is None else curve_pair(losses, None)
        keep = steps >= 1  # the profiler counts completed steps from 1
        steps, values = steps[keep], values[keep]
        order = np.argsort(steps, kind="stable")
        self._steps, self._values = steps[order], values[order]
        self._trace = LossTrace()
        self._fed = 0

    def curve(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The profiler's curve of the points seen by ``step``."""
        end = int(np.searchsorted(self._steps, step, side="right"))
        if end > self._fed:
            self._trace.extend(self._steps[self._fed : end], self._values[self._fed : end])
            self._fed = end
        return self._trace.curve()


@dataclass
class _LevelCopies:
    """One storage level's copies in the replay: the steps sent to it so far."""

    record: LevelCosts
    sent: list[int] = field(default_factory=list)

    def history(self) -> LevelCosts:
        """The level's copy history as an observation carries it: every step sent so far, the
        newest one (committed or in flight) its ``last_step``."""
        return LevelCosts(level=self.record.level, last_step=self.sent[-1] if self.sent else None, taken_steps=tuple(self.sent))


@dataclass(frozen=True)
class OnlineRun:
    """What an online replay took: the checkpoint ``steps``, the ``observations`` made, and per
    level above the local one (``LevelCosts.name``) the steps sent to it."""

    steps: np.ndarray
    observations: int
    level_steps: dict[str, np.ndarray]


class _OnlineReplay:
    """A policy driven step by step as [``coci.Session``][coci.Session] drives it, on the failure-free run,
    observing on a ``Cadence``."""

    def __init__(self, policy: Any, job: Job, trace: _RevealedTrace, cadence: Cadence, plan_seconds: float) -> None:
        self.policy = policy
        self.job = job
        self.trace = trace
        self.cadence = cadence
        self.plan_seconds = plan_seconds
        self.commit_lag = max(1, math.ceil(job.window_progress / job.step_seconds - 1e-9))  # steps a persist spans
        self.taken: list[int] = []
        self.commit_step: int | None = None  # step at which the persist in flight commits
        self.observations = 0
        self.levels = [_LevelCopies(record) for record in job.levels]
        self.level_paid = 0.0  # the transfers' interference paid so far (training seconds)
        self._planned: tuple[Plan | None, dict[str, frozenset[int]]] = (None, {})  # _planned_steps' plan and its sets

    def run(self) -> OnlineRun:
        """What the whole run took (``OnlineRun``)."""
        for step in range(1, self.job.total_steps + 1):
            self._advance(step)
        sent = {level.record.name: np.asarray(level.sent, dtype=np.int64) for level in self.levels}
        return OnlineRun(np.asarray(self.taken, dtype=np.int64), self.observations, sent)

    def _advance(self, step: int) -> None:
        committed = self.commit_step is not None and step >= self.commit_step
        if committed:
            self.commit_step = None
        planned = self.policy.should_checkpoint(step)  # asked before any re-plan at this step, as the session does
        if self._observe_due(step, committed):
            self._observe(step)
        last = step == self.job.total_steps
        if not last and (planned or self.policy.should_checkpoint(step)) and not self._warmup_skipped(step):
            self.taken.append(step)
            self.commit_step = step + self.commit_lag
            self._send(step)

    def _send(self, step: int) -> None:
        """Checkpoint ``step`` to each level the current plan sends it to (no plan: every level)."""
        planned = self._planned_steps()
        for level in self.levels:
            if planned is None or step in planned[level.record.name]:
                level.sent.append(step)
                self.level_paid += level.record.interference

    def _planned_steps(self) -> dict[str, frozenset[int]] | None:
        """Each level's steps in the plan in effect (None: no plan), built once per plan."""
        plan = getattr(self.policy, "plan", None)
        if not isinstance(plan, Plan):
            return None
        if self._planned[0] is not plan:
            self._planned = (plan, {level.record.name: frozenset(plan.level_steps(level.record.name)) for level in self.levels})
        return self._planned[1]

    def _wall_clock(self, step: int, per_checkpoint: float) -> ElapsedClock:
        """Failure-free wall time at ``step``: steps, ``per_checkpoint`` seconds per checkpoint taken,
        and the planning charged so far."""
        return lambda: step * self.job.step_seconds + len(self.taken) * per_checkpoint + self.level_paid + self.cadence.planning_seconds

    def _observe_due(self, step: int, committed: bool) -> bool:
        elapsed = self._wall_clock(step, self.job.stall_seconds + self.job.interference_seconds)
        if committed and self.cadence.observe_after_commit(elapsed):
            return True
        return self.cadence.observe_at_step(step, step, warming_up(self.policy), elapsed)

    def _warmup_skipped(self, step: int) -> bool:
        return Cadence.skip_warmup_checkpoint(
            warming_up=warming_up(self.policy),
            persist_in_flight=self.commit_step is not None,
            stalled_seconds=len(self.taken) * self.job.stall_seconds,
            elapsed=self._wall_clock(step, self.job.stall_seconds),
        )

    def _observe(self, step: int) -> None:
        loss_steps, losses = self.trace.curve(step)
        observation = Observation(
            step=step,
            profile=_replay_profile(self.job, step),
            loss_steps=loss_steps,
            losses=losses,
            checkpoint_steps=tuple(self.taken),
            levels=tuple(level.history() for level in self.levels),
        )
        self.policy.observe(observation)
        self.observations += 1
        timed = step > profiler_knobs.WARMUP_STEPS  # before, a planning policy has no step time and returns at once
        self.cadence.record_observation(step, self.plan_seconds if timed else 0.0)


def _replay_profile(job: Job, step: int) -> Profile:
    """The profile at ``step``: the job's costs as measured values (no step time during the
    profiler's warm-up, which times no step)."""
    timed_steps = step - profiler_knobs.WARMUP_STEPS
    return Profile(
        steps=step,
        step_seconds=Estimate(value=job.step_seconds, count=timed_steps) if timed_steps >= 1 else Estimate(),
        stall_seconds=Estimate(value=job.stall_seconds, count=1),
        persist_seconds=Estimate(value=job.persist_seconds, count=1),
        interference=Estimate(value=job.slowdown, count=1),
        restore_seconds=Estimate(value=job.restart_seconds, count=1),
        levels=tuple(_measured(record) for record in job.levels),
    )


def _measured(record: LevelCosts) -> LevelEstimates:
    """A level's costs as the profiler measures them: a transfer's seconds, the slow-down of the
    steps it overlaps (``interference`` over the transfer) and the restore (the level's restart)."""
    seconds = record.transfer_seconds
    ratio = seconds / (seconds - record.interference) if 0.0 < record.interference < seconds else 1.0
    return LevelEstimates(
        name=record.name,
        seconds=Estimate(value=seconds, count=1),
        interference=Estimate(value=ratio, count=1),
        restore_seconds=Estimate(value=record.restart, count=1),
    )


def online_schedule(
    policy: Any,
    job: Job | PlanInputs,
    losses: Any,
    *,
    observe_every: int | None = None,
    plan_seconds: float | None = None,
) -> tuple[np.ndarray, int]:
    """Checkpoint steps a policy takes when driven as [``coci.Session``][coci.Session] drives it.

    ``losses``: per-step losses or ``(steps, losses)`` (the trace training reveals; a point at
    step ``s`` is seen from step ``s`` on). Returns ``(steps, observations)``. The policy observes on
    the session's ``Cadence`` (warm-up, after each commit and every
    ``observe_every`` steps, default ``knobs.OBSERVE_EVERY_STEPS``), each observation charged
    ``plan_seconds`` against the planning-time cap; see the module docstring. The profile carries
    the job's costs as measured values.
    """
    run = online_run(policy, job, losses, observe_every=observe_every, plan_seconds=plan_seconds)
    return run.steps, run.observations


def online_run(
    policy: Any,
    job: Job | PlanInputs,
    losses: Any,
    *,
    observe_every: int | None = None,
    plan_seconds: float | None = None,
) -> OnlineRun:
    """``online_schedule`` with the steps sent to each level above the local one (module docstring)."""
    figures = job if isinstance(job, Job) else Job.of(job)
    every = checks.optional_integer(observe_every, "observe_every", minimum=1)
    charge = checks.number(knobs.SIMULATE_PLAN_SECONDS if plan_seconds is None else plan_seconds, "plan_seconds")
    replay = _OnlineReplay(policy, figures, _RevealedTrace(losses), Cadence(observe_every=every), charge)
    return replay.run()


def online_trace(trace: Any, plan: Plan | None, target: Any, job: Job) -> Any:
    """The loss trace an online replay reveals: a trace as given, a usable fit's curve over the
    run, or None where the policy does not need one."""
    if not (trace is None or isinstance(trace, CurveFit) or callable(trace)):
        return trace
    if isinstance(trace, CurveFit) and trace.usable:
        steps = np.arange(1, job.total_steps + 1)
        return steps, trace.loss(steps)
    if _needs_trace(plan, target):
        raise ConfigError("losses: online replay needs the loss trace (per-step losses or (steps, losses))")
    return None


def _needs_trace(plan: Plan | None, target: Any) -> bool:
    name = plan.policy if plan is not None else getattr(target, "policy", None)
    objective = plan.objective if plan is not None else getattr(target, "objective", None)
    return name == "coci" or (name == "auto" and objective == "progress")


def online_policy(plan: Plan) -> Any:
    fell_back = any("time objective" in f for f in plan.fallbacks)
    objective = "progress" if fell_back else plan.objective
    inputs = plan.inputs
    return make_policy(
        plan.policy,
        failures=inputs.failures,
        total_steps=inputs.total_steps,
        restart_seconds=inputs.restart_seconds,
        objective=objective,
        time_budget=plan.time_budget,
        max_overhead=inputs.max_overhead,
    )
