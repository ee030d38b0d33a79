"""coci's planning policies observe on the planner thread (coci.planning.background): the session
follows the current plan until the new one applies, at a step fixed by the observation (observed
step + ``apply_lag_steps``), so a run's checkpoint steps never depend on how fast the planner ran."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import coci
from coci import knobs
from coci.planning.background import apply_lag_steps
from coci.planning.failures import Failures
from coci.planning.online import PlanningPolicy

STEP_SECONDS = 0.05  # the injected clock's step time


class RecordingPolicy(PlanningPolicy):
    """coci's auto policy, recording where it observed and delayed by ``delay`` real seconds."""

    def __init__(self, delay: float, **choices: Any) -> None:
        super().__init__("auto", **choices)
        self.delay = delay
        self.threads: list[str] = []

    def observe(self, observation: coci.Observation) -> None:
        time.sleep(self.delay)
        self.threads.append(threading.current_thread().name)
        super().observe(observation)


def _run(run_dir: Path, delay: float, steps: int = 260) -> tuple[coci.Session, list[tuple[int, Any]]]:
    """Train ``steps`` steps on an injected clock; return the session and (step, plan) after each."""
    now = [0.0]
    policy = RecordingPolicy(delay, failures=Failures.exponential(mtbf="2h"), total_steps=2000)
    session = coci.Session(run_dir, {"w": torch.zeros(4)}, policy=policy, clock=lambda: now[0])
    plans: list[tuple[int, Any]] = []
    for step in range(1, steps + 1):
        now[0] += STEP_SECONDS
        session.step(5.0 / math.sqrt(step))
        pending = session._checkpointer.pending
        if pending is not None:
            pending.upload_completion.exception()  # commits before the next step: same schedule each run
        plans.append((session.steps, session.plan))
    session.close()
    return session, plans


@pytest.fixture(autouse=True)
def _uncapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planning-time cap compares real planner CPU seconds with the injected clock: lift it so
    the schedule is a function of the observations alone."""
    monkeypatch.setattr(knobs, "PLANNING_TIME_FRACTION", 1e9)
    monkeypatch.setattr(knobs, "OBSERVE_EVERY_STEPS", 100)


def test_the_first_plan_applies_at_its_fixed_step_and_was_made_off_the_training_thread(tmp_path: Path) -> None:
    session, plans = _run(tmp_path, delay=0.0, steps=3 * knobs.PLAN_WARMUP_STEPS)  # past the first plan's apply step (at most warm-up + lag)
    lag = apply_lag_steps(STEP_SECONDS)
    assert lag == math.ceil(knobs.PLAN_APPLY_SECONDS / STEP_SECONDS)
    first_applied = next(step for step, plan in plans if plan is not None)
    first_plan = dict(plans)[first_applied]
    observed = first_plan.inputs.start_step  # the plan starts at the step it was observed at
    assert knobs.PLAN_WARMUP_STEPS // 2 <= observed <= knobs.PLAN_WARMUP_STEPS
    assert first_applied == observed + lag  # and is followed from exactly its apply step on
    assert isinstance(session.policy, RecordingPolicy)
    assert session.policy.threads and all(name.startswith("coci-planner") for name in session.policy.threads)


@pytest.mark.slow  # a planner slowed down on purpose
def test_a_slow_planner_changes_nothing_but_wall_time(tmp_path: Path) -> None:
    """The same observations give the same plans at the same steps, whether the planner is instant
    or slower than the apply lag (the training thread then waits at the apply step)."""
    fast, fast_plans = _run(tmp_path / "fast", delay=0.0)
    slow, slow_plans = _run(tmp_path / "slow", delay=0.3)
    assert fast.checkpoint_steps == slow.checkpoint_steps
    assert [(step, None if plan is None else plan.steps) for step, plan in fast_plans] == [
        (step, None if plan is None else plan.steps) for step, plan in slow_plans
    ]
    assert len({id(plan) for _, plan in fast_plans if plan is not None}) >= 2  # it re-planned too


def test_inline_mode_plans_on_the_training_thread_at_the_observed_step(tmp_path: Path) -> None:
    with knobs.override(PLAN_IN_BACKGROUND=False):
        session, plans = _run(tmp_path, delay=0.0, steps=40)
        first_applied, first_plan = next((step, plan) for step, plan in plans if plan is not None)
        assert first_applied == first_plan.inputs.start_step  # inline: followed from the step it was observed at
        assert session.policy.threads[0] == threading.main_thread().name


def test_a_restore_drops_the_plan_in_flight(tmp_path: Path) -> None:
    """A plan observed before a restore never applies after it (it describes the abandoned run)."""
    now = [0.0]
    state = {"w": torch.zeros(4)}
    session = coci.Session(tmp_path, state, policy=RecordingPolicy(0.0, failures=Failures.exponential(mtbf="2h"), total_steps=2000), clock=lambda: now[0])
    for step in range(1, knobs.PLAN_WARMUP_STEPS + 1):
        now[0] += STEP_SECONDS
        session.step(1.0 / step)
        if session._checkpointer.pending is not None:
            session._checkpointer.pending.upload_completion.exception()
    assert session._planner.in_flight
    result = session.restore()
    assert result is not None and not session._planner.in_flight
    for _ in range(apply_lag_steps(STEP_SECONDS) + 1):
        now[0] += STEP_SECONDS
        session.step(0.5)
    session.close()
    assert session.plan is None or session.plan.inputs.start_step > result.step
