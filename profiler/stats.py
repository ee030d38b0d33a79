"""Robust summaries of measured samples: median and median absolute deviation of a window.

Pure functions: a bounded window of samples in, an ``Estimate`` out. The
median and the median absolute deviation resist the outliers a training job produces (a data-loader
hiccup, an evaluation pass, a page-cache flush) that would drag a mean and a standard deviation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from . import knobs
from .profile import Estimate

#: How much the recent steps' median must differ from the window's (either way) to count as drift.
_DRIFT_RATIO: float = 1.25

#: Scale that turns a median absolute deviation into a standard-deviation-like spread
#: (1.4826 makes MAD consistent with the standard deviation of a normal distribution).
_MAD_TO_SIGMA: float = 1.4826


def robust_estimate(samples: Iterable[float]) -> Estimate:
    """Median and scaled MAD (``_MAD_TO_SIGMA``) of ``samples``; an empty Estimate if none."""
    values = np.fromiter(samples, dtype=np.float64)
    if values.size == 0:
        return Estimate()
    median = float(np.median(values))
    spread = None
    if values.size >= 2:
        spread = float(_MAD_TO_SIGMA * np.median(np.abs(values - median)))
    return Estimate(value=median, spread=spread, count=int(values.size))


def ratio_estimate(numerator: Estimate, denominator: Estimate) -> Estimate:
    """``numerator.value / denominator.value`` with the relative spreads combined in quadrature.

    The count is the numerator's (for the interference ratio: the persist-overlapped steps). Unknown
    (empty Estimate) when either side is unmeasured or the denominator is not positive.
    """
    if not (numerator.measured and denominator.measured):
        return Estimate()
    num, den = float(numerator.value), float(denominator.value)  # type: ignore[arg-type]
    if den <= 0.0 or not math.isfinite(num / den):
        return Estimate()
    ratio = num / den
    spread = None
    if numerator.spread is not None and denominator.spread is not None and num > 0.0:
        spread = ratio * math.hypot(numerator.spread / num, denominator.spread / den)
    return Estimate(value=ratio, spread=spread, count=numerator.count)


def prior(value: float | None) -> Estimate:
    """An unmeasured estimate (``count == 0``) derived from the state size and the probe."""
    if value is None or not math.isfinite(value):
        return Estimate()
    return Estimate(value=float(value), spread=None, count=0)


def recent_regime(samples: list[float]) -> list[float]:
    """The samples since the job's speed last changed (oldest first in, oldest first out).

    The job changed speed when the median of the last ``knobs.DRIFT_SAMPLES`` differs by more than
    ``_DRIFT_RATIO`` (either way) from the median of the window's older half. The window is
    then cut after the newest pair of consecutive samples on the old side of the two medians'
    geometric mean (one outlier does not cut); otherwise all samples are kept.
    """
    recent = knobs.DRIFT_SAMPLES
    if len(samples) <= recent:
        return samples
    tail = float(np.median(samples[-recent:]))
    old = float(np.median(samples[: max((len(samples) - recent) // 2, 1)]))
    if tail <= 0.0 or old <= 0.0 or max(tail / old, old / tail) <= _DRIFT_RATIO:
        return samples
    boundary = math.sqrt(tail * old)
    on_old_side = [(value > boundary) == (old > boundary) for value in samples]
    start = len(samples) - recent
    while start > 1 and not (on_old_side[start - 1] and on_old_side[start - 2]):
        start -= 1
    return samples[start:] if start > 1 else samples
