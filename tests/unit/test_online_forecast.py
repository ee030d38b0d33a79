"""The online planner's curve (:func:`coci.planning.empirical.forecast_curve`): the past as the trace
shows it, the future blended from extensions by held-out error; and the planning policy that re-plans
on it as the trace is revealed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coci.errors import ConfigError
from coci.planning.empirical import BLEND, EmpiricalCurve, empirical_progress_rate, forecast_curve
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.online import PlanningPolicy, make_policy
from coci.planning.policy import Observation
from coci.planning.progress import fit_progress_weight, run_mean_rate
from coci.profiler import Estimate, Profile

N = 20_000
STEPS = np.arange(1, N + 1, dtype=float)
NOISE = np.random.default_rng(0).normal(0.0, 0.01, N)


def profile(at: int) -> Profile:
    return Profile(
        steps=at, step_seconds=Estimate(value=0.5, count=50), stall_seconds=Estimate(value=0.8, count=3),
        persist_seconds=Estimate(value=4.0, count=3), restore_seconds=Estimate(value=30.0, count=1),
    )


def policy() -> PlanningPolicy:
    return make_policy("auto", failures=Failures.exponential("2h"), total_steps=N, restart_seconds=60.0)


def observe(pol: PlanningPolicy, at: int, losses: np.ndarray, taken: list[int]) -> None:
    """One observation at step ``at`` (the trace so far), the plan's checkpoints up to it taken."""
    last = taken[-1] if taken else 0
    taken.extend(s for s in (pol.plan.steps if pol.plan is not None else []) if last < s <= at)
    pol.observe(Observation(step=at, profile=profile(at), loss_steps=STEPS[:at], losses=losses[:at], checkpoint_steps=tuple(taken)))


def weight(curve, steps: np.ndarray) -> np.ndarray:
    """The progress weight the planner derives from ``curve``: its rate over the whole run's mean."""
    mean, _ = run_mean_rate(None, curve, N, [])
    assert mean is not None
    return np.asarray(curve(steps)) / mean


def test_the_observed_past_is_the_trace_and_keeps_the_early_fall() -> None:
    losses = 2.0 + 8.0 * np.exp(-STEPS / 150.0) + 0.4 * np.exp(-STEPS / 5000.0) + NOISE
    at = 3000
    fit = fit_curve(STEPS[:at], losses[:at])
    curve = forecast_curve(STEPS[:at], losses[:at], fit)
    past = np.linspace(1.0, curve.last_step, 400)  # the trace's last smoothed point: the past ends there
    np.testing.assert_array_equal(curve(past), empirical_progress_rate(STEPS[:at], losses[:at])(past))
    pol = policy()
    observe(pol, at, losses, [])
    assert isinstance(pol.curve, EmpiricalCurve) and pol.curve.extension == BLEND
    np.testing.assert_array_equal(pol.curve(past), curve(past))
    # the early fall keeps its weight: the law the planner used before (a window fit, the observed
    # average before its window) puts the first 300 steps far below what the trace shows
    early = np.linspace(1.0, 300.0, 100)
    law = fit_progress_weight(fit, N)
    assert law is not None
    assert weight(curve, early).mean() > 3.0 * law(early).mean()
    assert pol.plan is not None and pol.plan.fit is not None and "blend" in pol.plan.inputs.curve


@pytest.mark.slow  # an online run of re-plans over thousands of steps
def test_a_curve_that_flattens_moves_the_plan_off_its_first_guess() -> None:
    # falls steadily to step 2000, flat after: early, every forecast expects the fall to go on
    losses = 5.0 + np.clip(1.0 - STEPS / 2000.0, 0.0, None) + NOISE
    pol, taken = policy(), []
    late = np.linspace(5000.0, N, 200)
    observe(pol, 250, losses, taken)
    assert weight(pol.curve, late).mean() > 0.4  # the first guess: progress all run
    replans, moved_at = pol.replans, None
    for at in range(500, 4001, 250):
        observe(pol, at, losses, taken)
        if at > 2000 and moved_at is None and weight(pol.curve, late).mean() < 0.05:
            moved_at = at
    assert moved_at is not None and moved_at <= 3000  # once the held-back tail is flat
    assert pol.replans - replans <= 10
    assert pol.plan is not None and pol.plan.steps[0] > 2000


@pytest.mark.slow  # an online run of re-plans over thousands of steps
def test_a_curve_flat_at_first_that_then_falls_moves_the_plan_off_its_first_guess() -> None:
    # flat (noise only) to step 3000, then falls by 1.0 over 3000 steps, flat after: the first guess
    # (a flat trace) is the time-optimal plan; once the fall shows, the plan must weigh it
    losses = 3.0 + np.clip((6000.0 - STEPS) / 3000.0, 0.0, 1.0) + NOISE
    pol, taken = policy(), []
    observe(pol, 250, losses, taken)
    assert pol.plan is not None and pol.plan.mu is None and not isinstance(pol.curve, EmpiricalCurve)
    first = np.asarray(pol.plan.steps)
    replans, moved_at = pol.replans, None
    for at in range(500, 6001, 250):
        observe(pol, at, losses, taken)
        assert pol.plan is not None
        ahead, window = np.asarray(pol.plan.steps), (at, at + 1500)  # the next 1500 steps, against the first guess
        denser = np.count_nonzero((ahead > window[0]) & (ahead <= window[1])) > np.count_nonzero(
            (first > window[0]) & (first <= window[1]))
        if moved_at is None and isinstance(pol.curve, EmpiricalCurve) and pol.plan.mu is not None and denser:
            moved_at = at
    assert moved_at is not None and moved_at <= 4000  # within 1000 steps of the fall's start
    assert pol.replans - replans <= 5


@pytest.mark.slow  # an online run of re-plans over thousands of steps
def test_a_second_fall_after_a_plateau_moves_the_plan_within_a_few_re_plans() -> None:
    # falls by 1.0 to step 2000, flat (noise only) to step 6000, then falls by 1.0 again over 3000
    # steps: on the plateau the forecast expects little more progress; once the second fall shows,
    # the plan must checkpoint more densely ahead than the plan made on the plateau
    second = 6000
    losses = 5.0 + np.clip(1.0 - STEPS / 2000.0, 0.0, None) + np.clip((second + 3000.0 - STEPS) / 3000.0, 0.0, 1.0) + NOISE
    pol, taken = policy(), []
    for at in range(250, second + 1, 250):
        observe(pol, at, losses, taken)
    assert pol.plan is not None
    plateau, replans = np.asarray(pol.plan.steps), pol.replans
    assert weight(pol.curve, np.linspace(second, second + 1500, 50)).mean() < 0.1  # the plateau's guess
    moved_at = None
    for at in range(second + 250, second + 2001, 250):
        observe(pol, at, losses, taken)
        ahead, window = np.asarray(pol.plan.steps), (at, at + 1500)
        denser = np.count_nonzero((ahead > window[0]) & (ahead <= window[1])) > np.count_nonzero(
            (plateau > window[0]) & (plateau <= window[1]))
        if moved_at is None and denser and weight(pol.curve, np.linspace(at, at + 1500, 50)).mean() > 0.5:
            moved_at, replans_to_move = at, pol.replans - replans
    assert moved_at is not None and moved_at <= second + 1000  # within 1000 steps of the second fall's start
    assert replans_to_move <= 4


@pytest.mark.parametrize("shape", ["noisy", "two phases", "fast early fall"])
def test_the_forecast_is_well_behaved(shape: str) -> None:
    rng = np.random.default_rng(1)
    losses = {
        "noisy": 3.0 + 8.0 * (STEPS + 100.0) ** -0.3 + rng.normal(0.0, 0.2, N),
        "two phases": 3.0 + np.exp(-STEPS / 300.0) + np.where(STEPS > 2500, 0.0, 0.8) + rng.normal(0.0, 0.01, N),
        "fast early fall": 2.0 + 8.0 * np.exp(-STEPS / 30.0) + rng.normal(0.0, 0.01, N),
    }[shape]
    for at in (60, 400, 2000, 4000):
        try:
            curve = forecast_curve(STEPS[:at], losses[:at], fit_curve(STEPS[:at], losses[:at]))
        except ConfigError:  # refused cleanly: a fall still within the noise
            assert shape == "noisy" and at < 2000
            continue
        assert math.isclose(sum(curve.blend.values()), 1.0) and all(w >= 0 for w in curve.blend.values())
        grid = np.linspace(0.0, N, 4001)
        rate = curve(grid)
        assert np.all(np.isfinite(rate)) and np.all(rate >= 0)
        assert np.all(curve.loss(grid) >= 0) and np.all(np.diff(curve.loss(grid)) <= 1e-12)
    pol, taken = policy(), []
    for at in (100, 1000, 3000):
        observe(pol, at, losses, taken)
        assert pol.plan is not None and [s for s in pol.plan.steps if s > at]
        assert isinstance(pol.curve, EmpiricalCurve) or shape == "noisy"


def test_a_flat_trace_is_no_forecast_and_plans_for_time() -> None:
    losses = 3.0 + NOISE
    with pytest.raises(ConfigError):
        forecast_curve(STEPS[:2000], losses[:2000], fit_curve(STEPS[:2000], losses[:2000]))
    pol, taken = policy(), []
    observe(pol, 2000, losses, taken)
    assert pol.plan is not None and pol.plan.mu is None  # the time objective
    assert not isinstance(pol.curve, EmpiricalCurve)
