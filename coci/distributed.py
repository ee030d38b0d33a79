"""Data-parallel coci: the process groups the Session uses under ``torch.distributed``.

The Session builds a ``DistributedContext`` when ``torch.distributed`` is initialised (any
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
checkpoint format written under a process group is in ``coci.checkpoint.dcp``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch.distributed as dist

from coci import knobs
from coci.errors import ConfigError

__all__ = [
    "RUN_DIR_LAYOUTS",
    "DistributedContext",
    "RunDirLayout",
    "agree",
    "aggregate_profile",
    "broadcast_object",
    "from_coordinator",
    "gather_objects",
    "observe_policy",
    "with_run_dir_layout",
]

T = TypeVar("T")

#: ``Session(run_dir_layout=...)``: probe the run directory, or say whether the nodes share it.
RunDirLayout = Literal["auto", "shared", "node-local"]
RUN_DIR_LAYOUTS: tuple[str, ...] = ("auto", "shared", "node-local")
_PROBE_PREFIX = ".coci-layout-probe-"

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
    #: coci's two groups by name (``control``, ``persist``); emptied by ``release``.
    groups: dict[str, Any]
    timeout_seconds: float
    #: Node-local run directories: the ranks of each node (the ranks that share one directory),
    #: ascending; None when every rank sees the same run directory (the shared layout).
    nodes: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def detect(cls, timeout_seconds: float | None = None) -> DistributedContext | None:
        """A context when ``torch.distributed`` is initialised, else None (single process).

        Collective: every rank must call it, in the same order (it creates two groups).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return None
        seconds = knobs.DIST_TIMEOUT_SECONDS if timeout_seconds is None else float(timeout_seconds)
        timeout = timedelta(seconds=seconds)
        groups = {name: dist.new_group(backend="gloo", timeout=timeout) for name in ("control", "persist")}
        return cls(dist.get_rank(), dist.get_world_size(), groups, seconds)

    @property
    def control_group(self) -> Any:
        """The training thread's group: profile aggregation, plan broadcast, restore."""
        return self._group("control")

    @property
    def persist_group(self) -> Any:
        """The background writer's group."""
        return self._group("persist")

    def _group(self, name: str) -> Any:
        try:
            return self.groups[name]
        except KeyError:
            raise RuntimeError(f"coci's {name} process group was released (the session is closed)") from None

    def release(self) -> None:
        """Destroy coci's groups now (local, not collective; after this rank's last collective on them).

        A gloo group's worker threads end only when its last reference goes: a group left to the
        interpreter's exit is torn down while Python finalizes, where a gloo thread that needs the GIL
        aborts the process ("terminate called without an active exception"). Every copy of this
        context (``dataclasses.replace``) shares ``groups``, so they are all released.
        """
        while self.groups:
            _, group = self.groups.popitem()
            if dist.is_initialized():
                with contextlib.suppress(ValueError):  # the user destroyed it already
                    dist.destroy_process_group(group)

    @property
    def is_coordinator(self) -> bool:
        """Rank 0 plans, commits, applies retention and picks the checkpoint to restore."""
        return self.rank == 0

    @property
    def node_local(self) -> bool:
        """True when each node has its own run directory (``with_run_dir_layout``)."""
        return self.nodes is not None

    @property
    def node(self) -> int:
        """The index of this rank's node (0 in the shared layout: one directory, one 'node')."""
        return next((index for index, ranks in enumerate(self.nodes or ()) if self.rank in ranks), 0)

    @property
    def node_ranks(self) -> tuple[int, ...]:
        """The ranks that share this rank's run directory."""
        return self.nodes[self.node] if self.nodes is not None else tuple(range(self.world_size))

    @property
    def is_node_leader(self) -> bool:
        """The lowest rank of its directory: it creates, commits and retains checkpoints there."""
        return self.rank == self.node_ranks[0]


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
    return "; ".join(dict.fromkeys(p for p in problems if p)) or None  # each once: every rank often has the same


# --- run directory layout (Session) --------------------------------------------------------------


def with_run_dir_layout(context: DistributedContext, run_dir: Path, setting: str) -> DistributedContext:
    """``context`` with the nodes of its run directories (collective on the control group).

    ``"shared"``: one directory for every rank (NFS, Lustre; ``nodes`` None). ``"node-local"``:
    the ranks of one host (hostname and torchrun's ``GROUP_RANK``) share a directory.
    ``"auto"``: every rank writes a token file with a random name into ``run_dir`` and reports
    which of the others' tokens it sees; the ranks that see each other share a directory. A probe
    whose answers are not a partition (a cache that shows some files late) is a ConfigError
    asking for an explicit setting. One group is the shared layout.
    """
    if setting not in RUN_DIR_LAYOUTS:
        raise ConfigError(f"run_dir_layout must be one of {', '.join(RUN_DIR_LAYOUTS)}, got {setting!r}")
    if setting == "shared":
        return replace(context, nodes=None)
    if setting == "node-local":
        groups = _groups_by(gather_objects((socket.gethostname(), os.environ.get("GROUP_RANK")), context.control_group))
        _check_not_shared(context, run_dir, groups)
    else:
        groups = _probed_groups(context, run_dir)
    return replace(context, nodes=groups if len(groups) > 1 else None)


def _check_not_shared(context: DistributedContext, run_dir: Path, groups: tuple[tuple[int, ...], ...]) -> None:
    """ConfigError when ranks of different nodes see each other's token files: ``"node-local"``
    forced on a directory the nodes share (their commits would overwrite each other's parts). A
    file shown late by a cache is not seen: that never refuses a real node-local layout."""
    views = _token_views(context, run_dir)
    node_of = {rank: index for index, ranks in enumerate(groups) for rank in ranks}
    shared = sorted({(node_of[rank], node_of[other]) for rank, seen in enumerate(views) for other in seen if node_of[other] != node_of[rank]})
    if shared:
        first, second = shared[0]
        raise ConfigError(
            f"run_dir_layout='node-local', but nodes {first} (ranks {list(groups[first])}) and {second} (ranks "
            f"{list(groups[second])}) see the same run directory {run_dir}: it is shared. Pass run_dir_layout='shared' "
            "(or 'auto'), or give each node a directory on its own disk"
        )


def _groups_by(keys: list[Any]) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by equal keys, each group ascending, the groups by their lowest rank."""
    groups: dict[Any, list[int]] = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    return tuple(sorted(tuple(ranks) for ranks in groups.values()))


def _token_views(context: DistributedContext, run_dir: Path) -> list[tuple[int, ...]]:
    """For each rank, the ranks whose token file it sees in its run directory (collective)."""
    token = run_dir / f"{_PROBE_PREFIX}{context.rank}-{secrets.token_hex(8)}"
    token.touch()
    try:
        names = gather_objects(token.name, context.control_group)  # every token exists once this returns
        seen = tuple(rank for rank, name in enumerate(names) if (run_dir / name).exists())
        return gather_objects(seen, context.control_group)  # nobody removes a token before all looked
    finally:
        token.unlink(missing_ok=True)


def _probed_groups(context: DistributedContext, run_dir: Path) -> tuple[tuple[int, ...], ...]:
    """Which ranks see each other's token files in their run directory (collective)."""
    views = _token_views(context, run_dir)
    groups = _groups_by(views)
    if any(views[rank] != ranks for ranks in groups for rank in ranks):
        raise ConfigError(
            f"the run directory probe is inconsistent (rank r sees the tokens of ranks {views}): "
            "pass Session(run_dir_layout='shared') or 'node-local'"
        )
    return groups
