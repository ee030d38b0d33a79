"""A level above the remote tier over any increasing subset of the levels below it: the common
single-node chain (local disk, an object store, a second store) plans and simulates ``level4``
without the peer level, as do local, peer and ``level4``, and local and ``level4`` alone."""

from __future__ import annotations

import numpy as np
import pytest
from exact_optimum import optimal_three_level

import coci
from coci.analysis.simulate import simulate
from coci.analysis.simulate_levels import LOCAL, REMOTE, restore_levels
from coci.analysis.simulated_job import Job
from coci.errors import ConfigError
from coci.planning.config import PlanConfig
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import Level, LevelCosts
from coci.planning.online import PlanningPolicy
from coci.planning.problem import build_problem

COSTS = dict(total_steps=1500, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0, interference_seconds=0.2,
             restart_seconds=60.0)
PEER = LevelCosts(level=Level.PEER, seconds=10.0, interference=0.5, restart=90.0)
REMOTE_TIER = LevelCosts(level=Level.REMOTE, seconds=60.0, interference=2.0, restart=300.0)
ARCHIVE = LevelCosts(level=4, seconds=300.0, interference=3.0, restart=900.0)


def every_depth(region: str = "10h") -> Failures:
    """A class of each depth: a process crash, a node loss, several nodes, a region (the remote tier too)."""
    return Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("8h")),
        FailureClass(name="node", failures=Failures.exponential("6h"), destroys=("local",)),
        FailureClass(name="multi-node", failures=Failures.exponential("20h"), destroys=("local", "peer")),
        FailureClass(name="region", failures=Failures.exponential(region), destroys=("local", "peer", "remote")),
    )


def test_local_remote_and_level4_plan_level4_nested_in_the_uploads() -> None:
    plan = coci.plan(failures=every_depth(), objective="time", **COSTS, levels=[ARCHIVE, REMOTE_TIER])
    assert plan.inputs.levels == (REMOTE_TIER, ARCHIVE) and plan.peer_steps is None
    assert plan.promote_steps is not None and plan.higher_steps is not None
    archived = plan.higher_steps["level4"]
    assert archived and set(archived) < set(plan.promote_steps) < set(plan.steps)
    assert min(np.diff(archived)) >= plan.details["min_level4_steps"] == 150  # 300 s / 2 s: one in flight
    assert plan.expected["level4_copies"] == len(archived) and plan.expected["promotions"] == len(plan.promote_steps)
    assert "peer_copies" not in plan.expected
    # without the peer level the remote chain takes the node and the multi-node classes, level4 the region's
    run = COSTS["total_steps"] * COSTS["step_seconds"]
    assert plan.expected["remote_failures"] == pytest.approx(run / (6 * 3600) + run / (20 * 3600), rel=1e-6)
    assert plan.expected["level4_failures"] == pytest.approx(run / (10 * 3600), rel=1e-6)
    assert any(note.startswith(f"three levels: {len(plan.promote_steps)} of {len(plan.steps)} checkpoints uploaded, "
                               f"{len(archived)} sent to level4") for note in plan.notes)
    assert coci.Plan.model_validate_json(plan.model_dump_json()) == plan


def test_local_remote_and_level4_is_simulated() -> None:
    failures = every_depth("5h")
    plan = coci.plan(failures=failures, objective="time", **COSTS, levels=[REMOTE_TIER, ARCHIVE])
    assert plan.higher_steps is not None and len(plan.higher_steps["level4"]) > 2
    played = simulate(plan, failures=failures, trials=300, seed=5)
    assert played.higher_steps == plan.higher_steps and played.promote_steps == plan.promote_steps
    assert not any("sent to level4" in note or "restores locally" in note for note in played.notes)
    assert played.metrics["wall_seconds"].mean == pytest.approx(plan.expected["wall_seconds"], rel=0.3)
    # without copies on level4 a region failure rolls back to the start
    never = simulate(plan.model_copy(update={"higher_steps": {"level4": []}}), failures=failures, trials=300, seed=5)
    assert never.metrics["lost_seconds"].mean > 2 * played.metrics["lost_seconds"].mean


def test_a_class_restores_from_the_lowest_level_the_job_has_above_what_it_destroys() -> None:
    failures = every_depth()
    job = Job.of(coci.plan("young", failures="8h", **COSTS, levels=[REMOTE_TIER, ARCHIVE]).inputs)
    assert restore_levels(failures, job).tolist() == [LOCAL, REMOTE, REMOTE, REMOTE + 1]
    alone = Job.of(coci.plan("young", failures="8h", **COSTS, levels=[ARCHIVE]).inputs)
    assert restore_levels(failures, alone).tolist() == [LOCAL, REMOTE + 1, REMOTE + 1, REMOTE + 1]


@pytest.mark.parametrize("below", [(PEER,), ()], ids=["local+peer+level4", "local+level4"])
def test_level4_over_the_peer_level_or_the_local_tier_alone(below: tuple[LevelCosts, ...]) -> None:
    failures = every_depth()
    plan = coci.plan(failures=failures, objective="time", **COSTS, levels=[*below, ARCHIVE])
    assert plan.promote_steps is None and plan.higher_steps is not None
    under = plan.peer_steps if below else plan.steps
    assert under is not None and plan.higher_steps["level4"] and set(plan.higher_steps["level4"]) <= set(under)
    played = simulate(plan, failures=failures, trials=200, seed=3)
    assert played.higher_steps == plan.higher_steps and not any("restores locally" in note for note in played.notes)
    assert played.metrics["wall_seconds"].mean == pytest.approx(plan.expected["wall_seconds"], rel=0.3)


def test_a_level_above_the_remote_tier_is_still_checked() -> None:
    with pytest.raises(ConfigError, match=r"levels\[1\].seconds: a transfer to level4 takes at least as long as one to remote"):
        coci.plan(failures="8h", **COSTS, levels=[REMOTE_TIER, ARCHIVE.model_copy(update={"seconds": 30.0})])
    with pytest.raises(ConfigError, match=r"levels\[0\].level: the level above the remote tier is rank 4, got 5"):
        coci.plan(failures="8h", **COSTS, levels=[ARCHIVE.model_copy(update={"level": 5})])
    with pytest.raises(ConfigError, match="class 'region' destroys local\\+peer\\+remote"):
        coci.plan(failures=every_depth(), **COSTS, levels=[PEER])


#: The budget horizon: the exact DP over (step, level) is cubic in it.
BUDGET_STEPS = 200


@pytest.mark.slow  # auto's plan and the exact DP, cubic in the 200 steps (~1.3 s per shape)
@pytest.mark.parametrize("shape", ["fast early fall", "two phases"])
def test_local_remote_and_level4_plan_stays_within_the_budget_of_the_exact_time_optimum(shape: str) -> None:
    """``auto``'s local + remote + ``level4`` plan (weighing progress within a 5% budget) against
    the exact time optimum over every (step, level) assignment of the same chain model."""
    fraction = np.arange(1, BUDGET_STEPS + 1) / BUDGET_STEPS
    losses = {"fast early fall": 2.0 + 8.0 * np.exp(-40.0 * fraction),
              "two phases": 2.0 + 3.0 * np.exp(-20.0 * fraction) + 1.5 / (1.0 + np.exp((fraction - 0.6) * 60.0))}[shape]
    curve = (np.arange(1, BUDGET_STEPS + 1, dtype=float), losses)
    failures = Failures.compose(
        FailureClass(name="process", failures=Failures.exponential(40.0)),
        FailureClass(name="node", failures=Failures.exponential(120.0), destroys=("local",)),
        FailureClass(name="region", failures=Failures.exponential(300.0), destroys=("local", "peer", "remote")),
    )
    costs = dict(step_seconds=1.0, stall_seconds=0.3, persist_seconds=1.0)
    levels = (LevelCosts(level=Level.REMOTE, seconds=4.0, interference=1.0, restart=20.0),
              LevelCosts(level=4, seconds=8.0, interference=2.0, restart=40.0))
    plan = coci.plan(failures=failures, total_steps=BUDGET_STEPS, curve=curve, restart_seconds=5.0, **costs, levels=levels)
    assert plan.higher_steps is not None and plan.promote_steps is not None
    assert set(plan.higher_steps["level4"]) <= set(plan.promote_steps) <= set(plan.steps)
    config = PlanConfig(policy="auto", failures=failures, total_steps=BUDGET_STEPS, restart_seconds=5.0)
    problem = build_problem(config, curve, interference_seconds=0.0, start_step=0, last_checkpoint_step=0,
                            failure_origin_step=0, levels=levels, **costs)
    model = problem.three_level
    assert model is not None and model.names == ("local", "remote", "level4")
    spacing = dict(min_steps=int(plan.details["min_interval_steps"]), min_peer=int(plan.details["min_promote_steps"]),
                   min_promote=int(plan.details["min_level4_steps"]))
    *_, time_optimum = optimal_three_level(model, alpha=0.0, **spacing)
    chosen = model.expected(np.asarray(plan.steps), np.asarray(plan.promote_steps), np.asarray(plan.higher_steps["level4"]))
    assert chosen.wall_seconds == pytest.approx(plan.expected["wall_seconds"])
    assert chosen.wall_seconds <= 1.05 * time_optimum * 1.001


@pytest.mark.slow  # an online run over 300 steps, every re-plan replayed (~3 s)
def test_an_online_run_re_plans_level4_without_the_peer_level() -> None:
    """The replay's observations measure level4 as a session's profile does, so each re-plan of
    local + remote + ``level4`` plans it (before, none could: the region class destroys every level
    a plan without ``level4`` has) and the trials play the copies sent."""
    total = 300
    fraction = np.arange(1, total + 1) / total
    curve = (np.arange(1, total + 1, dtype=float), 2.0 + 3.0 * np.exp(-20.0 * fraction))
    failures = Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("2h")),
        FailureClass(name="node", failures=Failures.exponential("2h"), destroys=("local",)),
        FailureClass(name="region", failures=Failures.exponential("3h"), destroys=("local", "peer", "remote")),
    )
    costs = dict(step_seconds=4.0, stall_seconds=1.6, persist_seconds=30.0, restart_seconds=120.0)
    levels = [LevelCosts(level=Level.REMOTE, seconds=100.0, interference=5.0, restart=600.0),
              LevelCosts(level=4, seconds=200.0, interference=6.0, restart=900.0)]
    job = coci.plan("auto", failures=failures, total_steps=total, curve=curve, levels=levels, **costs)
    policy = PlanningPolicy("auto", failures=failures, total_steps=total, restart_seconds=costs["restart_seconds"])
    played = simulate(policy, job=job, failures=failures, curve=curve, trials=4, seed=0)
    assert policy.plan is not None and policy.plan.higher_steps is not None and policy.plan.inputs.start_step > 0
    assert not any("not planned" in note for note in policy.plan.fallbacks)
    assert played.promote_steps is not None and played.higher_steps is not None
    assert set(played.higher_steps["level4"]) <= set(played.promote_steps) < set(played.steps)
