"""``DirectoryLevel``: a storage level added above the built-in ones, held in another directory.

A second disk, a parallel file system or a mounted bucket becomes one more level of a session:

```python
session = coci.Session(run_dir, state, mtbf="8h", levels=(coci.DirectoryLevel("/archive/run"),))
```

It is the remote tier's machinery on a directory, reused as it is: the copies are the remote
tier's promotions ([``RemoteTier``][coci.checkpoint.remote.tier.RemoteTier] on a
[``DirectoryStore``][coci.checkpoint.remote.filesystem.DirectoryStore]: each file written under a
temporary name, fsynced and renamed, checked against its recorded crc32c, the record written last
as the commit marker; one copy in flight, a newer one replacing a waiting one), the directory is
claimed for one run as a remote prefix is (``coci.checkpoint.remote.identity``), a fetch is the
remote tier's (``coci.checkpoint.remote.fetch``: untrusted input, sizes bounded by the record,
checksums verified, links never followed, committed locally as a write is), and retention keeps
the newest ``keep_last`` trusted copies. What differs from the remote tier: the events name the
level (a ``level`` field), no history of the run is mirrored there, and the steps it takes are
the plan's ``higher_steps[name]`` (``coci.checkpoint.storage_level.planned_steps``).

Design choices: the level is a value built by the user before the session exists, so what a
session gives it (the run directory, its events, the process group, the profiler) comes at
``open`` (``coci.checkpoint.storage_level.AddedLevel``, in the manner of DCP's
``StorageWriter.set_up_storage_writer``); a ``DirectoryLevel`` serves one open session at a time.
On node-local run directories (each node its own part of a step) it is refused: the whole-step
fetch it implements needs one shared run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from coci import checks
from coci.checkpoint.remote.filesystem import DirectoryStore
from coci.checkpoint.remote.promotion import Promotion
from coci.checkpoint.retention import DEFAULT_KEEP_LAST, KeepLast, check_keep_last
from coci.checkpoint.storage_level import ADDED_RANK, LevelContext, LevelPlan, SentSteps
from coci.distributed import DistributedContext
from coci.errors import ConfigError
from coci.events import EventLog
from coci.units import parse_duration

__all__ = ["DirectoryLevel", "LevelEvents"]


class LevelEvents(EventLog):
    """The event log as one added level writes it: every event it emits carries ``level=<name>``,
    so the report tells its copies, fetches and errors from the remote tier's (the same kinds:
    ``promoted``, ``promote_skip``, ``remote_fetch``, ...). Only ``emit`` is used by a level."""

    def __init__(self, log: EventLog, level: str) -> None:
        self._log = log
        self._path = log.path  # what ``path`` reads; the file stays the log's
        self.level = level

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        return self._log.emit(event, **fields, level=self.level)


class DirectoryLevel:
    """A storage level in the directory ``path``, above the session's local, peer and remote
    levels: ``Session(..., levels=(coci.DirectoryLevel(path),))`` (module docstring).

    Args:
        path: the directory (created at ``open``); claimed for one run, as a remote prefix is.
        rank: its restore rank, ``4`` for the first added level (its name is ``level<rank>``:
            the key of its steps in ``Plan.higher_steps`` and of its costs in ``Profile.levels``).
        keep_last: the newest copies kept there (None: every one; by default as many as the
            other levels keep, ``coci.checkpoint.retention.DEFAULT_KEEP_LAST``).
        owner: another run's directory: ``"refuse"`` (ConfigError naming its owner) or ``"adopt"``.
        close_timeout: the seconds ``Session.close()`` waits at most for its last copy (a copy
            unfinished then is recorded in ``<name>_unfinished.json`` and taken by the next run
            that restores that step).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, rank: int = ADDED_RANK, keep_last: int | None = DEFAULT_KEEP_LAST, owner: str = "refuse",
        close_timeout: float | str = 60.0,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigError(f"DirectoryLevel.path must be a directory path, got {path!r}")
        self.path = Path(path)
        self.rank = checks.integer(rank, "DirectoryLevel.rank", minimum=ADDED_RANK)
        self.keep_last = check_keep_last(keep_last, "DirectoryLevel.keep_last")
        self.owner = owner
        self.close_timeout = parse_duration(close_timeout, field="DirectoryLevel.close_timeout", positive=True)
        self._promotion: Promotion | None = None
        self._dist: DistributedContext | None = None
        self._open = False

    def __repr__(self) -> str:
        return f"DirectoryLevel({str(self.path)!r}, rank={self.rank}, keep_last={self.keep_last})"

    @property
    def name(self) -> str:
        """``level<rank>``."""
        return f"level{self.rank}"

    @property
    def promotion(self) -> Promotion:
        """The copies to the directory (the remote tier's ``Promotion`` on it); ConfigError before ``open``."""
        if self._promotion is None:
            raise ConfigError(f"{self!r} is not open: a Session opens it (Session(..., levels=(level,)))")
        return self._promotion

    def open(self, context: LevelContext) -> None:
        """Claim the directory for the session's run and start copying (``AddedLevel``, 1.)."""
        if self._open:
            raise ConfigError(f"{self!r} serves one session at a time and is open: close that session first, or give each its own")
        if context.dist is not None and context.dist.node_local:
            raise ConfigError(f"levels: {self!r} needs one shared run directory, not node-local ones (run_dir_layout)")
        self._promotion = Promotion.open(
            DirectoryStore(self.path), None, retention=None if self.keep_last is None else KeepLast(self.keep_last),
            owner=self.owner, run_dir=context.run_dir, events=LevelEvents(context.events, self.name), listener=context.listener,
            dist=context.dist, steps=lambda: None, history_from=0, close_timeout=self.close_timeout, name=self.name,
        )
        self._dist, self._open = context.dist, True

    def committed_steps(self) -> list[int]:
        """The steps committed in the directory by this run (or the runs it adopted), oldest first."""
        return self.promotion.tier.committed_steps()

    def fetch(self, step: int, root: Path) -> Path:
        """Copy committed ``step`` into ``root/step_<step>`` as untrusted input, committed there."""
        return self.promotion.tier.fetch(step, root, self._dist)

    def restored(self, step: int, path: Path, source: str) -> None:
        self.promotion.restored(step, path, source)

    def promote(self, step: int, path: Path, plan: LevelPlan | None) -> None:
        self.promotion.promote(step, path, plan)

    def promote_always(self, step: int, plan: LevelPlan | None) -> None:
        self.promotion.promote_always(step, plan)

    @property
    def newest_step(self) -> int | None:
        """The newest step copied there by this session or restored from it (None before ``open``)."""
        return None if self._promotion is None else self._promotion.newest_step

    @property
    def sent_steps(self) -> SentSteps:
        """The steps this session handed to the directory (none before ``open``)."""
        return SentSteps() if self._promotion is None else self._promotion.sent_steps

    def close(self, step: int, failing: bool) -> BaseException | None:
        """The last copies, within ``close_timeout``; then the level may be opened again (by the next session)."""
        self._open = False
        self.promotion.close(step, failing)
        return None
