"""The exact DP, and ``auto`` validated against it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from exact_optimum import constrained_optimum, optimal_steps

from coci.errors import ConfigError
from coci.planning.failures import Failures
from coci.planning.formulas import auto_steps, min_interval_steps, periodic_steps, young_interval_seconds
from coci.planning.objective import ExpectedFailures, build_cost_model, expected_failures


def decaying_rate(s: np.ndarray) -> np.ndarray:
    """v(s) of L(s) = 2 + 3 (s + 50)^-0.5: falls fast early, slowly late."""
    return 1.5 * (np.asarray(s, dtype=float) + 50.0) ** -1.5


def model(total, *, t=1.0, c=2.0, p=5.0, r=30.0, failures=None, curve=None, **kw):
    failures = ExpectedFailures.constant(1 / 2000) if failures is None else failures
    if not isinstance(failures, ExpectedFailures):
        failures = expected_failures(failures, total * t)
    return build_cost_model(
        total_steps=total, step_seconds=t, checkpoint_seconds=c, persist_seconds=p, restart_seconds=r,
        failures=failures, progress_rate=curve, **kw,
    )


@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("min_steps", [1, 3])
def test_dp_equals_brute_force_on_a_tiny_horizon(alpha: float, min_steps: int) -> None:
    m = model(14, c=0.3, p=1.5, failures=ExpectedFailures.constant(1 / 15), curve=decaying_rate)
    best = (np.inf, ())
    for n in range(0, 14):
        for combo in itertools.combinations(range(1, 14), n):
            gaps = np.diff((0, *combo))
            if len(combo) and np.any(gaps < min_steps):
                continue
            value = m.objective(np.asarray(combo, dtype=np.int64), alpha)
            best = min(best, (value, combo))
    steps, value = optimal_steps(m, alpha=alpha, min_steps=min_steps)
    assert value == pytest.approx(best[0], rel=1e-12)
    assert m.objective(steps, alpha) == pytest.approx(value, rel=1e-12)


def test_dp_refuses_long_horizons() -> None:
    with pytest.raises(ConfigError, match="total_steps"):
        optimal_steps(model(30_000), alpha=0.0)


@pytest.mark.parametrize(
    "failures",
    [ExpectedFailures.constant(1 / 2000), ExpectedFailures.constant(1 / 300)],
    ids=["mtbf-2000s", "mtbf-300s"],
)
def test_auto_time_objective_is_within_one_percent_of_the_dp(failures: ExpectedFailures) -> None:
    m = model(2000, failures=failures)
    kmin = min_interval_steps(1.0, 5.0, 2.0, None)
    auto = m.expected(auto_steps(m, objective="time", min_steps=kmin).steps).wall_seconds
    _, optimum = optimal_steps(m, alpha=0.0, min_steps=kmin)
    assert optimum * (1 - 1e-12) <= auto <= 1.01 * optimum


def test_auto_time_objective_with_a_restarting_weibull_is_near_the_dp() -> None:
    m = model(2000, failures=Failures.weibull(0.6, 1500.0))
    auto = m.expected(auto_steps(m, objective="time", min_steps=5).steps).wall_seconds
    _, optimum = optimal_steps(m, alpha=0.0, min_steps=5)
    assert optimum * (1 - 1e-12) <= auto <= 1.02 * optimum


def test_auto_progress_objective_matches_the_constrained_dp(capsys: pytest.CaptureFixture[str]) -> None:
    m = model(2000, curve=decaying_rate)
    kmin = min_interval_steps(1.0, 5.0, 2.0, None)
    result = auto_steps(m, objective="progress", time_budget=0.05, min_steps=kmin)
    auto = m.expected(result.steps)
    intervals = np.diff(np.concatenate([[0], result.steps]))

    # intervals grow with the step (up to one step of rounding)
    assert intervals[-1] > 3 * intervals[0] and np.all(np.diff(intervals) >= -1)
    # wall-clock overhead within the budget, measured against the DP's time optimum too
    _, time_optimum = optimal_steps(m, alpha=0.0, min_steps=kmin)
    assert auto.wall_seconds <= result.budget_wall_seconds
    assert auto.wall_seconds <= 1.05 * time_optimum * 1.01
    # progress-weighted overhead within 2% of the DP optimum under the same budget; the dual
    # bound is a certified lower bound on that optimum
    # (the DP's constraint is on the first-order wall-clock overhead: auto's own, so both spend the same)
    dp = constrained_optimum(m, budget_wall_seconds=auto.wall_seconds, min_steps=kmin)
    assert dp.dual_bound <= dp.overhead.progress_seconds + 1e-9
    assert dp.overhead.wall_seconds <= result.budget_wall_seconds
    assert auto.progress_seconds <= 1.02 * dp.dual_bound

    young_interval = round(young_interval_seconds(2.0, 1 / 2000))
    young = m.expected(periodic_steps(young_interval, 0, 2000))
    cut = 1 - auto.progress_seconds / young.progress_seconds
    wall_change = auto.wall_seconds / young.wall_seconds - 1
    assert cut > 0.1
    with capsys.disabled():
        print(
            f"\n[auto vs DP] progress-weighted: auto {auto.progress_seconds:.2f} s, DP {dp.overhead.progress_seconds:.2f} s "
            f"(dual bound {dp.dual_bound:.2f}); wall: auto {auto.wall_seconds:.2f} s <= budget "
            f"{result.budget_wall_seconds:.2f} s; vs Young: progress-weighted -{cut:.1%}, wall {wall_change:+.1%}"
        )


def test_constrained_dp_budget_trades_wall_time_for_progress() -> None:
    m = model(1500, curve=decaying_rate)
    _, time_optimum = optimal_steps(m, alpha=0.0, min_steps=5)
    tight = constrained_optimum(m, budget_wall_seconds=1.01 * time_optimum, min_steps=5)
    loose = constrained_optimum(m, budget_wall_seconds=1.20 * time_optimum, min_steps=5)
    assert loose.overhead.progress_seconds < tight.overhead.progress_seconds
    assert tight.overhead.wall_seconds <= 1.01 * time_optimum
    with pytest.raises(ConfigError, match="budget"):
        constrained_optimum(m, budget_wall_seconds=0.9 * time_optimum, min_steps=5)


def test_online_dp_and_auto_share_the_start_and_last_checkpoint() -> None:
    m = model(2000, start_step=700, last_checkpoint_step=650, curve=decaying_rate)
    steps, value = optimal_steps(m, alpha=0.0, min_steps=5)
    assert steps[0] > 700 and steps[0] - 650 >= 5
    auto = auto_steps(m, objective="time", min_steps=5)
    assert auto.steps[0] > 700
    assert m.objective(auto.steps, 0.0) <= 1.01 * value
