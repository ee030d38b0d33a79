"""Failure models against closed forms; maximum likelihood from logs; validation; JSON round trip."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from coci.errors import ConfigError
from coci.planning.failures import Failures

# --- exponential ---------------------------------------------------------------------------------


def test_exponential_from_mtbf_string() -> None:
    model = Failures.exponential("8h")
    tau = np.array([0.0, 60.0, 3600.0, 86400.0])
    assert model.mean_seconds == pytest.approx(28800.0)
    assert model.rate == pytest.approx(1 / 28800.0)
    assert model.is_memoryless
    np.testing.assert_allclose(model.hazard(tau), np.full(4, 1 / 28800.0))
    np.testing.assert_allclose(model.cumulative_hazard(tau), tau / 28800.0)
    np.testing.assert_allclose(model.survival(tau), np.exp(-tau / 28800.0))


@pytest.mark.parametrize(("mtbf", "seconds"), [("45m", 2700.0), ("90s", 90.0), (600, 600.0), ("1h30m", 5400.0)])
def test_exponential_mtbf_forms(mtbf: object, seconds: float) -> None:
    assert Failures.exponential(mtbf).mean_seconds == pytest.approx(seconds)


def test_exponential_from_rate_and_per_node() -> None:
    assert Failures.exponential(rate=1 / 3600).mean_seconds == pytest.approx(3600.0)
    per_node = Failures.exponential("8h", nodes=8)
    assert per_node.mean_seconds == pytest.approx(3600.0)  # job MTBF = per-node MTBF / nodes
    assert per_node.rate == pytest.approx(8 / 28800.0)
    assert Failures.exponential(rate=1e-5, nodes=4).rate == pytest.approx(4e-5)


# --- Weibull -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "nodes"), [(0.6, 1), (0.6, 16), (1.0, 4), (2.5, 3)])
def test_weibull_closed_forms(shape: float, nodes: int) -> None:
    scale = 50_000.0
    model = Failures.weibull(shape, scale, nodes=nodes)
    node = Failures.weibull(shape, scale)
    job_scale = scale / nodes ** (1 / shape)
    tau = np.geomspace(1.0, 5e5, 40)
    assert model.job_scale_seconds == pytest.approx(job_scale)
    assert model.mean_seconds == pytest.approx(scale * math.gamma(1 + 1 / shape) / nodes ** (1 / shape))
    assert model.rate == pytest.approx(1 / model.mean_seconds)
    np.testing.assert_allclose(model.hazard(tau), shape / job_scale * (tau / job_scale) ** (shape - 1))
    np.testing.assert_allclose(model.survival(tau), np.exp(-((tau / job_scale) ** shape)))
    # the job fails at the first of `nodes` independent node failures
    np.testing.assert_allclose(model.hazard(tau), nodes * node.hazard(tau))
    np.testing.assert_allclose(model.survival(tau), node.survival(tau) ** nodes)
    # hazard is the derivative of the cumulative hazard
    h = 1e-4 * tau
    numeric = (model.cumulative_hazard(tau + h) - model.cumulative_hazard(tau - h)) / (2 * h)
    np.testing.assert_allclose(model.hazard(tau), numeric, rtol=1e-6)
    # and the mean is the integral of the survival function
    grid = np.linspace(0, 40 * model.mean_seconds, 400_001)
    assert np.trapezoid(model.survival(grid), grid) == pytest.approx(model.mean_seconds, rel=2e-3)
    assert model.is_memoryless == (shape == 1.0)


def test_weibull_infant_mortality_hazard_falls_after_restart() -> None:
    model = Failures.weibull(0.7, "30d", nodes=100)
    hazard = model.hazard([0.0, 60.0, 3600.0, 86400.0])
    assert hazard[0] == math.inf
    assert np.all(np.diff(hazard[1:]) < 0)
    assert model.survival(0.0) == 1.0


def test_sample_matches_distribution() -> None:
    model = Failures.weibull(0.7, 20_000.0, nodes=5)
    draws = model.sample(np.random.default_rng(0), 200_000)
    assert draws.shape == (200_000,)
    assert np.all(draws > 0)
    assert draws.mean() == pytest.approx(model.mean_seconds, rel=0.02)
    ks = stats.kstest(draws, lambda t: 1 - model.survival(t))
    assert ks.pvalue > 1e-3
    # minimum over nodes of node-level draws has the job distribution
    node = Failures.weibull(0.7, 20_000.0)
    first = node.sample(np.random.default_rng(1), (50_000, 5)).min(axis=1)
    assert stats.ks_2samp(first, model.sample(np.random.default_rng(2), 50_000)).pvalue > 1e-3


def test_sample_is_reproducible_and_shaped() -> None:
    model = Failures.exponential("1h")
    a = model.sample(np.random.default_rng(7), (3, 4))
    b = model.sample(7, (3, 4))
    assert a.shape == (3, 4)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(model.quantile([0.5]), [3600 * math.log(2)])


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mtbf", [0, -1, float("nan"), float("inf"), "nan", "abc", "-5h", "0s", True])
def test_bad_mtbf_names_the_field(mtbf: object) -> None:
    with pytest.raises(ConfigError, match="mtbf"):
        Failures.exponential(mtbf)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: Failures.exponential(rate=0), "rate"),
        (lambda: Failures.exponential(rate=float("inf")), "rate"),
        (lambda: Failures.exponential(), "mtbf or rate"),
        (lambda: Failures.exponential("8h", rate=1.0), "mtbf or rate"),
        (lambda: Failures.exponential("8h", nodes=0), "nodes"),
        (lambda: Failures.weibull(0, "8h"), "shape"),
        (lambda: Failures.weibull(float("nan"), "8h"), "shape"),
        (lambda: Failures.weibull(0.7, -1), "scale"),
        (lambda: Failures.weibull(0.7, "forever"), "scale"),
        (lambda: Failures(kind="weibull", shape=-1.0, scale_seconds=3.0), "shape"),
        (lambda: Failures(kind="weibull", shape=1.0, scale_seconds=float("nan")), "scale_seconds"),
        (lambda: Failures(kind="exponential", shape=2.0, scale_seconds=3.0), "shape"),
    ],
)
def test_bad_parameters_name_the_field(call, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        call()


def test_negative_tau_is_rejected() -> None:
    with pytest.raises(ConfigError, match="tau_seconds"):
        Failures.exponential("1h").hazard([-1.0])


@pytest.mark.parametrize(
    "model",
    [Failures.exponential("8h"), Failures.exponential("8h", nodes=64), Failures.weibull(0.7, "30d", nodes=128)],
)
def test_json_round_trip(model: Failures) -> None:
    again = Failures.model_validate_json(model.model_dump_json())
    assert again == model
    assert again.mean_seconds == model.mean_seconds


# --- failure logs ------------------------------------------------------------------------------


def _write_intervals(path: Path, intervals: np.ndarray, censored: np.ndarray | None = None) -> Path:
    lines = ["interval_s" + (",censored" if censored is not None else "")]
    for i, value in enumerate(intervals):
        lines.append(f"{float(value)!r}" + (f",{int(censored[i])}" if censored is not None else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_from_log_recovers_weibull_with_censoring(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    truth = Failures.weibull(0.6, 7200.0)
    lifetimes = truth.sample(rng, 3000)
    censor_at = rng.uniform(0, 40_000, lifetimes.size)  # about a quarter of the runs end unfailed
    observed = np.minimum(lifetimes, censor_at)
    censored = lifetimes > censor_at
    assert 0.1 < censored.mean() < 0.5
    model = Failures.from_log(_write_intervals(tmp_path / "log.csv", observed, censored))
    assert model.kind == "weibull"
    assert model.shape == pytest.approx(0.6, rel=0.05)
    assert model.scale_seconds == pytest.approx(7200.0, rel=0.1)
    fit = model.log_fit
    assert fit is not None and fit.chosen == "weibull"
    assert fit.n_failures == int((~censored).sum()) and fit.n_censored == int(censored.sum())
    assert fit.aic["weibull"] < fit.aic["exponential"] - 10
    assert fit.aic["weibull"] == pytest.approx(4 - 2 * fit.log_likelihood["weibull"])
    # ignoring censoring would bias the MTBF low: the censored fit must not
    naive = observed[~censored].mean()
    assert model.mean_seconds > naive
    assert Failures.model_validate_json(model.model_dump_json()) == model


def test_from_log_weibull_matches_scipy_without_censoring(tmp_path: Path) -> None:
    data = Failures.weibull(1.8, 1000.0).sample(np.random.default_rng(5), 500)
    model = Failures.from_log(_write_intervals(tmp_path / "log.csv", data))
    shape, _, scale = stats.weibull_min.fit(data, floc=0)
    assert model.kind == "weibull"
    assert model.shape == pytest.approx(shape, rel=1e-3)
    assert model.scale_seconds == pytest.approx(scale, rel=1e-3)


def test_from_log_prefers_exponential_for_exponential_data(tmp_path: Path) -> None:
    data = Failures.exponential("2h").sample(np.random.default_rng(11), 400)
    model = Failures.from_log(_write_intervals(tmp_path / "log.csv", data))
    fit = model.log_fit
    assert fit is not None
    assert fit.params["weibull"]["shape"] == pytest.approx(1.0, abs=0.1)
    assert model.kind == "exponential" and fit.chosen == "exponential"
    assert fit.aic["exponential"] <= fit.aic["weibull"]
    # exponential MLE with censoring is exposure / failures
    assert model.mean_seconds == pytest.approx(data.sum() / data.size)


def test_from_log_failure_times_with_running_job(tmp_path: Path) -> None:
    path = tmp_path / "times.csv"
    path.write_text("# failure times of one job, last row: now (still running)\ntime_s,censored\n100,0\n250,0\n450,0\n700,1\n")
    model = Failures.from_log(path)
    fit = model.log_fit
    assert fit is not None
    assert (fit.n_failures, fit.n_censored) == (3, 1)
    assert fit.exposure_seconds == pytest.approx(700.0)
    assert fit.params["exponential"]["mtbf_seconds"] == pytest.approx(700.0 / 3)


def test_from_log_hours_column(tmp_path: Path) -> None:
    path = tmp_path / "hours.csv"
    path.write_text("interval_h\n1\n2\n3\n")
    assert Failures.from_log(path).log_fit.params["exponential"]["mtbf_seconds"] == pytest.approx(7200.0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("interval_s,censored\n100,1\n200,1\n", "no failure"),
        ("seconds\n100\n", "interval_s"),
        ("interval_s\n100\n-5\n", "positive"),
        ("interval_s\n100\n0\n", "positive"),
        ("interval_s\n100\nabc\n", "interval_s"),
        ("interval_s,censored\n100,maybe\n", "censored"),
        ("time_s,censored\n100,1\n200,0\n", "last row"),
        ("time_s\n300\n200\n", "ascending"),
        ("interval_s\n", "no rows"),
    ],
)
def test_from_log_bad_files(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        Failures.from_log(path)


def test_from_log_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Failures.from_log(tmp_path / "absent.csv")
