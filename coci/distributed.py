"""Data-parallel coci: the process groups the Session uses under ``torch.distributed``.

The Session builds a :class:`DistributedContext` when ``torch.distributed`` is initialised (any
world size, so that a job keeps one checkpoint format when it shrinks to one process and grows
back). coci creates two gloo groups of its own with a timeout (``knobs.DIST_TIMEOUT_SECONDS``):
``control`` for the training thread (profile aggregation, plan broadcast, restore) and ``persist``
for the background writer. Never the training group: a background save sharing it with a barrier
in the training loop deadlocks, and two threads sharing one group would interleave their
collectives.

Profile and plan are agreed at observe time only, never per step: every rank's profile is
gathered and the slowest rank's estimates are kept, with rank 0's loss trace. A policy with
``state_dict``/``load_state_dict`` observes on rank 0 and its state, plan included, is broadcast;
a stateless policy decides the same on every rank from the same aggregated observation. The
checkpoint format written under a process group is in :mod:`coci.checkpoint.dcp`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from coci import knobs

__all__ = [
    "DistributedContext",
    "agree",
    "aggregate_profile",
    "broadcast_object",
    "from_coordinator",
    "gather_objects",
    "observe_policy",
]

T = TypeVar("T")

#: Estimates of the aggregated profile taken from the slowest rank (largest value).
_SLOWEST_ESTIMATES = (
    "step_seconds",
    "overlapped_step_seconds",
    "stall_step_seconds",
    "stall_seconds",
    "persist_seconds",
    "interference",
    "restore_seconds",
)


# --- context and collectives -------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the job and coci's own gloo groups (never the training group)."""

    rank: int
    world_size: int
    control_group: Any
    persist_group: Any
    timeout_seconds: float

    @classmethod
    def detect(cls, timeout_seconds: float | None = None) -> DistributedContext | None:
        """A context when ``torch.distributed`` is initialised, else None (single process).

        Collective: every rank must call it, in the same order (it creates two groups).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return None
        seconds = knobs.DIST_TIMEOUT_SECONDS if timeout_seconds is None else float(timeout_seconds)
        timeout = timedelta(seconds=seconds)
        control = dist.new_group(backend="gloo", timeout=timeout)
        persist = dist.new_group(backend="gloo", timeout=timeout)
        return cls(dist.get_rank(), dist.get_world_size(), control, persist, seconds)

    @property
    def is_coordinator(self) -> bool:
        """Rank 0 plans, commits, applies retention and picks the checkpoint to restore."""
        return self.rank == 0


def gather_objects(value: Any, group: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (collective on ``group``)."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def broadcast_object(value: Any, group: Any) -> Any:
    """The first rank of ``group``'s ``value``, on every rank (collective)."""
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


# --- profile and plan (observe time) ----------------------------------------------------------


def aggregate_profile(profile: Any, context: DistributedContext) -> Any:
    """The job's profile: the slowest rank's cost estimates, rank 0's trace and counters (collective)."""
    dumps = gather_objects(profile.model_dump(mode="json"), context.control_group)
    merged = dict(dumps[0])
    for name in _SLOWEST_ESTIMATES:
        candidates = [d[name] for d in dumps if isinstance(d.get(name), dict) and d[name].get("value") is not None]
        if candidates:
            merged[name] = max(candidates, key=lambda estimate: estimate["value"])
    return type(profile).model_validate(merged)


def observe_policy(policy: Any, observation: Any, context: DistributedContext) -> None:
    """Let the policy (re-)plan on the aggregated profile so every rank decides the same steps.

    Collective. Stateful policies plan on rank 0 and their state is broadcast; stateless ones
    observe everywhere (the same input gives the same decisions).
    """
    observation = replace(observation, profile=aggregate_profile(observation.profile, context))
    save = getattr(policy, "state_dict", None)
    load = getattr(policy, "load_state_dict", None)
    if not (callable(save) and callable(load)):
        policy.observe(observation)
        return
    state = None
    if context.is_coordinator:
        policy.observe(observation)
        state = save()
    state = broadcast_object(state, context.control_group)
    if not context.is_coordinator:
        load(state)


# --- agreement (restore) -----------------------------------------------------------------------


def from_coordinator(compute: Callable[[], T], context: DistributedContext | None) -> T:
    """``compute()`` run on rank 0 only and its result sent to every rank (collective on the
    control group); simply ``compute()`` without a context. ``compute`` must not raise."""
    if context is None:
        return compute()
    value = compute() if context.is_coordinator else None
    return broadcast_object(value, context.control_group)


def agree(problem: str | None, context: DistributedContext | None) -> str | None:
    """Every rank's problem joined, None when no rank has one (collective on the control group),
    so that the ranks take or skip a checkpoint together."""
    if context is None:
        return problem
    problems = gather_objects(problem, context.control_group)
    return "; ".join(p for p in problems if p) or None
