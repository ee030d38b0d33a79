"""Convergence fits: parameter recovery, family choice, recent-window refit, fallbacks, COCI's fit."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from coci.errors import ConfigError
from coci.planning.fit import CurveFit, fit_coci_exponential, fit_curve

STEPS = np.arange(1, 8001, dtype=float)


def power_curve(s: np.ndarray) -> np.ndarray:
    return 2.0 + 6.0 * (s + 80.0) ** -0.45


def noisy(values: np.ndarray, sd: float, seed: int = 0) -> np.ndarray:
    return values + np.random.default_rng(seed).normal(0.0, sd, values.size)


def test_recovers_a_power_law_and_forecasts_it() -> None:
    fit = fit_curve(STEPS, noisy(power_curve(STEPS), 0.01))
    assert fit.usable and fit.family == "power" and fit.fallback is None
    assert fit.window_start == 1.0  # no drift: the whole trace is fitted
    assert abs(fit.drift) < 3
    far = np.array([8000.0, 12000.0, 16000.0])
    np.testing.assert_allclose(fit.loss(far), power_curve(far), atol=0.01)
    np.testing.assert_allclose(fit.slope(4000.0), -6 * 0.45 * 4080.0**-1.45, rtol=0.1)
    assert fit.holdout_error < 0.01 and fit.rmse < 0.01
    assert fit.candidates["power"] < fit.candidates["coci_exp"]
    assert fit.n_points == STEPS.size and fit.dropped_points == 0
    assert fit.n_fit_points <= 250  # smoothed and decimated


def test_recovers_an_exponential_to_a_floor() -> None:
    truth = 3.0 + 4.0 * np.exp(-STEPS / 1500.0)
    fit = fit_curve(STEPS, noisy(truth, 0.005, seed=1))
    assert fit.family == "exp_floor"
    assert fit.params["k"] == pytest.approx(1 / 1500.0, rel=0.05)
    assert fit.params["c"] == pytest.approx(3.0, abs=0.01)
    np.testing.assert_allclose(fit.loss(STEPS[::500]), truth[::500], atol=0.01)


@pytest.mark.parametrize("family", ["power", "exp_floor", "coci_exp"])
def test_slope_is_the_derivative_and_methods_are_vectorised(family: str) -> None:
    fit = fit_curve(STEPS, noisy(power_curve(STEPS), 0.01), families=[family], window=False)
    assert fit.family == family
    grid = np.linspace(100.0, 20000.0, 12).reshape(3, 4)
    h = 1e-4 * grid
    numeric = (fit.loss(grid + h) - fit.loss(grid - h)) / (2 * h)
    assert fit.loss(grid).shape == (3, 4) and fit.slope(grid).shape == (3, 4)
    np.testing.assert_allclose(fit.slope(grid), numeric, rtol=1e-4, atol=1e-9)
    assert np.all(fit.slope(grid) < 0)
    np.testing.assert_array_equal(fit.progress_rate(grid), np.maximum(-fit.slope(grid), 0.0))


def test_recent_window_refit_follows_a_learning_rate_decay() -> None:
    # constant learning rate for 6000 steps, then a decay that makes the loss fall faster
    decay = np.clip((STEPS - 6000.0) / 2000.0, 0.0, 1.0)
    truth = power_curve(STEPS) - 0.12 * (2 * decay - decay**2)
    losses = noisy(truth, 0.01, seed=2)
    train = STEPS <= 7400
    adaptive = fit_curve(STEPS[train], losses[train])
    stale = fit_curve(STEPS[train], losses[train], window=False)
    assert adaptive.drift < -2  # the loss falls faster than the global law forecast
    assert adaptive.window_start > 3000
    target = ~train
    adaptive_error = np.mean(np.abs(adaptive.loss(STEPS[target]) - truth[target]))
    stale_error = np.mean(np.abs(stale.loss(STEPS[target]) - truth[target]))
    assert adaptive_error < 0.03
    assert adaptive_error < 0.5 * stale_error


def test_spikes_and_nans_are_tolerated_and_counted() -> None:
    losses = noisy(power_curve(STEPS), 0.01, seed=3)
    spikes = np.random.default_rng(4).choice(STEPS.size, 40, replace=False)
    losses[spikes] += 5.0
    losses[[10, 500, 7000]] = [np.nan, np.inf, -np.inf]
    fit = fit_curve(STEPS, losses)
    assert fit.usable and fit.dropped_points == 3 and fit.n_points == STEPS.size - 3
    np.testing.assert_allclose(fit.loss([1000.0, 8000.0]), power_curve(np.array([1000.0, 8000.0])), atol=0.02)


def test_input_forms_agree() -> None:
    losses = noisy(power_curve(STEPS[:2000]), 0.01)
    by_index = fit_curve(losses)  # steps 1, 2, ...
    by_pair = fit_curve((STEPS[:2000], losses))
    by_args = fit_curve(list(STEPS[:2000]), list(losses))
    assert by_index == by_pair == by_args


@pytest.mark.parametrize(
    ("losses", "reason"),
    [
        (np.full(500, 3.0), "not falling"),
        (noisy(np.full(500, 3.0), 0.05), "not falling"),
        (np.linspace(2.0, 3.0, 500), "rising"),
        (np.array([5.0, 4.0, 3.5, 3.2]), "too few points"),
        (np.array([5.0, np.nan, np.nan, 3.0, np.inf, 2.0, 1.0]), "too few points"),
        (np.full(10, np.nan), "too few points"),
    ],
)
def test_unusable_curves_fall_back_without_raising(losses: np.ndarray, reason: str) -> None:
    fit = fit_curve(losses)
    assert fit.family == "none" and not fit.usable
    assert reason in fit.fallback
    assert fit.dropped_points == int(np.count_nonzero(~np.isfinite(losses)))
    assert np.all(fit.progress_rate(np.arange(10.0)) == 0.0)
    assert np.all(fit.slope([1.0, 2.0]) == 0.0)


def test_none_is_a_missing_value() -> None:
    fit = fit_curve([5.0, None, 4.0, 3.0, 2.5, 2.2, 2.0, 1.9, 1.85])
    assert fit.dropped_points == 1 and fit.n_points == 8


def test_empty_input_is_a_fallback_not_an_error() -> None:
    fit = fit_curve([])
    assert not fit.usable and fit.family == "none" and "too few points" in fit.fallback


def test_unusable_fit_reports_the_last_level() -> None:
    fit = fit_curve(np.full(100, 3.0))
    np.testing.assert_allclose(fit.loss([1.0, 1e6]), [3.0, 3.0])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([1.0, 2.0, 3.0], [1.0, 2.0]), "same length"),
        ((["a", "b", "c"],), "numeric"),
        (("abc",), "string"),
        ((np.ones((3, 3)),), "one-dimensional"),
        (([1.0, {}, 2.0],), "numeric"),
    ],
)
def test_structurally_bad_input_raises(args: tuple, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fit_curve(*args)


def test_unknown_family_raises() -> None:
    with pytest.raises(ConfigError, match="families"):
        fit_curve(STEPS, power_curve(STEPS), families=["cubic"])


def test_curve_fit_json_round_trip() -> None:
    fit = fit_curve(STEPS, noisy(power_curve(STEPS), 0.01))
    again = CurveFit.model_validate_json(fit.model_dump_json())
    assert again == fit
    np.testing.assert_array_equal(again.loss(STEPS[:5]), fit.loss(STEPS[:5]))


def test_coci_exponential_fit_is_a_line_through_log_loss() -> None:
    minutes = np.linspace(0.0, 60.0, 50)
    losses = np.exp(-0.078 * minutes + 0.787)  # COCI's worked example
    theta1, theta2 = fit_coci_exponential(minutes, losses)
    assert theta1 == pytest.approx(-0.078, rel=1e-9) and theta2 == pytest.approx(0.787, rel=1e-9)
    noisy_losses = losses * np.exp(np.random.default_rng(0).normal(0, 0.05, minutes.size))
    expected = np.polyfit(minutes, np.log(noisy_losses), 1)
    np.testing.assert_allclose(fit_coci_exponential(minutes, noisy_losses), expected)


@pytest.mark.parametrize(
    ("minutes", "losses", "match"),
    [
        ([1.0, 2.0], [1.0], "same length"),
        ([1.0, 2.0, 3.0], [1.0, 0.0, 0.5], "positive"),
        ([1.0, 1.0], [1.0, 0.5], "two distinct"),
    ],
)
def test_coci_exponential_fit_rejects_bad_input(minutes: list, losses: list, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fit_coci_exponential(minutes, losses)


def test_forecasts_a_real_gpt2_training_curve(external_data: str) -> None:
    import pandas as pd

    dense = pd.read_csv(Path(external_data) / "modded-nanogpt" / "mng_train_loss_dense.csv")
    run = dense[dense.run_id == 2].sort_values("step")
    steps, losses = run.step.to_numpy(float), run.train_loss.to_numpy(float)
    cut = steps[0] + 0.9 * (steps[-1] - steps[0])
    fit = fit_curve(steps[steps <= cut], losses[steps <= cut])
    assert fit.usable and not math.isnan(fit.holdout_error)
    chunks = np.array_split(np.flatnonzero(steps > cut), 10)
    target_steps = np.array([steps[c].mean() for c in chunks])
    target = np.array([losses[c].mean() for c in chunks])
    assert np.mean(np.abs(fit.loss(target_steps) - target)) < 0.06


def test_quality_figures_are_finite_for_json() -> None:
    # too few points for the power law in the backtest: its candidate is left out, not inf
    losses = np.array([6.0, 4.0, 3.3, 3.0, 2.8, 2.7])
    fit = fit_curve(losses)
    assert fit.usable and "power" not in fit.candidates and fit.family != "power"
    assert all(math.isfinite(v) for v in fit.candidates.values())
    assert CurveFit.model_validate_json(fit.model_dump_json()) == fit
