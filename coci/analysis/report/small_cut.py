"""Why checkpointing by training progress saves little on some curves: the report's one line.

The progress objective beats Young by checkpointing densely where the loss falls fast. To first
order (Young's model, the planner's progress weight ``w`` with mean 1 over the run) a checkpoint
density ``u`` times Young's costs ``mean(u + w / u) / 2`` of Young's progress-weighted overhead,
least at ``u = sqrt(w)`` (within the plan's shortest and longest intervals). No schedule, offline
or online, saves more than ``1 -`` that minimum (``attainable_cut``); where it is small, the
loss falls too slowly early, for what a checkpoint costs, to be worth protecting more densely, and
``small_cut_reason`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from coci.errors import ConfigError
from coci.planning.empirical import empirical_progress_rate
from coci.planning.progress import fit_progress_weight
from coci.planning.records import Plan

__all__ = ["attainable_cut", "early_weight", "small_cut_reason", "trace_weight"]

#: The report says why in one line (coci.analysis.report.small_cut) when no schedule can cut the
#: progress-weighted overhead by this share of Young's (first order): the loss falls too slowly early.
_REPORT_SMALL_CUT: float = 0.10

Weight = Callable[[np.ndarray], np.ndarray]


def _grid(total_steps: int) -> np.ndarray:
    """Steps 1..N, log-spaced early (where the weight moves fast) and linear late."""
    return np.unique(np.concatenate([np.geomspace(1.0, total_steps, 2048), np.linspace(1.0, total_steps, 4096)]))


def trace_weight(steps: np.ndarray, losses: np.ndarray, total_steps: int) -> Weight | None:
    """The progress weight a recorded loss trace shows: its empirical rate
    (``coci.planning.empirical.empirical_progress_rate``, no fitted law) over its mean on steps
    1..``total_steps``; None when the trace does not fall."""
    try:
        rate = empirical_progress_rate(steps, losses)
    except ConfigError:
        return None
    grid = _grid(total_steps)
    mean = float(np.trapezoid(rate(grid), grid)) / max(total_steps - 1.0, 1.0)
    if not (mean > 0 and math.isfinite(mean)):
        return None
    return lambda query: rate(np.asarray(query, dtype=float)) / mean


def attainable_cut(
    weight: Weight, total_steps: int, young_steps: float, min_steps: int, max_steps: float,
    time_budget: float | None = None,
) -> float:
    """The largest first-order cut of Young's progress-weighted overhead a schedule can make within
    ``time_budget`` (extra wall-clock overhead over Young's; None: unbounded): the density ``u =
    sqrt(alpha w + 1 - alpha)`` times Young's, clipped to intervals between ``min_steps`` and
    ``max_steps`` (``young_steps``: Young's interval), costs ``mean(u + w / u) / mean(1 + w)`` of
    Young's progress-weighted overhead and ``mean(u + 1 / u) / 2`` of its wall-clock overhead; the
    largest ``alpha`` within the budget is bisected."""
    steps = _grid(total_steps)
    w = np.maximum(np.nan_to_num(weight(steps), nan=0.0, posinf=0.0), 0.0)
    low, high = young_steps / max(max_steps, young_steps), young_steps / min(min_steps, young_steps)
    young = float(np.trapezoid(1.0 + w, steps))
    if not young > 0:
        return 0.0

    def density(alpha: float) -> np.ndarray:
        return np.clip(np.sqrt(alpha * w + 1.0 - alpha), low, high)

    def within_budget(alpha: float) -> bool:
        u = density(alpha)
        return time_budget is None or float(np.trapezoid(u + 1.0 / u, steps)) <= (1.0 + time_budget) * 2.0 * (steps[-1] - steps[0])

    alpha, step = (1.0, 0.0) if within_budget(1.0) else (0.0, 0.5)
    for _ in range(30 if step else 0):  # bisection: the largest alpha within the budget
        if within_budget(alpha + step):
            alpha += step
        step /= 2.0
    u = density(alpha)
    return float(1.0 - np.trapezoid(u + w / u, steps) / young)


def early_weight(weight: Weight, young_steps: float) -> float:
    """The mean progress weight over the first Young interval: how many times its run average the
    loss falls per step while the first checkpoint is due."""
    steps = np.linspace(1.0, 1.0 + young_steps, 256)
    return float(np.mean(np.maximum(np.nan_to_num(weight(steps), nan=0.0, posinf=0.0), 0.0)))


def _planned_on_trace(plan: Plan) -> bool:
    """True when the plan weighed the loss trace itself (an empirical curve: offline from a recorded
    trace, online the trace so far and its forecast), not its recorded fit's law."""
    return "empirical (" in plan.inputs.curve


def small_cut_reason(plan: Plan, trace: tuple[np.ndarray, np.ndarray] | None = None) -> str | None:
    """One sentence saying why the progress objective cuts little against Young on this run, or
    None when it can cut at least ``_REPORT_SMALL_CUT`` (or there is no curve or failure model).

    From the plan's recorded costs, time budget and progress weight: the weight of the plan's
    recorded fit and, when given, the one the run's loss ``trace`` ``(steps, losses)`` shows. Two
    reasons: the loss falls too slowly early for what a checkpoint costs (the trace's weight, else
    the fit's, leaves no cut), or the trace allows a cut that the fit hides (a recent-window fit holds
    the loss before its window at the observed average, so plans made from it stay near Young); not
    said of a plan that weighed the trace itself (``auto`` online, or from a recorded trace)."""
    inputs = plan.inputs
    if inputs.failures is None or not inputs.checkpoint_seconds > 0:
        return None
    young = math.sqrt(2.0 * inputs.checkpoint_seconds * inputs.failures.mean_seconds) / inputs.step_seconds
    max_steps = plan.details.get("max_interval_steps", float(inputs.total_steps))

    def cut_of(weight: Weight) -> float:
        return attainable_cut(weight, inputs.total_steps, young, inputs.min_interval_steps, max_steps, plan.time_budget)

    fitted = None if plan.fit is None else fit_progress_weight(plan.fit, inputs.total_steps)
    shown = None if trace is None else trace_weight(
        np.asarray(trace[0], dtype=float), np.asarray(trace[1], dtype=float), inputs.total_steps
    )
    weight = shown if shown is not None else fitted
    if weight is None:
        return None
    cut = cut_of(weight)
    if cut < _REPORT_SMALL_CUT:
        return (
            f"progress weighting can save little here: over the first Young interval ({young:.0f} steps) the loss "
            f"fell only {early_weight(weight, young):.2g}x as fast as its run average, too slowly for what a "
            f"checkpoint costs, so no schedule within the time budget saves more than {max(cut, 0.0):.0%} of "
            "Young's progress-weighted overhead (first order); an online plan, which learns the curve as it comes, "
            "saves less."
        )
    if shown is None or fitted is None or plan.fit is None or _planned_on_trace(plan):
        return None
    fit_cut = cut_of(fitted)
    if fit_cut >= _REPORT_SMALL_CUT:
        return None
    return (
        f"plans from this fit save little though the trace allows more: the fit ({plan.fit.family}, window from "
        f"step {plan.fit.window_start or 0:.0f}) puts the early loss fall at {early_weight(fitted, young):.2g}x its "
        f"run average where the trace shows {early_weight(shown, young):.2g}x, so a plan made from it saves at "
        f"most {max(fit_cut, 0.0):.0%} of Young's progress-weighted overhead where one from the trace could save "
        f"{cut:.0%} (first order, within the time budget); earlier plans, made before the window, may have saved more."
    )
