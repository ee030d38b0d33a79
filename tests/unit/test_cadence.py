"""coci.planning.cadence.Cadence: the observation rules the Session and the replay share."""

from __future__ import annotations

import pytest

from coci import knobs
from coci.planning.cadence import Cadence


def test_first_observation_waits_for_the_profile_warmup() -> None:
    cadence = Cadence()
    clock = lambda: 100.0  # noqa: E731
    assert not cadence.observe_at_step(5, knobs.PLAN_WARMUP_STEPS - 1, warming_up=False, elapsed=clock)
    assert cadence.observe_at_step(5, knobs.PLAN_WARMUP_STEPS, warming_up=False, elapsed=clock)


def test_then_every_n_steps_while_planning_is_affordable() -> None:
    cadence = Cadence(observe_every=50)
    cadence.record_observation(20, seconds=0.0)
    wall = [100.0]
    assert not cadence.observe_at_step(69, 69, warming_up=False, elapsed=lambda: wall[0])
    assert cadence.observe_at_step(70, 70, warming_up=False, elapsed=lambda: wall[0])
    cadence.record_observation(70, seconds=knobs.PLANNING_TIME_FRACTION * 100.0 + 1e-3)
    assert not cadence.observe_at_step(120, 120, warming_up=False, elapsed=lambda: wall[0])  # over budget
    wall[0] = 1_000.0  # the job ran on; planning is again a small share of it
    assert cadence.observe_at_step(120, 120, warming_up=False, elapsed=lambda: wall[0])


def test_collective_cadence_has_no_commit_observation_and_no_cap() -> None:
    cadence = Cadence(collective=True, observe_every=10)
    cadence.record_observation(20, seconds=1e9)
    assert not cadence.observe_after_commit(lambda: 1.0)
    assert cadence.observe_at_step(30, 30, warming_up=False, elapsed=lambda: 1.0)
    assert Cadence().observe_after_commit(lambda: 1.0)


def test_restart_observes_again_after_the_warmup() -> None:
    cadence = Cadence(observe_every=500)
    cadence.record_observation(700, seconds=0.0)
    cadence.restart()
    assert cadence.observe_at_step(701, knobs.PLAN_WARMUP_STEPS, warming_up=False, elapsed=lambda: 10.0)


@pytest.mark.parametrize(
    ("warming_up", "in_flight", "stalled", "skip"),
    [(False, True, 99.0, False), (True, True, 0.0, True), (True, False, 0.0, False), (True, False, 50.0, True)],
)
def test_warmup_checkpoints_never_wait_and_respect_the_stall_budget(warming_up: bool, in_flight: bool, stalled: float, skip: bool) -> None:
    decision = Cadence.skip_warmup_checkpoint(
        warming_up=warming_up, persist_in_flight=in_flight, stalled_seconds=stalled, elapsed=lambda: 100.0
    )
    assert decision is skip


def test_warming_up_answers_as_the_warms_up_protocol_does() -> None:
    """``warming_up`` (read at every step) agrees with ``isinstance(policy, WarmsUp) and policy.warming_up``."""
    from coci import EveryN
    from coci.config import SessionConfig, session_policy
    from coci.planning.arguments import WarmsUp, warming_up

    auto = session_policy(SessionConfig.from_options(mtbf="8h", total_steps=1000))
    assert isinstance(auto, WarmsUp) and auto.warming_up and warming_up(auto) is True
    every = EveryN(5)
    assert not isinstance(every, WarmsUp) and warming_up(every) is False
