"""Failure classes, the two-level objective and plan, checked against brute force and the exact DP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import coci
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import auto_two_level
from coci.planning.objective import ExpectedFailures, TwoLevelCostModel, build_cost_model
from exact_optimum import optimal_two_level


def decaying_rate(s: np.ndarray) -> np.ndarray:
    return 1.5 * (np.asarray(s, dtype=float) + 50.0) ** -1.5


def mixed() -> Failures:
    return Failures.compose(
        FailureClass(name="process", failures=Failures.weibull(0.7, "10h")),
        FailureClass(name="node", failures=Failures.exponential("20h"), destroys=("local",)),
    )


# --- failure classes -----------------------------------------------------------------------------


def test_classes_add_hazards_and_sample_the_first_failure() -> None:
    model = mixed()
    process, node = (c.failures for c in model.classes)
    tau = np.array([60.0, 3600.0, 86400.0])
    np.testing.assert_allclose(model.hazard(tau), process.hazard(tau) + node.hazard(tau))
    np.testing.assert_allclose(model.survival(tau), process.survival(tau) * node.survival(tau))
    life, which = model.sample_classes(np.random.default_rng(1), 200_000)
    assert life.mean() == pytest.approx(model.mean_seconds, rel=0.01)
    assert float(np.median(life)) == pytest.approx(float(model.quantile(0.5)), rel=0.01)
    # the share of node failures is the integral of its hazard against the joint survival
    grid = np.linspace(0.0, 40 * model.mean_seconds, 400_001)
    share = np.trapezoid(node.hazard(grid) * model.survival(grid), grid)
    assert which.mean() == pytest.approx(share, abs=0.005)
    assert model.destroys_mask().tolist() == [False, True]
    assert not model.is_memoryless


def test_exponential_classes_have_the_summed_rate() -> None:
    model = Failures.large_gpu_job(1024)
    assert model.is_memoryless
    assert model.mean_seconds / 3600 == pytest.approx(50_700 / 1024, rel=1e-9)  # the job MTBF of the published figure
    node = model.destroying("local")
    assert node is not None and node.rate == pytest.approx(0.78 * model.rate)
    sparing = model.sparing("local")
    assert sparing is not None and sparing.rate == pytest.approx(0.22 * model.rate)


def test_a_plain_model_is_one_class_that_destroys_nothing() -> None:
    plain = Failures.exponential("8h")
    assert plain.destroying("local") is None
    assert plain.sparing("local") is plain
    assert [c.name for c in plain.failure_classes] == ["all"] and not plain.failure_classes[0].destroys
    life, which = plain.sample_classes(np.random.default_rng(3), 10)
    np.testing.assert_array_equal(life, plain.sample(np.random.default_rng(3), 10))  # the same draws as before
    assert not which.any()


def test_classes_round_trip_through_json_with_a_warning() -> None:
    model = mixed().warned(0.25, "60s")
    again = Failures.model_validate_json(model.model_dump_json())
    assert again == model
    unwarned = model.unwarned(10.0)
    assert unwarned.warned_fraction == 0
    np.testing.assert_allclose(unwarned.hazard([100.0, 5000.0]), 0.75 * model.hazard([100.0, 5000.0]))


def test_invalid_classes_are_refused() -> None:
    with pytest.raises(ConfigError):
        Failures.compose()
    with pytest.raises(ConfigError, match="unique"):
        Failures.compose(*(FailureClass(name="a", failures=Failures.exponential("1h")) for _ in range(2)))
    with pytest.raises(ConfigError, match="classes"):
        Failures(kind="classes", scale_seconds=10.0)
    with pytest.raises(ValueError, match="plain"):
        FailureClass(name="a", failures=mixed())
    with pytest.raises(ConfigError, match="node_share"):
        Failures.large_gpu_job(8, node_share=1.0)


# --- the two-level objective and its exact optimum ---------------------------------------------------


def two_level(total: int, *, c=0.3, p=1.0, u=4.0, cu=2.0, r=5.0, rr=20.0, local=1 / 20, node=1 / 60, curve=None):
    def build(cost: float, persist: float, restart: float, rate: float):
        return build_cost_model(
            total_steps=total, step_seconds=1.0, checkpoint_seconds=cost, persist_seconds=persist,
            restart_seconds=restart, failures=ExpectedFailures.constant(rate), progress_rate=curve,
        )

    return TwoLevelCostModel(build(c, p, r, local), build(cu, p + u, rr, node))


@pytest.mark.parametrize(("alpha", "min_steps", "min_promote"), [(0.0, 1, 1), (0.6, 1, 1), (0.6, 1, 3), (0.0, 2, 2)])
def test_dp_equals_brute_force_over_every_step_and_level(alpha: float, min_steps: int, min_promote: int) -> None:
    model = two_level(11, curve=decaying_rate)

    def chains(spacing: int) -> list[tuple[int, ...]]:
        subsets = itertools.chain.from_iterable(itertools.combinations(range(1, 11), n) for n in range(11))
        return [c for c in subsets if not np.any(np.diff((0, *c)) < spacing)]

    local = {c: model.local.objective(np.asarray(c, dtype=np.int64), alpha) for c in chains(min_steps)}
    remote = {c: model.remote.objective(np.asarray(c, dtype=np.int64), alpha) for c in chains(min_promote)}
    best = min(local[x] + remote[y] for x in local for y in remote if set(y) <= set(x))  # every (step, level) plan
    steps, promote, value = optimal_two_level(model, alpha=alpha, min_steps=min_steps, min_promote=min_promote)
    assert value == pytest.approx(best, rel=1e-12)
    assert model.objective(steps, promote, alpha) == pytest.approx(value, rel=1e-12)
    assert set(promote.tolist()) <= set(steps.tolist())


GRIDS = {
    "both-frequent": {},
    "process-dominates": dict(local=1 / 30, node=1 / 600, u=20.0, cu=5.0, curve=decaying_rate),
    "node-dominates": dict(local=1 / 2000, node=1 / 300, c=0.5, cu=3.0, u=10.0, curve=decaying_rate),
    "cheap-local-slow-upload": dict(local=1 / 80, node=1 / 150, c=0.1, p=0.5, u=25.0, cu=6.0, rr=60.0, curve=decaying_rate),
}


@pytest.mark.parametrize("grid", sorted(GRIDS))
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_two_level_auto_is_within_one_percent_of_the_exact_optimum(grid: str, alpha: float) -> None:
    model = two_level(300, **GRIDS[grid])
    min_promote = 5
    _, promote_opt, best = optimal_two_level(model, alpha=alpha, min_promote=min_promote)
    result = auto_two_level(
        model, objective="time" if alpha == 0 else "progress", alpha=alpha if alpha > 0 else None, min_promote=min_promote,
    )
    assert set(result.promote.tolist()) <= set(result.steps.tolist())
    assert np.all(np.diff(result.promote) >= min_promote)
    assert model.objective(result.steps, result.promote, alpha) <= 1.01 * best


def test_two_level_auto_keeps_the_time_budget() -> None:
    model = two_level(300, **GRIDS["cheap-local-slow-upload"])
    result = auto_two_level(model, time_budget=0.05, min_promote=25)
    assert result.budget_wall_seconds is not None
    assert model.expected(result.steps, result.promote).wall_seconds <= result.budget_wall_seconds * (1 + 1e-12)
    time_plan = auto_two_level(model, objective="time", min_promote=25)
    assert model.objective(result.steps, result.promote, 1.0) <= model.objective(time_plan.steps, time_plan.promote, 1.0)


# --- plan() ------------------------------------------------------------------------------------


COSTS = dict(total_steps=3000, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0,
             interference_seconds=0.2, restart_seconds=60.0)
LOSSES = 2 + 3 * (np.arange(1, 3001) + 50.0) ** -0.5


def test_without_a_remote_tier_the_plan_is_as_before() -> None:
    failures = Failures.exponential("40h", nodes=8)
    before = coci.plan(failures=failures, curve=LOSSES, **COSTS)
    again = coci.plan(failures=failures, curve=LOSSES, upload_seconds=None, remote_restart_seconds=None, **COSTS)
    assert again == before and before.promote_steps is None


def test_a_remote_tier_without_a_class_that_destroys_it_is_single_level() -> None:
    failures = Failures.exponential("40h", nodes=8)
    before = coci.plan(failures=failures, curve=LOSSES, **COSTS)
    remote = coci.plan(failures=failures, curve=LOSSES, upload_seconds=30.0, **COSTS)
    assert remote.steps == before.steps and remote.promote_steps is None
    assert any("no failure class destroys the local tier" in n for n in remote.notes)


def test_plan_promotes_a_subset_and_beats_promoting_every_checkpoint() -> None:
    failures = Failures.large_gpu_job(4096)
    remote = dict(upload_seconds="40s", upload_interference_seconds=4.0, remote_restart_seconds="5m")
    plan = coci.plan(failures=failures, curve=LOSSES, objective="time", **remote, **COSTS)
    assert plan.promote_steps is not None and 0 < len(plan.promote_steps) < len(plan.steps)
    assert set(plan.promote_steps) <= set(plan.steps)
    assert np.all(np.diff(plan.promote_steps) >= 20)  # one 40 s upload in flight at 2 s a step
    assert plan.inputs.upload_seconds == 40.0 and plan.inputs.remote_restart_seconds == 300.0
    assert plan.expected["promotions"] == len(plan.promote_steps)
    young = coci.plan("young", failures=failures, **remote, **COSTS)
    assert young.promote_steps is None and young.expected["promotions"] == len(young.steps)
    assert plan.expected["wall_seconds"] < young.expected["wall_seconds"]
    assert coci.Plan.model_validate_json(plan.model_dump_json()) == plan


def test_remote_costs_are_validated() -> None:
    with pytest.raises(ConfigError, match="upload_seconds is required"):
        coci.plan(failures="8h", remote_restart_seconds=10.0, **COSTS)
    with pytest.raises(ConfigError, match="upload_seconds"):
        coci.plan(failures="8h", upload_seconds=-3.0, **COSTS)
