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
from coci.planning.objective import CostModel, Overhead, TwoLevelCostModel
from coci.planning.three_levels import ThreeLevelCostModel

__all__ = ["ConstrainedOptimum", "constrained_optimum", "optimal_steps", "optimal_three_level", "optimal_two_level"]

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


# --- two levels ----------------------------------------------------------------------------------


def _chain_terms(model: CostModel, alpha: float, ref_step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per node (0: the plan's start, rolling back to ``ref_step``; i: a checkpoint at step
    ``start_step + i``): ``G(lo)``, ``M(lo)``, ``W(ref)`` and the steps, for the link costs."""
    t, p, horizon = model.step_seconds, model.persist_seconds, model.horizon_seconds
    candidates = np.arange(model.start_step + 1, model.total_steps, dtype=np.int64)
    lo = np.concatenate([[model.start_seconds], np.minimum(candidates * t + p, horizon)])
    ref = np.concatenate([[ref_step * t], candidates * t])
    steps = np.concatenate([[model.start_step], candidates])
    return model.hazard_integral(lo, alpha), model.failures_until(lo), model.weight_until(ref, alpha), steps


def _links(model: CostModel, alpha: float, ref_step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(link[a, b], end[a])``: the cost of the chain link ``a -> b`` (C plus the work failures in
    ``[commit(a), commit(b))`` lose) and of the last link ``a -> horizon`` (no checkpoint)."""
    big_g, big_m, slope, _ = _chain_terms(model, alpha, ref_step)
    link = big_g[None, :] - big_g[:, None] - slope[:, None] * (big_m[None, :] - big_m[:, None]) + model.checkpoint_seconds
    end_g = float(model.hazard_integral(model.horizon_seconds, alpha))
    end_m = float(model.failures_until(model.horizon_seconds))
    return link, end_g - big_g - slope * (end_m - big_m)


def optimal_two_level(
    model: TwoLevelCostModel, *, alpha: float = 0.0, min_steps: int = 1, min_promote: int = 1
) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact minimiser of ``model.objective(steps, promote, alpha)`` over every (step, level)
    assignment: ``(steps, promote, value)``. O(N^3) in the steps of the span: small grids only.

    ``L[a, b]``: the cheapest local chain from node ``a`` to node ``b`` (both checkpoints); the
    promoted chain is a DP over its nodes with link ``a -> b`` costing the remote link plus
    ``L[a, b]``, since the local chain between two promotions is independent of the rest.
    Both chains start at ``max(start_step, last_checkpoint_step)`` for the spacing.
    """
    local, remote = model.local, model.remote
    if local.total_steps - local.start_step > 400:
        raise ConfigError("the two-level DP is cubic: at most 400 steps")
    steps, (local_link, remote_link), (local_end, remote_end) = _grid(
        ((local, min_steps), (remote, min_promote)), alpha)
    best_local, via = _best_chains(local_link)
    local_tail, local_last = _tail(best_local, local_end)
    promoted, parent = _top_chain(remote_link, best_local)
    finals = promoted + remote_end + local_tail
    last = int(np.argmin(finals))
    restarts = sum(float(m.failures_until(m.horizon_seconds)) * m.restart_seconds for m in (local, remote))
    promote_nodes = _walk(parent, last)
    local_nodes = _stretches(via, [0, *promote_nodes], int(local_last[last]))
    return steps[local_nodes], steps[promote_nodes], float(finals[last]) + restarts


def _grid(
    chains: tuple[tuple[CostModel, int], ...], alpha: float
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The nodes' steps (node 0 at ``max(start_step, last_checkpoint_step)`` for the spacing) and,
    per ``(chain, spacing)``, its link costs (``inf`` below the spacing) and end costs."""
    local = chains[0][0]
    steps = _chain_terms(local, alpha, local.last_checkpoint_step)[3].copy()
    steps[0] = max(local.start_step, local.last_checkpoint_step)
    gap = steps[None, :] - steps[:, None]
    links, ends = [], []
    for chain, spacing in chains:
        link, end = _links(chain, alpha, chain.last_checkpoint_step)
        links.append(np.where(gap >= spacing, link, np.inf))
        ends.append(end)
    return steps, links, ends


def _top_chain(link: np.ndarray, inner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top level's chain from node 0: per node ``b``, the cheapest chain ending at ``b`` (its
    links ``a -> b`` cost ``link[a, b]`` plus ``inner[a, b]``) and the node before ``b``."""
    n = link.shape[0]
    cost = np.full(n, np.inf)
    cost[0] = 0.0
    parent = np.full(n, -1, dtype=np.int64)
    for b in range(1, n):
        options = cost[:b] + link[:b, b] + inner[:b, b]
        parent[b] = int(np.argmin(options))
        cost[b] = options[parent[b]]
    return cost, parent


def _walk(parent: np.ndarray, node: int) -> list[int]:
    chain = []
    while node > 0:
        chain.append(node)
        node = int(parent[node])
    return chain[::-1]


def _best_chains(link: np.ndarray, inner: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(best[a, b], via[a, b])``: the cheapest chain from node ``a`` to node ``b`` whose links
    ``c -> d`` cost ``link[c, d]`` plus ``inner[c, d]`` (the lower level's chain between them), and
    each chain's node before ``b``."""
    n = link.shape[0]
    cost = link if inner is None else link + inner
    best = np.full((n, n), np.inf)
    np.fill_diagonal(best, 0.0)
    via = np.full((n, n), -1, dtype=np.int64)
    for b in range(1, n):
        options = best[:, :b] + cost[None, :b, b]  # [a, c]: a -> ... -> c -> b
        via[:, b] = np.argmin(options, axis=1)
        best[:b, b] = options[np.arange(b), via[:b, b]]
    return best, via


def _tail(best: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node ``a``: the cheapest chain from ``a`` to some ``c >= a`` then to the horizon, and that ``c``."""
    tails = best + end[None, :]
    tails[np.tril_indices(best.shape[0], -1)] = np.inf
    return tails.min(axis=1), tails.argmin(axis=1)


def _stretches(via: np.ndarray, anchors: list[int], last: int) -> list[int]:
    """The nodes of a level's chain: each anchor-to-anchor stretch, then the last anchor to ``last``."""
    nodes: list[int] = []
    for a, b in zip(anchors, [*anchors[1:], last]):
        stretch = []
        node = b
        while node != a:
            stretch.append(node)
            node = int(via[a, node])
        nodes.extend(stretch[::-1])
    return nodes


# --- three levels --------------------------------------------------------------------------------


def optimal_three_level(
    model: ThreeLevelCostModel, *, alpha: float = 0.0, min_steps: int = 1, min_peer: int = 1, min_promote: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Exact minimiser of ``model.objective(steps, peer, promote, alpha)`` over every (step, level)
    assignment with nested levels: ``(steps, peer, promote, value)``. O(N^3): small grids only.

    As :func:`optimal_two_level`, one level up: ``L[a, b]`` the cheapest local chain between two
    peer copies, ``Q[a, b]`` the cheapest peer chain between two uploads (its links ``c -> d`` cost
    the peer link plus ``L[c, d]``), and the uploads a DP over links costing the remote link plus
    ``Q[a, b]``; after the last upload, a peer chain, then a local chain, then the horizon.
    """
    local, peer, remote = model.chains
    if local.total_steps - local.start_step > 400:
        raise ConfigError("the three-level DP is cubic: at most 400 steps")
    steps, links, ends = _grid(((local, min_steps), (peer, min_peer), (remote, min_promote)), alpha)
    best_local, via_local = _best_chains(links[0])
    best_peer, via_peer = _best_chains(links[1], best_local)
    local_tail, local_last = _tail(best_local, ends[0])
    peer_tail, peer_last = _tail(best_peer, ends[1] + local_tail)
    uploaded, parent = _top_chain(links[2], best_peer)
    finals = uploaded + ends[2] + peer_tail
    last = int(np.argmin(finals))
    restarts = sum(float(m.failures_until(m.horizon_seconds)) * m.restart_seconds for m in model.chains)
    upload_nodes = _walk(parent, last)
    peer_nodes = _stretches(via_peer, [0, *upload_nodes], int(peer_last[last]))
    last_peer = peer_nodes[-1] if peer_nodes else 0
    local_nodes = _stretches(via_local, [0, *peer_nodes], int(local_last[last_peer]))
    return steps[local_nodes], steps[peer_nodes], steps[upload_nodes], float(finals[last]) + restarts
