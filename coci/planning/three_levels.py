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
the peer copies are planned on the peer chain (``three_level_model``, with a note); the local
tier and the remote tier alone are the two-level model of ``coci.planning.levels``.

The planner is one chain over ``N`` levels (``LevelChainModel``, ``level_candidates``,
``auto_levels``; three levels are ``auto_three_level``). The top level's steps are placed as the
two-level promotions are (each charged the interference of every level below it; charged its own
interference alone, riding on transfers the level below takes anyway; and on the model of every
checkpoint at every level), plus none; then level by level down, each level's steps around the
ones above (``coci.planning.levels.local_around`` on its chain, each charged the levels below it,
the ones above held in place) or the same as the level above, and where the level above takes
nothing, also placed alone as the top one. Every candidate is scored by the exact chain objective;
the mixture weight and the time budget are handled as ``coci.planning.levels.auto_two_level``
does. Each level's steps are at least ``ceil(transfer / t)`` apart (one transfer in flight). The
local and remote tiers alone keep their own planner (``auto_two_level``): its candidates hold
neither the empty top level nor the top chain charged its own interference alone, so the chain of
two would plan differently; the local tier and one level above the remote tier alone (``level4``)
are a chain of two.

Levels above the remote tier
----------------------------
A plan's ``levels`` (``coci.LevelCosts``, ``PlanInputs.levels``) may hold levels above the remote
tier, each one more entry: ``LevelCosts(level=4, ...)`` (its restore rank), its steps in
``Plan.higher_steps`` by name (``level4``). The chain is any increasing subset of the levels above
the local tier (``chain_levels``): local, remote and ``level4`` (one node, an object store and a
second store), local, peer and ``level4``, local and ``level4`` alone, or all four. Each chain is
planned against the failure classes that destroy every level below it and spare it, by restore
rank (``FailureClass.depth``): without the peer level, the remote chain takes the classes that
destroy the peer copies too. ``coci.planning.levels.check_levels`` keeps the chain exact to first
order: the levels above the remote tier take the ranks from 4 on, one each, and each one's
transfer takes at least as long as the level's below it (the delays grow with the rank, as ``D <=
U`` above); a ``ConfigError`` names the field otherwise. ``coci.simulate`` plays it
(``coci.analysis.simulate_levels``: its transfers queued from the local commit, the classes that
destroy the levels below it restored from it). A session runs it as a level added by value
(``coci.DirectoryLevel``, ``coci.checkpoint.storage_level.AddedLevel``): it copies there the steps
``Plan.higher_steps`` names for it, and ``measured_levels`` plans it from the profile once it is
measured; until then it takes the remote tier's checkpoints, and a class that destroys the remote
tier is planned as if the remote tier survived it, with a fallback (``survivable_failures``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from coci.errors import ConfigError
from coci.planning.failures import TIERS, Failures
from coci.planning.formulas import max_interval_steps, periodic_candidates, place
from coci.planning.levels import (
    HoldsLevels,
    Level,
    LevelCosts,
    MixtureChoice,
    WholeRun,
    against_all,
    auto_mixture,
    charged,
    check_levels,
    local_around,
)
from coci.planning.objective import CostModel, ExpectedFailures, Overhead, build_cost_model, expected_failures, level_figures

if TYPE_CHECKING:
    from coci.planning.policy import Observation
    from coci.planning.records import PlanInputs

__all__ = [
    "LevelChainModel", "LevelsResult", "ThreeLevelCostModel", "ThreeLevelResult", "auto_levels", "auto_three_level",
    "chain_levels", "level_candidates", "measured_levels", "plans_chain", "survivable_failures", "three_level_candidates", "three_level_model",
]

LevelsPlan = tuple[np.ndarray, ...]
ThreeLevelPlan = LevelsPlan

#: The names of a chain model's levels by position (local first); a level past these is ``level<k>``.
CHAIN_NAMES: tuple[str, ...] = ("local", "peer", "remote")
#: What ``as_dict`` calls an upper level's transfers and their seconds (``coci.planning.objective.level_figures``).
_TRANSFER_FIGURES: dict[str, tuple[str, str]] = {
    "peer": ("peer_copies", "peer_copy_seconds"), "remote": ("promotions", "promotion_seconds"),
}


def chain_name(position: int) -> str:
    """The name of a chain model's level at ``position`` (0: the local tier)."""
    return CHAIN_NAMES[position] if position < len(CHAIN_NAMES) else f"level{position + 1}"


@dataclass(frozen=True, init=False)
class LevelChainModel:
    """The objective over ``N`` nested levels (module docstring): ``chains[0]`` scores the local
    steps against the failures that spare the local tier, ``chains[k]`` the subset at level ``k``
    against those that destroy the levels below it and spare it (its ``checkpoint_seconds`` is the
    transfer's interference, its ``persist_seconds`` the persist plus the transfer, its
    ``restart_seconds`` the restore from it), the top chain against every class that destroys the
    levels below it. Built as ``LevelChainModel(local, peer, remote, ...)``; ``names`` names each
    chain's level (default: by position, ``chain_name``; a chain without the peer level, such as
    local, remote, ``level4``, names them)."""

    chains: tuple[CostModel, ...]
    names: tuple[str, ...]

    def __init__(self, *chains: CostModel, names: Sequence[str] | None = None) -> None:
        if len(chains) < 2:
            raise ConfigError(f"a level chain needs the local tier and at least one level above it, got {len(chains)} chains")
        given = tuple(chain_name(position) for position in range(len(chains))) if names is None else tuple(names)
        if len(given) != len(chains):
            raise ConfigError(f"names: one per chain ({len(chains)}), got {len(given)}")
        object.__setattr__(self, "chains", tuple(chains))
        object.__setattr__(self, "names", given)

    @property
    def local(self) -> CostModel:
        return self.chains[0]

    @property
    def peer(self) -> CostModel:
        return self.chains[1]

    @property
    def remote(self) -> CostModel:
        return self.chains[2]

    def parts(self, *plan: Any) -> tuple[Overhead, ...]:
        """Expected overhead of each chain, ``plan`` one step list per level (local first); raises
        [``ConfigError``][coci.ConfigError] unless each level's steps are a subset of the one below."""
        if len(plan) != len(self.chains):
            raise ConfigError(f"a plan of {len(self.chains)} levels needs {len(self.chains)} step lists, got {len(plan)}")
        checked = [m.check_steps(s) for m, s in zip(self.chains, plan)]
        for position in range(1, len(checked)):
            if not np.all(np.isin(checked[position], checked[position - 1])):
                if self.names == CHAIN_NAMES:
                    raise ConfigError("peer_steps must be a subset of steps, and promote_steps a subset of peer_steps")
                raise ConfigError(f"the {self.names[position]} steps must be a subset of the {self.names[position - 1]} steps")
        return tuple(m.expected(s) for m, s in zip(self.chains, checked))

    def expected(self, *plan: Any) -> Overhead:
        """Expected overhead of a plan, the chains added (``checkpoints`` counts the local ones;
        each upper level's transfers are in ``as_dict``)."""
        parts = self.parts(*plan)
        return Overhead(
            checkpoints=parts[0].checkpoints,
            checkpoint_seconds=sum(p.checkpoint_seconds for p in parts),
            failures=sum(p.failures for p in parts),
            restart_seconds=sum(p.restart_seconds for p in parts),
            lost_seconds=sum(p.lost_seconds for p in parts),
            lost_progress_seconds=sum(p.lost_progress_seconds for p in parts),
            run_seconds=parts[0].run_seconds,
        )

    def as_dict(self, *plan: Any) -> dict[str, float]:
        """``Overhead.as_dict`` of the plan, with each upper level's transfers and each class group's part."""
        parts = self.parts(*plan)
        figures = self.expected(*plan).as_dict()
        uppers = []
        for position, part in enumerate(parts[1:], start=1):
            name = self.names[position]
            transfers, seconds = _TRANSFER_FIGURES.get(name, (f"{name}_copies", f"{name}_copy_seconds"))
            uppers.append((name, transfers, seconds, part))
        figures.update(level_figures(parts[0], uppers))
        return figures

    def objective(self, *plan_and_alpha: Any) -> float:
        """The ``w_alpha`` objective of a plan: ``objective(steps, ..., top_steps, alpha)`` (what
        its planner and DP minimise)."""
        *plan, alpha = plan_and_alpha
        return sum(m.objective(s, alpha) for m, s in zip(self.chains, plan))


#: The three-level model (local, peer, remote chains) is the chain model of three levels.
ThreeLevelCostModel = LevelChainModel


@dataclass(frozen=True)
class LevelsResult(MixtureChoice):
    """What ``auto_levels`` chose: each level's steps (local first, each a subset of the one
    below), the mixture and the budget."""

    levels: tuple[np.ndarray, ...]
    alpha: float
    time_optimal_wall_seconds: float
    budget_wall_seconds: float | None

    @property
    def steps(self) -> np.ndarray:
        """The local steps."""
        return self.levels[0]

    @property
    def peer(self) -> np.ndarray:
        """The steps copied to the level above the local tier."""
        return self.levels[1]

    @property
    def promote(self) -> np.ndarray:
        """The steps uploaded to the third level (the remote tier)."""
        return self.levels[2]


ThreeLevelResult = LevelsResult


def _top_sets(model: LevelChainModel, alpha: float, spacing: int, refined: bool) -> list[np.ndarray]:
    """Candidate step sets of the top level: none, and the single-level placement on the top chain
    charged every level below, on the top chain alone and on the chain of every checkpoint at every
    level (``m - 1``, ``m``, ``m + 1``; at ``alpha = 0`` the Young intervals)."""
    *below, top = model.chains
    sets: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    if not np.any(top.hazard > 0):  # no class destroys the level below the top (or no top level): none
        return sets
    # each charged the transfers and local checkpoint it needs; charged its own interference only
    # (it rides on a transfer the level below takes anyway: where those are dense, the marginal
    # cost); and every checkpoint at every level
    for chain in (charged(top, sum(c.checkpoint_seconds for c in below)), top, against_all(top, *below)):
        sets += place(chain, alpha, spacing, (-1, 0, 1), max_interval_steps(chain, spacing), refined)
        if alpha == 0.0:
            sets += periodic_candidates(chain, spacing)
    return sets


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


def level_candidates(
    model: LevelChainModel, alpha: float, spacings: Sequence[int], refined: bool = True,
) -> list[LevelsPlan]:
    """Plans (one step list per level, local first) for one mixture weight (module docstring):
    the top level's sets, then level by level down, each level's steps around the ones above
    (``local_around`` on its chain charged the levels below it, the ones above held in place) or
    the same as the level above; a level whose level above takes nothing is also placed alone.
    ``spacings``: each level's fewest steps between two of its checkpoints."""
    chains = model.chains
    plans: list[tuple[np.ndarray, ...]] = [(top,) for top in _top_sets(model, alpha, spacings[-1], refined)]
    for position in range(len(chains) - 2, -1, -1):
        below = chains[:position]
        chain = charged(chains[position], sum(c.checkpoint_seconds for c in below)) if below else chains[position]
        spacing = spacings[position]
        alone = [] if not below else _placed(chain, alpha, spacing, refined) + _placed(against_all(chains[position], *below), alpha, spacing, refined)
        expanded: list[tuple[np.ndarray, ...]] = []
        for plan in plans:
            above = plan[0]
            sets = [_around(chain, above, alpha, spacing, refined), above]
            if below and above.size == 0:  # the problem one level down: place this level as the top one
                sets += alone
            expanded += [(steps, *plan) for steps in sets]
        plans = expanded
    return plans


def three_level_candidates(
    model: LevelChainModel, alpha: float, min_steps: int, min_peer: int, min_promote: int, refined: bool = True,
) -> list[LevelsPlan]:
    """``(steps, peer, promote)`` candidates for one mixture weight (``level_candidates``)."""
    return level_candidates(model, alpha, (min_steps, min_peer, min_promote), refined)


def auto_levels(
    model: LevelChainModel,
    spacings: Sequence[int],
    *,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    alpha: float | None = None,
    whole_run: WholeRun | None = None,
) -> LevelsResult:
    """``auto`` over ``N`` levels: ``coci.planning.levels.auto_mixture`` over the plans of
    ``level_candidates`` scored by the chain objective (module docstring); ``whole_run``: a
    re-plan's whole run."""
    if len(spacings) != len(model.chains):
        raise ConfigError(f"spacings: one per level ({len(model.chains)}), got {len(spacings)}")

    def candidates(weight: float, refined: bool) -> list[LevelsPlan]:
        return level_candidates(model, weight, spacings, refined)

    plan, weight, time_wall, budget = auto_mixture(
        candidates, model.objective, model.expected, model.local.has_progress,
        objective=objective, time_budget=time_budget, alpha=alpha, whole_run=whole_run)
    return LevelsResult(tuple(plan), weight, time_wall, budget)


def auto_three_level(
    model: LevelChainModel,
    *,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    min_steps: int = 1,
    min_peer: int = 1,
    min_promote: int = 1,
    alpha: float | None = None,
) -> LevelsResult:
    """``auto`` for three levels: ``auto_levels`` with the local, peer and upload spacings."""
    return auto_levels(model, (min_steps, min_peer, min_promote), objective=objective, time_budget=time_budget, alpha=alpha)


# --- from a plan's inputs --------------------------------------------------------------------------


#: Per level above the local one: the ``Profile`` level's name and the fallback note when a restore
#: from it is not measured yet (``{seconds:.3g}``: one transfer's time).
_UNMEASURED_RESTORE: dict[Level | int, str] = {
    Level.REMOTE: "remote restore not measured yet: assumed one upload's time ({seconds:.3g} s)",
    Level.PEER: "restore from a peer's copy not measured yet: assumed one copy's time ({seconds:.3g} s)",
}
_UNMEASURED_ADDED = "restore from {name} not measured yet: assumed one copy's time ({seconds:.3g} s)"


def measured_levels(observation: Observation, restart: float, fallbacks: list[str]) -> tuple[LevelCosts, ...]:
    """The measured costs of each level the observation holds (``observation.levels``, measured in
    ``observation.profile.levels``) as [``coci.plan``][coci.plan]'s ``levels``; a level before its
    first transfer is measured, or with nothing committed on it, is left out (every checkpoint at
    that level, as a plan without it has). Unmeasured, a transfer's interference is 0 and a
    restart from that level costs the local restart plus one transfer's time (fetching the same
    bytes back), recorded as a fallback; measured, the local restart plus what a restore from that
    level took over a local one. A level added above the remote tier (``level4``, a session's
    ``levels=``) is planned over whichever of the peer and remote levels are measured below it,
    where ``check_levels`` takes it (a transfer at least as long as the one below it); otherwise it
    is left out with a fallback note, and takes what the remote tier takes (``survivable_failures``
    then plans the classes only it survives)."""
    added = sorted({record.level for record in observation.levels if record.rank > int(Level.REMOTE)}, key=int)
    measured = [
        record for level in (Level.REMOTE, Level.PEER, *added)
        if (record := _measured_level(observation, level, restart, fallbacks)) is not None
    ]
    built_in = [record for record in measured if record.rank <= int(Level.REMOTE)]
    if len(built_in) == len(measured):
        return check_levels(measured)
    try:
        return check_levels(measured)
    except ConfigError as exc:
        names = ", ".join(record.name for record in measured if record.rank > int(Level.REMOTE))
        fallbacks.append(f"{names} not planned ({exc}): each takes the checkpoints the remote tier takes")
        return check_levels(built_in)


def survivable_failures(
    failures: Failures | None, observation: Observation, levels: Sequence[LevelCosts], fallbacks: list[str],
) -> Failures | None:
    """The failure model a re-plan over ``levels`` (``measured_levels``) plans. While a level above
    the remote tier that the observation holds is left out of ``levels`` (its first copy not
    measured yet, or refused by ``check_levels``) and no planned level is above the remote tier,
    that level takes the checkpoints the remote tier takes (``Plan.level_steps``: every upload goes
    on up). A class that destroys the remote tier then rolls back to the last remote commit, which
    that level holds too: it is planned as if it destroyed the local and peer levels only (its
    restore from the added level counted as one from the remote tier), with a fallback naming the
    class and the level, rather than refused by ``check_survivable``. Otherwise ``failures`` is
    returned as it is (and a class that nothing survives is refused)."""
    planned = {record.level for record in levels}
    waiting = [record.name for record in observation.levels if record.rank > int(Level.REMOTE) and record.level not in planned]
    if failures is None or not waiting or any(record.rank > int(Level.REMOTE) for record in levels):
        return failures
    spared = TIERS[: len(TIERS) - 1]
    lowered = [c.name for c in failures.classes if c.depth >= len(TIERS)]
    if not lowered:
        return failures
    names = ", ".join(waiting)
    for name in lowered:
        fallbacks.append(
            f"{names} not planned yet: class {name!r} (destroys {'+'.join(TIERS)}) planned as if the remote tier "
            f"survived it ({names} takes the checkpoints the remote tier takes)"
        )
    classes = tuple(c.model_copy(update={"destroys": spared}) if c.depth >= len(TIERS) else c for c in failures.classes)
    return failures.model_copy(update={"classes": classes})


def _measured_level(observation: Observation, level: Level | int, restart: float, fallbacks: list[str]) -> LevelCosts | None:
    """``measured_levels``' record of one level (None: not held, or no transfer measured yet)."""
    held = next((record for record in observation.levels if record.level == level), None)
    estimates = None if held is None else observation.profile.level(held.name)
    if held is None or held.last_step is None or estimates is None or not estimates.seconds.known:
        return None
    seconds = float(estimates.seconds.value)  # type: ignore[arg-type]
    restore = estimates.restore_seconds.value
    if restore is None:
        extra = seconds
        fallbacks.append(_UNMEASURED_RESTORE.get(level, _UNMEASURED_ADDED).format(seconds=seconds, name=held.name))
    else:
        extra = max(float(restore) - float(observation.profile.restore_seconds.value or 0.0), 0.0)
    return held.model_copy(update={
        "seconds": seconds, "interference": float(estimates.interference_seconds), "restart": restart + extra,
    })


def chain_levels(inputs: HoldsLevels) -> tuple[LevelCosts, ...]:
    """The levels above the local tier a chain model of ``inputs`` plans, by rank: its levels, and
    with the peer level alone (no remote tier, no level above it) an empty remote level above it
    (no class left to plan it for: ``three_level_model``)."""
    if inputs.has_peer_level and len(inputs.levels) == 1:
        return (*inputs.levels, LevelCosts(level=Level.REMOTE))
    return tuple(sorted(inputs.levels, key=lambda record: record.rank))


def plans_chain(inputs: HoldsLevels) -> bool:
    """True when the chain planner plans ``inputs``' levels: a peer level, or a level above the
    remote tier (local, remote and ``level4``; local and ``level4``; ...); two levels (local and
    remote) keep the two-level planner (``coci.planning.levels``)."""
    return inputs.has_peer_level or bool(inputs.higher_levels)


def three_level_model(
    inputs: PlanInputs, last_checkpoint_step: int, rate: Any, mean_rate: float | None, notes: list[str],
) -> LevelChainModel | None:
    """The chain model of a plan's inputs (local, then each level of ``inputs.levels`` by rank), or
    None without a peer level or a level above the remote tier (``plans_chain``), a failure model
    or a class that destroys the local tier (then a note, with a peer level). Any increasing subset
    of the levels above the local tier is one chain: chain ``k`` is planned against the classes that
    destroy every level below it and spare it, the top level's against every class that destroys
    the levels below it (``_classes``, by restore rank: without the peer level the remote chain
    takes the classes that destroy the peer copies too). With the peer level alone, the classes
    that destroy the peer copies are planned as if a peer's copy survived them (a note; an empty
    remote chain stands above it), as the two-level planner plans without a remote tier; a warning
    protects only the classes that spare the local tier (a checkpoint taken on a notice is local)."""
    failures = inputs.planned_failures()
    if failures is None or not plans_chain(inputs):
        return None
    assert inputs.failures is not None
    unwarned = inputs.failures.model_copy(update={"warned_fraction": 0.0, "warning_seconds": None})
    if unwarned.destroying("local") is None:
        if inputs.has_peer_level:
            notes.append("no failure class destroys the local tier: no peer level planned (every checkpoint copied)")
        return None
    uppers = chain_levels(inputs)
    if len(uppers) > len(inputs.levels) and unwarned.destroying("peer") is not None:
        notes.append("failure classes destroy the peer copies but no remote tier is given: planned as if a peer's copy restored them")
    ranks = (int(Level.LOCAL), *(record.rank for record in inputs.levels))
    restart, step, persist = inputs.restart_seconds, inputs.step_seconds, inputs.persist_seconds
    origin = inputs.failure_origin_step * step

    def build(group: Failures | None, cost: float, delay: float, restart: float, last: int) -> CostModel:
        span = inputs.total_steps * step - origin
        hazard = ExpectedFailures.none(origin) if group is None else expected_failures(group, span, origin)
        return build_cost_model(
            total_steps=inputs.total_steps, step_seconds=step, checkpoint_seconds=cost, persist_seconds=persist + delay,
            restart_seconds=restart, failures=hazard, progress_rate=rate, start_step=inputs.start_step,
            last_checkpoint_step=last, mean_rate=mean_rate if rate is not None else None,
        )

    chains = [build(failures.sparing("local"), inputs.checkpoint_seconds, 0.0, restart, last_checkpoint_step)]
    last = last_checkpoint_step
    for position, level in enumerate(uppers, start=1):
        last = last if level.last_step is None else min(level.last_step, last)
        group = _classes(unwarned, ranks, position) if position < len(ranks) else None
        chains.append(build(group, level.interference, level.transfer_seconds, level.restart_seconds(restart), last))
    names = ("local", *(record.name for record in uppers))
    return LevelChainModel(*chains, names=names)


def _classes(failures: Failures, ranks: tuple[int, ...], position: int) -> Failures | None:
    """The classes chain ``position`` of the levels of restore ranks ``ranks`` (local first) is
    planned against: those that destroy every level below it and spare it
    (``coci.FailureClass.depth`` at least the rank below it and below its own; the top level: at
    least the rank below it)."""
    return failures.of_depth(ranks[position - 1], None if position == len(ranks) - 1 else ranks[position])
