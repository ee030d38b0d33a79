"""The level planner as one chain over N levels: three levels are its N = 3 case, and a toy fourth
level (a second, slower store above the remote tier, with a failure class of its own) is planned by
the same code."""

from __future__ import annotations

import numpy as np
import pytest

import coci
from coci.analysis.simulate import simulate
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures, check_survivable
from coci.planning.objective import CostModel, ExpectedFailures, build_cost_model
from coci.planning.three_levels import LevelChainModel, auto_levels, auto_three_level, level_candidates


def chain(total: int, cost: float, persist: float, restart: float, rate: float) -> CostModel:
    failures = ExpectedFailures.constant(rate) if rate > 0 else ExpectedFailures.none()
    return build_cost_model(
        total_steps=total, step_seconds=1.0, checkpoint_seconds=cost, persist_seconds=persist,
        restart_seconds=restart, failures=failures,
    )


def four_levels(total: int = 400, archive_rate: float = 1 / 150) -> LevelChainModel:
    """Local, peer, remote and a toy archive: each chain against the failures that destroy the
    levels below it and spare it (the archive's: those that destroy the remote tier too)."""
    return LevelChainModel(
        chain(total, 0.3, 1.0, 5.0, 1 / 40), chain(total, 0.5, 3.0, 10.0, 1 / 80),
        chain(total, 2.0, 9.0, 30.0, 1 / 300), chain(total, 3.0, 40.0, 90.0, archive_rate),
    )


def nested(levels: tuple[np.ndarray, ...]) -> bool:
    return all(np.all(np.isin(upper, lower)) for lower, upper in zip(levels, levels[1:]))


def test_three_levels_are_the_chain_of_three() -> None:
    model = LevelChainModel(*four_levels().chains[:3])
    three = auto_three_level(model, objective="time", min_steps=2, min_peer=4, min_promote=10)
    chain_of_three = auto_levels(model, (2, 4, 10), objective="time")
    assert all(np.array_equal(a, b) for a, b in zip(three.levels, chain_of_three.levels))
    assert three.steps is three.levels[0] and three.peer is three.levels[1] and three.promote is three.levels[2]


def test_a_fourth_level_is_planned_by_the_same_chain() -> None:
    model = four_levels()
    spacings = (2, 4, 10, 40)
    result = auto_levels(model, spacings, objective="time")
    assert len(result.levels) == 4 and nested(result.levels)
    for steps, spacing in zip(result.levels, spacings):
        assert np.all(np.diff(steps) >= spacing)
    archived = result.levels[3]
    assert archived.size > 0  # its class is planned against: the toy level takes checkpoints
    never_archived = [plan for plan in level_candidates(model, 0.0, spacings) if plan[3].size == 0]
    assert never_archived, "the candidates hold plans without the fourth level"
    best_without = min(model.objective(*plan, 0.0) for plan in never_archived)
    assert model.objective(*result.levels, 0.0) < best_without
    figures = model.as_dict(*result.levels)
    assert figures["level4_copies"] == archived.size
    assert figures["level4_failures"] > 0 and figures["promotions"] == result.levels[2].size


def test_a_fourth_level_without_failures_of_its_own_takes_nothing() -> None:
    result = auto_levels(four_levels(archive_rate=0.0), (2, 4, 10, 40), objective="time")
    assert result.levels[3].size == 0 and result.levels[2].size > 0


def test_a_chain_plan_must_nest_and_give_one_list_per_level() -> None:
    model = four_levels(total=100)
    with pytest.raises(ConfigError, match="level4 steps must be a subset of the remote steps"):
        model.expected(np.array([10, 20]), np.array([20]), np.array([20]), np.array([10]))
    with pytest.raises(ConfigError, match="4 step lists"):
        model.expected(np.array([10]), np.array([10]), np.array([10]))
    with pytest.raises(ConfigError, match="spacings"):
        auto_levels(model, (1, 1, 1))


# --- failure classes by rank -----------------------------------------------------------------------


def classes_of_every_depth() -> Failures:
    return Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("60h")),
        FailureClass(name="node", failures=Failures.exponential("20h"), destroys=("local",)),
        FailureClass(name="multi_node", failures=Failures.exponential("200h"), destroys=("local", "peer")),
        FailureClass(name="region", failures=Failures.exponential("900h"), destroys=("local", "peer", "remote")),
    )


def test_a_class_destroys_the_levels_below_a_rank() -> None:
    model = classes_of_every_depth()
    assert [c.depth for c in model.failure_classes] == [0, 1, 2, 3]
    exactly_node, from_multi = model.of_depth(1, 2), model.of_depth(2)
    assert exactly_node is not None and from_multi is not None
    assert exactly_node.rate == pytest.approx(1 / (20 * 3600))
    assert from_multi.rate == pytest.approx(1 / (200 * 3600) + 1 / (900 * 3600))
    assert model.of_depth(4) is None
    for skipping in [("remote",), ("local", "remote"), ("peer", "remote")]:
        with pytest.raises(ValueError, match="below a given rank"):
            FailureClass(name="odd", failures=Failures.exponential("1h"), destroys=skipping)  # type: ignore[arg-type]
    assert Failures.model_validate_json(model.model_dump_json()) == model


def test_a_class_that_destroys_the_remote_tier_needs_a_level_above_it() -> None:
    failures = classes_of_every_depth()
    peer = coci.LevelCosts(level=coci.Level.PEER, seconds=10.0)
    remote = coci.LevelCosts(level=coci.Level.REMOTE, seconds=120.0)
    with pytest.raises(ConfigError, match="failures: class 'region' destroys local\\+peer\\+remote"):
        coci.plan(total_steps=500, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0, failures=failures, levels=[peer, remote])
    check_survivable(failures, 4)  # a fourth level above the remote tier would hold a copy
    check_survivable(Failures.compose(*failures.failure_classes[:3]), 3)


# --- a fourth level through coci.plan ----------------------------------------------------------------

TOY_COSTS = dict(total_steps=1500, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0, interference_seconds=0.2,
                 restart_seconds=60.0)
PEER = coci.LevelCosts(level=coci.Level.PEER, seconds=10.0, interference=0.5, restart=90.0)
REMOTE = coci.LevelCosts(level=coci.Level.REMOTE, seconds=60.0, interference=2.0, restart=300.0)
#: The toy fourth level: a second, slower store above the remote tier (an integer rank above 3).
ARCHIVE = coci.LevelCosts(level=4, seconds=300.0, interference=3.0, restart=900.0)


def test_a_fourth_level_is_one_more_entry_in_coci_plans_levels() -> None:
    failures = Failures.compose(*classes_of_every_depth().failure_classes[:3],
                                FailureClass(name="region", failures=Failures.exponential("60h"), destroys=("local", "peer", "remote")))
    plan = coci.plan(failures=failures, objective="time", **TOY_COSTS, levels=[ARCHIVE, PEER, REMOTE])
    assert plan.inputs.levels == (PEER, REMOTE, ARCHIVE) and ARCHIVE.name == "level4"
    assert plan.higher_steps is not None and plan.peer_steps is not None and plan.promote_steps is not None
    archived = plan.higher_steps["level4"]
    assert archived and set(archived) <= set(plan.promote_steps) <= set(plan.peer_steps) <= set(plan.steps)
    assert min(np.diff(archived), default=150) >= plan.details["min_level4_steps"] == 150  # 300 s / 2 s: one in flight
    assert plan.expected["level4_copies"] == len(archived) and plan.expected["level4_failures"] > 0
    assert coci.Plan.model_validate_json(plan.model_dump_json()) == plan
    three = coci.plan(failures=Failures.compose(*failures.failure_classes[:3]), objective="time", **TOY_COSTS, levels=[PEER, REMOTE])
    assert three.higher_steps is None and "higher_steps" not in three.model_dump()
    # each plan's note counts the levels it has
    assert any(note.startswith(f"four levels: {len(plan.peer_steps)} of {len(plan.steps)} checkpoints") for note in plan.notes)
    assert any(note.startswith("three levels: ") for note in three.notes) and not any("four levels" in note for note in three.notes)


def test_a_fourth_level_is_simulated() -> None:
    failures = Failures.compose(*classes_of_every_depth().failure_classes[:3],
                                FailureClass(name="region", failures=Failures.exponential("5h"), destroys=("local", "peer", "remote")))
    plan = coci.plan(failures=failures, objective="time", **{**TOY_COSTS, "total_steps": 6000}, levels=[PEER, REMOTE, ARCHIVE])
    assert plan.higher_steps is not None and len(plan.higher_steps["level4"]) > 5
    played = simulate(plan, failures=failures, trials=300, seed=5)
    assert played.higher_steps == plan.higher_steps and not any("sent to level4" in n for n in played.notes)
    assert played.metrics["wall_seconds"].mean == pytest.approx(plan.expected["wall_seconds"], rel=0.3)
    # without copies on the fourth level a region failure rolls back to the start
    never = simulate(plan.model_copy(update={"higher_steps": {"level4": []}}), failures=failures, trials=300, seed=5)
    assert never.metrics["lost_seconds"].mean > 5 * played.metrics["lost_seconds"].mean
    unplanned = simulate(plan.model_copy(update={"higher_steps": None}), failures=failures, trials=300, seed=5)
    assert "every uploaded checkpoint sent to level4" in unplanned.notes


def test_a_fourth_level_is_checked() -> None:
    def plan(*levels: coci.LevelCosts) -> coci.Plan:
        return coci.plan(failures="8h", **TOY_COSTS, levels=list(levels))

    with pytest.raises(ConfigError, match=r"levels\[1\].level: the level above remote is rank 4, got 5"):
        plan(REMOTE, ARCHIVE.model_copy(update={"level": 5}))
    with pytest.raises(ConfigError, match=r"levels\[2\].seconds: a transfer to level4 takes at least as long as one to remote"):
        plan(PEER, REMOTE, ARCHIVE.model_copy(update={"seconds": 30.0}))
    with pytest.raises(ConfigError, match=r"levels\[2\].level: the level above remote is rank 4, got 5"):
        plan(PEER, REMOTE, ARCHIVE.model_copy(update={"level": 5}))
    with pytest.raises(ValueError):
        coci.LevelCosts(level=0, seconds=1.0)
