"""Two-level plans: which steps checkpoint locally and which of those are promoted to the remote tier.

A pure extension of ``coci.planning.formulas.auto_steps`` to the objective of
``coci.planning.objective.TwoLevelCostModel`` (local chain against the failures that spare the
local tier, promoted chain against those that destroy it). For a mixture weight ``alpha``:

1. the promoted steps ``y``: the single-level placement (``place``, its
   exact refinement included) on the remote model, each promotion charged its upload interference
   plus the local checkpoint it needs, and on the model of every checkpoint promoted (both hazards,
   the same charge); ``m - 1``, ``m`` and ``m + 1`` promotions, and at ``alpha = 0`` the two integer
   Young intervals;
2. the local steps around them (``local_around``): in each gap between promotions, the number
   of local segments that minimises ``s + N^2 / s`` (``N`` the first-order density
   ``sqrt(h_p w_alpha / 2C)`` integrated over the gap), placed at its quantiles, then refined
   exactly with the promotions held in place;
3. every ``(x, y)`` candidate, and each ``y`` promoted at every checkpoint (``x = y``, the best
   single-level plan), is scored by the exact two-level objective; the least wins.

Levels
------
A planned checkpoint's level is a [``Level``][coci.Level]: ``LOCAL`` (node-local only), ``PEER`` (also
copied to another node's memory or disk, ``coci.planning.three_levels``) or ``REMOTE`` (also
uploaded). The levels nest: a ``REMOTE`` checkpoint is a ``PEER`` one is a ``LOCAL`` one. A plan
records them as ``Plan.steps`` (every level), ``Plan.peer_steps`` (``PEER`` and ``REMOTE``) and
``Plan.promote_steps`` (``REMOTE``); ``level_of`` reads one step's level from those lists.

``auto`` (``auto_two_level``) then does what the single-level ``auto`` does: the time optimum
sets the reference, and the largest progress weight whose plan keeps the expected wall-clock
overhead within ``1 + time_budget`` of it is bisected. Promotions are at least
``ceil(upload / step)`` steps apart (one upload in flight).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from coci import checks, knobs
from coci.errors import ConfigError
from coci.planning.formulas import (
    checkpoint_density,
    max_checkpoints,
    max_interval_steps,
    periodic_candidates,
    place,
    refine,
    snap_to_steps,
)
from coci.planning.objective import CostModel, Overhead, TwoLevelCostModel, mu_from_alpha
from coci.units import parse_duration

__all__ = [
    "HoldsLevels", "Level", "LevelCosts", "TwoLevelResult", "WholeRun", "against_all", "auto_two_level", "charged", "level_named", "level_of", "levels_of", "local_around", "min_promote_steps", "two_level_candidates",
]

TwoLevelPlan = tuple[np.ndarray, np.ndarray]
Plan = TypeVar("Plan", bound=tuple[np.ndarray, ...])


class Level(enum.IntEnum):
    """Where a planned checkpoint lives; each level includes the ones below it (module docstring)."""

    LOCAL = 1
    PEER = 2
    REMOTE = 3


class LevelCosts(BaseModel):
    """One storage level above the local tier, as a value: what the planner, the simulator and the
    report read of it. ``level`` is a ``Level`` or, for a level above the remote tier (a second,
    slower and more durable store), its restore rank (an integer above 3: planned by
    ``coci.plan`` and ``coci.simulate``, not yet run by a session). ``seconds`` is what one transfer takes, from the local commit to this level's
    commit (None in an [``Observation``][coci.Observation]: not measured yet);
    ``interference`` the training seconds one transfer costs; ``restart`` the restart when a
    failure restores from this level (None: the local restart, plus one transfer's time for the
    peer level: fetching the same bytes back); ``last_step`` the newest step committed on it, or
    whose transfer to it is in flight, as ``last_checkpoint_step`` counts a persist in flight (for
    a re-plan; None: the last local checkpoint); ``taken_steps`` every step sent to it so far, its
    copy history (for a re-plan: with it on every level, ``auto`` holds the whole run to the time
    budget, as ``coci.plan``'s ``taken_steps`` does for one level; None: not known, the budget is
    measured on the remaining steps). The local tier's own costs are the plan's ``stall_seconds``,
    ``persist_seconds``, ``interference_seconds`` and ``restart_seconds``."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    level: Level | Annotated[int, Field(gt=int(Level.REMOTE))]
    seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    interference: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    restart: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    last_step: int | None = Field(default=None, ge=0)
    taken_steps: tuple[Annotated[int, Field(ge=1)], ...] | None = Field(default=None, exclude_if=lambda steps: steps is None)

    @property
    def name(self) -> str:
        """The level's name: ``peer``, ``remote``, or ``level<k>`` for a level above the remote tier."""
        return self.level.name.lower() if isinstance(self.level, Level) else f"level{self.level}"

    @property
    def rank(self) -> int:
        """Restore rank: of two levels holding the same newest step, a restore reads the lower rank
        (the cheaper fetch) first; the levels nest in this order (``Level``)."""
        return int(self.level)

    @property
    def transfer_seconds(self) -> float:
        """``seconds``, 0 where not measured."""
        return float(self.seconds or 0.0)

    def restart_seconds(self, local_restart: float) -> float:
        """The restart from this level: ``restart``, or its default from the local one (class docstring)."""
        if self.restart is not None:
            return self.restart
        return local_restart + (self.seconds or 0.0) if self.level == Level.PEER else local_restart


def level_named(name: str) -> Level | int:
    """The ``LevelCosts.level`` of the level named ``name`` (``LevelCosts.name``'s inverse:
    ``"peer"``, ``"remote"``, or ``"level<k>"`` for a level above the remote tier); a ``ConfigError``
    naming it otherwise."""
    if name.upper() in Level.__members__:
        return Level[name.upper()]
    rank = name.removeprefix("level")
    if name.startswith("level") and rank.isdigit() and int(rank) > int(Level.REMOTE):
        return int(rank)
    raise ConfigError(f"a storage level is named peer, remote or level<k> (k > {int(Level.REMOTE)}), got {name!r}")


class HoldsLevels:
    """What a record with a ``levels`` tuple of ``LevelCosts`` (``PlanInputs``, the simulator's
    ``Job``) answers about them."""

    levels: tuple[LevelCosts, ...]

    def level(self, level: Level) -> LevelCosts | None:
        """The costs of ``level`` (None: no such level)."""
        return next((record for record in self.levels if record.level == level), None)

    @property
    def has_remote_tier(self) -> bool:
        """True when a remote tier's costs are given (``Level.REMOTE``)."""
        return self.level(Level.REMOTE) is not None

    @property
    def has_peer_level(self) -> bool:
        """True when the peer level's costs are given (``Level.PEER``)."""
        return self.level(Level.PEER) is not None

    @property
    def higher_levels(self) -> tuple[LevelCosts, ...]:
        """The levels above the remote tier (restore rank above ``Level.REMOTE``), by rank."""
        return tuple(sorted((record for record in self.levels if record.rank > int(Level.REMOTE)), key=lambda record: record.rank))


#: The compatibility keywords of [``coci.plan``][coci.plan] (and the CLI's flags), per level: its
#: ``seconds``, ``interference``, ``restart`` and ``last_step``. A plan's levels are a tuple of
#: ``LevelCosts``; these flat names are kept for callers written before.
LEGACY_KEYWORDS: dict[Level, tuple[str, str, str, str]] = {
    Level.REMOTE: ("upload_seconds", "upload_interference_seconds", "remote_restart_seconds", "last_promoted_step"),
    Level.PEER: ("peer_seconds", "peer_interference_seconds", "peer_restart_seconds", "last_peer_step"),
}


def check_levels(levels: Any) -> tuple[LevelCosts, ...]:
    """``levels`` as a tuple of ``LevelCosts`` sorted by level; a ``ConfigError`` naming ``levels``
    unless each is a level above the local one with its ``seconds``, each at most once.

    A level above the remote tier (an integer rank) takes the next rank above the remote tier's
    and a transfer at least as long as the one below it (``_check_above_remote``)."""
    records = tuple(levels)
    for index, record in enumerate(records):
        if not isinstance(record, LevelCosts):
            raise ConfigError(f"levels[{index}] must be a LevelCosts, got {type(record).__name__}")
        if record.level == Level.LOCAL:
            raise ConfigError(f"levels[{index}]: the local tier's costs are stall_seconds, persist_seconds, ... not a level")
        if record.seconds is None:
            raise ConfigError(f"levels[{index}].seconds is required (one transfer's seconds)")
    names = [record.level for record in records]
    if len(set(names)) != len(names):
        raise ConfigError(f"levels: each level at most once, got {[record.name for record in records]}")
    ordered = tuple(sorted(records, key=lambda record: record.rank))
    _check_above_remote(ordered, records)
    return ordered


def _check_above_remote(ordered: tuple[LevelCosts, ...], given: tuple[LevelCosts, ...]) -> None:
    """The levels above the remote tier take the ranks from ``Level.REMOTE + 1`` on, one each, over
    any increasing subset of the peer and remote levels (none, either or both); each level's
    transfer takes at least as long as the transfer of the level below it in the chain (enforced
    here for the levels above the remote tier; the chain objective of
    ``coci.planning.three_levels`` is exact to first order only while the delays grow with the
    rank). A ``ConfigError`` names the field otherwise."""
    for position, record in enumerate(ordered):
        if record.rank <= int(Level.REMOTE):
            continue
        index = given.index(record)
        below = ordered[position - 1] if position else None
        rank = below.rank + 1 if below is not None and below.rank > int(Level.REMOTE) else int(Level.REMOTE) + 1
        if record.rank != rank:
            under = below.name if below is not None and below.rank >= int(Level.REMOTE) else "the remote tier"
            raise ConfigError(f"levels[{index}].level: the level above {under} is rank {rank}, got {record.rank}")
        if below is not None and record.transfer_seconds < below.transfer_seconds:
            raise ConfigError(
                f"levels[{index}].seconds: a transfer to {record.name} takes at least as long as one to {below.name} "
                f"({below.transfer_seconds:g} s), got {record.transfer_seconds:g}"
            )


def levels_from_keywords(given: dict[Level, tuple[Any, Any, Any, Any]]) -> tuple[LevelCosts, ...]:
    """The compatibility path: each level's ``(seconds, interference, restart, last_step)`` as
    given to the flat keywords (``LEGACY_KEYWORDS``), validated with errors naming those keywords;
    a level whose seconds are None is absent (the remote tier's ``last_promoted_step`` alone is
    ignored, the peer level's ``last_peer_step`` is refused)."""
    levels: list[LevelCosts] = []
    for level, (seconds, interference, restart, last_step) in given.items():
        names = LEGACY_KEYWORDS[level]
        if seconds is None:
            others = {names[1]: interference, names[2]: restart, **({names[3]: last_step} if level == Level.PEER else {})}
            if any(value is not None for value in others.values()):
                *first, last = others
                raise ConfigError(f"{names[0]} is required with {', '.join(first)} or {last}")
            continue
        levels.append(LevelCosts(
            level=level,
            seconds=parse_duration(seconds, field=names[0], positive=True),
            interference=0.0 if interference is None else parse_duration(interference, field=names[1], positive=False),
            restart=None if restart is None else parse_duration(restart, field=names[2], positive=False),
            last_step=checks.optional_integer(last_step, names[3], minimum=0),
        ))
    return check_levels(levels)


def level_of(
    step: int, steps: Sequence[int], peer_steps: Sequence[int] | None, promote_steps: Sequence[int] | None,
) -> Level | None:
    """The level of ``step`` in a plan's lists (None: not a planned checkpoint). ``peer_steps``
    None (a plan without a peer level) copies every checkpoint to a peer where the job has peers;
    ``promote_steps`` None promotes every checkpoint where it has a remote tier."""
    if step not in steps:
        return None
    return levels_of([step], peer_steps, promote_steps)[0]


def levels_of(steps: Sequence[int], peer_steps: Sequence[int] | None, promote_steps: Sequence[int] | None) -> list[Level]:
    """``level_of`` of every planned step at once."""
    planned = np.asarray(steps, dtype=np.int64)
    uploaded = np.ones(planned.size, bool) if promote_steps is None else np.isin(planned, np.asarray(promote_steps, dtype=np.int64))
    copied = np.ones(planned.size, bool) if peer_steps is None else np.isin(planned, np.asarray(peer_steps, dtype=np.int64))
    codes = np.where(uploaded, Level.REMOTE, np.where(copied, Level.PEER, Level.LOCAL))
    return [Level(int(code)) for code in codes]


class MixtureChoice:
    """What a multi-level ``auto`` chose at mixture weight ``alpha`` (``auto_mixture``)."""

    alpha: float

    @property
    def mu(self) -> float | None:
        """The progress weight ``mu`` of ``alpha`` (``coci.planning.objective.mu_from_alpha``)."""
        return mu_from_alpha(self.alpha)


@dataclass(frozen=True)
class TwoLevelResult(MixtureChoice):
    """What ``auto_two_level`` chose: local steps, promoted steps, the mixture and the budget."""

    steps: np.ndarray
    promote: np.ndarray
    alpha: float
    time_optimal_wall_seconds: float
    budget_wall_seconds: float | None


def min_promote_steps(step_seconds: float, upload_seconds: float, min_steps: int) -> int:
    """Fewest steps between promotions: one upload in flight, and never below ``min_steps``."""
    return max(min_steps, math.ceil(upload_seconds / step_seconds - 1e-9))


def local_around(
    model: CostModel, promote: np.ndarray, alpha: float, min_steps: int, max_steps: int | None = None,
    refined: bool = True,
) -> np.ndarray:
    """The local steps of a two-level plan with the promotions ``promote`` among them (see the
    module docstring, step 2); ``model`` is the local chain's cost model; ``refined=False`` skips
    the exact refinement."""
    density = checkpoint_density(model, alpha, min_steps, max_steps)
    t = model.step_seconds
    lead = float(density[0]) * max(0.0, model.start_seconds - model.last_checkpoint_step * t)
    cumulative = np.concatenate([[0.0], np.cumsum(density * np.diff(model.edges))]) + lead
    end = max(model.horizon_seconds - model.persist_seconds, model.start_seconds)
    bounds = np.concatenate([[0.0], np.interp(promote * t, model.edges, cumulative), [np.interp(end, model.edges, cumulative)]])
    gaps = np.maximum(np.diff(bounds), 0.0)
    segments = _best_segments(gaps)
    interior = segments - 1
    if not interior.sum() <= max_checkpoints():
        interior = np.zeros_like(interior)
    owner = np.repeat(np.arange(gaps.size), interior)
    rank = np.arange(owner.size) - np.repeat(np.cumsum(interior) - interior, interior) + 1
    targets = bounds[owner] + gaps[owner] * rank / segments[owner]
    extra = snap_to_steps(np.interp(targets, cumulative, model.edges), model, min_steps)
    steps = _merge(extra, promote, min_steps)
    if refined and 0 < steps.size <= knobs.PLAN_REFINE_MAX_CHECKPOINTS:
        steps = refine(model, steps, alpha, min_steps, max_steps, fixed=np.isin(steps, promote))
    return steps


def _best_segments(density_mass: np.ndarray) -> np.ndarray:
    """Per gap, the segment count ``s >= 1`` minimising ``s + N^2 / s`` (floor or ceil of ``N``)."""
    low = np.maximum(np.floor(density_mass), 1.0)
    high = low + 1.0
    squared = density_mass * density_mass
    pick_high = high + squared / high < low + squared / low
    return np.where(pick_high, high, low).astype(np.int64)


def _merge(extra: np.ndarray, promote: np.ndarray, min_steps: int) -> np.ndarray:
    """``promote`` plus the ``extra`` steps at least ``min_steps`` from every promotion, sorted."""
    if promote.size and extra.size:
        nearest = np.searchsorted(promote, extra)
        before = np.abs(extra - promote[np.clip(nearest - 1, 0, promote.size - 1)])
        after = np.abs(promote[np.clip(nearest, 0, promote.size - 1)] - extra)
        extra = extra[np.minimum(before, after) >= min_steps]
    return np.union1d(extra, promote).astype(np.int64)


def two_level_candidates(
    model: TwoLevelCostModel, alpha: float, min_steps: int, min_promote: int, max_steps: int | None = None,
    refined: bool = True,
) -> list[TwoLevelPlan]:
    """``(steps, promote)`` candidates for one mixture weight (module docstring, steps 1-3);
    ``refined=False`` skips the exact refinements (enough to tell on which side of the budget a
    weight falls)."""
    promotions: list[np.ndarray] = []
    # the promoted chain alone, each promotion charged its upload and the local checkpoint it needs;
    # and every checkpoint promoted, against every failure
    for chain in (charged(model.remote, model.local.checkpoint_seconds), against_all(model.remote, model.local)):
        max_promote = max_interval_steps(chain, min_promote)
        promotions += place(chain, alpha, min_promote, (-1, 0, 1), max_promote, refined)
        if alpha == 0.0:
            promotions += periodic_candidates(chain, min_promote)
    candidates: list[TwoLevelPlan] = []
    for promote in promotions:
        candidates.append((local_around(model.local, promote, alpha, min_steps, max_steps, refined), promote))
        candidates.append((promote, promote))
    return candidates


def charged(chain: CostModel, extra: float) -> CostModel:
    """``chain`` with each of its checkpoints charged ``extra`` more (the lower levels it needs)."""
    return dataclasses.replace(chain, checkpoint_seconds=chain.checkpoint_seconds + extra)


def against_all(top: CostModel, *below: CostModel) -> CostModel:
    """Every checkpoint at level ``top``: one chain against the failures of every level (the
    hazards added; the cell grids are the same and the tabulated integrals linear in the hazard),
    at the costs of every level and ``top``'s commit delay."""
    return dataclasses.replace(
        charged(top, sum(chain.checkpoint_seconds for chain in below)),
        hazard=sum((chain.hazard for chain in below), top.hazard),
        cum_failures=sum((chain.cum_failures for chain in below), top.cum_failures),
        cum_time_integral=sum((chain.cum_time_integral for chain in below), top.cum_time_integral),
        cum_progress_integral=sum((chain.cum_progress_integral for chain in below), top.cum_progress_integral),
    )


@dataclass(frozen=True)
class WholeRun:
    """A re-plan's whole run (``auto_mixture``): ``expected(*plan)`` the whole run's expected
    overhead with the checkpoints already taken at each level followed by ``plan``, ``time_wall``
    the whole run's time optimum (expected wall seconds) and ``budget`` its wall budget."""

    expected: Callable[..., Overhead]
    time_wall: float
    budget: float


def auto_mixture(
    candidates: Callable[[float, bool], list[Plan]],
    objective_of: Callable[..., float],
    expected_of: Callable[..., Overhead],
    has_progress: bool,
    *,
    objective: str,
    time_budget: float | None,
    alpha: float | None,
    whole_run: WholeRun | None = None,
) -> tuple[Plan, float, float, float | None]:
    """``auto`` over multi-level plans (module docstring): the chosen plan, its mixture weight, the
    time optimum's expected wall seconds and the wall budget (None unless bisected).

    ``candidates(weight, refined)`` lists the plans for one weight; ``objective_of(*plan, weight)``
    and ``expected_of(*plan)`` score one (a cost model's ``objective`` and ``expected``). A re-plan
    given its ``whole_run`` holds the whole run, the checkpoints already taken included, to the
    whole run's budget instead of granting the remaining steps a fresh one (the remaining steps'
    time-optimal plan is always admitted: nothing better is possible once the past spent it)."""

    def best(plans: list[Plan], weight: float) -> Plan:
        return min(plans, key=lambda plan: objective_of(*plan, weight))

    time_plan = best(candidates(0.0, True), 0.0)
    time_wall = objective_of(*time_plan, 0.0)
    if objective == "time" or not has_progress or (alpha is not None and alpha <= 0.0):
        return time_plan, 0.0, time_wall, None
    if alpha is not None:
        return best([time_plan, *candidates(alpha, True)], alpha), float(alpha), time_wall, None
    if time_budget is None:
        return best(candidates(1.0, True), 1.0), 1.0, time_wall, None
    if whole_run is None:
        budget = (1.0 + time_budget) * time_wall
        feasible: list[tuple[float, float, Plan]] = [(objective_of(*time_plan, 1.0), 0.0, time_plan)]
    else:
        expected_of, time_wall, budget = whole_run.expected, whole_run.time_wall, whole_run.budget
        first = expected_of(*time_plan)
        feasible = [(first.progress_seconds, 0.0, time_plan)]
        if first.wall_seconds > budget:
            return time_plan, 0.0, time_wall, budget

    def consider(weight: float, refined: bool = True) -> bool:
        found = False
        for plan in candidates(weight, refined):
            overhead = expected_of(*plan)
            if overhead.wall_seconds <= budget:
                feasible.append((overhead.progress_seconds, weight, plan))
                found = True
        return found

    if not consider(1.0):
        low, high = 0.0, 1.0
        for _ in range(knobs.PLAN_BISECTION_STEPS):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if consider(mid, refined=False) else (low, mid)
        consider(low)
    _, weight, plan = min(feasible, key=lambda item: (item[0], -item[1]))
    return plan, weight, time_wall, budget


def auto_two_level(
    model: TwoLevelCostModel,
    *,
    objective: str = "progress",
    time_budget: float | None = 0.05,
    min_steps: int = 1,
    min_promote: int = 1,
    alpha: float | None = None,
    whole_run: WholeRun | None = None,
) -> TwoLevelResult:
    """``auto`` for two levels: as ``coci.planning.formulas.auto_steps``, over ``(steps,
    promote)`` plans scored by the two-level objective (module docstring); ``whole_run``: a
    re-plan's whole run (``auto_mixture``)."""
    max_steps = max_interval_steps(model.local, min_steps)

    def candidates(weight: float, refined: bool) -> list[TwoLevelPlan]:
        return two_level_candidates(model, weight, min_steps, min_promote, max_steps, refined)

    plan, weight, time_wall, budget = auto_mixture(
        candidates, model.objective, model.expected, model.local.has_progress,
        objective=objective, time_budget=time_budget, alpha=alpha, whole_run=whole_run)
    return TwoLevelResult(*plan, weight, time_wall, budget)
