"""The two local minimisers the curve fit needs, without importing ``scipy.optimize``.

``scipy.optimize`` costs 0.3-0.6 s of CPU to import (it pulls ``scipy.special``, ``scipy.linalg``
and more), and the first plan of every process paid it on the planner thread, holding the GIL
against the training loop. These are the algorithms of scipy 1.17's ``minimize(method=
"Nelder-Mead")`` (no bounds, not adaptive) and ``minimize_scalar(method="bounded")`` written out
operation for operation, so a fit gives the same floats as before; ``tests/unit/test_minimize.py``
checks them against scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

_SQRT_EPS = math.sqrt(2.2e-16)
_GOLDEN_MEAN = 0.5 * (3.0 - math.sqrt(5.0))


def nelder_mead(
    objective: Callable[[np.ndarray], float], x0: np.ndarray, *, xatol: float, fatol: float, maxiter: int
) -> tuple[np.ndarray, float]:
    """Minimise ``objective`` from ``x0`` (standard coefficients 1, 2, 0.5, 0.5; initial simplex
    steps of 5% of each non-zero coordinate, 0.00025 for a zero one); returns (x, f(x))."""
    x0 = np.asarray(x0, dtype=float).flatten()
    n = x0.size
    sim = np.empty((n + 1, n), dtype=float)
    sim[0] = x0
    for k in range(n):
        vertex = np.array(x0, copy=True)
        vertex[k] = 1.05 * vertex[k] if vertex[k] != 0 else 0.00025
        sim[k + 1] = vertex
    fsim = np.array([float(objective(np.copy(vertex))) for vertex in sim])
    order = np.argsort(fsim)
    sim, fsim = np.take(sim, order, 0), np.take(fsim, order, 0)
    iterations = 1
    while iterations < maxiter:
        if np.max(np.ravel(np.abs(sim[1:] - sim[0]))) <= xatol and np.max(np.abs(fsim[0] - fsim[1:])) <= fatol:
            break
        sim, fsim = _nelder_mead_step(objective, sim, fsim, n)
        iterations += 1
        order = np.argsort(fsim)
        sim, fsim = np.take(sim, order, 0), np.take(fsim, order, 0)
    return sim[0], float(np.min(fsim))


def _nelder_mead_step(
    objective: Callable[[np.ndarray], float], sim: np.ndarray, fsim: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """One reflect / expand / contract / shrink move of the worst vertex (``sim`` sorted by ``fsim``)."""
    xbar = np.add.reduce(sim[:-1], 0) / n
    xr = 2 * xbar - 1 * sim[-1]
    fxr = float(objective(np.copy(xr)))
    if fxr < fsim[0]:
        xe = 3 * xbar - 2 * sim[-1]
        fxe = float(objective(np.copy(xe)))
        sim[-1], fsim[-1] = (xe, fxe) if fxe < fxr else (xr, fxr)
        return sim, fsim
    if fxr < fsim[-2]:
        sim[-1], fsim[-1] = xr, fxr
        return sim, fsim
    if fxr < fsim[-1]:  # outside contraction
        xc = 1.5 * xbar - 0.5 * sim[-1]
        fxc = float(objective(np.copy(xc)))
        if fxc <= fxr:
            sim[-1], fsim[-1] = xc, fxc
            return sim, fsim
    else:  # inside contraction
        xcc = 0.5 * xbar + 0.5 * sim[-1]
        fxcc = float(objective(np.copy(xcc)))
        if fxcc < fsim[-1]:
            sim[-1], fsim[-1] = xcc, fxcc
            return sim, fsim
    for j in range(1, n + 1):  # shrink towards the best vertex
        sim[j] = sim[0] + 0.5 * (sim[j] - sim[0])
        fsim[j] = float(objective(np.copy(sim[j])))
    return sim, fsim


def bounded_scalar(
    objective: Callable[[float], float], low: float, high: float, *, xatol: float, maxiter: int = 500
) -> tuple[float, float]:
    """Brent's bounded minimisation (golden section with parabolic steps) of ``objective`` on
    ``[low, high]``; returns (x, f(x))."""
    a, b = low, high
    fulc = a + _GOLDEN_MEAN * (b - a)
    nfc, xf = fulc, fulc
    rat = e = 0.0
    fx = objective(xf)
    calls = 1
    fu = math.inf
    ffulc = fnfc = fx
    xm = 0.5 * (a + b)
    tol1 = _SQRT_EPS * abs(xf) + xatol / 3.0
    tol2 = 2.0 * tol1
    while abs(xf - xm) > (tol2 - 0.5 * (b - a)):
        golden = True
        if abs(e) > tol1:  # try a parabola through the three best points
            golden = False
            r = (xf - nfc) * (fx - ffulc)
            q = (xf - fulc) * (fx - fnfc)
            p = (xf - fulc) * q - (xf - nfc) * r
            q = 2.0 * (q - r)
            if q > 0.0:
                p = -p
            q = abs(q)
            r, e = e, rat
            if abs(p) < abs(0.5 * q * r) and p > q * (a - xf) and p < q * (b - xf):
                rat = (p + 0.0) / q
                x = xf + rat
                if (x - a) < tol2 or (b - x) < tol2:
                    rat = tol1 * (_sign(xm - xf) + ((xm - xf) == 0))
            else:
                golden = True
        if golden:
            e = a - xf if xf >= xm else b - xf
            rat = _GOLDEN_MEAN * e
        x = xf + (_sign(rat) + (rat == 0)) * max(abs(rat), tol1)
        fu = objective(x)
        calls += 1
        if fu <= fx:
            if x >= xf:
                a = xf
            else:
                b = xf
            fulc, ffulc = nfc, fnfc
            nfc, fnfc = xf, fx
            xf, fx = x, fu
        else:
            if x < xf:
                a = x
            else:
                b = x
            if fu <= fnfc or nfc == xf:
                fulc, ffulc = nfc, fnfc
                nfc, fnfc = x, fu
            elif fu <= ffulc or fulc == xf or fulc == nfc:  # noqa: SIM109 (==, not identity: NaN)
                fulc, ffulc = x, fu
        xm = 0.5 * (a + b)
        tol1 = _SQRT_EPS * abs(xf) + xatol / 3.0
        tol2 = 2.0 * tol1
        if calls >= maxiter:
            break
    return float(xf), float(fx)


def _sign(value: float) -> float:
    """``np.sign`` of a float (0.0 for 0, NaN for NaN)."""
    if value != value:
        return value
    return (value > 0) - (value < 0)
