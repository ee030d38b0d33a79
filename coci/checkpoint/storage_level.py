"""``StorageLevel``: the one shape of every storage level a session drives (local, peer, remote).

The local writer ([``Checkpointer``][coci.checkpoint.checkpointer.Checkpointer]), the peer copies
([``PeerCopying``][coci.checkpoint.peers.PeerCopying]) and the remote tier
([``Promotion``][coci.checkpoint.remote.promotion.Promotion]) each implement it; a
[``coci.Session``][coci.Session] holds them as a tuple, local first, and calls each the same way.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["LevelPlan", "StorageLevel", "plan_copies"]


class LevelPlan(Protocol):
    """What a level reads of a plan (``coci.Plan``): which committed steps go up to each level."""

    @property
    def promote_steps(self) -> Collection[int] | None: ...

    @property
    def peer_steps(self) -> Collection[int] | None: ...


@runtime_checkable
class StorageLevel(Protocol):
    """One storage level of a session's checkpoints.

    A session calls its levels in this order (each call on every level, local first):

    1. Opening: each level is built when the session starts, by its own factory
       (``Checkpointer(...)``, ``PeerCopying.start``, ``Promotion.open``; collective under
       ``torch.distributed``). A level that is not configured is absent from the tuple.
    2. ``restored(step, path, source)``: ``restore()`` loaded ``step`` (at ``path``) from the level
       named ``source``; the step then counts for this level's retention as one of the run's own,
       and a level may take it up (the remote tier promotes a step the previous run's ``close()``
       left unpromoted).
    3. ``promote(step, path, plan)``: after each local commit of ``step`` at ``path``, in commit
       order; the level takes its copy when ``plan`` says so (None: no plan yet, every commit), in
       the background: training never waits for it.
    4. ``promote_always(step, plan)``: ``step`` must reach the level whatever the plan says (a
       preemption's checkpoint, the final one); taken now when it already committed, else at its
       ``promote``.
    5. ``newest_step``: read when the policy observes: the newest step this level holds durably
       (the planner's position on each level).
    6. ``close(step, failing)``: at ``Session.close()``, in the tuple's order, after the local
       level's last commit has been promoted: finish what is in flight within the level's own
       limit, then stop. ``failing``: the session closes on the way out of an exception, so the
       level must not wait for other ranks. Returns a background failure the session raises (the
       local level's stuck persist), or None.

    Fetching is not one call: ``restore()`` (``coci.checkpoint.restore.Restorer``) searches the
    levels newest step first, and what each level gives is of a different shape (the local level
    a directory, the peer level one node's part, the remote tier a whole step or a node's part),
    so the restorer reads each level by its own method.
    """

    @property
    def name(self) -> str:
        """``"local"``, ``"peer"`` or ``"remote"``: the ``tier`` of a ``restore`` event."""
        ...

    def restored(self, step: int, path: Path, source: str) -> None: ...

    def promote(self, step: int, path: Path, plan: LevelPlan | None) -> None: ...

    def promote_always(self, step: int, plan: LevelPlan | None) -> None: ...

    @property
    def newest_step(self) -> int | None: ...

    def close(self, step: int, failing: bool) -> BaseException | None: ...


def plan_copies(steps: Collection[int] | None, step: int) -> bool:
    """Whether a plan's subset ``steps`` (``promote_steps``, ``peer_steps``) takes ``step``: None
    (no subset planned) takes every committed step."""
    return steps is None or step in steps
