"""coci.plan / Plan / make_policy: inputs, fallbacks, errors, round trips and online re-planning."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from coci import knobs
from coci.errors import ConfigError
from coci.planning.config import POLICIES
from coci.planning.empirical import empirical_curve
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.online import PlanningPolicy, make_policy
from coci.planning.planner import plan
from coci.planning.policy import CheckpointPolicy, Observation
from coci.planning.records import PRIOR_PROGRESS_RATE, Plan
from coci.profiler import Estimate, Profile

BASE = dict(
    failures=Failures.exponential("2h"),
    total_steps=20_000,
    step_seconds=0.5,
    stall_seconds=0.8,
    persist_seconds=4.0,
    restart_seconds=60.0,
)


def losses(n: int = 3000, seed: int = 0) -> np.ndarray:
    steps = np.arange(1, n + 1)
    noise = np.random.default_rng(seed).normal(0, 0.01, n)
    return 3.0 + 4.0 * (steps + 200.0) ** -0.5 + noise


# --- plan ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_plans_and_round_trips_through_json(policy: str) -> None:
    p = plan(policy, curve=losses(), **BASE)
    assert p.policy == policy and p.steps == sorted(set(p.steps))
    assert p.steps[0] > 0 and p.steps[-1] < BASE["total_steps"]
    again = Plan.model_validate_json(p.model_dump_json())
    assert again == p
    assert json.loads(p.model_dump_json())["inputs"]["failures"]["kind"] == "exponential"
    frame = p.to_frame()
    assert list(frame.columns) == ["step", "interval_steps", "interval_seconds", "progress_seconds", "level"]
    assert frame["step"].tolist() == p.steps
    assert frame["interval_steps"].sum() == p.steps[-1]
    assert p.expected["checkpoints"] == len(p.steps)
    assert p.expected["wall_seconds"] == pytest.approx(
        p.expected["checkpoint_seconds"] + p.expected["restart_seconds"] + p.expected["lost_seconds"]
    )


def test_auto_records_fit_mu_and_budget_and_beats_young_on_progress() -> None:
    auto = plan("auto", curve=losses(), **BASE)
    young = plan("young", curve=losses(), **BASE)
    assert auto.fit is not None and auto.fit.family in ("power", "exp_floor", "coci_exp")
    assert auto.objective == "progress" and auto.mu is not None and auto.fallbacks == []
    assert auto.expected["wall_seconds"] <= auto.expected["budget_wall_seconds"] + 1e-9
    assert auto.expected["budget_wall_seconds"] == pytest.approx(1.05 * auto.expected["time_optimal_wall_seconds"])
    assert auto.expected["progress_seconds"] < 0.95 * young.expected["progress_seconds"]
    intervals = auto.intervals
    assert intervals[-1] > intervals[0]


@pytest.mark.slow  # several full plans (~3 s)
def test_curve_inputs_are_equivalent() -> None:
    y = losses()
    steps = np.arange(1, y.size + 1)
    fit = fit_curve(steps, y)
    a = plan("auto", curve=y, **BASE)
    b = plan("auto", curve=(steps, y), **BASE)
    assert a.steps == b.steps
    assert a.fit is not None and a.fit.family == fit.family
    # a recorded trace is planned on what it shows (its empirical curve), a fit on the law
    shown = plan("auto", curve=empirical_curve(steps, y, BASE["total_steps"], fit), **BASE)
    assert shown.steps == a.steps and shown.fit == a.fit  # an empirical curve records its fit
    c = plan("auto", curve=fit, **BASE)
    v = plan("auto", curve=fit.progress_rate, **BASE)  # a progress-rate callable
    assert v.fit is None and c.steps != a.steps


def test_time_objective_ignores_the_curve_and_is_periodic() -> None:
    p = plan("auto", curve=losses(), objective="time", **BASE)
    assert p.mu is None and p.objective == "time"
    assert max(p.intervals[1:]) - min(p.intervals[1:]) <= 1


def test_pure_progress_without_budget() -> None:
    p = plan("auto", curve=losses(), time_budget=None, **BASE)
    assert p.mu == 0.0 and "budget_wall_seconds" not in p.expected


def test_no_curve_falls_back_to_the_time_objective() -> None:
    p = plan("auto", **BASE)
    assert p.objective == "time" and p.mu is None
    assert any("no curve" in f for f in p.fallbacks)
    assert p.steps == plan("auto", objective="time", **BASE).steps


def test_unusable_curves_fall_back_and_say_why() -> None:
    rising = np.linspace(2.0, 3.0, 500)
    p = plan("auto", curve=rising, **BASE)
    assert p.objective == "time" and p.fit is not None and p.fit.family == "none"
    assert any("unusable" in f and "rising" in f for f in p.fallbacks)
    few = plan("auto", curve=[3.0, 2.5, 2.2], **BASE)
    assert any("too few" in f for f in few.fallbacks)
    c = plan("coci", curve=rising, **BASE)
    assert any(f.startswith("coci needs a falling loss curve") for f in c.fallbacks)


def test_nan_losses_are_dropped_and_counted() -> None:
    y = losses()
    y[::100] = np.nan
    y[5] = np.inf
    p = plan("auto", curve=y, **BASE)
    assert p.fit is not None and p.fit.dropped_points == 31
    assert any("dropped 31 NaN/inf" in f for f in p.fallbacks)


def test_weibull_failures_are_planned_with_the_expected_hazard() -> None:
    base = {**BASE, "failures": Failures.weibull(0.6, "2h")}
    p = plan("auto", objective="time", **base)
    assert any("renewal" in f for f in p.fallbacks)
    assert p.intervals[0] < p.intervals[-1]  # infant mortality: short intervals first


def test_daly_plan_reproduces_his_interval_in_steps() -> None:
    p = plan("daly", failures=Failures.exponential("24h"), total_steps=100_000, step_seconds=1.0,
             stall_seconds=300.0, persist_seconds=60.0, restart_seconds=600.0)
    assert p.details["interval_seconds"] / 60 == pytest.approx(116.7, abs=0.1)
    assert p.intervals[0] == round(p.details["interval_seconds"])


def test_coci_plan_records_its_fit_in_minutes() -> None:
    p = plan("coci", curve=losses(), **BASE)
    assert p.details["theta1_per_minute"] < 0 and p.details["pe"] > 0
    assert p.objective == "progress"


def test_checkfreq_needs_no_failure_model() -> None:
    p = plan("checkfreq", **{**BASE, "failures": None})
    assert p.intervals[0] == 8  # ceil(P / t)
    assert p.expected == {"checkpoints": len(p.steps), "checkpoint_seconds": 0.8 * len(p.steps)}


def test_max_overhead_caps_every_policy() -> None:
    for policy in ("auto", "young", "daly"):
        p = plan(policy, curve=losses(), max_overhead=0.01, **BASE)
        assert min(p.intervals) >= 160  # 0.8 s / (0.01 * 0.5 s)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"policy": "often"}, "policy"),
        ({"objective": "speed"}, "objective"),
        ({"stall_seconds": 0.0}, "stall_seconds"),
        ({"persist_seconds": -1.0}, "persist_seconds"),
        ({"step_seconds": float("nan")}, "step_seconds"),
        ({"restart_seconds": -5}, "restart_seconds"),
        ({"interference_seconds": float("inf")}, "interference_seconds"),
        ({"total_steps": 0}, "total_steps"),
        ({"total_steps": 10.5}, "total_steps"),
        ({"time_budget": -0.1}, "time_budget"),
        ({"max_overhead": 0.0}, "max_overhead"),
        ({"failures": None}, "failures"),
        ({"failures": "-8h"}, "failures"),
    ],
)
def test_bad_inputs_name_the_field(change: dict, field: str) -> None:
    kwargs = {**BASE, "policy": "auto", **change}
    with pytest.raises(ConfigError, match=field):
        plan(**kwargs)


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        plan("often", **BASE)
    assert all(name in str(info.value) for name in POLICIES)
    with pytest.raises(ConfigError, match="'auto'.*'checkfreq'"):
        make_policy("often", failures=BASE["failures"], total_steps=100)


def test_durations_are_accepted_for_costs() -> None:
    a = plan("young", **{**BASE, "failures": "2h", "stall_seconds": "800ms"})
    assert a.steps == plan("young", **BASE).steps


# --- make_policy ---------------------------------------------------------------------------------


def profile(step=0.5, stall=0.8, persist=4.0, steps=100) -> Profile:
    return Profile(
        steps=steps,
        step_seconds=Estimate(value=step, count=50),
        stall_seconds=Estimate(value=stall, count=3),
        persist_seconds=Estimate(value=persist, count=3),
        restore_seconds=Estimate(value=30.0, count=1),
    )


def observation(at: int, trace: np.ndarray | None = None, checkpoints=(), **costs) -> Observation:
    y = losses(at) if trace is None else trace
    return Observation(
        step=at, profile=profile(steps=at, **costs), loss_steps=np.arange(1, y.size + 1, dtype=float),
        losses=y, checkpoint_steps=tuple(checkpoints),
    )


def test_planning_policy_checkpoints_on_doublings_during_warm_up_then_plans() -> None:
    pol = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=None,
                      objective="progress", time_budget=0.05, max_overhead=None)
    assert isinstance(pol, CheckpointPolicy)
    assert pol.plan is None
    warmup = list(knobs.PLAN_WARMUP_CHECKPOINT_STEPS)  # then every last interval of them until the first plan
    assert [s for s in range(1, 60) if pol.should_checkpoint(s)] == [*warmup, *range(2 * warmup[-1] - warmup[-2], 60, warmup[-1] - warmup[-2])]
    pol.observe(observation(500))
    assert pol.plan is not None and pol.plan.inputs.start_step == 500
    assert pol.plan.inputs.restart_seconds == 30.0  # measured restore
    assert all(s > 500 for s in pol.plan.steps)
    planned = set(pol.plan.steps)
    assert {s for s in range(1, 20_000) if pol.should_checkpoint(s)} == planned


@pytest.mark.parametrize(
    ("policy", "objective"), [("auto", "time"), ("young", "progress"), ("checkfreq", "progress"), ("coci", "progress")]
)
def test_only_progress_weighting_checkpoints_before_its_first_plan(policy: str, objective: str) -> None:
    pol = make_policy(policy, failures=BASE["failures"], total_steps=20_000, objective=objective)
    assert not any(pol.should_checkpoint(s) for s in range(1, 2000))
    short = make_policy("auto", failures=BASE["failures"], total_steps=5)  # warm-up steps inside the run only
    assert [s for s in range(1, 6) if short.should_checkpoint(s)] == [1, 2, 4]


@pytest.mark.slow  # several full plans and a curve fit (~6 s)
def test_a_short_trace_plans_with_the_prior_and_a_fit_replaces_it() -> None:
    pol = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0)
    sparse = np.array([9.0, 6.0, 5.0])  # e.g. validation losses: 3 points, too few to fit
    pol.observe(Observation(step=300, profile=profile(steps=300), loss_steps=np.array([1.0, 100.0, 200.0]),
                            losses=sparse))
    prior = pol.plan
    assert prior.inputs.curve == PRIOR_PROGRESS_RATE.description and prior.objective == "progress"
    assert any("prior" in note for note in prior.fallbacks)
    # the prior front-loads: shorter intervals early than Young's, longer late
    young = plan("young", **{**BASE, "start_step": 300})
    gaps = np.diff(prior.steps)
    assert gaps[:5].mean() < np.diff(young.steps).mean() < gaps[-5:].mean()
    # the same plan plan() makes from the prior callable
    direct = plan("auto", curve=PRIOR_PROGRESS_RATE, **{**BASE, "start_step": 300, "restart_seconds": 60.0})
    assert direct.steps == prior.steps
    pol.observe(observation(600))  # enough points: the fit replaces the prior
    assert pol.replans == 2 and pol.plan.fit is not None and pol.plan.fit.usable


def test_a_flat_trace_or_no_loss_gets_no_prior() -> None:
    pol = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0)
    pol.observe(observation(300, trace=np.full(300, 2.5)))
    assert pol.plan.objective == "time" and pol.plan.inputs.curve != PRIOR_PROGRESS_RATE.description
    silent = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0)
    silent.observe(observation(300, trace=np.zeros(0)))
    assert silent.plan.objective == "time"


@pytest.mark.slow  # several full re-plans (~5 s)
def test_planning_policy_replans_only_when_something_moved() -> None:
    pol = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0,
                      objective="progress", time_budget=0.05, max_overhead=None)
    pol.observe(observation(1000))
    first = pol.plan
    pol.observe(observation(1500, checkpoints=(1100,)))  # same costs, same curve
    assert pol.plan is first and pol.replans == 1
    pol.observe(observation(2000, step=0.8))  # step time +60%
    assert pol.plan is not first and pol.replans == 2
    assert pol.plan.inputs.step_seconds == 0.8 and pol.plan.inputs.start_step == 2000
    pol.observe(observation(2500, step=0.8, stall=3.0))  # C moved
    assert pol.replans == 3


@pytest.mark.slow  # several full plans (~3.5 s)
def test_planning_policy_state_round_trips() -> None:
    pol = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0,
                      objective="progress", time_budget=0.05, max_overhead=None)
    pol.observe(observation(800))
    state = json.loads(json.dumps(pol.state_dict()))  # JSON-like
    fresh = make_policy("auto", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0,
                        objective="progress", time_budget=0.05, max_overhead=None)
    fresh.load_state_dict(state)
    assert fresh.plan == pol.plan
    assert all(fresh.should_checkpoint(s) for s in pol.plan.steps)
    fresh.observe(observation(900))  # a resumed run re-plans from its own measurements
    assert fresh.replans == 1 and fresh.plan.inputs.start_step == 900


def test_checkfreq_grows_its_interval_online_and_keeps_it() -> None:
    pol = make_policy("checkfreq", failures=None, total_steps=10_000, restart_seconds=None,
                      objective="progress", time_budget=0.05, max_overhead=None)
    # C = 0.8 s, t = 0.5 s: k = ceil(4 / 0.5) = 8 costs 0.8 / 4 = 20% > 5%
    pol.observe(observation(100))
    assert pol.plan.steps[:2] == [104, 112]
    pol.observe(observation(120, checkpoints=(104, 112)))  # two checkpoints seen: k 8 -> 10 -> 12
    assert pol.plan.details["interval_steps"] == 12
    assert pol.plan.steps[:2] == [132, 144]  # 120 was due under the old plan: the session takes it at this step
    state = pol.state_dict()
    assert state["checkfreq_k"] == 12
    fresh = PlanningPolicy("checkfreq", failures=None, total_steps=10_000)
    fresh.load_state_dict(state)
    fresh.observe(observation(200, checkpoints=(188,)))
    assert fresh.plan.details["interval_steps"] == 14


def test_open_ended_runs_use_the_default_horizon_and_extend_it() -> None:
    from coci import knobs

    pol = make_policy("young", failures=BASE["failures"], total_steps=None, restart_seconds=0.0,
                      objective="progress", time_budget=0.05, max_overhead=None)
    pol.observe(observation(100))
    assert pol.plan.inputs.total_steps == knobs.PLAN_DEFAULT_HORIZON_STEPS
    assert any("total_steps unknown" in f for f in pol.plan.fallbacks)
    late = int(knobs.PLAN_HORIZON_EXTEND_AT * knobs.PLAN_DEFAULT_HORIZON_STEPS) + 1
    pol.observe(observation(late, trace=losses(100)))
    assert pol.plan.inputs.total_steps == 2 * knobs.PLAN_DEFAULT_HORIZON_STEPS
    assert pol.plan.steps[0] > late


def test_unmeasured_costs_are_assumed_and_recorded() -> None:
    pol = make_policy("auto", failures=BASE["failures"], total_steps=5000, restart_seconds=None,
                      objective="time", time_budget=0.05, max_overhead=None)
    bare = Profile(steps=30, step_seconds=Estimate(value=0.5, count=10))
    pol.observe(Observation(step=30, profile=bare))
    assert pol.plan is not None
    text = " ".join(pol.plan.fallbacks)
    assert "stall not measured" in text and "persist not measured" in text and "restart_seconds unknown" in text
    nothing = make_policy("auto", failures=BASE["failures"], total_steps=5000, restart_seconds=None,
                          objective="time", time_budget=0.05, max_overhead=None)
    nothing.observe(Observation(step=30, profile=Profile(steps=30)))  # no step time yet
    assert nothing.plan is None and not nothing.should_checkpoint(31)


def test_a_fit_extrapolating_below_zero_stops_falling_at_zero() -> None:
    """A short noisy trace of a positive loss fitted with a negative asymptote would put most of the
    run's progress in the future (a flat weight); the planner's curve stops at 0 instead."""
    from coci.planning.progress import observed_past_rate, run_mean_rate

    steps = np.arange(1.0, 301.0)
    fit = fit_curve(steps, 2.0 - 0.004 * steps + np.random.default_rng(0).normal(0, 0.01, steps.size))
    assert fit.usable and fit.loss(np.array([20_000.0]))[0] < 0  # the law as fitted goes negative
    rate = observed_past_rate(fit, fit.progress_rate)
    mean, _ = run_mean_rate(fit, rate, 20_000, [])
    crossing = float(steps[-1])
    while fit.loss(np.array([crossing]))[0] > 0:
        crossing += 1.0
    assert rate(np.array([crossing + 10.0]))[0] == 0.0 and rate(np.array([100.0]))[0] > 0
    level = fit.loss(np.array([fit.first_step]))[0]  # a whole-trace fit: the fitted first loss
    assert mean == pytest.approx((level - 0.0) / (20_000 - fit.first_step), rel=1e-9)


# --- PlanConfig ----------------------------------------------------------------------------------


@pytest.mark.slow  # plans every policy twice (~1.2 s)
def test_plan_config_gives_the_same_plan_as_the_keywords() -> None:
    from coci import PlanConfig

    costs = dict(step_seconds=0.5, stall_seconds=0.8, persist_seconds=4.0)
    for name in POLICIES:  # a shorter horizon than BASE's: the same comparison, a tenth of the planning
        config = PlanConfig(policy=name, failures="2h", total_steps=2_000, restart_seconds=60.0)
        assert config.failures == BASE["failures"]  # an MTBF becomes the exponential model
        assert plan(config=config, curve=losses(), **costs) == plan(name, curve=losses(), **{**BASE, "total_steps": 2_000})


def test_plan_config_validates_its_fields_and_is_not_mixed_with_keywords() -> None:
    from coci import PlanConfig

    with pytest.raises(ConfigError, match="policy must be one of"):
        PlanConfig(policy="often", failures="8h")
    with pytest.raises(ConfigError, match="failures is required for policy 'auto'"):
        PlanConfig()
    with pytest.raises(ConfigError, match="time_budget must be"):
        PlanConfig(failures="8h", time_budget=-1.0)
    with pytest.raises(ConfigError, match="total_steps must be an integer >= 1"):
        PlanConfig(failures="8h", total_steps=True)
    assert PlanConfig(policy="checkfreq").failures is None
    config = PlanConfig(failures="8h", total_steps=100)
    with pytest.raises(ConfigError, match="either config= or the planning choices"):
        plan(config=config, total_steps=200, step_seconds=1.0, stall_seconds=1.0, persist_seconds=1.0)
    with pytest.raises(ConfigError, match="total_steps must be an integer >= 1, got None"):
        plan(config=config.replace(total_steps=None), step_seconds=1.0, stall_seconds=1.0, persist_seconds=1.0)


def test_every_policy_re_plans_from_a_plans_inputs_in_two_lines() -> None:
    from coci import PlanConfig

    reference = plan("auto", curve=losses(), **BASE)
    for name in POLICIES:
        config = PlanConfig.from_inputs(reference.inputs, policy=name, time_budget=reference.time_budget)
        again = plan(config=config, curve=reference.fit, **reference.inputs.measured_costs())
        assert again == plan(name, curve=reference.fit, **BASE)


def test_make_policy_and_planning_policy_accept_a_plan_config() -> None:
    from coci import PlanConfig

    config = PlanConfig(policy="young", failures=BASE["failures"], total_steps=20_000, restart_seconds=60.0)
    by_config, by_keywords = make_policy(config), make_policy("young", failures="2h", total_steps=20_000,
                                                              restart_seconds=60.0)
    assert by_config.config == by_keywords.config == config
    by_config.observe(observation(100))
    by_keywords.observe(observation(100))
    assert by_config.plan == by_keywords.plan
    with pytest.raises(ConfigError, match="either a PlanConfig or its fields"):
        PlanningPolicy(config, total_steps=10)


def test_session_takes_a_plan_config_or_builds_one_from_its_keywords(tmp_path) -> None:
    import torch

    from coci import PlanConfig, Session

    state = {"w": torch.zeros(4)}
    config = PlanConfig(policy="daly", failures=BASE["failures"], total_steps=500, restart_seconds=5.0)
    with_config = Session(tmp_path / "a", state, plan_config=config)
    with_keywords = Session(tmp_path / "b", state, policy="daly", mtbf="2h", total_steps=500, restart_seconds=5.0)
    try:
        assert with_config.policy.config == with_keywords.policy.config == config
    finally:
        with_config.close()
        with_keywords.close()
    with pytest.raises(ConfigError, match=r"either plan_config= or the planning arguments \(total_steps\)"):
        Session(tmp_path / "c", state, plan_config=config, total_steps=10)
    with pytest.raises(ConfigError, match=r"either plan_config= or the planning arguments \(policy\)"):
        Session(tmp_path / "d", state, policy="young", plan_config=config)


def test_a_restart_long_against_the_mtbf_is_noted_as_understating_the_wall_time() -> None:
    """With a toy MTBF shorter than the restart, the first-order expected costs (no failure during
    a restart) understate the wall time; the plan says so, with the memoryless restart time."""
    costs = dict(total_steps=1000, step_seconds=0.1, stall_seconds=0.01, persist_seconds=0.05)
    toy = plan("auto", failures="10s", restart_seconds=30, **costs)
    [note] = [n for n in toy.notes if "restart" in n]
    assert "3 of the job's MTBF" in note and f"{10 * math.expm1(3):.3g} s on average" in note
    assert toy.expected["restart_seconds"] == pytest.approx(toy.expected["failures"] * 30)  # the figures stay first order
    for policy in ("young", "daly", "auto"):
        realistic = plan(policy, failures="8h", restart_seconds=60, **costs)
        assert not any("restart" in n for n in realistic.notes)
    assert not any("restart" in n for n in plan("auto", failures="10s", restart_seconds=1, **costs).notes)


def test_a_plan_whose_failures_cost_the_whole_run_round_trips_its_infinite_figures() -> None:
    """An MTBF shorter than a restart makes the exposed wall-clock overhead infinite; the policy
    state carries the plan as JSON between ranks and across restores, so ``inf`` must come back."""
    p = plan("young", **{**BASE, "failures": Failures.exponential(2.0), "restart_seconds": 10.0})
    assert math.isinf(p.expected["exposed_wall_seconds"])
    assert Plan.model_validate_json(p.model_dump_json()) == p
