"""The peer level: failure classes that destroy it, the three-level objective and plan, checked
against brute force and the exact DP over (step, level)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from exact_optimum import optimal_three_level

from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import Level, level_of
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.three_levels import ThreeLevelCostModel, auto_three_level


def decaying_rate(s: np.ndarray) -> np.ndarray:
    return 1.5 * (np.asarray(s, dtype=float) + 50.0) ** -1.5


def three_classes() -> Failures:
    return Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("60h")),
        FailureClass(name="node", failures=Failures.exponential("20h"), destroys=("local",)),
        FailureClass(name="multi_node", failures=Failures.exponential("200h"), destroys=("local", "peer")),
    )


# --- failure classes -----------------------------------------------------------------------------


def test_classes_say_which_levels_they_destroy() -> None:
    model = three_classes()
    assert model.destroys_mask("local").tolist() == [False, True, True]
    assert model.destroys_mask("peer").tolist() == [False, False, True]
    sparing_peer = model.sparing("peer")
    destroying_peer = model.destroying("peer")
    assert sparing_peer is not None and destroying_peer is not None
    assert destroying_peer.rate == pytest.approx(1 / (200 * 3600))
    assert sparing_peer.rate + destroying_peer.rate == pytest.approx(model.rate)
    assert Failures.model_validate_json(model.model_dump_json()) == model


def test_a_class_cannot_destroy_the_peer_copies_and_spare_the_local_files() -> None:
    with pytest.raises(ValueError, match="destroys the local tier too"):
        FailureClass(name="odd", failures=Failures.exponential("1h"), destroys=("peer",))


def test_level_of_reads_the_nested_lists() -> None:
    steps, peer, promote = [10, 20, 30, 40], [20, 40], [40]
    assert [level_of(s, steps, peer, promote) for s in (10, 20, 40, 15)] == [Level.LOCAL, Level.PEER, Level.REMOTE, None]
    assert level_of(10, steps, None, promote) == Level.PEER  # no peer level planned: every checkpoint is copied
    assert level_of(10, steps, peer, None) == Level.REMOTE  # single-level: every checkpoint goes everywhere
    assert Level.LOCAL < Level.PEER < Level.REMOTE


# --- the three-level objective and its exact optimum ---------------------------------------------


def three_level(
    total: int, *, c=0.3, p=1.0, d=2.0, cp=0.5, u=6.0, cu=2.0, r=5.0, rp=10.0, rr=30.0,
    process=1 / 20, node=1 / 50, multi=1 / 200, curve=None,
) -> ThreeLevelCostModel:
    def build(cost: float, persist: float, restart: float, rate: float):
        failures = ExpectedFailures.constant(rate) if rate > 0 else ExpectedFailures.none()
        return build_cost_model(
            total_steps=total, step_seconds=1.0, checkpoint_seconds=cost, persist_seconds=persist,
            restart_seconds=restart, failures=failures, progress_rate=curve,
        )

    return ThreeLevelCostModel(build(c, p, r, process), build(cp, p + d, rp, node), build(cu, p + u, rr, multi))


@pytest.mark.parametrize(
    ("alpha", "min_steps", "min_peer", "min_promote"), [(0.0, 1, 1, 1), (0.6, 1, 1, 1), (0.6, 1, 2, 3), (0.0, 2, 2, 2)],
)
def test_dp_equals_brute_force_over_every_step_and_level(alpha: float, min_steps: int, min_peer: int, min_promote: int) -> None:
    model = three_level(10, curve=decaying_rate, node=1 / 8, multi=1 / 30)

    def chains(spacing: int) -> list[tuple[int, ...]]:
        subsets = itertools.chain.from_iterable(itertools.combinations(range(1, 10), n) for n in range(10))
        return [c for c in subsets if not np.any(np.diff((0, *c)) < spacing)]

    def scores(chain, spacing: int) -> dict[tuple[int, ...], float]:
        return {c: chain.objective(np.asarray(c, dtype=np.int64), alpha) for c in chains(spacing)}

    local, peer, remote = scores(model.local, min_steps), scores(model.peer, min_peer), scores(model.remote, min_promote)
    best = min(  # every (step, level) plan with nested levels
        local[x] + peer[p] + remote[y]
        for x in local for p in peer if set(p) <= set(x) for y in remote if set(y) <= set(p)
    )
    steps, copies, uploads, value = optimal_three_level(
        model, alpha=alpha, min_steps=min_steps, min_peer=min_peer, min_promote=min_promote,
    )
    assert value == pytest.approx(best, rel=1e-12)
    assert model.objective(steps, copies, uploads, alpha) == pytest.approx(value, rel=1e-12)
    assert set(uploads.tolist()) <= set(copies.tolist()) <= set(steps.tolist())


def test_the_levels_must_nest() -> None:
    model = three_level(20)
    with pytest.raises(ConfigError, match="subset"):
        model.expected([5, 10], [7], [])
    with pytest.raises(ConfigError, match="subset"):
        model.expected([5, 10], [5], [10])


GRIDS = {
    "all-frequent": {},
    "node-dominates": dict(process=1 / 400, node=1 / 40, multi=1 / 600, curve=decaying_rate),
    "process-dominates": dict(process=1 / 25, node=1 / 300, multi=1 / 1500, cp=1.0, curve=decaying_rate),
    "slow-upload-costly-peer": dict(node=1 / 60, multi=1 / 300, d=8.0, cp=2.0, u=25.0, cu=6.0, rr=80.0, curve=decaying_rate),
    "no-multi-node-class": dict(multi=0.0, curve=decaying_rate),
}


@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_three_level_auto_is_within_one_percent_of_the_exact_optimum(grid: str, alpha: float) -> None:
    model = three_level(200, **GRIDS[grid])
    spacing = dict(min_peer=3, min_promote=8)
    *_, best = optimal_three_level(model, alpha=alpha, **spacing)
    result = auto_three_level(
        model, objective="time" if alpha == 0 else "progress", alpha=alpha if alpha > 0 else None, **spacing,
    )
    assert set(result.promote.tolist()) <= set(result.peer.tolist()) <= set(result.steps.tolist())
    assert np.all(np.diff(result.peer) >= 3) and np.all(np.diff(result.promote) >= 8)
    assert model.objective(result.steps, result.peer, result.promote, alpha) <= 1.01 * best


def test_three_level_auto_keeps_the_time_budget() -> None:
    model = three_level(200, **GRIDS["slow-upload-costly-peer"])
    result = auto_three_level(model, time_budget=0.05, min_peer=8, min_promote=25)
    assert result.budget_wall_seconds is not None
    assert model.expected(result.steps, result.peer, result.promote).wall_seconds <= result.budget_wall_seconds * (1 + 1e-12)
    time_plan = auto_three_level(model, objective="time", min_peer=8, min_promote=25)
    progress = model.objective(result.steps, result.peer, result.promote, 1.0)
    assert progress <= model.objective(time_plan.steps, time_plan.peer, time_plan.promote, 1.0)
