"""No gap after warm-up: ``auto`` checkpoints at the warm-up cadence's last interval until its first
plan is in effect; a plan made on the planner thread never starts with steps already past (moved
to the step it takes effect, or dropped when a checkpoint was taken since, and noted); a skipped
warm-up checkpoint leaves a ``warmup_skip`` event and a line in the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

import coci
from coci import knobs
from coci.events import read_events
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation
from coci.profiler import Profiler
from coci.profiler import knobs as profiler_knobs

WARMUP = knobs.PLAN_WARMUP_CHECKPOINT_STEPS
LAST_INTERVAL = WARMUP[-1] - WARMUP[-2]


class _Clock:
    """A seconds clock that moves only when told: a step of training, a snapshot's copy."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Costly:
    """State whose capture takes ``seconds`` of the fake clock: a checkpoint stall the plan sees."""

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds

    def state_dict(self) -> dict[str, Any]:
        self.clock.now += self.seconds
        return {"n": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def run_auto(run_dir: Path, steps: int) -> tuple[list[int], int]:
    """``auto`` over a run whose step time is measured only after 40 steps (the profiler's warm-up),
    so its first plan comes late; the checkpoints taken and the step the first plan took effect."""
    clock = _Clock()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = {"model": model, "optimizer": optimizer, "costly": _Costly(clock, 0.05)}  # 5% of a step: within the warm-up's stall budget
    with profiler_knobs.override(WARMUP_STEPS=40):
        session = coci.Session(run_dir, state=state, policy="auto", mtbf="2h", total_steps=2000, clock=clock)
        for step in range(steps):
            optimizer.zero_grad()
            loss = model(torch.ones(1, 2)).sum() ** 2
            loss.backward()
            optimizer.step()
            clock.now += 1.0
            session.step(10.0 / (step + 1))
            session.wait()  # no warm-up checkpoint skipped for a persist in flight
        taken = list(session.checkpoint_steps)
        session.close()
    first_plan = min(event["step"] for event in read_events(run_dir) if event["event"] == "plan")
    return taken, first_plan


def test_the_warm_up_cadence_goes_on_until_the_first_plan_is_in_effect(tmp_path: Path) -> None:
    taken, first_plan = run_auto(tmp_path, 120)
    assert first_plan > WARMUP[-1] + LAST_INTERVAL  # the slow first plan this test is about
    before = [step for step in taken if step <= first_plan]
    assert before[: len(WARMUP) + 2] == [*WARMUP, WARMUP[-1] + LAST_INTERVAL, WARMUP[-1] + 2 * LAST_INTERVAL]
    gaps = np.diff([0, *before, first_plan])
    assert gaps.max() <= LAST_INTERVAL, before
    assert [event for event in read_events(tmp_path) if event["event"] == "warmup_skip"] == []


def observed_policy(step: int) -> PlanningPolicy:
    """A ``young`` policy whose first plan was made from the observation at ``step``."""
    profiler = Profiler(warmup_steps=0)
    profiler.replay(step_seconds=np.ones(50))
    policy = PlanningPolicy("young", failures=coci.Failures.exponential("20min"), total_steps=2000)
    policy.observe(Observation(step=step, profile=profiler.profile, checkpoint_steps=(1, 2, 4, 8, 16)))
    assert policy.plan is not None and policy.plan.steps[0] > step
    return policy


def test_planned_steps_passed_before_the_plan_takes_effect_move_to_that_step() -> None:
    policy = observed_policy(30)
    assert policy.plan is not None
    first, second = policy.plan.steps[:2]
    policy.take_effect(first + 2, (1, 2, 4, 8, 16))
    assert policy.plan.steps[:2] == [first + 2, second]
    assert policy.should_checkpoint(first + 2) and not policy.should_checkpoint(first)
    assert f"planned at step 30, in effect from step {first + 2}: planned step(s) [{first}] had passed; moved to step {first + 2}" in policy.plan.notes
    policy.take_effect(second + 5, (1, 2, 4, 8, 16, first + 2))  # once per plan: the next apply changes nothing
    assert policy.plan.steps[1] == second


def test_planned_steps_passed_are_dropped_when_a_checkpoint_was_taken_since() -> None:
    policy = observed_policy(30)
    assert policy.plan is not None
    first, second = policy.plan.steps[:2]
    policy.take_effect(first + 2, (1, 2, 4, 8, 16, first + 1))  # a warm-up checkpoint after the planned one
    assert policy.plan.steps[0] == second
    assert any(note.endswith(f"dropped (checkpoint taken at step {first + 1})") for note in policy.plan.notes)


def test_a_skipped_warm_up_checkpoint_is_an_event_and_a_report_line(tmp_path: Path) -> None:
    clock = _Clock()
    state = {"costly": _Costly(clock, 0.5)}  # 0.5 s stall a step of 1 s: past the warm-up's stall budget
    with coci.Session(tmp_path, state=state, policy="auto", mtbf="2h", total_steps=2000, clock=clock) as session:
        for _ in range(12):
            clock.now += 1.0
            session.step(1.0)
            session.wait()
    skips = [event for event in read_events(tmp_path) if event["event"] == "warmup_skip"]
    assert skips and {event["reason"] for event in skips} == {"stall_budget"}
    assert set(session.checkpoint_steps).isdisjoint(event["step"] for event in skips)
    summary = coci.report(tmp_path).summary()
    steps = ", ".join(str(event["step"]) for event in skips)
    assert f"warm-up checkpoints skipped: {len(skips)} at steps {steps} (stall budget {len(skips)})" in summary
