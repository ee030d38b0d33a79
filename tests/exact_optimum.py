"""Exact numeric optimum of the checkpoint objective: the oracle the planner's tests compare ``auto`` with.

A dynamic program over step positions that minimises the same objective as the planner
(:class:`coci.planning.objective.CostModel`), used by the tests to validate ``auto`` and by benchmarks to
report how far a heuristic is from optimal. It is O(N^2) in the number of steps, for small horizons
(a few thousand steps).

State: the last checkpoint ``a``. A plan is a chain ``start -> a_1 -> ... -> a_n -> end``; the cost
of the link ``a -> b`` is ``C`` plus the expected (weighted) work lost by failures in
``[commit(a), commit(b))``, which roll back to ``a``. Writing the link cost as
``G(lo_b) - G(lo_a) - W(a) (M(lo_b) - M(lo_a))`` separates it into a part of ``a`` and a part of
``b``, so each ``b`` is one vectorised minimum over its admissible predecessors (``b - a >=
min_steps``, as in the planner).

For the time budget, :func:`constrained_optimum` bisects the Lagrange multiplier of
``min J_p  s.t.  J_t <= B``: for ``alpha = 1/(1+mu)`` the DP minimises ``alpha J_p + (1-alpha) J_t``
exactly; the best feasible plan found is returned together with the Lagrangian dual bound
``max_mu min_plan J_p + mu (J_t - B)``, a certified lower bound on the true constrained optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coci.errors import ConfigError
from coci.planning.objective import CostModel, Overhead

__all__ = ["ConstrainedOptimum", "constrained_optimum", "optimal_steps"]

#: Horizons beyond this many steps are refused (the DP is quadratic).
MAX_DP_STEPS = 20_000


def optimal_steps(model: CostModel, *, alpha: float = 0.0, min_steps: int = 1) -> tuple[np.ndarray, float]:
    """Exact minimiser of ``model.objective(steps, alpha)`` over integer plans; ``(steps, value)``.

    Candidates are ``(start_step, total_steps)``; consecutive checkpoints (and the first one from
    ``max(start_step, last_checkpoint_step)``) are at least ``min_steps`` apart.
    """
    span = model.total_steps - model.start_step
    if span > MAX_DP_STEPS:
        raise ConfigError(f"total_steps - start_step must be at most {MAX_DP_STEPS} for the exact DP, got {span}")
    t, p = model.step_seconds, model.persist_seconds
    horizon = model.horizon_seconds
    candidates = np.arange(model.start_step + 1, model.total_steps, dtype=np.int64)
    # node 0 is the plan's start; node i >= 1 is a checkpoint at candidates[i - 1]
    node_steps = np.concatenate([[max(model.start_step, model.last_checkpoint_step)], candidates])
    lo = np.concatenate([[model.start_seconds], np.minimum(candidates * t + p, horizon)])
    ref = np.concatenate([[model.last_checkpoint_step * t], candidates * t])
    big_g = model.hazard_integral(lo, alpha)
    big_m = model.failures_until(lo)
    slope = model.weight_until(ref, alpha)  # W(a)
    cost = np.full(node_steps.size, np.inf)
    cost[0] = 0.0
    parent = np.full(node_steps.size, -1, dtype=np.int64)
    intercept = np.full(node_steps.size, np.inf)  # cost[a] - G(lo_a) + W(a) M(lo_a)
    intercept[0] = cost[0] - big_g[0] + slope[0] * big_m[0]
    c = model.checkpoint_seconds
    for b in range(1, node_steps.size):
        last = int(np.searchsorted(node_steps, node_steps[b] - min_steps, side="right"))
        if last == 0:
            continue
        values = intercept[:last] - slope[:last] * big_m[b]
        a = int(np.argmin(values))
        if not np.isfinite(values[a]):
            continue
        cost[b] = values[a] + big_g[b] + c
        parent[b] = a
        intercept[b] = cost[b] - big_g[b] + slope[b] * big_m[b]
    end_g = float(model.hazard_integral(horizon, alpha))
    end_m = float(model.failures_until(horizon))
    finals = intercept - slope * end_m + end_g
    best = int(np.argmin(finals))
    chain = []
    node = best
    while node > 0:
        chain.append(int(node_steps[node]))
        node = int(parent[node])
    steps = np.asarray(chain[::-1], dtype=np.int64)
    value = float(finals[best]) + end_m * model.restart_seconds
    return steps, value


@dataclass(frozen=True)
class ConstrainedOptimum:
    """Best plan under ``J_t <= budget`` found by the Lagrangian DP, and the dual lower bound."""

    steps: np.ndarray
    overhead: Overhead
    alpha: float
    dual_bound: float
    budget_wall_seconds: float


def constrained_optimum(
    model: CostModel, *, budget_wall_seconds: float, min_steps: int = 1, iterations: int = 30
) -> ConstrainedOptimum:
    """Minimise progress-weighted overhead subject to expected wall-clock overhead <= budget."""
    best: tuple[float, float, np.ndarray, Overhead] | None = None
    dual = -np.inf

    def evaluate(alpha: float) -> bool:
        nonlocal best, dual
        steps, _ = optimal_steps(model, alpha=alpha, min_steps=min_steps)
        overhead = model.expected(steps)
        if alpha > 0:
            mu = (1.0 - alpha) / alpha
            dual = max(dual, overhead.progress_seconds + mu * (overhead.wall_seconds - budget_wall_seconds))
        feasible = overhead.wall_seconds <= budget_wall_seconds * (1 + 1e-12)
        if feasible and (best is None or overhead.progress_seconds < best[0]):
            best = (overhead.progress_seconds, alpha, steps, overhead)
        return feasible

    if not evaluate(0.0):
        raise ConfigError(
            f"budget_wall_seconds {budget_wall_seconds!r} is below the time optimum; nothing is feasible"
        )
    if not evaluate(1.0):
        low, high = 0.0, 1.0
        for _ in range(iterations):
            mid = 0.5 * (low + high)
            if evaluate(mid):
                low = mid
            else:
                high = mid
    else:
        dual = best[0] if best is not None else dual
    assert best is not None
    return ConstrainedOptimum(best[2], best[3], best[1], float(dual), budget_wall_seconds)
