"""coci.planning.minimize gives the floats scipy.optimize gives (the fit's results do not change)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from coci.planning.minimize import bounded_scalar, nelder_mead


def _rosenbrock(theta: np.ndarray) -> float:
    return float((1.0 - theta[0]) ** 2 + 100.0 * (theta[1] - theta[0] ** 2) ** 2)


def _power_sse(theta: np.ndarray) -> float:
    """The curve fit's kind of objective: a power law's squared error on noisy points, inf off its domain."""
    x = np.linspace(0.01, 1.0, 60)
    y = 2.5 + 3.0 * (x + 0.05) ** -0.4 + 0.01 * np.sin(37.0 * x)
    b, shift = math.exp(min(theta[0], 3.0)), math.exp(min(theta[1], 3.0))
    if shift > 2.0:
        return math.inf
    phi = (x + shift) ** -b
    design = np.stack([np.ones_like(phi), phi], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    return float(resid @ resid)


@pytest.mark.parametrize("objective", [_rosenbrock, _power_sse])
@pytest.mark.parametrize("start", [(-1.2, 1.0), (0.0, 0.0), (0.3, -2.0), (2.0, 0.5)])
@pytest.mark.parametrize("maxiter", [5, 40, 300])
def test_nelder_mead_matches_scipy_bit_for_bit(objective, start, maxiter) -> None:
    expected = optimize.minimize(
        objective, np.array(start), method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-10, "maxiter": maxiter}
    )
    x, fun = nelder_mead(objective, np.array(start), xatol=1e-4, fatol=1e-10, maxiter=maxiter)
    assert fun == expected.fun
    assert np.array_equal(x, expected.x)


@pytest.mark.parametrize(
    ("objective", "low", "high"),
    [
        (lambda g: (g - 0.3) ** 2, -1.0, 2.0),
        (lambda g: math.cos(3.0 * g) + 0.1 * g, 0.0, 4.0),
        (lambda g: abs(g - 1.5) ** 0.5, 1.0, 3.0),
        (lambda g: math.inf if g > 0.5 else (g + 1.0) ** 2, -3.0, 1.0),
        (lambda g: g, 0.0, 1.0),
    ],
)
@pytest.mark.parametrize("xatol", [1e-5, 1e-8])
def test_bounded_scalar_matches_scipy_bit_for_bit(objective, low, high, xatol) -> None:
    expected = optimize.minimize_scalar(objective, bounds=(low, high), method="bounded", options={"xatol": xatol})
    x, fun = bounded_scalar(objective, low, high, xatol=xatol)
    assert x == float(expected.x)
    assert fun == float(expected.fun)
