"""Checkpoint policies as pure functions: costs, a failure model and a curve in, steps out.

Each policy turns cost figures, a failure model and (for the convergence-aware ones) a loss curve
into checkpoint steps. ``coci.planning.planner`` validates inputs, picks the policy by name and wraps the
result in a [``coci.Plan``][coci.Plan]; everything here is plain numbers and arrays.

* ``young``: ``T = sqrt(2 C / lambda)``.
* ``daly``: Daly's exact optimum for exponential failures,
  ``T = M (1 + W0(-exp(-(C/M + 1))))`` with ``M = 1 / lambda``. For a non-exponential model both
  use the long-run rate ``lambda = 1 / MTBF``.
* ``checkfreq``: as CheckFreq's code does it: ``k = max(ceil((t_full - o) / t), 1)`` with ``o`` the
  snapshot stall and ``t_full = o + P``; after each checkpoint, if the measured overhead of the next
  ``k`` steps (``C / (k t)``) exceeds ``max_overhead`` (CheckFreq: 5%), ``k += 2`` (never back). It
  ignores the failure rate. Offline the growth is replayed from the known ``C``; online
  (``coci.planning.online.PlanningPolicy``) it runs from measurements.
* ``coci``: as COCI's code does it: ``L(t) = exp(theta1 t + theta2)`` with ``t`` in **minutes**,
  ``P_e = (1 - exp(theta1 C)) (1/(2 lambda) - 1/(2 theta1))`` (C in minutes, lambda per minute), and
  checkpoint ``k`` at ``L^-1(L_now - k P_e)``. Unit caveat: ``P_e`` has the unit of time (minutes)
  but is subtracted from loss values, so the plan changes if the same job is described in seconds or
  hours; and it is not the minimiser of the objective the paper states. Kept for reproduction and
  comparison. When the fitted loss cannot fall by another ``P_e`` before the horizon (``L`` tends to
  0), the last interval is repeated to the end (the authors' code re-fits every 10,000 steps
  instead); the planner records this.
* ``auto``: the convergence-aware optimum, see ``auto_steps``.

Constraints shared by every policy (``min_interval_steps``): consecutive checkpoints are at least
``ceil(P / t)`` steps apart (one persist in flight: the next snapshot waits for the previous
commit) and, when ``max_overhead`` is given, at least ``C / (max_overhead t)`` steps apart (the
checkpoint cost never exceeds that share of the run time: for ``auto``, ``young`` and ``daly`` the
cap covers the whole of C, stall plus interference). Steps are integers, strictly increasing, inside
``(start_step, total_steps)``.

``auto`` alone also has a longest interval (``max_interval_steps``): at most
``_PLAN_MAX_INTERVAL_MTBF`` (0.5) of the MTBF over the plan's span (expected failures per
second of progress, inverted), and never shorter than Young's interval (so the time optimum is never
constrained). Reason: the first-order model counts a segment of length ``a`` as losing ``a^2 / 2M``
in expectation, while the exact expected time is ``M (e^(a/M) - 1) - a``; the two agree within 4%
for ``a <= M / 2`` and diverge exponentially beyond (at ``a = 2M`` the model undercounts by 2.4x).
Without the cap a pure-progress plan on a flat tail (``w`` near 0) leaves segments of several
MTBFs whose true wall-clock cost the model does not see.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from coci import knobs
from coci.errors import ConfigError
from coci.planning.objective import CostModel, Overhead, mu_from_alpha

#: Further bisection steps on alpha with refined placements, when no refined plan at the boundary
#: alpha fits the budget (more: closer to the exact optimum, each step a few refinements' time).
_REFINED_BISECTION_STEPS = 8

__all__ = [
    "AutoResult",
    "arange_steps",
    "auto_steps",
    "check_plan_size",
    "checkfreq_interval",
    "checkfreq_steps",
    "checkpoint_density",
    "coci_expected_progress",
    "coci_minutes",
    "daly_interval_seconds",
    "max_checkpoints",
    "max_interval_steps",
    "min_interval_steps",
    "periodic_candidates",
    "periodic_steps",
    "place",
    "plan_size_cap",
    "refine",
    "snap_to_steps",
    "young_interval_seconds",
]

#: Sweeps (even then odd checkpoints) of that refinement at most.
_PLAN_REFINE_SWEEPS: int = 6

#: Longest interval "auto" plans, as a fraction of the MTBF over the plan's span (never below
#: Young's interval): the first-order model is within 4% of the exact expected time up to MTBF / 2.
_PLAN_MAX_INTERVAL_MTBF: float = 0.5


# --- classical intervals ---------------------------------------------------------------------------


def young_interval_seconds(checkpoint_seconds: float, rate: float) -> float:
    """Young (1974): ``T = sqrt(2 C / lambda)`` seconds."""
    return math.sqrt(2.0 * checkpoint_seconds / rate)


def daly_interval_seconds(checkpoint_seconds: float, mean_seconds: float) -> float:
    """Daly (2006), exact: ``T = M (1 + W0(-exp(-(C/M + 1))))``; ``M`` if ``C >= M`` (his rule)."""
    m = mean_seconds
    if checkpoint_seconds >= m:
        return m
    from scipy.special import lambertw  # here, not at import: ``import coci`` stays light

    w = lambertw(-math.exp(-(checkpoint_seconds / m + 1.0)), 0).real
    return float(m * (1.0 + w))


def min_interval_steps(
    step_seconds: float, persist_seconds: float, checkpoint_seconds: float, max_overhead: float | None
) -> int:
    """Fewest steps between checkpoints: one persist in flight, and C at most ``max_overhead``."""
    steps = max(1, math.ceil(persist_seconds / step_seconds - 1e-9))
    if max_overhead is not None:
        steps = max(steps, math.ceil(checkpoint_seconds / (max_overhead * step_seconds) - 1e-9))
    return steps


def max_interval_steps(model: CostModel, min_steps: int = 1) -> int:
    """Longest interval ``auto`` allows (steps): ``_PLAN_MAX_INTERVAL_MTBF`` of the MTBF over
    the plan's span, but never below Young's interval nor ``min_steps`` (see the module docstring)."""
    span = model.horizon_seconds - model.start_seconds
    failures = float(model.cum_failures[-1])
    if not (failures > 0 and span > 0):
        return max(min_steps, model.total_steps - model.start_step)
    mtbf = span / failures
    cap = max(_PLAN_MAX_INTERVAL_MTBF * mtbf, young_interval_seconds(model.checkpoint_seconds, 1.0 / mtbf))
    whole = max(min_steps, model.total_steps - model.start_step)  # no interval is longer: also no overflow
    steps = cap / model.step_seconds + 1e-9
    return whole if not steps < whole else max(min_steps, int(math.floor(steps)))


#: The plan-size cap in force and the knob that sets it (None: ``knobs.PLAN_MAX_CHECKPOINTS``).
_MAX_CHECKPOINTS: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar("plan_max_checkpoints", default=None)


def max_checkpoints() -> int:
    """The most checkpoints a plan may hold here: ``knobs.PLAN_MAX_CHECKPOINTS``, or a lower cap
    set by ``plan_size_cap`` (the report's comparison plans under its own)."""
    return _cap()[0]


def _cap() -> tuple[int, str]:
    cap = _MAX_CHECKPOINTS.get()
    if cap is None or cap[0] >= knobs.PLAN_MAX_CHECKPOINTS:
        return knobs.PLAN_MAX_CHECKPOINTS, "knobs.PLAN_MAX_CHECKPOINTS"
    return cap


@contextlib.contextmanager
def plan_size_cap(cap: int, name: str) -> Iterator[None]:
    """Plans made inside hold at most ``cap`` checkpoints (never more than the knob); ``name``
    says in errors where the cap comes from."""
    token = _MAX_CHECKPOINTS.set((cap, name))
    try:
        yield
    finally:
        _MAX_CHECKPOINTS.reset(token)


def check_plan_size(count: float) -> None:
    """The plan-size rule every policy's schedule goes through before its array is built:
    ConfigError when it would hold more than ``max_checkpoints`` (NaN included)."""
    cap, name = _cap()
    if not count <= cap:
        raise ConfigError(
            f"the plan would hold about {count:.3g} checkpoints, over the cap of {cap} ({name}): "
            "shorten total_steps (plan a horizon and re-plan) or check the costs"
        )


def arange_steps(first: int, stop: int, interval: int) -> np.ndarray:
    """``first, first + interval, ...`` below ``stop``, its size checked first (``check_plan_size``)."""
    check_plan_size(max(0, -(-(stop - first) // interval)))
    return np.arange(first, stop, interval, dtype=np.int64)


def periodic_steps(interval: int, start_step: int, total_steps: int, anchor: int | None = None) -> np.ndarray:
    """``anchor + interval, anchor + 2 interval, ...`` after ``start_step`` and before ``total_steps``."""
    anchor = start_step if anchor is None else anchor
    first = anchor + interval * max(1, math.ceil((start_step + 1 - anchor) / interval))
    return arange_steps(first, total_steps, interval)


def checkfreq_interval(stall_seconds: float, persist_seconds: float, step_seconds: float) -> int:
    """CheckFreq's initial ``k = max(ceil((t_full - o) / t_step), 1)``, ``t_full = o + P``."""
    full = stall_seconds + persist_seconds
    return max(math.ceil((full - stall_seconds) / step_seconds - 1e-9), 1)


def checkfreq_steps(
    interval: int,
    *,
    checkpoint_seconds: float,
    step_seconds: float,
    max_overhead: float,
    start_step: int,
    total_steps: int,
    anchor: int | None = None,
) -> tuple[np.ndarray, int]:
    """CheckFreq's schedule with its growth rule replayed from a known ``C``.

    After each checkpoint the next ``k`` steps cost ``C / (k t)`` extra; while that exceeds
    ``max_overhead`` the interval grows by 2. Returns ``(steps, final_k)``.
    """
    k = interval
    target = checkpoint_seconds / (max_overhead * step_seconds)
    growth = max(0, math.ceil((target - k) / 2.0 - 1e-12)) if target > k else 0
    anchor = start_step if anchor is None else anchor
    # the ramp's j-th checkpoint lies past anchor + j k + j (j - 1): only those before the horizon are built
    reach = math.isqrt(max(0, total_steps - anchor)) + 1
    shown = min(growth, reach)
    check_plan_size(shown)
    intervals = k + 2 * np.arange(1, shown + 1, dtype=np.int64)  # after checkpoint j: k + 2j
    first = np.array([k], dtype=np.int64)
    ramp = np.concatenate([first, intervals[:-1]]) if shown else first
    positions = anchor + np.cumsum(ramp)
    final_k = int(k + 2 * growth)
    last = int(positions[-1])
    tail = arange_steps(last + final_k, total_steps, final_k) if shown == growth else np.zeros(0, dtype=np.int64)
    steps = np.concatenate([positions, tail])
    steps = steps[(steps > start_step) & (steps < total_steps)]
    return steps, final_k


# --- COCI as published --------------------------------------------------------------------------


def coci_expected_progress(theta1: float, checkpoint_minutes: float, rate_per_minute: float) -> float:
    """COCI's ``P_e = (1 - exp(theta1 C)) (1/(2 lambda) - 1/(2 theta1))`` (minutes; see caveat)."""
    return (1.0 - math.exp(theta1 * checkpoint_minutes)) * (
        1.0 / (2.0 * rate_per_minute) - 1.0 / (2.0 * theta1)
    )


def coci_minutes(
    theta1: float, theta2: float, pe: float, *, now_minutes: float, end_minutes: float
) -> tuple[np.ndarray, bool]:
    """Checkpoint times (minutes) ``L^-1(L_now - k P_e)``, k = 1, 2, ... before ``end_minutes``.

    Returns ``(times, repeated)``; ``repeated`` is True when the loss ran out of room
    (``L_now - k P_e <= 0``) before the end and the last interval was repeated to the end.
    """
    level = math.exp(theta1 * now_minutes + theta2)
    count = math.ceil(level / pe) + 1 if math.isfinite(level / pe) else math.inf
    check_plan_size(count)
    targets = level - pe * np.arange(1, int(count) + 1)
    targets = targets[targets > 0]
    times = (np.log(targets) - theta2) / theta1
    inside = times[times < end_minutes]
    if inside.size == times.size and times.size >= 2:
        last_interval = float(times[-1] - times[-2])
        if last_interval > 0:
            check_plan_size(times.size + (end_minutes - times[-1]) / last_interval)
        extra = np.arange(times[-1] + last_interval, end_minutes, last_interval) if last_interval > 0 else np.empty(0)
        return np.concatenate([times, extra]), True
    return inside, False


# --- auto ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AutoResult:
    """What ``auto_steps`` chose: steps, the mixture (alpha = 1/(1+mu)) and the budget (the time
    optimum's and the budget's wall-clock overhead are exposed figures, ``Overhead.exposed_wall_seconds``)."""

    steps: np.ndarray
    alpha: float
    time_optimal_wall_seconds: float
    budget_wall_seconds: float | None
    notes: tuple[str, ...] = field(default=())

    @property
    def mu(self) -> float | None:
        return mu_from_alpha(self.alpha)


def checkpoint_density(model: CostModel, alpha: float, min_steps: int, max_steps: int | None) -> np.ndarray:
    """First-order optimal checkpoints per second per cell: sqrt(h w_alpha / (2 C)), between
    ``1 / (max_steps t)`` and ``1 / (min_steps t)``. A checkpoint that stalls nothing (C = 0: an
    upper level's chain, whose copy runs in the background) takes the limit C -> 0: as dense as
    ``min_steps`` allows where failures cost anything (h w_alpha > 0), as sparse as ``max_steps``
    allows where they cost nothing."""
    weight = alpha * model.weight + (1.0 - alpha)
    exposure = model.hazard * weight
    if model.checkpoint_seconds > 0.0:
        density = np.sqrt(exposure / (2.0 * model.checkpoint_seconds))
    else:
        density = np.where(exposure > 0.0, np.inf, 0.0)
    cap = 1.0 / (min_steps * model.step_seconds)
    density = np.minimum(density, cap)
    if max_steps is not None:
        density = np.maximum(density, 1.0 / (max(max_steps, min_steps) * model.step_seconds))
    floor = 1e-12 * max(float(density.max()), 1e-300)
    return np.maximum(density, floor)


def place(
    model: CostModel,
    alpha: float,
    min_steps: int,
    offsets: tuple[int, ...] = (0,),
    max_steps: int | None = None,
    refined: bool = True,
) -> list[np.ndarray]:
    """Checkpoint steps from the density ``n = sqrt(h w_alpha / (2C))`` integrated along the run.

    The cumulative density ``N(x)`` up to the effective end ``H - P`` (the last segment is longer by
    ``P``: its failures after the last commit are fewer; on a re-plan ``N`` counts from the last
    checkpoint, so the segment already running is not restarted) is split into ``m`` equal parts, ``m`` the
    nearest integer to ``N(H - P)`` plus each of ``offsets``; checkpoints sit at the split points,
    rounded to steps and thinned to the minimum interval. ``max_steps`` floors the density (no
    interval longer, up to rounding) and bounds ``refine``; ``refined=False`` skips that exact
    local refinement (the bisection in ``auto_steps`` only needs to know on which side of the
    budget a weight falls). Returns one candidate per offset.
    """
    density = checkpoint_density(model, alpha, min_steps, max_steps)
    # a re-plan starts mid-segment: the density since the last checkpoint counts towards the first
    lead = float(density[0]) * max(0.0, model.start_seconds - model.last_checkpoint_step * model.step_seconds)
    cumulative = np.concatenate([[0.0], np.cumsum(density * np.diff(model.edges))]) + lead
    end = model.horizon_seconds - model.persist_seconds
    if end <= model.start_seconds:
        return [np.zeros(0, dtype=np.int64) for _ in offsets]
    total = float(np.interp(end, model.edges, cumulative))
    check_plan_size(total)  # NaN included: memory is bounded before any array is built
    base = max(1, int(round(total)))
    candidates = []
    for offset in offsets:
        segments = max(1, base + offset)
        targets = total * np.arange(1, segments) / segments
        targets = targets[targets > lead]
        seconds = np.interp(targets, cumulative, model.edges)
        steps = snap_to_steps(seconds, model, min_steps)
        if refined and 0 < steps.size <= knobs.PLAN_REFINE_MAX_CHECKPOINTS:
            steps = refine(model, steps, alpha, min_steps, max_steps)
        candidates.append(steps)
    return candidates


class _LocalCost:
    """Weighted lost work of the two segments a checkpoint at step ``y`` touches (vectorised over
    the checkpoints moved together).

    Failures in ``[prev_lo, commit(y))`` roll back to ``prev`` (seconds); those in
    ``[commit(y), hi)`` roll back to ``y``. The terms at the fixed ends (``prev``, ``prev_lo``,
    ``hi``) are computed once, not at every probe of the search (the same values, so the same costs).
    """

    def __init__(
        self, model: CostModel, prev: np.ndarray, prev_lo: np.ndarray, hi: np.ndarray, alpha: float
    ) -> None:
        self.model, self.alpha = model, alpha
        self.m_lo, self.m_hi = model.failures_until(prev_lo), model.failures_until(hi)
        self.i_lo, self.i_hi = model.hazard_integral(prev_lo, alpha), model.hazard_integral(hi, alpha)
        self.w_prev = model.weight_until(prev, alpha)

    def __call__(self, *ys: np.ndarray) -> list[np.ndarray]:
        """The cost at each of ``ys`` (arrays shaped like the checkpoints), in one evaluation."""
        model, count = self.model, len(ys)
        x = np.concatenate(ys) * model.step_seconds
        commit = np.minimum(x + model.persist_seconds, model.horizon_seconds)
        m_c, i_c = model.failures_until(commit), model.hazard_integral(commit, self.alpha)
        m_lo, m_hi, i_lo, i_hi, w_prev = (np.tile(v, count) for v in (self.m_lo, self.m_hi, self.i_lo, self.i_hi, self.w_prev))
        before = i_c - i_lo - w_prev * (m_c - m_lo)
        after = i_hi - i_c - model.weight_until(x, self.alpha) * (m_hi - m_c)
        return np.split(before + after, count)


def refine(
    model: CostModel, steps: np.ndarray, alpha: float, min_steps: int, max_steps: int | None = None,
    fixed: np.ndarray | None = None,
) -> np.ndarray:
    """Exact local improvement of a plan: move each checkpoint to its best step between its
    neighbours (vectorised ternary search; even and odd checkpoints alternately, a few sweeps),
    keeping both its intervals within ``[min_steps, max_steps]`` where they already were.

    The first-order density is accurate when intervals are short against the scale on which the
    weight and hazard change; with few checkpoints on a steep curve it is not, and this pass closes
    the gap to the exact optimum (the DP of ``exact_optimum``) for a fixed number of checkpoints.
    ``fixed`` (a mask over ``steps``) holds checkpoints in place (a two-level plan's promoted ones).
    """
    steps = steps.astype(np.int64).copy()
    n = steps.size
    t, p, horizon = model.step_seconds, model.persist_seconds, model.horizon_seconds
    first_allowed = first_allowed_step(model, min_steps)
    for _ in range(_PLAN_REFINE_SWEEPS):
        moved = False
        for parity in (0, 1):
            index = np.arange(parity, n, 2)
            if index.size == 0:
                continue
            prev_step = np.where(index > 0, steps[np.maximum(index - 1, 0)], -1)
            next_step = np.where(index < n - 1, steps[np.minimum(index + 1, n - 1)], -1)
            prev = np.where(prev_step >= 0, prev_step * t, model.last_checkpoint_step * t)
            prev_lo = np.where(prev_step >= 0, np.minimum(prev_step * t + p, horizon), model.start_seconds)
            hi = np.where(next_step >= 0, np.minimum(next_step * t + p, horizon), horizon)
            low = np.where(prev_step >= 0, prev_step + min_steps, first_allowed)
            high = np.where(next_step >= 0, next_step - min_steps, model.total_steps - 1)
            current = steps[index]
            if max_steps is not None:
                before = np.where(prev_step >= 0, prev_step, max(model.start_step, model.last_checkpoint_step))
                after = np.where(next_step >= 0, next_step, model.total_steps)
                low = np.maximum(low, after - max_steps)
                high = np.minimum(high, before + max_steps)
            stuck = (high < low) | (current < low) | (current > high)
            if fixed is not None:
                stuck |= fixed[index]
            low, high = np.where(stuck, current, low), np.where(stuck, current, high)
            cost = _LocalCost(model, prev, prev_lo, hi, alpha)
            best = _ternary(cost, low, high)
            at_current, at_best = cost(current, best)
            gain = at_current - at_best
            better = gain > 1e-12 * max(1.0, float(np.abs(gain).max()))
            if np.any(better):
                steps[index[better]] = best[better]
                moved = True
        if not moved:
            break
    return steps


def _ternary(cost: _LocalCost, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The step in ``[low, high]`` of least ``cost`` (unimodal), per checkpoint."""
    low, high = low.copy(), high.copy()
    while True:
        wide = high - low > 2
        if not np.any(wide):
            break
        third = (high - low) // 3
        m1, m2 = low + third, high - third
        f1, f2 = cost(m1, m2)
        left = wide & (f1 < f2)
        right = wide & ~(f1 < f2)
        high = np.where(left, m2 - 1, high)
        low = np.where(right, m1 + 1, low)
    options = [np.minimum(low + k, high) for k in range(3)]
    costs = np.stack(cost(*options))
    return np.stack(options)[np.argmin(costs, axis=0), np.arange(low.size)]


def first_allowed_step(model: CostModel, min_steps: int) -> int:
    """The earliest step a plan may checkpoint at: ``min_steps`` after the last checkpoint (its
    persist done) and after the (re-)planning step. A re-plan mid-segment does not restart the
    minimum interval: re-planning at the commit of the last checkpoint (as the session does) would
    otherwise push every next checkpoint a whole minimum interval further."""
    return max(model.start_step + 1, model.last_checkpoint_step + min_steps)


def snap_to_steps(seconds: np.ndarray, model: CostModel, min_steps: int) -> np.ndarray:
    """Positions (seconds of progress) to admissible checkpoint steps: rounded, inside
    ``[first_allowed_step, total_steps)``, deduplicated, ``min_steps`` apart."""
    steps = np.rint(seconds / model.step_seconds).astype(np.int64)
    first_allowed = first_allowed_step(model, min_steps)
    steps = steps[(steps >= first_allowed) & (steps < model.total_steps)]
    if steps.size > 1:  # sorted already (monotone positions): drop rounding duplicates
        steps = steps[np.concatenate([[True], np.diff(steps) > 0])]
    if steps.size > 1 and np.any(np.diff(steps) < min_steps):
        steps = _thin(steps, min_steps)
    return steps


def _thin(steps: np.ndarray, min_steps: int) -> np.ndarray:
    """Drop checkpoints closer than ``min_steps`` to the previous kept one (rare: rounding)."""
    kept = [int(steps[0])]
    for step in steps[1:].tolist():
        if step - kept[-1] >= min_steps:
            kept.append(step)
    return np.asarray(kept, dtype=np.int64)


def _best(model: CostModel, candidates: list[np.ndarray], alpha: float) -> tuple[np.ndarray, float]:
    scored = [(model.objective(c, alpha), i) for i, c in enumerate(candidates)]
    value, index = min(scored)
    return candidates[index], value


def periodic_candidates(model: CostModel, min_steps: int) -> list[np.ndarray]:
    """Young-spaced plans at the two integer intervals around ``sqrt(2C / mean hazard)``.

    When optimal intervals are only a few steps long, rounding a density plan step by step mixes
    intervals (2, 3, 2, ...) that a constant integer interval beats; these candidates cover that.
    """
    failures = float(model.cum_failures[-1])
    if failures <= 0:
        return []
    rate = failures / (model.horizon_seconds - model.start_seconds)
    ideal = young_interval_seconds(model.checkpoint_seconds, rate) / model.step_seconds
    anchor = min(model.start_step, model.last_checkpoint_step)  # a re-plan keeps the running segment
    return [
        periodic_steps(k, model.start_step, model.total_steps, anchor=anchor)
        for k in sorted({max(min_steps, math.floor(ideal)), max(min_steps, math.ceil(ideal))})
    ]


def _bisect_alpha(
    consider: Callable[[float, list[np.ndarray]], bool], model: CostModel, min_steps: int, offsets: tuple[int, ...], max_steps: int | None
) -> None:
    """Bisect on alpha for the largest one whose placement ``consider`` accepts (within the budget),
    then offer that alpha's refined placement (m - 1 and m + 1 at the boundary).

    Refining a placement moves its checkpoints towards the steep part of the curve, which costs
    wall-clock time: at the boundary alpha the refined plans can all exceed the budget while a
    refined plan at a slightly smaller alpha fits and beats every unrefined one. When none fits,
    the refined placements are bisected again below it (``_REFINED_BISECTION_STEPS``)."""
    low, high = 0.0, 1.0
    for _ in range(knobs.PLAN_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if consider(mid, place(model, mid, min_steps, max_steps=max_steps, refined=False)):
            low = mid
        else:
            high = mid
    boundary = place(model, low, min_steps, offsets, max_steps)
    if consider(low, boundary) or all(steps.size > knobs.PLAN_REFINE_MAX_CHECKPOINTS for steps in boundary):
        return  # fits, or too many checkpoints to be refined: the unrefined bisection stands
    floor, ceiling = 0.0, low
    for _ in range(_REFINED_BISECTION_STEPS):
        mid = 0.5 * (floor + ceiling)
        if consider(mid, place(model, mid, min_steps, offsets, max_steps)):
            floor = mid
        else:
            ceiling = mid


def auto_steps(
    model: CostModel,
    *,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    min_steps: int = 1,
    max_steps: int | None = None,
    alpha: float | None = None,
    baselines: dict[str, np.ndarray] | None = None,
) -> AutoResult:
    """``auto``: minimise progress-weighted overhead within a wall-clock budget.

    1. The time-optimal plan (``alpha = 0``, Young/Daly generalised to the hazard; the better of
       the density plan and the two integer Young intervals) sets the reference ``J_t*``; ``objective="time"`` (or a model without progress) returns it.
    2. The pure progress plan (``alpha = 1``, ``mu = 0``) is returned when ``time_budget`` is None
       or when it already meets ``J_t <= (1 + time_budget) J_t*``.
    3. Otherwise ``alpha = 1/(1 + mu)`` is bisected for the largest progress weight whose plan
       meets the budget; of all feasible plans seen, the one with the least progress-weighted
       overhead wins. The end points and the final alpha also try ``m - 1`` and ``m + 1``
       segments (see ``place``).

    The budget is measured on the exposed wall-clock overhead (``Overhead.exposed_wall_seconds``:
    the failures that strike during restarts and re-done work counted), which is what a run pays:
    on the first-order figure a plan with longer rollbacks than the time optimum's looked within 5%
    and cost up to 5.8% in the simulator (MTBF 3 h, restart 600 s, persist 300 s).

    ``alpha`` given (an online re-plan, see [``coci.planning.planner.plan``][coci.plan]): the mixture weight was
    chosen on the whole run; the plan minimises ``alpha J_p + (1 - alpha) J_t`` over the model's
    span (by the principle of optimality its tail is the tail of the whole run's plan), the time
    plan competing. ``max_steps`` is the longest interval (default ``max_interval_steps``; it
    never binds the time optimum).

    ``baselines`` (name: steps) are the plans a user would pick instead (continuous, Young, Daly,
    CheckFreq, fixed intervals): each competes as one more candidate, under the same objective and
    budget, so no baseline within the budget has a lower progress-weighted overhead than the plan
    (under the model). ``AutoResult.notes`` names a baseline that wins.
    """
    offsets = (-1, 0, 1)
    if max_steps is None:
        max_steps = max_interval_steps(model, min_steps)
    time_candidates = place(model, 0.0, min_steps, offsets, max_steps) + periodic_candidates(model, min_steps)
    time_plan, _ = _best(model, time_candidates, 0.0)
    time_wall = model.expected(time_plan).exposed_wall_seconds
    if objective == "time" or not model.has_progress:
        return AutoResult(time_plan, 0.0, time_wall, None)
    if alpha is not None:
        if alpha <= 0.0:
            return AutoResult(time_plan, 0.0, time_wall, None)
        plan, _ = _best(model, [time_plan, *place(model, alpha, min_steps, offsets, max_steps)], alpha)
        return AutoResult(plan, float(alpha), time_wall, None)
    progress_candidates = place(model, 1.0, min_steps, offsets, max_steps)
    if time_budget is None:
        plan, _ = _best(model, progress_candidates, 1.0)
        return AutoResult(plan, 1.0, time_wall, None)
    budget = (1.0 + time_budget) * time_wall
    feasible: list[tuple[float, float, np.ndarray]] = [(model.objective(time_plan, 1.0), 0.0, time_plan)]

    def consider(alpha: float, candidates: list[np.ndarray]) -> bool:
        found = False
        for steps in candidates:
            overhead = model.expected(steps)
            if overhead.exposed_wall_seconds <= budget:
                feasible.append((overhead.progress_seconds, alpha, steps))
                found = True
        return found

    if not consider(1.0, progress_candidates):
        _bisect_alpha(consider, model, min_steps, offsets, max_steps)
    floor = model.restart_seconds * float(model.failures_until(model.horizon_seconds))
    steps, alpha, notes = _best_feasible(feasible, baselines or {}, model.expected, budget, model.checkpoint_seconds, floor)
    return AutoResult(steps, alpha, time_wall, budget, notes)


def _best_feasible(
    feasible: list[tuple[float, float, np.ndarray]], baselines: dict[str, np.ndarray],
    score: Callable[[np.ndarray], Overhead], budget: float, checkpoint_seconds: float, restart_seconds: float,
) -> tuple[np.ndarray, float, tuple[str, ...]]:
    """The feasible plan of least progress-weighted overhead (ties: the larger progress weight),
    the baselines within the budget competing at alpha 0; a note names a baseline that wins. A
    baseline whose checkpoints and restarts alone (``restart_seconds``: every plan pays them) cost
    more than the budget or the best plan's progress overhead is not scored: it can be neither
    feasible nor better."""
    progress, alpha, steps = min(feasible, key=lambda item: (item[0], -item[1]))
    winner = None
    for name, candidate in baselines.items():
        if candidate.size * checkpoint_seconds + restart_seconds > min(budget, progress):
            continue
        overhead = score(candidate)
        if overhead.exposed_wall_seconds <= budget and overhead.progress_seconds < progress:
            progress, alpha, steps, winner = overhead.progress_seconds, 0.0, candidate, name
    notes = () if winner is None else (
        f"auto: the {winner} plan has the least progress-weighted overhead within the time budget; planned it",
    )
    return steps, alpha, notes


def auto_steps_within_run_budget(
    model: CostModel,
    whole: CostModel,
    taken: np.ndarray,
    *,
    time_budget: float,
    min_steps: int = 1,
    max_steps: int | None = None,
    baselines: dict[str, np.ndarray] | None = None,
) -> AutoResult:
    """``auto`` re-planning the rest of a run (``model``) under the **whole run's** time budget.

    ``whole`` is the same job over the whole run (from step 0) and ``taken`` the checkpoints the run
    has already taken (warm-up checkpoints and earlier plans' included). The budget is
    ``(1 + time_budget)`` times the whole run's time optimum, and a candidate for the remaining steps
    is feasible when the whole run's expected wall-clock overhead, ``taken`` followed by the
    candidate, stays within it: what was spent before (checkpoints, their lost work) is charged, so
    no re-plan spends a fresh budget. As ``auto_steps``, the largest feasible progress weight is
    bisected and the feasible plan with the least progress-weighted overhead wins; the time-optimal
    rest is always admitted (nothing better is possible when the past spent the budget).
    ``baselines`` (the rest of each baseline plan) compete as in ``auto_steps``.
    """
    offsets = (-1, 0, 1)
    if max_steps is None:
        max_steps = max_interval_steps(model, min_steps)
    time_plan, _ = _best(model, place(model, 0.0, min_steps, offsets, max_steps) + periodic_candidates(model, min_steps), 0.0)
    whole_time = auto_steps(whole, objective="time", min_steps=min_steps).time_optimal_wall_seconds
    budget = (1.0 + time_budget) * whole_time
    past = np.asarray(taken, dtype=np.int64)

    def run(steps: np.ndarray) -> Overhead:
        return whole.expected(np.concatenate([past, steps]).astype(np.int64))

    first = run(time_plan)
    feasible: list[tuple[float, float, np.ndarray]] = [(first.progress_seconds, 0.0, time_plan)]

    def consider(alpha: float, candidates: list[np.ndarray]) -> bool:
        found = False
        for steps in candidates:
            overhead = run(steps)
            if overhead.exposed_wall_seconds <= budget:
                feasible.append((overhead.progress_seconds, alpha, steps))
                found = True
        return found

    if first.exposed_wall_seconds > budget:
        spent = "the checkpoints already taken spent the run's time budget: the rest is time-optimal"
        return AutoResult(time_plan, 0.0, whole_time, budget, (spent,))
    if not consider(1.0, place(model, 1.0, min_steps, offsets, max_steps)):
        _bisect_alpha(consider, model, min_steps, offsets, max_steps)
    floor = whole.restart_seconds * float(whole.failures_until(whole.horizon_seconds))
    steps, alpha, notes = _best_feasible(feasible, baselines or {}, run, budget, model.checkpoint_seconds, floor)
    return AutoResult(steps, alpha, whole_time, budget, notes)
