"""The policies against their published numbers and the constraints every plan keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coci.planning.failures import Failures
from coci.planning.formulas import (
    auto_steps,
    checkfreq_interval,
    checkfreq_steps,
    coci_expected_progress,
    coci_minutes,
    daly_interval_seconds,
    max_interval_steps,
    min_interval_steps,
    periodic_steps,
    young_interval_seconds,
)
from coci.planning.objective import ExpectedFailures, build_cost_model, expected_failures

MINUTE = 60.0
HOUR = 3600.0


def decaying_rate(s: np.ndarray) -> np.ndarray:
    """v(s) of L(s) = 3 + 4 (s + 200)^-0.5."""
    return 2.0 * (np.asarray(s, dtype=float) + 200.0) ** -1.5


# --- Young and Daly ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mtbf", "design", "published"),
    [(24 * HOUR, 116.7, 117.0), (6 * HOUR, 56.7, 57.0), (15 * MINUTE, 9.17, 9.1)],
)
def test_daly_reproduces_his_published_cases(mtbf: float, design: float, published: float) -> None:
    """Daly 2006, C = 5 min, R = 10 min: 117 / 57 / 9.1 min (his table rounds; the exact
    Lambert-W values are 116.7 / 56.7 / 9.17)."""
    minutes = daly_interval_seconds(5 * MINUTE, mtbf) / MINUTE
    assert minutes == pytest.approx(design, abs=0.1)
    assert round(minutes) == round(published) if published > 10 else minutes == pytest.approx(published, abs=0.1)


def test_daly_higher_order_approximation_agrees_with_the_exact_optimum() -> None:
    c, m = 5 * MINUTE, 6 * HOUR
    approx = math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c  # Daly's eq. 37
    assert daly_interval_seconds(c, m) == pytest.approx(approx, rel=1e-3)
    assert daly_interval_seconds(2 * m, m) == m  # C >= M: checkpoint every MTBF (his rule)


def test_young_matches_its_formula() -> None:
    assert young_interval_seconds(5 * MINUTE, 1 / (24 * HOUR)) / MINUTE == pytest.approx(120.0)
    assert young_interval_seconds(0.4, 1 / 28800) == pytest.approx(math.sqrt(2 * 0.4 * 28800))


# --- CheckFreq ---------------------------------------------------------------------------------


def test_checkfreq_initial_interval_is_what_the_persist_allows() -> None:
    assert checkfreq_interval(0.4, 6.0, 0.25) == 24  # ceil((0.4 + 6 - 0.4) / 0.25)
    assert checkfreq_interval(0.4, 6.1, 0.25) == 25
    assert checkfreq_interval(1.0, 0.01, 0.25) == 1  # never below one step


def test_checkfreq_grows_by_two_until_its_overhead_is_under_the_threshold() -> None:
    # C = 0.4 s, t = 0.25 s, 5%: needs k >= 32; the authors' rule grows 24 -> 26 -> ... -> 32
    steps, final = checkfreq_steps(
        24, checkpoint_seconds=0.4, step_seconds=0.25, max_overhead=0.05, start_step=0, total_steps=300
    )
    assert final == 32
    assert np.diff(np.concatenate([[0], steps])).tolist() == [24, 26, 28, 30, 32, 32, 32, 32, 32]
    cheap, k = checkfreq_steps(
        24, checkpoint_seconds=0.1, step_seconds=0.25, max_overhead=0.05, start_step=0, total_steps=100
    )
    assert k == 24 and cheap.tolist() == [24, 48, 72, 96]


# --- COCI as published -------------------------------------------------------------------------


def test_coci_reproduces_the_authors_worked_example() -> None:
    theta1, theta2, checkpoint_minutes, rate = -0.078, 0.787, 0.0015, 0.0042
    pe = coci_expected_progress(theta1, checkpoint_minutes, rate)
    assert pe == pytest.approx(0.01468, abs=1e-4)
    times, repeated = coci_minutes(theta1, theta2, pe, now_minutes=0.0, end_minutes=60.0)
    intervals = np.diff(np.concatenate([[0.0], times]))
    assert intervals[0] == pytest.approx(0.086, abs=0.001)
    assert np.all(np.diff(intervals) > 0)  # equal loss decrements: intervals grow
    assert intervals[-1] > 1.0  # minutes late in the run
    assert not repeated


def test_coci_plan_depends_on_the_time_unit() -> None:
    """The documented caveat: P_e (a time) is subtracted from losses, so units change the plan."""
    theta1_min, theta2, c_min, rate_min = -0.078, 0.787, 0.0015, 0.0042
    in_minutes = coci_minutes(theta1_min, theta2, coci_expected_progress(theta1_min, c_min, rate_min),
                              now_minutes=0, end_minutes=30)[0]
    # the same job described in seconds (theta1 / 60, C * 60, rate / 60), converted back to minutes
    pe_s = coci_expected_progress(theta1_min / 60, c_min * 60, rate_min / 60)
    in_seconds = coci_minutes(theta1_min / 60, theta2, pe_s, now_minutes=0, end_minutes=30 * 60)[0] / 60
    assert in_seconds[0] != pytest.approx(in_minutes[0], rel=0.1)


def test_coci_repeats_its_last_interval_when_the_loss_runs_out() -> None:
    times, repeated = coci_minutes(-0.078, 0.787, 0.5, now_minutes=0.0, end_minutes=500.0)
    assert repeated and times[-1] < 500.0 and 500.0 - times[-1] <= times[-1] - times[-2] + 1e-9


# --- constraints and periodic plans ------------------------------------------------------------


def test_min_interval_steps() -> None:
    assert min_interval_steps(0.25, 6.0, 0.4, None) == 24  # one persist in flight
    assert min_interval_steps(0.25, 0.1, 0.4, None) == 1
    assert min_interval_steps(0.25, 6.0, 0.4, 0.01) == 160  # 0.4 / (0.01 * 0.25)


def test_periodic_steps_stay_inside_the_horizon() -> None:
    assert periodic_steps(30, 0, 100).tolist() == [30, 60, 90]
    assert periodic_steps(30, 65, 100, anchor=40).tolist() == [70]
    assert periodic_steps(30, 0, 90).tolist() == [30, 60]


# --- auto ----------------------------------------------------------------------------------------


def model(total=20_000, t=0.5, c=1.0, p=4.0, r=60.0, failures=None, curve=None):
    failures = failures if failures is not None else ExpectedFailures.constant(1 / (2 * HOUR))
    if not isinstance(failures, ExpectedFailures):
        failures = expected_failures(failures, total * t)
    return build_cost_model(
        total_steps=total, step_seconds=t, checkpoint_seconds=c, persist_seconds=p, restart_seconds=r,
        failures=failures, progress_rate=curve,
    )


def test_auto_time_objective_with_constant_hazard_is_young_spaced() -> None:
    m = model()
    result = auto_steps(m, objective="time", min_steps=min_interval_steps(0.5, 4.0, 1.0, None))
    intervals = np.diff(result.steps)
    young = young_interval_seconds(1.0, 1 / (2 * HOUR)) / 0.5
    assert intervals.max() - intervals.min() <= 1
    assert np.median(intervals) == pytest.approx(young, rel=0.03)
    assert result.mu is None


def test_auto_progress_intervals_grow_with_the_step_within_the_budget() -> None:
    m = model(curve=decaying_rate)
    kmin = min_interval_steps(0.5, 4.0, 1.0, None)
    timed = auto_steps(m, objective="time", min_steps=kmin)
    result = auto_steps(m, objective="progress", time_budget=0.05, min_steps=kmin)
    intervals = np.diff(np.concatenate([[0], result.steps]))
    assert intervals[-1] > 2 * intervals[0]
    assert np.all(np.diff(intervals) >= -1)  # non-decreasing up to rounding
    wall = m.expected(result.steps).wall_seconds
    assert wall <= 1.05 * m.expected(timed.steps).wall_seconds + 1e-9
    assert result.budget_wall_seconds == pytest.approx(1.05 * result.time_optimal_wall_seconds)
    assert m.expected(result.steps).progress_seconds < m.expected(timed.steps).progress_seconds
    assert result.mu is not None and result.mu > 0


def test_pure_progress_costs_more_wall_time_than_the_budgeted_plan() -> None:
    m = model(curve=decaying_rate)
    budgeted = m.expected(auto_steps(m, time_budget=0.05, min_steps=8).steps)
    pure = auto_steps(m, time_budget=None, min_steps=8)
    assert pure.mu == 0.0
    o = m.expected(pure.steps)
    assert o.progress_seconds <= budgeted.progress_seconds
    assert o.wall_seconds > budgeted.wall_seconds


def test_auto_checkpoints_more_often_right_after_start_with_infant_mortality() -> None:
    weibull = Failures.weibull(0.5, 2 * HOUR)
    m = model(failures=weibull, total=40_000)
    result = auto_steps(m, objective="time", min_steps=8)
    intervals = np.diff(np.concatenate([[0], result.steps]))
    assert intervals[0] < 0.5 * np.median(intervals[len(intervals) // 2 :])


def test_auto_respects_persist_and_overhead_constraints() -> None:
    # a very high failure rate would like intervals shorter than the persist allows
    m = model(failures=ExpectedFailures.constant(1 / 600), p=20.0, curve=decaying_rate)
    kmin = min_interval_steps(0.5, 20.0, 1.0, 0.02)  # persist: 40 steps, 2% overhead: 100 steps
    assert kmin == 100
    for objective in ("time", "progress"):
        steps = auto_steps(m, objective=objective, min_steps=kmin).steps
        assert np.all(np.diff(steps) >= kmin) and steps[0] >= kmin
        assert steps.dtype.kind == "i" and steps[-1] < m.total_steps
        assert steps.size * 1.0 <= 0.02 * m.total_steps * 0.5 + 1e-9  # stall share <= max_overhead


def test_refinement_reaches_the_exact_optimum_with_few_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a steep curve with few, long intervals the first-order density is off; refinement fixes it."""
    from exact_optimum import optimal_steps

    from coci import knobs
    from coci.planning.formulas import place

    m = build_cost_model(
        total_steps=914, step_seconds=1.0, checkpoint_seconds=4.22, persist_seconds=8.2, restart_seconds=30.0,
        failures=ExpectedFailures.constant(1 / 2838), progress_rate=lambda s: 1.18 * (np.asarray(s) + 13.0) ** -2.18,
    )
    alpha = 0.5
    _, optimum = optimal_steps(m, alpha=alpha, min_steps=9)
    refined = min(m.objective(s, alpha) for s in place(m, alpha, 9, (-1, 0, 1)))
    monkeypatch.setattr(knobs, "PLAN_REFINE_MAX_CHECKPOINTS", 0)
    density_only = min(m.objective(s, alpha) for s in place(m, alpha, 9, (-1, 0, 1)))
    assert density_only > 1.01 * optimum
    assert refined <= 1.001 * optimum


def test_auto_caps_intervals_at_half_the_mtbf_but_never_below_young() -> None:
    """Progress that stops early (w ~ 0 after step 500): pure progress would leave the tail to a
    handful of segments spanning several MTBFs, where the first-order model undercounts."""
    def stops_early(s: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(s, dtype=float) < 500, 1.0, 1e-9)

    common = dict(total_steps=20_000, step_seconds=1.0, persist_seconds=1.0, restart_seconds=0.0,
                  failures=ExpectedFailures.constant(1 / 2000), progress_rate=stops_early)
    model = build_cost_model(checkpoint_seconds=2.0, **common)
    cap = max_interval_steps(model)
    assert cap == 1000  # 0.5 x MTBF 2000 s
    steps = auto_steps(model, objective="progress", time_budget=None).steps
    gaps = np.diff(np.concatenate([[0], steps, [20_000]]))
    assert gaps.max() <= cap + 2  # the last gap may exceed by P and rounding
    assert (steps > 500).sum() >= 19_000 / cap - 1
    # C large against the MTBF: Young's interval (sqrt(2 C M) = 1414 s) is never constrained
    costly = build_cost_model(checkpoint_seconds=500.0, **common)
    assert max_interval_steps(costly) == 1414
    time_plan = auto_steps(costly, objective="time").steps
    assert 1414 <= np.diff(time_plan).max() <= 1.02 * 1414  # equal segments: 20,000 / 14 steps
