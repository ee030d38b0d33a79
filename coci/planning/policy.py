"""The checkpoint-policy interface: what the session asks at each step, and the simple policies.

A [``CheckpointPolicy``][coci.CheckpointPolicy] answers one question per step: checkpoint now? The session asks
``should_checkpoint(step)`` after every ``session.step`` (it must be O(1): a set lookup or a
comparison) and calls ``observe(observation)`` rarely: once after warm-up, after each committed
checkpoint, and at most every ``knobs.OBSERVE_EVERY_STEPS`` steps. Planning policies re-plan inside
``observe``; the simple ones below ignore it.

Step numbers count completed training steps: ``should_checkpoint(n)`` is asked right after the
n-th ``session.step`` and a checkpoint taken then resumes at step ``n + 1``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from coci import checks, knobs
from coci.errors import ConfigError
from coci.planning.levels import LevelCosts, level_named

if TYPE_CHECKING:
    from coci.profiler import Profile


@dataclass(frozen=True)
class Observation:
    """What a policy may use to (re-)plan: the live profile and the loss trace so far.
    ``levels`` holds a [``LevelCosts``][coci.LevelCosts] per storage level the session keeps above
    the local one: its ``last_step`` the newest checkpoint sent to it (committed or in flight;
    None: none yet) and its ``taken_steps`` every step sent to it so far (None: not known); its
    costs are measured in ``profile.levels`` (``sent_levels`` builds them from a session's
    levels, as the simulator's online replay does)."""

    step: int
    profile: Profile
    loss_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    losses: np.ndarray = field(default_factory=lambda: np.empty(0))
    checkpoint_steps: tuple[int, ...] = ()
    levels: tuple[LevelCosts, ...] = ()


def committed_levels(newest: Iterable[tuple[str, int | None]]) -> tuple[LevelCosts, ...]:
    """An ``Observation``'s ``levels`` from each storage level's name (``"local"``, ``"peer"``,
    ``"remote"``, an added level's ``"level4"``: ``coci.checkpoint.storage_level.StorageLevel.name``)
    and newest committed step, without a copy history (``sent_levels`` with nothing sent)."""
    return sent_levels(((name, step, ()) for name, step in newest), whole_run=False)


def sent_levels(levels: Iterable[tuple[str, int | None, Collection[int]]], *, whole_run: bool) -> tuple[LevelCosts, ...]:
    """An ``Observation``'s ``levels`` from each storage level's name, newest step held
    (``StorageLevel.newest_step``) and the steps sent to it, ascending (``StorageLevel.sent_steps``):
    ``last_step`` the newer of the newest sent (committed or in flight, as ``last_checkpoint_step``
    counts a persist in flight) and the newest held; ``taken_steps`` the steps sent, when
    ``whole_run`` (they cover the run from step 0), else None (not known: a re-plan measures the
    budget on the remaining steps). The same values as the simulator's online replay observes
    (``coci.analysis.online_replay``), so a session and the replay re-plan alike."""
    costs = []
    for name, held, sent in levels:
        if name == "local":
            continue
        steps = tuple(sorted(step for step in sent if step >= 1))  # ascending (linear when already); step 0 loses nothing
        newest = max((step for step in (held, steps[-1] if steps else None) if step is not None), default=None)
        costs.append(LevelCosts(level=level_named(name), last_step=newest, taken_steps=steps if whole_run else None))
    return tuple(costs)


@runtime_checkable
class CheckpointPolicy(Protocol):
    """Decides at which steps the session checkpoints.

    Optional extras the session uses when present, each a protocol of
    [``coci.planning.arguments``][coci.planning.arguments]: a ``plan`` attribute ([``PlansAhead``][coci.planning.arguments.PlansAhead]:
    the current [``coci.Plan``][coci.Plan], written to ``plan.json`` and shown as ``session.plan``),
    ``state_dict()`` / ``load_state_dict()`` ([``SavesPolicyState``][coci.planning.arguments.SavesPolicyState]:
    saved in every checkpoint, so adaptive state such as CheckFreq's grown interval survives a
    restart), ``use_prior`` ([``TakesPrior``][coci.planning.arguments.TakesPrior]) and ``warming_up``
    ([``WarmsUp``][coci.planning.arguments.WarmsUp]).
    """

    def should_checkpoint(self, step: int) -> bool: ...

    def observe(self, observation: Observation) -> None: ...


@dataclass(frozen=True)
class EveryN:
    """Checkpoint every ``k`` steps (Lightning's ``every_n_train_steps``)."""

    k: int

    def __post_init__(self) -> None:
        if not checks.is_int(self.k) or self.k < 1:
            raise ConfigError(f"EveryN.k must be a positive integer, got {self.k!r}")

    def should_checkpoint(self, step: int) -> bool:
        return step > 0 and step % self.k == 0

    def observe(self, observation: Observation) -> None:
        return None


@dataclass(frozen=True)
class AtSteps:
    """Checkpoint at an explicit collection of steps (what a precomputed [``coci.Plan``][coci.Plan] gives)."""

    steps: frozenset[int]

    @classmethod
    def of(cls, steps: Iterable[Any]) -> AtSteps:
        """The steps of ``steps``: positive integers up to ``knobs.MAX_STEPS``, at most
        ``knobs.PLAN_MAX_CHECKPOINTS`` of them (``range(1, 10**18)`` is refused, not expanded)."""
        limit = knobs.PLAN_MAX_CHECKPOINTS
        if isinstance(steps, Sized) and len(steps) > limit:
            raise ConfigError(f"policy holds {len(steps)} steps, more than the {limit} a run may checkpoint at (knobs.PLAN_MAX_CHECKPOINTS)")
        checked: set[int] = set()
        for value in steps:
            if not checks.is_int(value) or not 1 <= value <= knobs.MAX_STEPS:
                raise ConfigError(f"policy steps must be positive integers up to {knobs.MAX_STEPS}, got {value!r}")
            checked.add(int(value))
            if len(checked) > limit:
                raise ConfigError(f"policy holds more than the {limit} steps a run may checkpoint at (knobs.PLAN_MAX_CHECKPOINTS)")
        return cls(frozenset(checked))

    def should_checkpoint(self, step: int) -> bool:
        return step in self.steps

    def observe(self, observation: Observation) -> None:
        return None
