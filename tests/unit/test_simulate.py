"""coci.analysis.simulate: the Monte Carlo replay against theory (Daly), hand-computed timelines, the planner's
expectation, restarting hazards, early termination, online replay, determinism and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import PrivateAttr

from coci import knobs
from coci.analysis.simulate import METRICS, SimulationResult, daly_expected_seconds, empirical_progress_rate, simulate
from coci.errors import ConfigError
from coci.planning.failures import Failures
from coci.planning.fit import CurveFit
from coci.planning.formulas import daly_interval_seconds
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.online import make_policy
from coci.planning.planner import plan
from coci.planning.policy import EveryN
from coci.planning.records import Plan, PlanInputs

NEVER = Failures.exponential(mtbf=1e15)


class ScriptedFailures(Failures):
    """Lifetimes from a script, one value per draw (every trial alike); then no more failures."""

    _script: list[float] = PrivateAttr(default_factory=list)

    @classmethod
    def of(cls, *lifetimes: float) -> ScriptedFailures:
        model = cls(kind="exponential", shape=1.0, scale_seconds=1e15)
        model._script = list(lifetimes)
        return model

    def sample(self, rng, size):  # type: ignore[override]
        value = self._script.pop(0) if self._script else 1e15
        return np.full(size, value)


def with_steps(base: Plan, steps) -> Plan:
    return base.model_copy(update={"steps": [int(s) for s in steps]})


def base_plan(**overrides) -> Plan:
    kwargs = dict(failures=NEVER, total_steps=10, step_seconds=1.0, stall_seconds=1.0,
                  persist_seconds=5.0, restart_seconds=0.0)
    kwargs.update(overrides)
    return plan("young", **kwargs)


# --- hand-computed timelines -------------------------------------------------------------------------


def test_failure_free_run_costs_exactly_the_checkpoints_and_the_persist_waits() -> None:
    # steps 2 and 4, S = 1, P = 5: the second snapshot waits for the first commit (wall 8).
    # Timeline: step 2 ends at 2, stall to 3, commit 8; step 4 reached at 5, waits to 8, stall to 9,
    # commit 14; then 6 steps, the first 5 inside the persist window: end at 15 for a 10 s run.
    result = simulate(with_steps(base_plan(), [2, 4]), trials=3, seed=0)
    for name in ("wall_seconds", "checkpoint_seconds", "progress_seconds"):
        assert result.values(name) == pytest.approx([5.0] * 3)
    assert result.values("checkpoints").tolist() == [2, 2, 2]
    assert result.values("failures").tolist() == [0, 0, 0]
    assert result.mean("wall_percent") == pytest.approx(50.0)


def test_interference_slows_the_steps_under_a_persist() -> None:
    # P = 4, I = 2: steps run at half speed for 4 s (2 s of progress): C = S + I = 3.
    p = base_plan(persist_seconds=4.0, interference_seconds=2.0)
    result = simulate(with_steps(p, [2]), trials=2, seed=0)
    assert result.values("wall_seconds") == pytest.approx([3.0, 3.0])


def test_a_failure_during_the_persist_loses_that_checkpoint() -> None:
    # t = 1, S = 1, P = 10, checkpoint at step 100: snapshot ends at 101, commits at 111.
    p = with_steps(base_plan(total_steps=300, persist_seconds=10.0, restart_seconds=7.0), [100, 200])
    early = simulate(p, failures=ScriptedFailures.of(105.0), trials=1, seed=0)  # before the commit
    assert early.values("lost_seconds")[0] == pytest.approx(104.0)  # back to step 0
    assert early.values("steps_lost")[0] == 104
    late = simulate(p, failures=ScriptedFailures.of(115.0), trials=1, seed=0)  # after it
    assert late.values("lost_seconds")[0] == pytest.approx(14.0)  # back to step 100
    assert late.values("steps_lost")[0] == 14
    for result, lost in ((early, 104.0), (late, 14.0)):
        assert result.values("failures")[0] == 1
        assert result.values("restart_seconds")[0] == pytest.approx(7.0)
        # wall = the 115/105 s before the failure + restart + the rest of the run from the rollback
        wall = result.values("wall_seconds")[0]
        assert wall == pytest.approx(result.values("checkpoint_seconds")[0] + 7.0 + lost)
    # the first trial re-takes checkpoint 100 after the restart: 3 snapshots in all
    assert early.values("checkpoints")[0] == 3 and late.values("checkpoints")[0] == 2


def test_a_failure_during_a_restart_starts_the_restart_over() -> None:
    p = with_steps(base_plan(total_steps=300, persist_seconds=2.0, restart_seconds=50.0), [100])
    # fails at 150 (after the commit at 103), then 20 s into the restart, then never
    result = simulate(p, failures=ScriptedFailures.of(150.0, 20.0), trials=1, seed=0)
    assert result.values("failures")[0] == 2
    assert result.values("restart_seconds")[0] == pytest.approx(20.0 + 50.0)


def test_lost_work_is_weighted_by_the_true_curve() -> None:
    curve = CurveFit(family="power", params={"a": 5.0, "b": 0.5, "s0": 10.0, "c": 2.0})
    p = with_steps(base_plan(total_steps=300, persist_seconds=2.0), [100, 200])
    result = simulate(p, failures=ScriptedFailures.of(150.0), trials=1, seed=0, curve=curve)
    model = build_cost_model(total_steps=300, step_seconds=1.0, checkpoint_seconds=1.0, persist_seconds=2.0,
                             restart_seconds=0.0, failures=ExpectedFailures.constant(1.0),
                             progress_rate=curve.progress_rate)
    progress = 100 + (150 - 101)  # position reached at the failure
    weighted = float(model.weight_until(progress) - model.weight_until(100.0))
    assert result.values("lost_progress_seconds")[0] == pytest.approx(weighted)
    assert result.values("lost_seconds")[0] == pytest.approx(49.0)
    assert weighted < 49.0  # w < 1 after step 100 of a decaying power law (w averages 1)
    assert result.values("progress_seconds")[0] == pytest.approx(
        result.values("checkpoint_seconds")[0] + result.values("restart_seconds")[0] + weighted
    )


# --- theory ----------------------------------------------------------------------------------------


DALY_JOB = dict(total_steps=3000, step_seconds=1.0, stall_seconds=6.0, persist_seconds=1e-3,
                restart_seconds=40.0)
DALY_MTBF = 600.0


def test_simulated_wall_time_matches_dalys_closed_form_over_a_grid_of_intervals() -> None:
    failures = Failures.exponential(mtbf=DALY_MTBF)
    daly = plan("daly", failures=failures, **DALY_JOB)
    grid = [25, 50, int(daly.details["interval_steps"]), 130, 250, 500]
    # Each point is checked against its own 95% interval with this seed; over seeds 0-29 the same
    # check missed 9 of 180 points (5%, as a correct model should) and the minimum test never failed.
    results = {}
    for k in grid:
        p = with_steps(daly, range(k, DALY_JOB["total_steps"], k))
        result = simulate(p, trials=4000, seed=3)
        theory = daly_expected_seconds(p) - DALY_JOB["total_steps"] * DALY_JOB["step_seconds"]
        summary = result.metrics["wall_seconds"]
        assert summary.ci_low <= theory <= summary.ci_high, (k, summary, theory)
        results[k] = result
    # Daly's interval is the simulated minimum within the (paired) confidence interval ...
    best = min(results, key=lambda k: results[k].mean("wall_seconds"))
    daly_k = int(daly.details["interval_steps"])
    change = results[daly_k].compare(results[best], "wall_seconds")
    assert change.ci_low <= 0.0, (best, change)
    # ... and intervals 4x off either way are clearly worse
    for far in (25, 500):
        assert results[far].compare(results[daly_k], "wall_seconds").ci_low > 0.05


def test_dalys_interval_formula_is_what_the_plan_uses() -> None:
    daly = plan("daly", failures=Failures.exponential(mtbf=DALY_MTBF), **DALY_JOB)
    seconds = daly_interval_seconds(DALY_JOB["stall_seconds"], DALY_MTBF)
    assert daly.details["interval_steps"] == round(seconds)


def test_simulation_agrees_with_the_planners_expectation_when_failures_are_rare() -> None:
    # the reference job (0.25 s steps, MTBF 8 h): first order is accurate (about one failure per run)
    p = plan("young", failures=Failures.exponential("8h"), total_steps=100_000, step_seconds=0.25,
             stall_seconds=0.4, persist_seconds=6.0, restart_seconds=60.0)
    result = simulate(p, trials=4000, seed=0)
    summary = result.metrics["wall_seconds"]
    assert abs(summary.mean / p.expected["wall_seconds"] - 1) < 0.05
    assert summary.ci_low <= p.expected["wall_seconds"] <= summary.ci_high + 0.02 * summary.mean
    assert result.mean("failures") == pytest.approx(p.expected["failures"], rel=0.05)
    frame = result.to_frame()
    assert frame["metric"].tolist() == list(METRICS)
    assert {"mean", "ci_low", "ci_high", "std", "expected"} <= set(frame.columns)


def test_weibull_hazard_restarts_at_every_restart() -> None:
    # shape 0.5 front-loads failures after each (re)start. A restart renews the clock, so failures
    # form a renewal process in wall time: their count follows the renewal function M(T) (the
    # planner's expected hazard), not the single-clock cumulative hazard (T / scale) ** 0.5.
    failures = Failures.weibull(0.5, "20m")
    p = plan("young", failures=failures, total_steps=20_000, step_seconds=1.0, stall_seconds=0.5,
             persist_seconds=1.0, restart_seconds=5.0)
    result = simulate(p, trials=400, seed=1)
    wall = float((result.values("run_seconds") + result.values("wall_seconds")).mean())
    renewal = ExpectedFailures.renewal(failures.cumulative_hazard, failures.mean_seconds, 2 * wall)
    summary = result.metrics["failures"]
    assert summary.mean == pytest.approx(float(renewal(wall)), rel=0.05)
    assert summary.mean > 2 * float(failures.cumulative_hazard(wall))  # a single clock: far fewer
    assert summary.mean == pytest.approx(p.expected["failures"], rel=0.15)  # first order, on progress


# --- exploratory jobs, online replay --------------------------------------------------------------


def test_termination_stops_each_trial_inside_its_range() -> None:
    p = plan("young", failures=Failures.exponential("2h"), total_steps=20_000, step_seconds=1.0,
             stall_seconds=2.0, persist_seconds=5.0, restart_seconds=60.0)
    ranged = simulate(p, trials=500, seed=0, termination=(0.4, 0.6))
    run = ranged.values("run_seconds")
    assert run.min() >= 0.4 * 20_000 and run.max() <= 0.6 * 20_000
    assert run.mean() == pytest.approx(10_000, rel=0.02)
    full = simulate(p, trials=500, seed=0)
    assert ranged.mean("checkpoints") < 0.65 * full.mean("checkpoints")
    half = simulate(p, trials=50, seed=0, termination=0.5, failures=NEVER)
    taken = sum(1 for s in p.steps if s < 10_000)
    assert half.values("checkpoints").tolist() == [taken] * 50
    assert half.values("wall_seconds") == pytest.approx([taken * 2.0] * 50)
    assert ranged.expected == {}


@pytest.mark.slow  # replays a policy step by step with many re-plans (~15 s)
def test_online_auto_plans_from_the_curve_prefix_and_checkfreq_grows() -> None:
    steps = np.arange(1, 4001)
    losses = 2.0 + 6.0 * (steps + 50.0) ** -0.6 + np.random.default_rng(0).normal(0, 0.01, steps.size)
    job = dict(failures=Failures.exponential("1h"), total_steps=4000, step_seconds=2.0, stall_seconds=3.0,
               persist_seconds=8.0, restart_seconds=60.0)
    offline = plan("auto", curve=(steps, losses), **job)
    online = simulate(offline, trials=300, seed=0, online=True, curve=(steps, losses))
    assert online.online and online.replans >= 8
    assert online.steps != offline.steps
    # before the first plan only warm-up checkpoints (doublings), skipped while a persist is in flight
    # (P = 8 s = 4 steps) or the stalls exceed 10% of the wall time (C = 3 s against 2 s steps)
    warm = [s for s in online.steps if s <= 20]
    assert set(warm) <= set(knobs.PLAN_WARMUP_CHECKPOINT_STEPS) and warm[0] == 1 and 2 not in warm
    young = simulate(plan("young", **job), trials=300, seed=0, curve=(steps, losses))
    # online auto still weights: shorter intervals early, longer late
    intervals = np.diff(online.steps)
    assert intervals[: len(intervals) // 4].mean() < intervals[-len(intervals) // 4 :].mean()
    assert online.compare(young, "progress_seconds").mean < 0
    # checkfreq's growth, replayed from its own observations: k = ceil(8 / 2) = 4 grows to C / 5% t,
    # never shrinking (a re-plan at a step the old plan checkpoints counts that checkpoint as taken)
    checkfreq = simulate(make_policy("checkfreq", failures=None, total_steps=4000), job=offline,
                         failures=job["failures"], trials=10, seed=0, losses=(steps, losses))
    gaps = np.diff(checkfreq.steps)
    assert gaps[0] == 4 and gaps[-1] >= 3.0 / (0.05 * 2.0) and np.all(np.diff(gaps) >= 0)


def test_policy_objects_replay_online() -> None:
    p = base_plan(total_steps=1000)
    result = simulate(EveryN(100), job=p, failures=NEVER, trials=2, seed=0)
    assert result.steps == list(range(100, 1000, 100)) and result.online
    assert result.values("checkpoints").tolist() == [9, 9]


class RecordingEvery100:
    """Checkpoints every 100 steps and records the steps at which it is observed."""

    def __init__(self) -> None:
        self.observed: list[int] = []

    def should_checkpoint(self, step: int) -> bool:
        return step % 100 == 0

    def observe(self, observation) -> None:
        self.observed.append(observation.step)


def test_replay_observes_after_each_commit_under_the_planning_time_cap() -> None:
    from coci.analysis.simulate import online_schedule

    job = base_plan(total_steps=1000).inputs  # t = 1 s, S = 1 s, P = 5 s: a checkpoint at s commits at s + 5
    cheap = RecordingEvery100()
    steps, count = online_schedule(cheap, job, None, plan_seconds=0.1)
    assert steps.tolist() == list(range(100, 1000, 100))
    # the session's cadence: warm-up, then after every commit (planning 0.1 s each stays under 1%)
    assert cheap.observed == [20, *range(105, 1000, 100)] and count == len(cheap.observed)
    # 5 s per re-plan: after warm-up the next commit observation waits until 5 s <= 1% of the wall
    # time (step 505: 505 + 5 stalls + 5 s planned = 515 s); then 10 s needs 1,000 s, beyond the run
    dear = RecordingEvery100()
    online_schedule(dear, job, None, plan_seconds=5.0)
    assert dear.observed == [20, 505]
    # a policy that never checkpoints is observed at warm-up and then every observe_every steps
    idle = RecordingEvery100()
    idle.should_checkpoint = lambda step: False  # type: ignore[method-assign]
    online_schedule(idle, job, None, observe_every=300, plan_seconds=0.1)
    assert idle.observed == [20, 320, 620, 920]
    with pytest.raises(ConfigError, match="observe_every"):
        online_schedule(RecordingEvery100(), job, None, observe_every=0)
    with pytest.raises(ConfigError, match="plan_seconds"):
        online_schedule(RecordingEvery100(), job, None, plan_seconds=-1.0)


def test_empirical_rate_is_non_negative_and_follows_the_fall() -> None:
    steps = np.arange(1, 5001)
    noisy = 3.0 + 5.0 * np.exp(-steps / 800.0) + np.random.default_rng(1).normal(0, 0.05, steps.size)
    rate = empirical_progress_rate(steps, noisy)
    v = rate(np.array([100.0, 1000.0, 3000.0]))
    truth = 5.0 / 800.0 * np.exp(-np.array([100.0, 1000.0, 3000.0]) / 800.0)
    assert np.all(v >= 0) and v[0] > v[1] > v[2] * 0.99
    assert v[0] == pytest.approx(truth[0], rel=0.3) and v[1] == pytest.approx(truth[1], rel=0.5)
    with pytest.raises(ConfigError, match="curve"):
        empirical_progress_rate(steps, np.ones(steps.size))


# --- determinism and bad input ---------------------------------------------------------------------


def test_deterministic_for_a_seed() -> None:
    p = plan("young", failures=Failures.exponential("1h"), total_steps=20_000, step_seconds=1.0,
             stall_seconds=2.0, persist_seconds=5.0, restart_seconds=60.0)
    a, b = simulate(p, trials=200, seed=7), simulate(p, trials=200, seed=7)
    assert a.samples == b.samples and a == b
    c = simulate(p, trials=200, seed=8)
    assert c.samples["wall_seconds"] != a.samples["wall_seconds"]
    assert SimulationResult.model_validate_json(a.model_dump_json()) == a  # JSON round trip


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(trials=0), "trials"),
        (dict(trials=-5), "trials"),
        (dict(trials=True), "trials"),
        (dict(seed=-1), "seed"),
        (dict(termination=(0.6, 0.4)), "termination"),
        (dict(termination=1e-4), "termination"),  # stops before the first of 1000 steps
        (dict(termination="half"), "termination"),
        (dict(failures=-3), "failures"),  # the argument passed, an MTBF
        (dict(failures=object()), "failures"),
    ],
)
def test_bad_inputs_name_the_field(kwargs: dict, field: str) -> None:
    p = base_plan(total_steps=1000)
    with pytest.raises(ConfigError, match=field):
        simulate(p, **kwargs)


def test_bad_plans_name_the_field() -> None:
    p = base_plan(total_steps=1000)
    empty_horizon = p.model_copy(update={"inputs": p.inputs.model_copy(update={"total_steps": 0}), "steps": []})
    with pytest.raises(ConfigError, match="total_steps"):
        simulate(empty_horizon, trials=10)
    outside = p.model_copy(update={"steps": [5, 2000]})
    with pytest.raises(ConfigError, match="plan.steps"):
        simulate(outside, trials=10)
    no_failures = p.model_copy(update={"inputs": p.inputs.model_copy(update={"failures": None})})
    with pytest.raises(ConfigError, match="failures"):
        simulate(no_failures, trials=10)
    replanned = p.model_copy(update={"inputs": p.inputs.model_copy(update={"start_step": 10})})
    with pytest.raises(ConfigError, match="start_step"):
        simulate(replanned, trials=10)
    heavy = p.model_copy(update={"inputs": p.inputs.model_copy(update={"interference_seconds": 9.0})})
    with pytest.raises(ConfigError, match="interference_seconds"):
        simulate(heavy, trials=10)
    with pytest.raises(ConfigError, match="job"):
        simulate(EveryN(10), trials=10)
    with pytest.raises(ConfigError, match="plan_or_policy"):
        simulate([10, 20], trials=10)
    with pytest.raises(ConfigError, match="losses"):
        _online_auto_without_trace()


def _online_auto_without_trace() -> None:
    curve = CurveFit(family="power", params={"a": 5.0, "b": 0.5, "s0": 10.0, "c": 2.0})
    p = plan("auto", failures=NEVER, total_steps=100, step_seconds=1.0, stall_seconds=1.0,
             persist_seconds=2.0, curve=curve)
    simulate(p, online=True, trials=2, curve=lambda s: np.ones_like(s))


def test_a_plan_without_checkpoints_is_the_no_checkpoint_baseline() -> None:
    p = with_steps(base_plan(total_steps=1000, restart_seconds=10.0), [])
    result = simulate(p, failures=ScriptedFailures.of(400.0), trials=1, seed=0)
    assert result.values("lost_seconds")[0] == pytest.approx(400.0)
    assert result.values("wall_seconds")[0] == pytest.approx(410.0)
    assert math.isclose(result.values("checkpoints")[0], 0.0)


def test_runaway_trials_are_capped_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from coci import knobs

    monkeypatch.setattr(knobs, "SIMULATE_MAX_FAILURES", 5)
    p = with_steps(base_plan(total_steps=100_000, restart_seconds=1.0), [])  # one 28 h segment
    result = simulate(p, failures=Failures.exponential("1h"), trials=20, seed=0)
    assert result.unfinished == 20 and "lower bounds" in " ".join(result.notes)
    assert result.values("failures").tolist() == [5.0] * 20


def test_plan_inputs_round_trip_in_the_result() -> None:
    p = base_plan(total_steps=1000)
    result = simulate(p, trials=5, seed=0)
    assert isinstance(result.inputs, PlanInputs) and result.inputs == p.inputs


@pytest.mark.slow  # replays a policy step by step with many re-plans (~15 s)
def test_online_replanning_keeps_most_of_the_offline_cut_on_a_decaying_curve() -> None:
    """The plan re-derived as training reveals the curve keeps most of the offline cut.

    Scored in expected-cost terms (coci.planning.objective) under the true empirical weight. Every
    re-plan normalises the weight over the whole run (normalised over the remaining steps only, each
    re-plan would checkpoint densely at its front). The warm-up checkpoints and earlier plans count
    against the whole run's 5% time budget, so the re-plans spend less where the warm-up already
    spent: online keeps about 69% of the offline cut at +4.1% wall clock over Young (without
    charging the warm-up it kept 78% at +6.6%, over the budget)."""
    from coci.analysis.simulate import online_schedule
    from coci.planning.objective import expected_failures

    total = 2000
    steps = np.arange(1, total + 1, dtype=float)
    losses = 2.0 + 8.0 * np.exp(-5.0 * steps / total) + np.random.default_rng(0).normal(0, 0.02, total)
    failures = Failures.exponential("1h")
    job = dict(failures=failures, total_steps=total, step_seconds=2.0, stall_seconds=3.0, persist_seconds=8.0,
               restart_seconds=60.0)
    offline = plan("auto", curve=(steps, losses), **job)
    young = plan("young", **job)
    policy = make_policy("auto", failures=failures, total_steps=total, restart_seconds=60.0)
    online, observations = online_schedule(policy, offline.inputs, (steps, losses))
    assert observations >= 5 and policy.replans >= 2
    truth = build_cost_model(total_steps=total, step_seconds=2.0, checkpoint_seconds=3.0, persist_seconds=8.0,
                             restart_seconds=60.0, failures=expected_failures(failures, total * 2.0),
                             progress_rate=empirical_progress_rate(steps, losses))
    cost = {name: truth.expected(np.asarray(s, dtype=np.int64))
            for name, s in (("young", young.steps), ("offline", offline.steps), ("online", online))}
    offline_cut = 1 - cost["offline"].progress_seconds / cost["young"].progress_seconds
    online_cut = 1 - cost["online"].progress_seconds / cost["young"].progress_seconds
    assert offline_cut > 0.08
    assert online_cut >= 0.6 * offline_cut
    assert cost["online"].wall_seconds <= 1.05 * cost["young"].wall_seconds  # the budget holds online
    # the warm-up bet loses on this job (what the README says): without it the online plan keeps more
    knobs_before = knobs.PLAN_WARMUP_CHECKPOINT_STEPS
    knobs.PLAN_WARMUP_CHECKPOINT_STEPS = ()
    try:
        no_bet, _ = online_schedule(make_policy("auto", failures=failures, total_steps=total, restart_seconds=60.0),
                                    offline.inputs, (steps, losses))
    finally:
        knobs.PLAN_WARMUP_CHECKPOINT_STEPS = knobs_before
    no_bet_cut = 1 - truth.expected(no_bet).progress_seconds / cost["young"].progress_seconds
    assert online_cut < no_bet_cut and no_bet_cut >= 0.85 * offline_cut  # 0.90 and 0.69 of it with the bet
    # and within the run's time budget (the budget applies to the whole run, not to each re-plan),
    # plus the warm-up bet: at most one stall (3 s) per warm-up checkpoint taken
    warmup = sum(1 for s in online if s < knobs.PLAN_WARMUP_STEPS)
    assert cost["online"].wall_seconds <= 1.06 * cost["young"].wall_seconds + warmup * 3.0
