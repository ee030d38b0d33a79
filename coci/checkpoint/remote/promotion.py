"""A session's side of the remote tier: the run's claim on the prefix, which committed checkpoints
are promoted, and the mirror of the run's history.

``Promotion.open`` claims the prefix for this run (``coci.checkpoint.remote.identity``) and
starts rank 0's history mirror (``coci.checkpoint.remote.history``). A committed checkpoint is
handed to the tier when the plan promotes it, or when it must be promoted whatever the plan says
(a preemption's, the final one); only the processes that upload do (rank 0 on one shared run
directory, each node's leader on node-local ones).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coci.checkpoint.remote.history import HistoryMirror, merge_history
from coci.checkpoint.remote.identity import RunIdentity, claim, claim_for_job
from coci.checkpoint.remote.schemes import RemoteLike, open_store
from coci.checkpoint.remote.tier import NodeRole, RemoteTier, UploadListener
from coci.checkpoint.retention import RetentionPolicy
from coci.checkpoint.storage_level import LevelPlan, SentSteps, plan_copies, planned_steps
from coci.distributed import DistributedContext
from coci.errors import ConfigError
from coci.events import EventLog, read_run_file, write_run_file

__all__ = ["UNFINISHED_FILENAME", "Promotion"]

logger = logging.getLogger(__name__)

#: In the run directory of a process that uploads: the steps ``close()`` left unpromoted (its
#: limit passed), for the next run to promote the one it restores.
UNFINISHED_FILENAME = "remote_unfinished.json"
#: The share of ``close()``'s remote limit kept for the last history mirror (at most its 15 s).
_HISTORY_SHARE = 0.25
_HISTORY_MAX_SECONDS = 15.0


class Promotion:
    """The remote tier of one session (rank 0's or a node leader's uploads, every rank's restores):
    the remote [``StorageLevel``][coci.checkpoint.storage_level.StorageLevel]. ``close_timeout``:
    the seconds its ``close`` spends at most (``finish_uploads``)."""

    #: The level's name (``StorageLevel.name``).
    name = "remote"
    #: The run directory's record of the steps ``close()`` left unpromoted (``resume_unfinished``).
    unfinished_filename = UNFINISHED_FILENAME

    def __init__(
        self, tier: RemoteTier, events: EventLog, dist: DistributedContext | None, run_dir: Path | None = None, close_timeout: float = 60.0,
    ) -> None:
        self.tier = tier
        self.close_timeout = close_timeout
        self.run_dir = run_dir
        self.history: HistoryMirror | None = None  # rank 0's mirror of the run's history
        self._events = events
        self._dist = dist
        self._must_promote: set[int] = set()  # promoted whatever the plan says (preemption, final)
        #: The steps this process handed to the tier (``StorageLevel.sent_steps``).
        self.sent_steps = SentSteps()
        self._last_commit: tuple[int, Path] | None = None
        self._history_seconds = _HISTORY_MAX_SECONDS  # close()'s last mirror (finish_uploads sets it)

    @classmethod
    def open(
        cls,
        remote: RemoteLike,
        storage_options: Mapping[str, Any] | None,
        *,
        retention: RetentionPolicy | None,
        owner: str,
        run_dir: Path,
        events: EventLog,
        listener: UploadListener,
        dist: DistributedContext | None,
        steps: Callable[[], int | None],
        history_from: int,
        close_timeout: float = 60.0,
        name: str = "remote",
    ) -> Promotion:
        """The tier ``remote`` names (``coci.checkpoint.remote.schemes.open_store``), kept by
        ``retention``, its prefix claimed for this run (``owner``: ``"refuse"`` or
        ``"adopt"``; ConfigError naming the owner, collective) and, on rank 0, the history mirror
        (from ``history_from``, this process's first event; ``steps`` reads the session's step);
        ``close`` waits ``close_timeout`` seconds at most. ``name``: the level's name; a store
        opened as an added level (``coci.DirectoryLevel``'s ``level4``) keeps its unpromoted
        steps in ``<name>_unfinished.json`` and mirrors no history (the run's history goes to
        the remote tier only)."""
        tier = RemoteTier(open_store(remote, storage_options), retention, events, listener, role=NodeRole.of(dist))
        tier.identity, started = claim_for_job(tier.store, run_dir, owner, events, dist, level=name)
        if tier.identity is None:  # the store did not answer (in time): claimed before it is used

            def again() -> RunIdentity:
                return claim(tier.store, run_dir, owner, events, level=name)

            tier.claim = again if started is None else functools.partial(started.identity_or, again)
            tier.start_claim = None if started is None else started.wait
        promotion = cls(tier, events, dist, run_dir, close_timeout)
        promotion.name = name
        if name != cls.name:
            promotion.unfinished_filename = f"{name}_unfinished.json"
        elif dist is None or dist.is_coordinator:
            promotion.history = HistoryMirror(tier.store, events, steps, history_from, owned=lambda: tier.owned() is not None)
            tier.after_promotion = promotion.history.request
            promotion.history.start()
        return promotion

    @property
    def uploads(self) -> bool:
        """This process promotes: rank 0 (one shared run directory), each node's leader (node-local)."""
        dist = self._dist
        return dist is None or (dist.is_node_leader if dist.node_local else dist.is_coordinator)

    def committed(self, step: int, path: Path, planned: bool) -> None:
        """Checkpoint ``step`` committed at ``path``: handed to the tier when ``planned`` (the plan
        promotes it) or when it must be promoted (``promote_always``)."""
        self._last_commit = (step, path)
        if (planned or step in self._must_promote) and self.uploads:  # node-local: each node its own part
            self.sent_steps.add(step)
            self.tier.promote(step, path)

    def restored(self, step: int, path: Path, source: str) -> None:
        """A restore loaded ``step`` at ``path`` from the level ``source``: from this tier it counts
        for its retention; from another it is promoted when the previous run left it unpromoted."""
        if source == self.name:
            self.tier.trust(step)
        else:
            self.resume_unfinished(step, path)

    def promote(self, step: int, path: Path, plan: LevelPlan | None) -> None:
        """Checkpoint ``step`` committed at ``path``: promoted when ``plan`` sends it to this level
        (``coci.checkpoint.storage_level.planned_steps``; None: every one)."""
        self.committed(step, path, plan is None or plan_copies(planned_steps(plan, self.name), step))

    @property
    def newest_step(self) -> int:
        """The newest step committed remotely by this process or restored from the tier."""
        return self.tier.last_promoted_step

    def close(self, step: int, failing: bool) -> None:
        """``finish_uploads`` within ``close_timeout`` (the history's last mirror is ``close_history``)."""
        self.finish_uploads(step, self.close_timeout)

    def promote_always(self, step: int, plan: LevelPlan | None = None) -> None:
        """Checkpoint ``step`` goes to the remote tier whatever a two-level plan promotes: the
        preemption checkpoint (a reclaimed node resumes from it) and the final one (the run's
        result must not live on one local disk only). Handed over now when it already committed."""
        self._must_promote.add(step)
        if self._last_commit is not None and self._last_commit[0] == step and step not in self.sent_steps:
            self.committed(*self._last_commit, planned=True)

    def promote_within(self, step: int, seconds: float) -> bool | None:
        """Promote the committed checkpoint of ``step`` and wait for its upload at most ``seconds``:
        True when it is in the remote tier by then, False when not (still uploading, or failed),
        None on a process that does not commit remotely (another node's leader uploads its part only)."""
        if not self.uploads:
            return None
        self.promote_always(step)
        self.tier.wait(max(seconds, 0.0))
        if self.tier.role is not None and not self.tier.role.commits:
            return None  # a node's part: whether the checkpoint is committed remotely is rank 0's to say
        return self.tier.last_promoted_step >= step

    def merge_history(self, step: int) -> None:
        """A fresh run directory takes the run's history from the remote (rank 0); a failure only
        costs the report that history (logged, an ``error`` event)."""
        mirror = self.history
        identity = None if mirror is None else self.tier.owned()
        if mirror is None or identity is None or identity.fresh:  # never another run's history
            return
        try:
            added = merge_history(mirror)
        except Exception as exc:  # the report then misses the earlier history; training goes on
            logger.warning("remote history not merged from %s: %s", mirror.store.url, exc)
            self._events.emit("error", step=step, phase="remote_history", message=f"{type(exc).__name__}: {exc}")
            return
        if added:
            self._events.emit("remote_history", step=step, events=added, remote=mirror.store.url)

    def finish_uploads(self, step: int, limit: float) -> list[int]:
        """``close()``'s wait for the queued promotions: ``limit`` seconds for them and the last
        history mirror together (``close_history`` gets what they leave, at least its share).
        A promotion unfinished by then is stopped, recorded (a ``remote_unfinished`` event and
        ``UNFINISHED_FILENAME``) and its steps returned; the local checkpoints are untouched."""
        began = time.monotonic()
        kept = min(_HISTORY_MAX_SECONDS, limit * _HISTORY_SHARE) if self.history is not None else 0.0
        self.tier.wait(limit - kept)
        self._history_seconds = max(limit - (time.monotonic() - began), 0.0)
        unfinished = self.tier.stop() if self.tier.in_flight else []
        if unfinished:
            logger.warning(
                "close(): the remote tier did not take step(s) %s within remote_close_timeout=%.3g s: they stay committed "
                "locally and the next run that restores one promotes it", unfinished, limit,
            )
            self._events.emit("remote_unfinished", step=step, steps=unfinished, seconds=limit, remote=self.tier.store.url)
            self._record_unfinished(unfinished)
        return unfinished

    def close_history(self) -> None:
        """The last history mirror (the ``close`` event included), within what ``finish_uploads``
        left of ``close()``'s remote limit."""
        if self.history is not None:
            self.history.close(self._history_seconds)

    def _record_unfinished(self, steps: list[int]) -> None:
        if self.run_dir is None:
            return
        try:
            write_run_file(self.run_dir / self.unfinished_filename, json.dumps({"steps": steps}))
        except (OSError, ConfigError) as exc:
            logger.warning("cannot record the unpromoted steps %s in %s: %s", steps, self.run_dir, exc)

    def resume_unfinished(self, step: int, path: Path) -> bool:
        """After a restore of local (or peer) ``step`` from ``path``: promote it when the previous
        run's ``close()`` left it unpromoted (``UNFINISHED_FILENAME``, then removed); True when
        handed to the tier."""
        if self.run_dir is None or not self.uploads:
            return False
        record = self.run_dir / self.unfinished_filename
        try:
            steps = json.loads(read_run_file(record, 1 << 16)).get("steps")
        except FileNotFoundError:
            return False
        except (OSError, ConfigError, ValueError, AttributeError) as exc:
            logger.warning("%s is unreadable (%s): ignored", record, exc)
            steps = None
        record.unlink(missing_ok=True)
        listed = [s for s in steps if type(s) is int] if isinstance(steps, list) else []
        if step not in listed:
            return False
        self._events.emit("remote_resumed", step=step, unfinished=listed)
        self._must_promote.add(step)
        self.committed(step, path, planned=True)
        return True
