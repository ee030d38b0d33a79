"""The online replay carries the levels: each checkpoint goes where the plan in effect sends it,
each re-plan sees every level's copy history and holds the whole run to the time budget, and
``coci.simulate(online=True)`` plays those copies."""

from __future__ import annotations

import numpy as np
import pytest

import coci
from coci.analysis.simulate import simulate
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import Level, LevelCosts
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation

TOTAL = 1000
FRACTION = np.arange(1, TOTAL + 1) / TOTAL
LOSSES = 2.0 + 3.0 * np.exp(-20.0 * FRACTION) + 1.5 / (1.0 + np.exp((FRACTION - 0.6) * 60.0))  # two phases
COSTS = dict(step_seconds=4.0, stall_seconds=1.6, persist_seconds=30.0, restart_seconds=120.0)
REMOTE = LevelCosts(level=Level.REMOTE, seconds=200.0, interference=5.0, restart=600.0)
PEER = LevelCosts(level=Level.PEER, seconds=20.0, interference=1.0, restart=180.0)


def failures() -> Failures:
    return Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("2h")),
        FailureClass(name="node", failures=Failures.exponential("2h"), destroys=("local",)),
        FailureClass(name="multi_node", failures=Failures.exponential("6h"), destroys=("local", "peer")),
    )


class Recording(PlanningPolicy):
    """A planning policy that keeps each observation and the plan each one left in effect."""

    def __init__(self) -> None:
        super().__init__("auto", failures=failures(), total_steps=TOTAL, restart_seconds=COSTS["restart_seconds"])
        self.seen: list[tuple[Observation, coci.Plan | None]] = []

    def observe(self, observation: Observation) -> None:
        super().observe(observation)
        self.seen.append((observation, self.plan))


def offline() -> coci.Plan:
    curve = (np.arange(1, TOTAL + 1, dtype=float), LOSSES)
    return coci.plan("auto", failures=failures(), total_steps=TOTAL, curve=curve, levels=[PEER, REMOTE], **COSTS)


def test_plan_level_steps_reads_every_level_alike() -> None:
    young = coci.plan("young", failures=failures(), total_steps=TOTAL, levels=[PEER, REMOTE], **COSTS)
    assert young.level_steps("local") == young.steps
    assert young.level_steps("peer") == young.level_steps("remote") == young.steps  # every checkpoint, as level() reads it
    steps = young.steps
    plan = young.model_copy(update={"peer_steps": steps[::2], "promote_steps": steps[::4]})
    assert plan.level_steps("peer") == steps[::2] and plan.level_steps("remote") == steps[::4]
    assert plan.level_steps("level4") == plan.level_steps("level5") == steps[::4]  # no subset chosen: every upload goes on up
    chosen = plan.model_copy(update={"higher_steps": {"level4": steps[:1], "level5": []}})
    assert chosen.level_steps("level4") == steps[:1] and chosen.level_steps("level5") == []
    assert [level.name for level in map(plan.level, steps[:4])] == ["REMOTE", "LOCAL", "PEER", "LOCAL"]
    for name in ("archive", "level3", "level"):
        with pytest.raises(ConfigError, match="a storage level is named peer, remote or level<k>"):
            plan.level_steps(name)


@pytest.mark.slow  # an online run over the whole horizon, every re-plan replayed
def test_each_re_plan_sees_every_levels_copy_history_and_simulate_plays_the_copies_sent() -> None:
    """One online run (``coci.simulate`` of a policy object, failures rare): the observations carry
    each level's copy history, each re-plan charges it to the whole run's budget, a checkpoint goes
    to a level when the plan in effect sends it there, and the trials pay every copy's interference."""
    policy = Recording()
    rare = Failures.compose(*(cls.model_copy(update={"failures": Failures.exponential("1000000h")}) for cls in failures().failure_classes))
    played = simulate(policy, job=offline(), failures=rare, curve=(np.arange(1, TOTAL + 1, dtype=float), LOSSES), trials=4, seed=0)
    assert played.peer_steps is not None and played.promote_steps is not None
    peer, remote = played.peer_steps, played.promote_steps
    assert 0 < len(remote) < len(peer) <= len(played.steps)  # the re-plans chose which to copy and upload
    assert set(remote) <= set(peer) <= set(played.steps)
    planned = [(observation, plan) for observation, plan in policy.seen if observation.step > 100]
    assert len(planned) > 5
    for observation, _ in planned:
        histories = {record.level: record for record in observation.levels}
        for level, sent in ((Level.PEER, peer), (Level.REMOTE, remote)):
            record = histories[level]
            before = [s for s in sent if s < observation.step]
            assert record.taken_steps is not None and list(record.taken_steps) == before
            assert record.last_step == before[-1]  # the newest sent: committed or in flight
    replans = [plan for observation, plan in planned if plan is not None and plan.inputs.start_step == observation.step]
    assert len(replans) > 3
    assert all(any(note.startswith("re-plan: the time budget holds for the whole run") for note in plan.notes) for plan in replans)
    for step in remote:
        in_effect = [plan for observation, plan in policy.seen if observation.step <= step and plan is not None]
        assert not in_effect or step in in_effect[-1].level_steps("remote")
    paid = len(played.steps) * COSTS["stall_seconds"] + len(peer) * PEER.interference + len(remote) * REMOTE.interference
    assert played.mean("checkpoint_seconds") == pytest.approx(paid, rel=1e-6)


def test_a_re_plan_without_the_copy_history_measures_the_budget_on_the_remaining_steps() -> None:
    two = Failures.compose(*failures().failure_classes[:2])
    curve = (np.arange(1, 601, dtype=float), LOSSES[:600])
    offline = coci.plan("auto", failures=two, total_steps=TOTAL, curve=(np.arange(1, TOTAL + 1, dtype=float), LOSSES), levels=[REMOTE], **COSTS)
    assert offline.promote_steps is not None
    taken = tuple(s for s in offline.steps if s <= 600)  # the past as the offline plan placed it
    uploaded = tuple(s for s in offline.promote_steps if s <= 600)
    replan = dict(failures=two, total_steps=TOTAL, curve=curve, start_step=600, last_checkpoint_step=taken[-1], taken_steps=taken, **COSTS)
    newest = coci.plan("auto", levels=[REMOTE.model_copy(update={"last_step": uploaded[-1]})], **replan)
    assert "re-plan with a remote tier: the time budget is measured on the remaining steps" in newest.notes
    history = coci.plan("auto", levels=[REMOTE.model_copy(update={"last_step": uploaded[-1], "taken_steps": uploaded})], **replan)
    assert any(note.startswith(f"re-plan: the time budget holds for the whole run, the {len(taken)} checkpoint(s) already taken and "
                               f"{len(uploaded)} sent") for note in history.notes)
    assert history.expected["time_optimal_wall_seconds"] == history.details["run_time_optimal_wall_seconds"]
    assert history.expected["budget_wall_seconds"] == pytest.approx(1.05 * history.details["run_time_optimal_wall_seconds"])
    assert "taken_steps" not in newest.inputs.levels[0].model_dump() and history.inputs.levels[0].taken_steps == uploaded
    assert coci.Plan.model_validate_json(history.model_dump_json()) == history
    assert not any("spent the run's time budget" in note for note in history.notes) and history.mu is not None
    # a past that copied and uploaded every few steps has spent the whole run's budget: the rest is time-optimal
    dense = tuple(range(10, 600, 10))
    spent = coci.plan("auto", levels=[REMOTE.model_copy(update={"last_step": 590, "taken_steps": dense})], **{**replan, "taken_steps": dense})
    assert "the checkpoints and copies already taken spent the run's time budget: the rest is time-optimal" in spent.notes
    assert spent.mu is None  # the time-optimal rest
