"""The report's line on why the progress objective cuts little (coci.analysis.report.small_cut)."""

from __future__ import annotations

import numpy as np

from coci.analysis.report.small_cut import attainable_cut, small_cut_reason
from coci.planning.empirical import forecast_curve
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.planner import plan

STEPS = 20_000
JOB = dict(failures=Failures.exponential(mtbf=8 * 3600.0), total_steps=STEPS, step_seconds=8.64, stall_seconds=1.6,
           persist_seconds=3.8, restart_seconds=120.0)


def _trace(losses_of) -> tuple[np.ndarray, np.ndarray]:
    steps = np.arange(1.0, STEPS + 1.0, 10.0)
    return steps, losses_of(steps) + np.random.default_rng(0).normal(0.0, 0.002, steps.size)


def test_a_curve_falling_slowly_early_gets_the_line_and_a_steep_one_does_not() -> None:
    slow = _trace(lambda s: 3.0 - 0.5 * s / STEPS - 0.2 * (s / STEPS) ** 2)  # falls faster late than early
    steep = _trace(lambda s: 2.0 + 6.0 * (s + 20.0) ** -0.5)
    for trace, small in ((slow, True), (steep, False)):
        planned = plan("auto", curve=fit_curve(*trace), **JOB)
        for given in (trace, None):  # from the trace, and from the plan's recorded fit alone
            reason = small_cut_reason(planned, given)
            assert (reason is not None) == small, (small, given is None, reason)
    reason = small_cut_reason(plan("auto", curve=fit_curve(*slow), **JOB), slow)
    assert reason is not None and "too slowly for what a checkpoint costs" in reason


def test_the_line_names_a_fit_that_hides_the_early_fall() -> None:
    trace = _trace(lambda s: 2.0 + 6.0 * (s + 20.0) ** -0.5)
    flat_fit = fit_curve(trace[0][-1000:], trace[1][-1000:])  # the second half only: the early fall unseen
    planned = plan("auto", curve=flat_fit, **JOB)
    reason = small_cut_reason(planned, trace)
    assert reason is not None and "plans from this fit save little" in reason
    # a plan on the trace and its forecast (auto online) records the same fit but weighs the early
    # fall as the trace shows it: no such line
    on_trace = plan("auto", curve=forecast_curve(*trace, flat_fit), **JOB)
    assert on_trace.fit is not None and on_trace.fit.window_start == flat_fit.window_start
    assert small_cut_reason(on_trace, trace) is None


def test_attainable_cut_first_order_values() -> None:
    def flat(s: np.ndarray) -> np.ndarray:
        return np.ones_like(np.asarray(s, dtype=float))

    assert abs(attainable_cut(flat, STEPS, 35.0, 1, STEPS)) < 1e-9  # a flat weight: Young is optimal

    def halves(s: np.ndarray) -> np.ndarray:  # weight 2 on the first half, 0 on the second
        return np.where(np.asarray(s) < STEPS / 2, 2.0, 0.0)

    unbounded = attainable_cut(halves, STEPS, 35.0, 1, 1e9)
    assert abs(unbounded - (1.0 - np.sqrt(2.0) / 2.0 / 1.0)) < 0.01  # 1 - mean(sqrt w) / mean(w)
    assert attainable_cut(halves, STEPS, 35.0, 1, 1e9, time_budget=0.05) < unbounded
