"""Three-level plans: which local checkpoints are copied to a peer node and which are uploaded.

The levels nest ([``coci.planning.levels.Level``][coci.Level]): a plan is the local steps ``x``, the subset
``p`` of them copied to a peer, and the subset ``y`` of ``p`` uploaded to the remote tier. Failure
classes ([``coci.FailureClass``][coci.FailureClass]) say what they destroy: a class that destroys nothing (a process
crash) rolls back to the last local commit; one that destroys the local tier only (one node lost,
with the peer copies it held for others) to the last *peer* commit, ``D`` (the peer copy's seconds)
after the local commit; one that destroys the peer level too (several nodes at once) to the last
remote commit, ``U`` after the local commit. As for two levels (``coci.planning.objective``) the
first-order objective is a sum of single-level objectives on the same weight,

    J(x, p, y) = J_local(x; C, P, R, M_process) + J_peer(p; C_p, P + D, R_p, M_node)
               + J_remote(y; C_u, P + U, R_r, M_multi),           y in p in x,

``C_p`` the training time one peer copy costs (its interference), ``R_p`` the restart from a peer's
copy. Nesting keeps the sum exact to first order: every uploaded checkpoint also has a peer copy,
so a node loss never has a newer remote commit than peer commit to restore from (while ``D <=
U``; the simulator plays the other case too). Without a remote tier the classes that destroy
the peer copies are planned on the peer chain (``three_level_model``, with a note); without a
peer level the two-level model of ``coci.planning.levels`` applies.

The planner (``auto_three_level``) extends ``coci.planning.levels`` by one level: the
uploads ``y`` are placed as the two-level promotions are (each charged ``C_u + C_p + C``; charged
``C_u`` alone, riding on copies the peer chain takes anyway; and on the model of every checkpoint at
every level), the peer copies around them (in each gap between
uploads, ``coci.planning.levels.local_around`` on the peer chain, each copy charged ``C_p +
C``, uploads held in place), the local steps around the peer copies, and every candidate (each
level also collapsed onto the one above it; with no uploads, the copies also placed as the
two-level promotions are) is scored by the exact three-level objective. The
mixture weight and the time budget are handled as ``coci.planning.levels.auto_two_level`` does.
Peer copies are at least ``ceil(D / t)`` steps apart (one copy in flight), uploads ``ceil(U / t)``.

At most three levels
--------------------
A plan's levels are ``coci.LevelCosts`` records (``PlanInputs.levels``), but a fourth is refused
(``coci.planning.levels.check_levels``: each of ``Level.PEER`` and ``Level.REMOTE`` at most once,
a ``ConfigError`` naming ``levels``). The placement above nests level by level and would extend
(each level around the one above, the top one placed alone), but what the plan is scored and
replayed against names the three levels and nothing else:

* the failure model: a class says what it destroys as ``("local",)`` or ``("local", "peer")``
  (``coci.FailureClass.destroys``), so there is no class that destroys a third level and spares a
  fourth, and a fourth level's chain would have no hazard of its own to be planned against;
* the objective's sum is exact to first order only while every transfer to a higher level starts
  after the one below commits and takes longer (``D <= U`` above); a fourth level needs that
  ordering of its delay stated and checked;
* the plan records one subset per level by name (``Plan.peer_steps``, ``Plan.promote_steps``),
  which the session's levels, the simulator (``coci.analysis.simulate_levels``) and the report
  read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from coci.errors import ConfigError
from coci.planning.failures import Failures
from coci.planning.formulas import max_interval_steps, periodic_candidates, place
from coci.planning.levels import Level, LevelCosts, MixtureChoice, against_all, auto_mixture, charged, check_levels, local_around
from coci.planning.objective import CostModel, ExpectedFailures, Overhead, build_cost_model, expected_failures, level_figures

if TYPE_CHECKING:
    from coci.planning.policy import Observation
    from coci.planning.records import PlanInputs

__all__ = [
    "ThreeLevelCostModel", "ThreeLevelResult", "auto_three_level", "measured_levels",
    "three_level_candidates", "three_level_model",
]

ThreeLevelPlan = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ThreeLevelCostModel:
    """The three-level objective (module docstring): ``local`` scores the local steps against the
    failures that spare the local tier, ``peer`` the peer copies against those that destroy the
    local tier only (its ``checkpoint_seconds`` is the copy's interference, its ``persist_seconds``
    the persist plus the copy, its ``restart_seconds`` the restore from a peer), ``remote`` the
    uploads against those that destroy the peer copies too."""

    local: CostModel
    peer: CostModel
    remote: CostModel

    def chains(self) -> tuple[CostModel, CostModel, CostModel]:
        return self.local, self.peer, self.remote

    def parts(self, steps: Any, peer: Any, promote: Any) -> tuple[Overhead, Overhead, Overhead]:
        """Expected overhead of each chain; raises [``ConfigError``][coci.ConfigError] unless ``promote`` is a
        subset of ``peer`` and ``peer`` of ``steps``."""
        local, copied, uploaded = (m.check_steps(s) for m, s in zip(self.chains(), (steps, peer, promote)))
        if not (np.all(np.isin(copied, local)) and np.all(np.isin(uploaded, copied))):
            raise ConfigError("peer_steps must be a subset of steps, and promote_steps a subset of peer_steps")
        return self.local.expected(local), self.peer.expected(copied), self.remote.expected(uploaded)

    def expected(self, steps: Any, peer: Any, promote: Any) -> Overhead:
        """Expected overhead of a three-level plan, the three chains added (``checkpoints`` counts
        the local ones; peer copies and uploads are in ``as_dict``)."""
        parts = self.parts(steps, peer, promote)
        return Overhead(
            checkpoints=parts[0].checkpoints,
            checkpoint_seconds=sum(p.checkpoint_seconds for p in parts),
            failures=sum(p.failures for p in parts),
            restart_seconds=sum(p.restart_seconds for p in parts),
            lost_seconds=sum(p.lost_seconds for p in parts),
            lost_progress_seconds=sum(p.lost_progress_seconds for p in parts),
            run_seconds=parts[0].run_seconds,
        )

    def as_dict(self, steps: Any, peer: Any, promote: Any) -> dict[str, float]:
        """``Overhead.as_dict`` of the plan, with the copies, uploads and each class group's part."""
        local, copied, uploaded = self.parts(steps, peer, promote)
        figures = self.expected(steps, peer, promote).as_dict()
        figures.update(level_figures(local, [
            ("peer", "peer_copies", "peer_copy_seconds", copied), ("remote", "promotions", "promotion_seconds", uploaded),
        ]))
        return figures

    def objective(self, steps: Any, peer: Any, promote: Any, alpha: float) -> float:
        """The ``w_alpha`` objective of a three-level plan (what its planner and DP minimise)."""
        return sum(m.objective(s, alpha) for m, s in zip(self.chains(), (steps, peer, promote)))


@dataclass(frozen=True)
class ThreeLevelResult(MixtureChoice):
    """What ``auto_three_level`` chose: local steps, peer copies, uploads, the mixture and the budget."""

    steps: np.ndarray
    peer: np.ndarray
    promote: np.ndarray
    alpha: float
    time_optimal_wall_seconds: float
    budget_wall_seconds: float | None


def _everything(model: ThreeLevelCostModel) -> CostModel:
    """Every checkpoint at every level."""
    return against_all(model.remote, model.local, model.peer)


def _uploads(model: ThreeLevelCostModel, alpha: float, min_promote: int, refined: bool) -> list[np.ndarray]:
    """Candidate upload sets: the single-level placement on the charged remote chain, on the remote
    chain alone and on the chain of every level (``m - 1``, ``m``, ``m + 1`` uploads; at
    ``alpha = 0`` the Young intervals)."""
    local, peer, remote = model.chains()
    uploads: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    if not np.any(remote.hazard > 0):  # no class destroys the peer copies (or no remote tier): no uploads
        return uploads
    # each upload charged the peer copy and local checkpoint it needs; charged its own interference
    # only (it rides on a copy the peer chain would take anyway: where copies are dense, the
    # marginal cost); and every checkpoint at every level
    for chain in (charged(remote, local.checkpoint_seconds + peer.checkpoint_seconds), remote, _everything(model)):
        uploads += place(chain, alpha, min_promote, (-1, 0, 1), max_interval_steps(chain, min_promote), refined)
        if alpha == 0.0:
            uploads += periodic_candidates(chain, min_promote)
    return uploads


def _placed(chain: CostModel, alpha: float, spacing: int, refined: bool) -> list[np.ndarray]:
    """The single-level placements of ``chain`` (``m - 1``, ``m``, ``m + 1`` checkpoints; none
    without failures to place against)."""
    if not np.any(chain.hazard > 0):
        return []
    return place(chain, alpha, spacing, (-1, 0, 1), max_interval_steps(chain, spacing), refined)


def _around(chain: CostModel, fixed: np.ndarray, alpha: float, spacing: int, refined: bool) -> np.ndarray:
    """``local_around`` where ``chain`` has failures to place against; else ``fixed`` alone."""
    if not np.any(chain.hazard > 0):
        return fixed
    return local_around(chain, fixed, alpha, spacing, max_interval_steps(chain, spacing), refined)


def three_level_candidates(
    model: ThreeLevelCostModel, alpha: float, min_steps: int, min_peer: int, min_promote: int, refined: bool = True,
) -> list[ThreeLevelPlan]:
    """``(steps, peer, promote)`` candidates for one mixture weight (module docstring)."""
    local, peer, _ = model.chains()
    peer_chain = charged(peer, local.checkpoint_seconds)
    candidates: list[ThreeLevelPlan] = []
    placed = _placed(peer_chain, alpha, min_peer, refined) + _placed(against_all(peer, local), alpha, min_peer, refined)
    for uploads in _uploads(model, alpha, min_promote, refined):
        copy_sets = [_around(peer_chain, uploads, alpha, min_peer, refined), uploads]
        if uploads.size == 0:  # the two-level problem one level down: place the copies as promotions
            copy_sets += placed
        for copies in copy_sets:
            candidates.append((_around(local, copies, alpha, min_steps, refined), copies, uploads))
            candidates.append((copies, copies, uploads))
    return candidates


def auto_three_level(
    model: ThreeLevelCostModel,
    *,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    min_steps: int = 1,
    min_peer: int = 1,
    min_promote: int = 1,
    alpha: float | None = None,
) -> ThreeLevelResult:
    """``auto`` for three levels: ``coci.planning.levels.auto_mixture`` over ``(steps, peer,
    promote)`` plans scored by the three-level objective (module docstring)."""

    def candidates(weight: float, refined: bool) -> list[ThreeLevelPlan]:
        return three_level_candidates(model, weight, min_steps, min_peer, min_promote, refined)

    plan, weight, time_wall, budget = auto_mixture(
        candidates, model.objective, model.expected, model.local.has_progress,
        objective=objective, time_budget=time_budget, alpha=alpha)
    return ThreeLevelResult(*plan, weight, time_wall, budget)


# --- from a plan's inputs --------------------------------------------------------------------------


#: Per level above the local one: the ``Profile`` level's name and the fallback note when a restore
#: from it is not measured yet (``{seconds:.3g}``: one transfer's time).
_UNMEASURED_RESTORE: dict[Level, str] = {
    Level.REMOTE: "remote restore not measured yet: assumed one upload's time ({seconds:.3g} s)",
    Level.PEER: "restore from a peer's copy not measured yet: assumed one copy's time ({seconds:.3g} s)",
}


def measured_levels(observation: Observation, restart: float, fallbacks: list[str]) -> tuple[LevelCosts, ...]:
    """The measured costs of each level the observation holds (``observation.levels``, measured in
    ``observation.profile.levels``) as [``coci.plan``][coci.plan]'s ``levels``; a level before its
    first transfer is measured, or with nothing committed on it, is left out (every checkpoint at
    that level, as a plan without it has). Unmeasured, a transfer's interference is 0 and a
    restart from that level costs the local restart plus one transfer's time (fetching the same
    bytes back), recorded as a fallback; measured, the local restart plus what a restore from that
    level took over a local one."""
    profile = observation.profile
    measured: list[LevelCosts] = []
    for level in (Level.REMOTE, Level.PEER):
        held = next((record for record in observation.levels if record.level == level), None)
        estimates = profile.level(level.name.lower())
        if held is None or held.last_step is None or estimates is None or not estimates.seconds.known:
            continue
        seconds = float(estimates.seconds.value)  # type: ignore[arg-type]
        restore = estimates.restore_seconds.value
        if restore is None:
            extra = seconds
            fallbacks.append(_UNMEASURED_RESTORE[level].format(seconds=seconds))
        else:
            extra = max(float(restore) - float(profile.restore_seconds.value or 0.0), 0.0)
        measured.append(held.model_copy(update={
            "seconds": seconds, "interference": float(estimates.interference_seconds), "restart": restart + extra,
        }))
    return check_levels(measured)


def three_level_model(
    inputs: PlanInputs, last_checkpoint_step: int, rate: Any, mean_rate: float | None, notes: list[str],
) -> ThreeLevelCostModel | None:
    """The three-level cost model of a plan's inputs, or None without a peer level, a failure model
    or a class that destroys the local tier (then a note). Without a remote tier the classes that
    destroy the peer copies are planned as if a peer's copy survived them (a note), as the two-level
    planner plans without a remote tier; a warning protects only the classes that spare the local
    tier (a checkpoint taken on a notice is local)."""
    failures = inputs.planned_failures()
    peer_level, remote_level = inputs.level(Level.PEER), inputs.level(Level.REMOTE)
    if failures is None or peer_level is None:
        return None
    assert inputs.failures is not None
    unwarned = inputs.failures.model_copy(update={"warned_fraction": 0.0, "warning_seconds": None})
    if unwarned.destroying("local") is None:
        notes.append("no failure class destroys the local tier: no peer level planned (every checkpoint copied)")
        return None
    multi = unwarned.destroying("peer") if inputs.has_remote_tier else None
    node = _spare(unwarned, "peer") if inputs.has_remote_tier else unwarned.destroying("local")
    if not inputs.has_remote_tier and unwarned.destroying("peer") is not None:
        notes.append("failure classes destroy the peer copies but no remote tier is given: planned as if a peer's copy restored them")
    restart = inputs.restart_seconds
    remote_level = remote_level or LevelCosts(level=Level.REMOTE)  # no remote tier: no class left to plan it for
    copied = last_checkpoint_step if peer_level.last_step is None else min(peer_level.last_step, last_checkpoint_step)
    promoted = copied if remote_level.last_step is None else min(remote_level.last_step, copied)
    step, persist = inputs.step_seconds, inputs.persist_seconds
    origin = inputs.failure_origin_step * step

    def build(group: Failures | None, cost: float, delay: float, restart: float, last: int) -> CostModel:
        span = inputs.total_steps * step - origin
        hazard = ExpectedFailures.none(origin) if group is None else expected_failures(group, span, origin)
        return build_cost_model(
            total_steps=inputs.total_steps, step_seconds=step, checkpoint_seconds=cost, persist_seconds=persist + delay,
            restart_seconds=restart, failures=hazard, progress_rate=rate, start_step=inputs.start_step,
            last_checkpoint_step=last, mean_rate=mean_rate if rate is not None else None,
        )

    return ThreeLevelCostModel(
        local=build(failures.sparing("local"), inputs.checkpoint_seconds, 0.0, restart, last_checkpoint_step),
        peer=build(node, peer_level.interference, peer_level.transfer_seconds, peer_level.restart_seconds(restart), copied),
        remote=build(multi, remote_level.interference, remote_level.transfer_seconds, remote_level.restart_seconds(restart), promoted),
    )


def _spare(failures: Failures, tier: str) -> Failures | None:
    """The classes that destroy the local tier but spare ``tier``."""
    group = [c for c in failures.failure_classes if "local" in c.destroys and tier not in c.destroys]
    if not group:
        return None
    return group[0].failures if len(group) == 1 else Failures.compose(*group)
