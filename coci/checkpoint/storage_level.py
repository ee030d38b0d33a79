"""``StorageLevel``: the one shape of every storage level a session drives (local, peer, remote),
and ``AddedLevel``: a level a user adds above them (``Session(levels=(...))``).

The local writer ([``Checkpointer``][coci.checkpoint.checkpointer.Checkpointer]), the peer copies
([``PeerCopying``][coci.checkpoint.peers.PeerCopying]) and the remote tier
([``Promotion``][coci.checkpoint.remote.promotion.Promotion]) each implement ``StorageLevel``; a
[``coci.Session``][coci.Session] holds them as a tuple, local first, the added levels last, and
calls each the same way. An added level ([``coci.AddedLevel``][coci.AddedLevel], such as
[``coci.DirectoryLevel``][coci.DirectoryLevel]) also opens itself for the session and fetches its
own checkpoints back, so ``restore()`` reads it without knowing what it is.
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from coci.errors import ConfigError

if TYPE_CHECKING:
    from coci.distributed import DistributedContext
    from coci.events import EventLog

__all__ = ["ADDED_NAME", "ADDED_RANK", "AddedLevel", "LevelContext", "LevelHistories", "LevelPlan", "SentSteps", "StorageLevel", "TransferListener", "check_added_levels", "open_added_levels",
           "plan_copies", "planned_steps"]

#: The restore rank of the first added level (``level4``): the local tier, the peer level and the
#: remote tier are ranks 1 to 3 (``coci.Level``); an added level is named ``level<rank>``, the name
#: ``coci.plan`` gives its steps in ``Plan.higher_steps``.
ADDED_RANK = 4
ADDED_NAME = re.compile(r"^level([1-9][0-9]{0,2})$")  #: an added level's name, ``level<rank>``


class LevelPlan(Protocol):
    """What a level reads of a plan (``coci.Plan``): which committed steps go up to each level."""

    @property
    def promote_steps(self) -> Collection[int] | None: ...

    @property
    def peer_steps(self) -> Collection[int] | None: ...

    @property
    def higher_steps(self) -> Mapping[str, Collection[int]] | None: ...


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
    5. ``newest_step`` and ``sent_steps``: read when the policy observes: the newest step this
       level holds durably, and every step this process sent it, ascending (handed to the level
       for its copy, committed or in flight; ``SentSteps`` keeps them compactly; the local
       level has none: its commits are the session's ``checkpoint_steps``).
       The session's observation carries them as the level's ``LevelCosts.last_step`` (the newer
       of the newest sent and the newest held) and ``taken_steps`` (the copy history a re-plan
       holds the whole run's time budget with: ``coci.planning.policy.sent_levels``), preceded by
       what the run's earlier processes sent it (``LevelHistories``: saved in each checkpoint).
    6. ``close(step, failing)``: at ``Session.close()``, in the tuple's order, after the local
       level's last commit has been promoted: finish what is in flight within the level's own
       limit, then stop. ``failing``: the session closes on the way out of an exception, so the
       level must not wait for other ranks. Returns a background failure the session raises (the
       local level's stuck persist), or None.

    Fetching: ``restore()`` (``coci.checkpoint.restore.Restorer``) searches the levels newest
    step first. What a built-in level gives is of a different shape (the local level a
    directory, the peer level one node's part, the remote tier a whole step or a node's part), so
    the restorer reads each of those by its own method; an added level fetches a whole step by
    its ``fetch`` (``AddedLevel``).
    """

    @property
    def name(self) -> str:
        """``"local"``, ``"peer"``, ``"remote"`` or an added level's ``level<rank>``: the ``tier`` of a ``restore`` event."""
        ...

    def restored(self, step: int, path: Path, source: str) -> None: ...

    def promote(self, step: int, path: Path, plan: LevelPlan | None) -> None: ...

    def promote_always(self, step: int, plan: LevelPlan | None) -> None: ...

    @property
    def newest_step(self) -> int | None: ...

    @property
    def sent_steps(self) -> Collection[int]: ...

    def close(self, step: int, failing: bool) -> BaseException | None: ...


class SentSteps:
    """The steps a process sent one storage level (``StorageLevel.sent_steps``), ascending, each
    once: 8 bytes a step (an ``array``), so a run that copies every one of its 10^6 steps holds 8 MB
    per level, as many entries as the session's own ``checkpoint_steps``."""

    def __init__(self) -> None:
        self._steps = array("q")

    def add(self, step: int) -> None:
        """Record ``step`` as sent (in commit order an append; an older step, such as a restored
        one promoted late, goes to its place; a step already recorded stays once)."""
        steps = self._steps
        if not steps or step > steps[-1]:
            steps.append(step)
            return
        index = bisect.bisect_left(steps, step)
        if steps[index] != step:
            steps.insert(index, step)

    @property
    def newest(self) -> int | None:
        """The newest step sent (None: none yet)."""
        return self._steps[-1] if self._steps else None

    def __contains__(self, step: object) -> bool:
        if type(step) is not int:
            return False
        index = bisect.bisect_left(self._steps, step)
        return index < len(self._steps) and self._steps[index] == step

    def __iter__(self) -> Iterator[int]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)


class LevelHistories:
    """Every level's copy history across a run's processes, as ``checkpoint_steps`` is: what the
    earlier processes sent each level, saved in each checkpoint's session entry (``level_steps``,
    by level name: the steps sent before the checkpoint's own step, and that step where the plan
    in effect sends it to the level: its copy follows its commit), followed by what this process
    sent it (``StorageLevel.sent_steps``). A restore from a level adds the restored step to its
    history (the level holds it). A checkpoint without ``level_steps`` leaves the history not
    known, and the checkpoints after it save none."""

    def __init__(self) -> None:
        self._earlier: dict[str, tuple[int, ...]] | None = {}

    @property
    def known(self) -> bool:
        """Whether the histories cover the run from step 0."""
        return self._earlier is not None

    def of(self, levels: Iterable[StorageLevel]) -> list[tuple[str, int | None, tuple[int, ...]]]:
        """Each level above the local one: its name, newest step held and every step sent to it
        in the run, ascending (only this process's when not known)."""
        return [(level.name, level.newest_step, self._history(level)) for level in levels if level.name != "local"]

    def entry(self, levels: Iterable[StorageLevel], step: int, plan: LevelPlan | None) -> dict[str, dict[str, list[int]]]:
        """The session entry's ``level_steps`` of the checkpoint of ``step`` taken under ``plan``
        (none when not known)."""
        if self._earlier is None:
            return {}
        saved = {}
        for name, _, steps in self.of(levels):
            copied = step >= 1 and (not steps or step > steps[-1]) and plan_copies(None if plan is None else planned_steps(plan, name), step)
            saved[name] = [*steps, step] if copied else list(steps)
        return {"level_steps": saved}

    def load(self, saved: Mapping[str, list[int]] | None) -> None:
        """A restored checkpoint's ``level_steps`` (checked: ``restore_checks.check_session_entry``)."""
        self._earlier = None if saved is None else {name: tuple(steps) for name, steps in saved.items()}

    def restored(self, step: int, source: str) -> None:
        """A restore loaded ``step`` from the level ``source``: the step is on it."""
        if self._earlier is not None and source != "local":
            earlier = self._earlier.get(source, ())
            self._earlier[source] = earlier if step in earlier[-1:] else earlier + (step,)

    def _history(self, level: StorageLevel) -> tuple[int, ...]:
        earlier = () if self._earlier is None else self._earlier.get(level.name, ())
        last = earlier[-1] if earlier else 0
        return earlier + tuple(step for step in level.sent_steps if step > last)


class TransferListener(Protocol):
    """What a level reports its transfers to (the session's profiler, which measures the level's
    ``seconds`` and ``bytes`` into ``Profile.levels`` under the level's name)."""

    def upload_started(self) -> None: ...

    def upload_finished(self, seconds: float, nbytes: int) -> None: ...

    def upload_aborted(self) -> None: ...


@dataclass(frozen=True)
class LevelContext:
    """What a session gives an added level when it opens it (``AddedLevel.open``): the run
    directory (``checkpoints/`` is the local tier; a level may keep a small record beside it), the
    event log (each event the level writes names it: a ``level`` field), the process group's
    context (None without ``torch.distributed``) and the listener of its transfers."""

    run_dir: Path
    events: EventLog
    dist: DistributedContext | None
    listener: TransferListener


@runtime_checkable
class AddedLevel(StorageLevel, Protocol):
    """A storage level a user adds above the local, peer and remote ones: one value in
    ``Session(levels=(...))`` (``RemoteConfig.levels``), such as
    [``coci.DirectoryLevel``][coci.DirectoryLevel]. It is a ``StorageLevel`` that also opens
    itself for a session and fetches its checkpoints back.

    A session calls an added level in this order:

    1. ``open(context)``: once, inside ``Session()``, after the built-in levels opened
       (collective under ``torch.distributed``: every rank calls it); ``context`` is a
       ``LevelContext``. A level that cannot be used raises a ``coci.ConfigError`` naming it.
    2. ``committed_steps()``: at ``restore()`` (rank 0 only; the ranks get its answer): the steps
       the level holds committed, oldest first. An unreachable level raises; the restore then
       goes on without it (an ``error`` event).
    3. ``fetch(step, root)``: at ``restore()``, when no lower level holds a committed step as new
       as ``step`` that loads (of two levels holding the same step the lower one is read first):
       put the committed checkpoint of ``step`` into ``root/step_<step>``, committed there as a
       local write is (temporary name, fsync, rename), and return that directory. Its content
       is untrusted: sizes bounded by the record, checksums verified, no link followed. A
       ``coci.CheckpointError`` passes over the step (a ``restore_skip`` event). Collective.
    4. ``restored(step, path, source)``: as for every level (``StorageLevel``, 2.).
    5. ``promote(step, path, plan)``: after each local commit; the level takes the steps the plan
       names for it (``Plan.higher_steps[name]``; a plan that names none: the steps the remote
       tier takes, ``Plan.promote_steps``; no plan: every commit), in the background, and keeps
       its own retention after each copy.
    6. ``promote_always(step, plan)``, ``newest_step``, ``sent_steps``, ``close(step, failing)``:
       as for every level (``StorageLevel``, 4. to 6.).

    ``name`` is ``level<rank>``, its restore rank ``ADDED_RANK`` or above: the added levels of a
    session are ``level4``, ``level5``, ... in the order given (``check_added_levels``), the names
    under which ``coci.plan`` places their steps, the profile measures their costs and the events
    and the report name them.
    """

    def open(self, context: LevelContext) -> None: ...

    def committed_steps(self) -> list[int]: ...

    def fetch(self, step: int, root: Path) -> Path: ...


def check_added_levels(levels: Iterable[object]) -> tuple[AddedLevel, ...]:
    """``levels`` as a tuple of ``AddedLevel``; a ``ConfigError`` naming ``levels[i]`` unless each
    is one, named ``level<rank>`` with ranks ``ADDED_RANK``, ``ADDED_RANK + 1``, ... in order."""
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Iterable):
        raise ConfigError(f"levels must be a tuple of storage levels (e.g. coci.DirectoryLevel(path)), got {levels!r}")
    checked: list[AddedLevel] = []
    for index, level in enumerate(levels):
        if not isinstance(level, AddedLevel):
            raise ConfigError(
                f"levels[{index}] must be a storage level (open, committed_steps, fetch, promote, promote_always, restored, "
                f"newest_step, sent_steps, close: coci.AddedLevel), got {type(level).__name__}"
            )
        name = level.name
        match = ADDED_NAME.match(name) if isinstance(name, str) else None
        if match is None or int(match.group(1)) != ADDED_RANK + index:
            raise ConfigError(f"levels[{index}].name must be 'level{ADDED_RANK + index}' (the added levels' ranks, in order), got {name!r}")
        checked.append(level)
    return tuple(checked)


def open_added_levels(
    levels: tuple[AddedLevel, ...], run_dir: Path, events: EventLog, dist: DistributedContext | None,
    listener_of: Callable[[str], TransferListener],
) -> tuple[AddedLevel, ...]:
    """Open each added level for a session (``AddedLevel``, 1.), in order; ``listener_of(name)``
    is the profiler's listener of the level named ``name``. When one refuses to open, those opened
    before it are closed again (a retry opens them anew) and its error is raised."""
    opened: list[AddedLevel] = []
    try:
        for level in levels:
            level.open(LevelContext(run_dir, events, dist, listener_of(level.name)))
            opened.append(level)
    except BaseException:
        for level in opened:
            level.close(0, True)
        raise
    return levels


def planned_steps(plan: LevelPlan, name: str) -> Collection[int] | None:
    """The steps ``plan`` sends to the level ``name``: ``peer_steps`` for ``"peer"``,
    ``promote_steps`` for ``"remote"``, ``higher_steps[name]`` for an added level, or where the
    plan names none for it, the remote tier's (the levels nest: what goes above went up to the
    remote tier first). None: every committed step."""
    if name == "peer":
        return plan.peer_steps
    higher = plan.higher_steps if name != "remote" else None
    if higher is not None and name in higher:
        return higher[name]
    return plan.promote_steps


def plan_copies(steps: Collection[int] | None, step: int) -> bool:
    """Whether a plan's subset ``steps`` (``promote_steps``, ``peer_steps``) takes ``step``: None
    (no subset planned) takes every committed step."""
    return steps is None or step in steps
