"""The peer level: failure classes that destroy it, the three-level objective and plan, checked
against brute force and the exact DP over (step, level)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from exact_optimum import optimal_three_level
from test_simulate import ScriptedFailures

import coci
from coci.analysis.simulate import simulate
from coci.analysis.simulate_levels import LOCAL, restore_levels
from coci.analysis.simulate_levels import PEER as PEER_LEVEL
from coci.analysis.simulate_levels import REMOTE as REMOTE_LEVEL
from coci.analysis.simulated_job import Job
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import Level, level_of, levels_of
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
    assert levels_of(steps, peer, promote) == [Level.LOCAL, Level.PEER, Level.LOCAL, Level.REMOTE]
    assert coci.Level is Level


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

    def subsets(chain: tuple[int, ...]) -> itertools.chain[tuple[int, ...]]:
        return itertools.chain.from_iterable(itertools.combinations(chain, n) for n in range(len(chain) + 1))

    local, peer, remote = scores(model.local, min_steps), scores(model.peer, min_peer), scores(model.remote, min_promote)
    # every (step, level) plan with nested levels: the best uploads within each set of copies, then
    # the best copies within each set of local steps
    upper = {p: peer[p] + min(remote[y] for y in subsets(p) if y in remote) for p in peer}
    best = min(local[x] + min(upper[p] for p in subsets(x) if p in upper) for x in local)
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
    # the time plan is always feasible, so the comparison above holds by construction: the budget
    # must also have bought a progress weight and a plan strictly better on progress
    assert result.alpha > 0.0
    assert progress < model.objective(time_plan.steps, time_plan.peer, time_plan.promote, 1.0)


# --- plan() ------------------------------------------------------------------------------------


COSTS = dict(total_steps=3000, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0,
             interference_seconds=0.2, restart_seconds=60.0)
LOSSES = 2 + 3 * (np.arange(1, 3001) + 50.0) ** -0.5
REMOTE = dict(upload_seconds="2m", upload_interference_seconds=4.0, remote_restart_seconds="10m")
PEER = dict(peer_seconds=10.0, peer_interference_seconds=0.5, peer_restart_seconds=90.0)


def large_job(gpus: int = 8192, multi_share: float = 0.1) -> Failures:
    per_gpu = 50_700 * 3600.0
    return Failures.compose(
        FailureClass(name="process", failures=Failures.exponential(per_gpu / 0.22, nodes=gpus)),
        FailureClass(name="node", failures=Failures.exponential(per_gpu / (0.78 - multi_share), nodes=gpus), destroys=("local",)),
        FailureClass(name="multi_node", failures=Failures.exponential(per_gpu / multi_share, nodes=gpus), destroys=("local", "peer")),
    )


def test_plan_copies_a_subset_to_peers_and_uploads_a_subset_of_those() -> None:
    plan = coci.plan(failures=large_job(), curve=LOSSES, objective="time", **REMOTE, **PEER, **COSTS)
    assert plan.peer_steps is not None and plan.promote_steps is not None
    assert set(plan.promote_steps) <= set(plan.peer_steps) <= set(plan.steps)
    assert 0 < len(plan.promote_steps) < len(plan.peer_steps)
    assert np.all(np.diff(plan.peer_steps) >= 5) and np.all(np.diff(plan.promote_steps) >= 60)  # one copy, one upload in flight
    assert plan.expected["peer_copies"] == len(plan.peer_steps) and plan.expected["promotions"] == len(plan.promote_steps)
    assert plan.level(plan.promote_steps[0]) == Level.REMOTE and plan.copies_to_peer(plan.promote_steps[0])
    local_only = sorted(set(plan.steps) - set(plan.peer_steps))
    if local_only:
        assert plan.level(local_only[0]) == Level.LOCAL and not plan.copies_to_peer(local_only[0])
    assert coci.Plan.model_validate_json(plan.model_dump_json()) == plan
    frame = plan.to_frame()
    assert frame["level"].tolist() == [plan.level(s).name for s in plan.steps]  # type: ignore[union-attr]
    # not only plan.level again (levels_of underlies both): the levels from the nested lists themselves
    peer, promote = set(plan.peer_steps), set(plan.promote_steps)
    assert frame["level"].tolist() == ["REMOTE" if s in promote else "PEER" if s in peer else "LOCAL" for s in plan.steps]
    assert (frame["level"] == "REMOTE").sum() == len(plan.promote_steps)
    two = coci.plan(failures=large_job(), curve=LOSSES, objective="time", **REMOTE, **COSTS)
    assert two.peer_steps is None and two.copies_to_peer(two.steps[0])  # a two-level plan copies every checkpoint
    assert plan.expected["wall_seconds"] < two.expected["wall_seconds"]


def test_without_a_peer_level_the_plan_is_as_before() -> None:
    before = coci.plan(failures=large_job(), curve=LOSSES, **REMOTE, **COSTS)
    again = coci.plan(failures=large_job(), curve=LOSSES, peer_seconds=None, **REMOTE, **COSTS)
    assert again == before and before.peer_steps is None and before.promote_steps is not None


def test_peer_costs_are_validated() -> None:
    with pytest.raises(ConfigError, match="peer_seconds is required"):
        coci.plan(failures="8h", peer_restart_seconds=10.0, **COSTS)
    with pytest.raises(ConfigError, match="peer_seconds"):
        coci.plan(failures="8h", peer_seconds=-1.0, **COSTS)


def test_a_single_level_policy_copies_and_uploads_every_checkpoint() -> None:
    young = coci.plan("young", failures=large_job(), **REMOTE, **PEER, **COSTS)
    assert young.peer_steps is None and young.promote_steps is None
    assert young.expected["peer_copies"] == young.expected["promotions"] == len(young.steps)


# --- the simulator plays the peer level ------------------------------------------------------------


def scripted(process: list[float], node: list[float], multi: list[float]) -> Failures:
    return Failures.compose(
        FailureClass(name="process", failures=ScriptedFailures.of(*process)),
        FailureClass(name="node", failures=ScriptedFailures.of(*node), destroys=("local",)),
        FailureClass(name="multi_node", failures=ScriptedFailures.of(*multi), destroys=("local", "peer")),
    )


def leveled_plan(peer: list[int] | None = None) -> coci.Plan:
    # t = 1, S = 1, P = 2: checkpoint 100 commits locally at 103, on the peer (copy 5 s) at 108 and
    # remotely (upload 10 s) at 113; checkpoint 200 is reached at 201, commits locally at 204 and
    # on the peer at 209.
    base = coci.plan(
        "young", failures=Failures.exponential(1e15), total_steps=300, step_seconds=1.0, stall_seconds=1.0,
        persist_seconds=2.0, restart_seconds=7.0, upload_seconds=10.0, remote_restart_seconds=30.0,
        peer_seconds=5.0, peer_restart_seconds=15.0,
    )
    return base.model_copy(update={"steps": [100, 200], "peer_steps": peer or [100, 200], "promote_steps": [100]})


@pytest.mark.parametrize(
    ("process", "node", "multi", "lost", "restart", "peer_restores", "remote_restores"),
    [
        ([250.0], [], [], 48.0, 7.0, 0, 0),  # process failure: back to the local commit of step 200
        ([], [250.0], [], 48.0, 15.0, 1, 0),  # node lost: back to the peer copy of step 200
        ([], [206.0], [], 104.0, 15.0, 1, 0),  # node lost while 200 is copied: back to the copy of 100
        ([], [], [250.0], 148.0, 30.0, 0, 1),  # several nodes lost: back to the upload of step 100
        ([250.0], [1e15, 3.0], [], 48.0, 3.0 + 15.0, 1, 0),  # a node lost during the local restart
        ([250.0], [], [1e15, 3.0], 148.0, 3.0 + 30.0, 0, 1),  # several nodes lost during the local restart
        ([], [250.0], [1e15, 3.0], 148.0, 3.0 + 30.0, 1, 1),  # several nodes lost during the peer restore
    ],
)
def test_hand_computed_rollbacks_per_level(process, node, multi, lost, restart, peer_restores, remote_restores) -> None:
    result = simulate(leveled_plan(), failures=scripted(process, node, multi), trials=1, seed=0)
    assert result.values("lost_seconds")[0] == pytest.approx(lost)
    assert result.values("restart_seconds")[0] == pytest.approx(restart)
    assert result.values("peer_restores")[0] == peer_restores
    assert result.values("remote_restores")[0] == remote_restores
    assert result.peer_steps == [100, 200] and result.promote_steps == [100]


def test_a_checkpoint_not_copied_is_not_restored_from_a_peer() -> None:
    result = simulate(leveled_plan(peer=[100]), failures=scripted([], [250.0], []), trials=1, seed=0)
    assert result.values("lost_seconds")[0] == pytest.approx(148.0)


def test_peer_interference_is_paid_per_copy() -> None:
    base = leveled_plan()
    levels = tuple(level.model_copy(update={"interference": 2.0}) if level.level == Level.PEER else level for level in base.inputs.levels)
    costly = base.model_copy(update={"inputs": base.inputs.model_copy(update={"levels": levels})})
    never = scripted([], [], [])
    plain = simulate(base, failures=never, trials=1, seed=0).values("checkpoint_seconds")[0]
    both = simulate(costly, failures=scripted([], [], []), trials=1, seed=0).values("checkpoint_seconds")[0]
    one = simulate(costly.model_copy(update={"peer_steps": [100]}), failures=scripted([], [], []), trials=1, seed=0)
    assert both == pytest.approx(plain + 4.0)
    assert one.values("checkpoint_seconds")[0] == pytest.approx(plain + 2.0)


def test_restore_levels_follow_the_levels_the_job_has() -> None:
    plan = coci.plan(failures=large_job(2048), curve=LOSSES, objective="time", **REMOTE, **PEER, **COSTS)
    both = Job.of(plan.inputs)
    def only(*kept: Level) -> Job:
        return Job.of(plan.inputs.model_copy(update={"levels": tuple(r for r in plan.inputs.levels if r.level in kept)}))

    no_peer, no_remote, neither = only(Level.REMOTE), only(Level.PEER), only()
    failures = large_job(2048)  # process, node, multi_node
    assert restore_levels(failures, both).tolist() == [LOCAL, PEER_LEVEL, REMOTE_LEVEL]
    assert restore_levels(failures, no_peer).tolist() == [LOCAL, REMOTE_LEVEL, REMOTE_LEVEL]  # the two-level replay
    assert restore_levels(failures, no_remote).tolist() == [LOCAL, PEER_LEVEL, PEER_LEVEL]  # planned so, noted
    assert restore_levels(failures, neither).tolist() == [LOCAL, LOCAL, LOCAL]  # as without classes


def test_simulated_three_level_overhead_matches_the_first_order_expectation() -> None:
    failures = Failures.compose(
        FailureClass(name="process", failures=Failures.exponential("60h")),
        FailureClass(name="node", failures=Failures.exponential("15h"), destroys=("local",)),
        FailureClass(name="multi_node", failures=Failures.exponential("80h"), destroys=("local", "peer")),
    )
    plan = coci.plan(
        failures=failures, objective="time", total_steps=4000, step_seconds=5.0, stall_seconds=0.5,
        persist_seconds=4.0, interference_seconds=0.3, restart_seconds=60.0, upload_seconds=60.0,
        upload_interference_seconds=3.0, remote_restart_seconds=300.0, peer_seconds=8.0,
        peer_interference_seconds=0.5, peer_restart_seconds=90.0,
    )
    result = simulate(plan, trials=3000, seed=4)
    summary = result.metrics["wall_seconds"]
    # first order: failures during overheads are not counted, so the simulation sits a little above
    assert summary.ci_low - 0.1 * plan.expected["wall_seconds"] <= plan.expected["wall_seconds"] <= summary.ci_high
    assert result.mean("peer_restores") == pytest.approx(plan.expected["peer_failures"], rel=0.15)
    assert result.mean("remote_restores") == pytest.approx(plan.expected["remote_failures"], rel=0.2)


# --- online: the policy plans three levels once a peer copy is measured ------------------------------


def test_the_policy_plans_a_peer_level_from_the_measured_copies() -> None:
    from coci.planning.online import make_policy
    from coci.planning.policy import Observation, committed_levels
    from coci.profiler import Estimate, LevelEstimates, Profile

    def observe(step: int, *peer: LevelEstimates) -> coci.Plan:
        profile = Profile(
            steps=step, step_seconds=Estimate(value=2.0, count=50), stall_seconds=Estimate(value=0.3, count=3),
            persist_seconds=Estimate(value=3.0, count=3), restore_seconds=Estimate(value=30.0, count=1),
            levels=(LevelEstimates(name="remote", seconds=Estimate(value=120.0, count=2)), *peer),
        )
        policy.observe(Observation(
            step=step, profile=profile, loss_steps=np.arange(1.0, step + 1), losses=LOSSES[:step],
            checkpoint_steps=(100,), levels=committed_levels([("remote", 100), ("peer", 100)]),
        ))
        assert policy.plan is not None
        return policy.plan

    policy = make_policy("auto", failures=large_job(), total_steps=3000, restart_seconds=None, objective="time")
    unmeasured = observe(200)
    assert unmeasured.peer_steps is None and unmeasured.inputs.level(Level.PEER) is None  # every checkpoint copied
    measured = observe(300, LevelEstimates(name="peer", seconds=Estimate(value=10.0, count=2), interference=Estimate(value=1.2, count=40)))
    peer = measured.inputs.level(Level.PEER)
    assert measured.peer_steps is not None and peer is not None and peer.seconds == 10.0
    assert peer.interference == pytest.approx(10.0 * (1 - 1 / 1.2))
    assert peer.restart == pytest.approx(30.0 + 10.0)  # no peer restore measured: one copy's time
    assert any("peer's copy not measured" in f for f in measured.fallbacks)
    assert peer.last_step == 100
    assert set(measured.promote_steps or []) <= set(measured.peer_steps) <= set(measured.steps)


def test_with_node_share_takes_a_multi_node_class_out_of_the_node_class() -> None:
    weibull = Failures.weibull(0.8, "100h", nodes=4)
    split = weibull.with_node_share(0.7, multi_node_share=0.1)
    assert [c.name for c in split.classes] == ["process", "node", "multi_node"]
    tau = np.array([10.0, 1000.0, 1e5])
    np.testing.assert_allclose(split.hazard(tau), weibull.hazard(tau))
    lost_peer, lost_local = split.destroying("peer"), split.destroying("local")
    assert lost_peer is not None and lost_local is not None
    np.testing.assert_allclose(lost_peer.hazard(tau), 0.1 * weibull.hazard(tau))
    np.testing.assert_allclose(lost_local.hazard(tau), 0.7 * weibull.hazard(tau))
    assert [c.name for c in weibull.with_node_share(0.7).classes] == ["process", "node"]
    with pytest.raises(ConfigError, match="multi_node_share"):
        weibull.with_node_share(0.3, multi_node_share=0.3)


def test_plan_command_plans_three_levels(capsys: pytest.CaptureFixture[str]) -> None:
    from coci.cli import main

    args = ["plan", "--mtbf", "50700h", "--nodes", "4096", "--node-share", "0.78", "--multi-node-share", "0.05",
            "--step-seconds", "2", "--stall-seconds", "0.3", "--persist-seconds", "4", "--restart-seconds", "120",
            "--total-steps", "20000", "--upload-seconds", "600", "--upload-interference-seconds", "10",
            "--remote-restart-seconds", "900", "--peer-seconds", "20", "--peer-interference-seconds", "1",
            "--peer-restart-seconds", "180", "--objective", "time"]
    assert main([*args, "--json"]) == 0
    plan = coci.Plan.model_validate_json(capsys.readouterr().out)
    assert plan.peer_steps is not None and plan.promote_steps is not None
    assert set(plan.promote_steps) <= set(plan.peer_steps) <= set(plan.steps)
    assert plan.inputs.failures is not None
    assert [c.name for c in plan.inputs.failures.classes] == ["process", "node", "multi_node"]
    assert plan.inputs.level(Level.PEER) == coci.LevelCosts(level=Level.PEER, seconds=20.0, interference=1.0, restart=180.0)
    assert main(args) == 0
    assert f"{len(plan.peer_steps)} copied to a peer" in capsys.readouterr().out
    assert main([a for a in args if a not in ("--node-share", "0.78")]) != 0  # a multi-node share needs the node share
    assert "--multi-node-share needs --node-share" in capsys.readouterr().err
