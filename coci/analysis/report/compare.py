"""The report's policy comparison: every policy re-planned over the whole run with what the run measured.

Each policy of ``coci.planning.config.POLICIES`` is planned from step 0 with the final plan's
measured inputs, failure model and fit ("what each policy would have planned, knowing what the run
measured"), each under the report's plan-size cap (``knobs.REPORT_MAX_PLAN_CHECKPOINTS``; a
larger plan is a row with an error). Its overheads are the planner's expected values, or Monte
Carlo means with 95% confidence intervals from [``coci.analysis.simulate.simulate``][coci.simulate] when
trials are asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from coci import knobs
from coci.analysis.report.read import PolicyRow
from coci.analysis.simulate import simulate as simulate_plan
from coci.analysis.simulation_results import MetricSummary
from coci.errors import CociError
from coci.planning.config import POLICIES, PlanConfig
from coci.planning.formulas import plan_size_cap
from coci.planning.planner import plan as make_plan
from coci.planning.records import Plan

__all__ = ["compare_policies", "simulated_into"]


def compare_policies(
    reference: Plan,
    *,
    policies: Iterable[str] = POLICIES,
    trials: int = 0,
    seed: int = 0,
) -> tuple[list[PolicyRow], dict[str, Plan]]:
    """Plan every policy over the whole run from ``reference``'s inputs and fit; score each.

    Rows carry the expected overhead from the planner, replaced by Monte Carlo mean and 95% CI
    when ``trials > 0``.
    """
    inputs = reference.inputs
    curve = reference.fit if reference.fit is not None and reference.fit.usable else None
    simulate = simulate_plan if trials > 0 else None
    rows: list[PolicyRow] = []
    plans: dict[str, Plan] = {}
    for name in policies:
        try:
            objective = "progress" if name != reference.policy else _requested_objective(reference)
            config = PlanConfig.from_inputs(inputs, policy=name, objective=objective, time_budget=reference.time_budget)
            with plan_size_cap(knobs.REPORT_MAX_PLAN_CHECKPOINTS, "knobs.REPORT_MAX_PLAN_CHECKPOINTS"):  # plan.json's inputs are untrusted
                planned = make_plan(config=config, curve=curve, **inputs.measured_costs())
        except (CociError, ValueError, ArithmeticError) as exc:  # ArithmeticError: a hostile plan.json's inputs overflow
            error = str(exc) if isinstance(exc, CociError) else f"plan.json inputs: {type(exc).__name__}: {exc}"
            rows.append(PolicyRow(policy=name, chosen=name == reference.policy, error=error))
            continue
        plans[name] = planned
        row = _expected_row(planned, chosen=name == reference.policy)
        if simulate is not None and inputs.failures is not None:
            simulated_into(row, simulate, planned, inputs.failures, trials, seed)
        rows.append(row)
    return rows, plans


def _requested_objective(reference: Plan) -> str:
    # A plan records the objective it ended up optimising; "time" may be a fallback of "progress".
    fell_back = any("time objective" in f for f in reference.fallbacks)
    return "progress" if fell_back else reference.objective


def _expected_row(planned: Plan, *, chosen: bool) -> PolicyRow:
    expected = planned.expected
    run = expected.get("run_seconds") or planned.inputs.total_steps * planned.inputs.step_seconds
    intervals = planned.intervals

    def percent(key: str) -> float | None:
        value = expected.get(key)
        return None if value is None or not run else 100.0 * value / run

    return PolicyRow(
        policy=planned.policy,
        chosen=chosen,
        checkpoints=len(planned.steps),
        first_interval_steps=intervals[0] if intervals else None,
        last_interval_steps=intervals[-1] if intervals else None,
        wall_seconds=expected.get("wall_seconds"),
        wall_percent=percent("wall_seconds"),
        progress_seconds=expected.get("progress_seconds"),
        progress_percent=percent("progress_seconds"),
        lost_seconds=expected.get("lost_seconds"),
        failure_hours=_hours(expected, "lost_seconds"),
        progress_failure_hours=_hours(expected, "lost_progress_seconds"),
        fallbacks=list(planned.fallbacks),
    )


def _hours(expected: dict[str, float], lost: str) -> float | None:
    """Restarts plus lost work (``lost``: wall-clock or progress-weighted), in hours."""
    if "restart_seconds" not in expected or lost not in expected:
        return None
    return (expected["restart_seconds"] + expected[lost]) / 3600.0


def simulated_into(row: PolicyRow, simulate: Any, planned: Plan, failures: Any, trials: int, seed: int) -> None:
    """Replace the row's expected figures with the simulated means and 95% CIs of
    [``coci.analysis.simulate.simulate``][coci.simulate] (its ``metrics``: ``wall_*`` / ``progress_*`` summaries)."""
    try:
        result = simulate(planned, failures=failures, trials=trials, seed=seed)
    except (CociError, ValueError) as exc:
        row.error = f"simulation failed: {exc}"
        return
    metrics = result.metrics
    for metric in ("wall", "progress"):
        seconds, percent = metrics[f"{metric}_seconds"], metrics[f"{metric}_percent"]
        setattr(row, f"{metric}_seconds", seconds.mean)
        setattr(row, f"{metric}_percent", percent.mean)
        setattr(row, f"{metric}_ci_percent", [percent.ci_low, percent.ci_high])
    row.lost_seconds = metrics["lost_seconds"].mean
    restarts = np.asarray(result.samples["restart_seconds"], dtype=float)
    for field, lost in (("failure_hours", "lost_seconds"), ("progress_failure_hours", "lost_progress_seconds")):
        hours = MetricSummary.of((restarts + np.asarray(result.samples[lost], dtype=float)) / 3600.0)
        setattr(row, field, hours.mean)
        setattr(row, f"{field}_ci", [hours.ci_low, hours.ci_high])
    row.source = f"simulated, {trials} trials, mean [95% CI]"

