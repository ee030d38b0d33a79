"""Failure classes, the two-level objective and plan, checked against brute force and the exact DP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from exact_optimum import optimal_two_level
from test_simulate import ScriptedFailures

import coci
from coci.analysis.simulate import simulate
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import auto_two_level
from coci.planning.objective import ExpectedFailures, TwoLevelCostModel, build_cost_model


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
    masks = {c: sum(1 << step for step in c) for c in (*local, *remote)}  # a chain as the bit set of its steps
    uploads, upload_values = np.array([masks[y] for y in remote]), np.array(list(remote.values()))
    best = min(value + upload_values[uploads & ~masks[x] == 0].min() for x, value in local.items())  # every (step, level) plan: uploads ⊆ steps
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
    tier = plan.inputs.level(coci.Level.REMOTE)
    assert tier is not None and tier.seconds == 40.0 and tier.restart == 300.0
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


# --- the simulator plays classes and tiers ------------------------------------------------------------


def scripted(process: list[float], node: list[float]) -> Failures:
    return Failures.compose(
        FailureClass(name="process", failures=ScriptedFailures.of(*process)),
        FailureClass(name="node", failures=ScriptedFailures.of(*node), destroys=("local",)),
    )


def tiered_plan(promote: list[int] | None = (100,), upload: float | None = 10.0) -> coci.Plan:
    # t = 1, S = 1, P = 2: checkpoint 100 commits locally at 103 and (upload 10 s) remotely at 113;
    # checkpoint 200 is reached at 201 and commits locally at 204.
    base = coci.plan(
        "young", failures=Failures.exponential(1e15), total_steps=300, step_seconds=1.0, stall_seconds=1.0,
        persist_seconds=2.0, restart_seconds=7.0, upload_seconds=upload,
        remote_restart_seconds=None if upload is None else 30.0,
    )
    return base.model_copy(update={"steps": [100, 200], "promote_steps": None if promote is None else list(promote)})


@pytest.mark.parametrize(
    ("process", "node", "lost", "restart", "remote_restores"),
    [
        ([250.0], [], 48.0, 7.0, 0),  # process failure: back to the local commit of step 200
        ([], [250.0], 148.0, 30.0, 1),  # node failure: back to the remote commit of step 100
        ([], [110.0], 109.0, 30.0, 1),  # node failure while 100 uploads: its upload is lost, back to 0
        ([250.0], [1e15, 3.0], 148.0, 3.0 + 30.0, 1),  # a node failure during the local restart
    ],
)
def test_hand_computed_rollbacks_per_class(process, node, lost, restart, remote_restores) -> None:
    result = simulate(tiered_plan(), failures=scripted(process, node), trials=1, seed=0)
    assert result.values("lost_seconds")[0] == pytest.approx(lost)
    assert result.values("restart_seconds")[0] == pytest.approx(restart)
    assert result.values("remote_restores")[0] == remote_restores
    assert result.promote_steps == [100]


def test_without_a_remote_tier_every_failure_restores_locally() -> None:
    result = simulate(tiered_plan(None, upload=None), failures=scripted([], [250.0]), trials=1, seed=0)
    assert result.values("lost_seconds")[0] == pytest.approx(48.0)
    assert result.values("remote_restores")[0] == 0
    assert any("no remote tier" in note for note in result.notes)


def test_upload_interference_is_paid_per_promotion() -> None:
    base = tiered_plan()
    levels = tuple(level.model_copy(update={"interference": 4.0}) for level in base.inputs.levels)
    costly = base.model_copy(update={"inputs": base.inputs.model_copy(update={"levels": levels})})
    never = scripted([], [])
    one = simulate(costly, failures=never, trials=1, seed=0).values("checkpoint_seconds")[0]
    both = simulate(costly.model_copy(update={"promote_steps": [100, 200]}), failures=scripted([], []), trials=1, seed=0)
    plain = simulate(base, failures=scripted([], []), trials=1, seed=0).values("checkpoint_seconds")[0]
    assert one == pytest.approx(plain + 4.0)
    assert both.values("checkpoint_seconds")[0] == pytest.approx(plain + 8.0)


@pytest.mark.parametrize("warned", [False, True])
def test_simulated_two_level_overhead_matches_the_first_order_expectation(warned: bool) -> None:
    failures = Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("60h")),
        FailureClass(name="node", failures=Failures.exponential("20h"), destroys=("local",)),
    )
    if warned:  # a notice saves the process failures' work only (its checkpoint is local)
        failures = failures.warned(0.5, "60s")
    plan = coci.plan(
        failures=failures, objective="time", total_steps=4000, step_seconds=5.0, stall_seconds=0.5,
        persist_seconds=4.0, interference_seconds=0.3, restart_seconds=60.0, upload_seconds=60.0,
        upload_interference_seconds=3.0, remote_restart_seconds=300.0,
    )
    result = simulate(plan, trials=3000, seed=4)
    summary = result.metrics["wall_seconds"]
    # first order: failures during overheads are not counted, so the simulation sits a little above
    assert summary.ci_low - 0.1 * plan.expected["wall_seconds"] <= plan.expected["wall_seconds"] <= summary.ci_high
    assert result.mean("remote_restores") == pytest.approx(plan.expected["remote_failures"], rel=0.15)


def test_plan_command_plans_two_levels(capsys: pytest.CaptureFixture[str]) -> None:
    from coci.cli import main

    args = ["plan", "--mtbf", "50700h", "--nodes", "4096", "--node-share", "0.78", "--step-seconds", "2",
            "--stall-seconds", "0.3", "--persist-seconds", "4", "--restart-seconds", "120", "--total-steps", "20000",
            "--upload-seconds", "60", "--upload-interference-seconds", "10", "--remote-restart-seconds", "600", "--json"]
    assert main(args) == 0
    plan = coci.Plan.model_validate_json(capsys.readouterr().out)
    assert plan.promote_steps is not None and set(plan.promote_steps) <= set(plan.steps)
    assert plan.inputs.failures is not None and [c.name for c in plan.inputs.failures.classes] == ["process", "node"]
    assert plan.inputs.failures.mean_seconds == pytest.approx(50_700 * 3600 / 4096)
    assert plan.inputs.levels[0].restart == 600.0


def test_with_node_share_splits_the_hazard() -> None:
    weibull = Failures.weibull(0.8, "100h", nodes=4)
    split = weibull.with_node_share(0.3)
    tau = np.array([10.0, 1000.0, 1e5])
    np.testing.assert_allclose(split.hazard(tau), weibull.hazard(tau))
    node = split.destroying("local")
    assert node is not None
    np.testing.assert_allclose(node.hazard(tau), 0.3 * weibull.hazard(tau))
