"""The shared cost model: weights, expected failures, and the expected overhead of a plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coci.errors import ConfigError
from coci.planning.failures import Failures
from coci.planning.objective import (
    ExpectedFailures,
    build_cost_model,
    expected_failures,
    mixture_weight,
    progress_weight,
    whole_run_mean_rate,
)


def power_rate(s: np.ndarray) -> np.ndarray:
    """v(s) of L(s) = 2 + 3 (s + 50)^-0.5."""
    return 1.5 * (np.asarray(s, dtype=float) + 50.0) ** -1.5


def model(total=1000, t=1.0, c=2.0, p=0.0, r=30.0, rate=1 / 500, curve=None, **kw):
    return build_cost_model(
        total_steps=total, step_seconds=t, checkpoint_seconds=c, persist_seconds=p, restart_seconds=r,
        failures=ExpectedFailures.constant(rate), progress_rate=curve, **kw,
    )


# --- weights -------------------------------------------------------------------------------------


def test_progress_weight_has_time_mean_one() -> None:
    rates = np.array([4.0, 2.0, 1.0, 1.0])
    widths = np.array([1.0, 1.0, 2.0, 4.0])
    w = progress_weight(rates, widths)
    assert np.dot(w, widths) / widths.sum() == pytest.approx(1.0)
    assert w[0] / w[2] == pytest.approx(4.0)
    assert progress_weight([1.0, 3.0]).tolist() == [0.5, 1.5]


@pytest.mark.parametrize("rates", [[0.0, 0.0], [1.0, np.nan], [1.0, -1.0], []])
def test_progress_weight_rejects_curves_without_progress(rates: list[float]) -> None:
    with pytest.raises(ConfigError, match="curve"):
        progress_weight(rates)


def test_mixture_weight_interpolates_between_progress_and_time() -> None:
    w = np.array([3.0, 1.0, 0.0])
    assert mixture_weight(w, 0.0).tolist() == w.tolist()
    assert mixture_weight(w, None).tolist() == [1.0, 1.0, 1.0]
    assert mixture_weight(w, math.inf).tolist() == [1.0, 1.0, 1.0]
    assert mixture_weight(w, 1.0).tolist() == [2.0, 1.0, 0.5]
    with pytest.raises(ConfigError, match="mu"):
        mixture_weight(w, -1.0)


# --- expected failures ---------------------------------------------------------------------------


def test_exponential_failures_are_linear() -> None:
    e = expected_failures(Failures.exponential("1000s"), 1e5)
    x = np.array([0.0, 10.0, 1e3, 5e4, 2e5])
    assert e(x) == pytest.approx(x / 1000.0)


def test_weibull_of_shape_one_matches_exponential_through_the_renewal_solve() -> None:
    e = expected_failures(Failures.weibull(1.0, 1000.0), 5e4)  # shape exactly 1 is memoryless
    assert e(np.array([2e4])) == pytest.approx([20.0])
    renewal = ExpectedFailures.renewal(lambda x: np.asarray(x) / 1000.0, 1000.0, 5e4)
    x = np.array([5.0, 100.0, 1e3, 1e4, 4e4, 1e5])
    assert renewal(x) == pytest.approx(x / 1000.0, rel=1e-2)


def test_weibull_renewal_function_matches_monte_carlo() -> None:
    failures = Failures.weibull(0.6, 1000.0)
    e = expected_failures(failures, 5e4)
    first = 1.0 - float(failures.survival(10.0))  # 10 s in: almost only the first failure counts
    assert first <= e(np.array([10.0]))[0] <= first * (1.0 + 2.0 * first)
    x = np.array([100.0, 1000.0, 5000.0, 20000.0])
    rng = np.random.default_rng(1)
    times = np.cumsum(failures.sample(rng, (6000, 200)), axis=1)
    counts = (times[:, :, None] <= x).sum(axis=1).mean(axis=0)
    assert e(x) == pytest.approx(counts, rel=0.05)
    # infant mortality: more failures early than the long-run rate predicts
    assert e(np.array([1000.0]))[0] > 1000.0 / failures.mean_seconds
    # long-run slope is 1 / MTBF
    slope = (e(np.array([4e4])) - e(np.array([3e4])))[0] / 1e4
    assert slope == pytest.approx(1.0 / failures.mean_seconds, rel=0.02)


def test_plain_hazard_callable_is_integrated() -> None:
    e = expected_failures(lambda tau: 1e-3 * (1.0 + np.asarray(tau) / 1000.0), 5000.0)
    assert e(np.array([2000.0]))[0] == pytest.approx(1e-3 * (2000.0 + 2000.0**2 / 2000.0), rel=1e-3)


# --- expected overhead ---------------------------------------------------------------------------


def test_constant_hazard_overhead_matches_closed_form_with_commit_delay() -> None:
    total, lam, c, p, r = 1000, 1 / 500, 2.0, 7.0, 30.0
    m = model(total=total, c=c, p=p, r=r, rate=lam)
    steps = np.array([100, 250, 400, 700])
    x = steps.astype(float)
    # failures in [0, x1 + P) lose x; in [x_i + P, x_{i+1} + P) lose (x - x_i); after the last commit
    lost = (x[0] + p) ** 2 / 2
    for a, b in zip(x[:-1], x[1:]):
        lost += ((b - a + p) ** 2 - p**2) / 2
    lost += ((total - x[-1]) ** 2 - p**2) / 2
    o = m.expected(steps)
    assert o.lost_seconds == pytest.approx(lam * lost)
    assert o.wall_seconds == pytest.approx(4 * c + lam * total * r + lam * lost)
    assert o.progress_seconds == pytest.approx(o.wall_seconds)  # no curve: metrics coincide
    assert o.checkpoints == 4 and o.failures == pytest.approx(2.0)


def test_progress_overhead_matches_monte_carlo_of_failures() -> None:
    """Failure positions sampled along the run; each costs R + W(x) - W(last committed)."""
    total, t, p, r, lam = 600, 0.5, 3.0, 10.0, 1 / 200
    m = model(total=total, t=t, c=1.0, p=p, r=r, rate=lam, curve=power_rate)
    steps = np.array([20, 45, 80, 130, 200, 300, 450])
    o = m.expected(steps)
    # independent weight: per-step average of v, normalised over the run
    fine = np.linspace(0, total, 600_001)
    v = power_rate(fine)
    big_w = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * np.diff(fine))])
    big_w /= big_w[-1] / (total * t)  # mean weight 1 over the run, in seconds
    rng = np.random.default_rng(0)
    positions = rng.uniform(0, total * t, 400_000)
    commits = steps * t + p
    index = np.searchsorted(commits, positions, side="right")
    ref = np.concatenate([[0.0], steps * t])[index]
    w_at = lambda sec: np.interp(sec / t, fine, big_w)  # noqa: E731
    expected_failures_ = lam * total * t
    lost_progress = expected_failures_ * np.mean(w_at(positions) - w_at(ref))
    lost_time = expected_failures_ * np.mean(positions - ref)
    assert o.lost_progress_seconds == pytest.approx(lost_progress, rel=0.01)
    assert o.lost_seconds == pytest.approx(lost_time, rel=0.01)


def test_cell_integrals_are_exact_at_any_position() -> None:
    m = model(total=50, t=2.0, rate=1 / 100, curve=power_rate)
    x = np.array([0.0, 0.3, 7.7, 33.3, 99.9, 100.0])
    fine = np.linspace(0, 100, 2_000_001)
    h = m.hazard[np.clip(np.searchsorted(m.edges, fine, side="right") - 1, 0, m.hazard.size - 1)]
    big_w = m.weight_until(fine, 1.0)
    integrand = h * big_w
    cumulative = np.concatenate([[0.0], np.cumsum(0.5 * (integrand[1:] + integrand[:-1]) * np.diff(fine))])
    assert m.hazard_integral(x, 1.0) == pytest.approx(np.interp(x, fine, cumulative), rel=1e-6, abs=1e-12)
    assert m.hazard_integral(x, 0.0) == pytest.approx(x**2 / 2 / 100, rel=1e-9, abs=1e-15)


def test_online_model_rolls_back_to_the_last_checkpoint_before_the_start() -> None:
    m = model(total=1000, p=0.0, rate=1 / 500, start_step=300, last_checkpoint_step=250)
    o = m.expected(np.array([400]))
    lost = ((400 - 250) ** 2 - 50**2) / 2 + (600**2) / 2  # [300, 400) rolls back to 250
    assert o.lost_seconds == pytest.approx(lost / 500)
    assert o.run_seconds == 700


def test_large_horizons_use_a_coarse_grid_with_the_same_totals() -> None:
    coarse = model(total=200_000, rate=1 / 20_000, curve=power_rate)
    fine = model(total=200_000, rate=1 / 20_000, curve=power_rate, per_step=True)
    assert coarse.hazard.size < 5000 < fine.hazard.size
    steps = np.arange(500, 200_000, 700)
    a, b = coarse.expected(steps), fine.expected(steps)
    assert a.wall_seconds == pytest.approx(b.wall_seconds, rel=1e-9)
    assert a.progress_seconds == pytest.approx(b.progress_seconds, rel=2e-3)


@pytest.mark.parametrize("steps", [[0, 5], [5, 5], [7, 3], [5, 1001], [1.5]])
def test_bad_step_lists_are_rejected(steps: list[float]) -> None:
    with pytest.raises(ConfigError, match="steps"):
        model().expected(np.asarray(steps))


def test_weight_is_normalised_over_the_whole_run_wherever_the_plan_starts() -> None:
    offline = model(total=1000, curve=power_rate, per_step=True)
    replan = model(total=1000, curve=power_rate, per_step=True, start_step=300, last_checkpoint_step=250)
    assert np.mean(offline.weight) == pytest.approx(1.0, rel=1e-9)
    # the re-plan scores its steps with the offline weights: below 1 late in a decaying run
    assert replan.weight == pytest.approx(offline.weight[300:], rel=1e-9)
    assert np.mean(replan.weight) < 0.6
    # v_bar = (L(0) - L(H)) / H for L = 2 + 3 (s + 50)^-0.5
    drop = 3 * (50.0**-0.5 - 1050.0**-0.5)
    assert whole_run_mean_rate(power_rate, 1000) == pytest.approx(drop / 1000, rel=1e-6)
    assert whole_run_mean_rate(None, 1000, origin_step=200, loss_drop=4.0) == pytest.approx(0.005)
    with pytest.raises(ConfigError, match="curve"):
        whole_run_mean_rate(None, 1000, loss_drop=-1.0)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_checkpoint_that_stalls_nothing_is_placed_as_densely_as_the_spacing_allows() -> None:
    """The first-order density sqrt(h w / 2C) at C = 0 (an upper level's chain) is its limit, without
    a division by zero: the cap ``1 / (min_steps t)`` where failures cost something, the floor of
    ``max_steps`` where they cost nothing (no progress left to lose, progress-weighted)."""
    from coci.planning.formulas import checkpoint_density

    free = checkpoint_density(model(c=0.0, t=2.0), alpha=0.0, min_steps=5, max_steps=None)
    assert np.all(free == 1.0 / (5 * 2.0))
    assert np.array_equal(free, checkpoint_density(model(c=1e-12, t=2.0), alpha=0.0, min_steps=5, max_steps=None))
    done = model(c=0.0, t=2.0, curve=lambda s: np.where(np.asarray(s) < 500, power_rate(s), 0.0))  # no progress past step 500
    progress = checkpoint_density(done, alpha=1.0, min_steps=5, max_steps=50)
    assert progress[0] == 1.0 / (5 * 2.0) and progress[-1] == 1.0 / (50 * 2.0)
