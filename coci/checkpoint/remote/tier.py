"""The remote tier: promotion of committed local checkpoints, per-tier retention, and fetching one back.

Remote layout, under the store's prefix:

```text
step_<n>/<data files>      uploaded first, each checked against the manifest's crc32c
step_<n>/manifest.json     uploaded last: the remote commit marker (object stores have no rename)
```

``RemoteTier`` promotes in the background on one worker thread: the checkpoint's files are
opened on the training thread when it is handed over (so local retention may delete it meanwhile),
the upload runs with at most one more promotion waiting (a newer one replaces a waiting one). A
failed attempt is logged and retried; it never writes the manifest, so a partial remote checkpoint
never counts, and it never touches the local copy. Retention applies the remote
[``coci.checkpoint.retention.RetentionPolicy``][coci.RetentionPolicy] (``keep_last_remote=n``: the newest ``n``) to
the *trusted* remote checkpoints (uploaded and verified by this process, or restored from): an
unverified one, however new, never makes a good one look old, and the newest trusted one is never
deleted. ``RemoteTier.fetch`` downloads a checkpoint as untrusted input into a ``.tmp``
directory of the run, each rank its own files under ``torch.distributed`` (``.fetch``), and
commits it locally the way a write does. It is not downloaded into the staging arena: restore reads
every format from files in a committed directory (DCP's reader opens paths), and a local commit
means that the next failure that spares the node restores locally instead of downloading again.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from coci import knobs
from coci.checkpoint import faults, layout, record_reads
from coci.checkpoint.records import CommitRecord, FileEntry
from coci.checkpoint.remote.fetch import fetch as fetch_checkpoint
from coci.checkpoint.remote.fetch import fetch_node_parts
from coci.checkpoint.remote.identity import OWNER_KEY, RunIdentity, step_owner
from coci.checkpoint.remote.schemes import open_store
from coci.checkpoint.remote.store import RemoteStore, is_plain_key
from coci.checkpoint.retention import RetentionPolicy, doomed_steps
from coci.checkpoint.storage_level import TransferListener
from coci.distributed import DistributedContext
from coci.errors import ConfigError, CorruptCheckpointError
from coci.events import EventLog

__all__ = ["NodeRole", "RemoteTier", "open_store"]

logger = logging.getLogger(__name__)

#: Remote keys coci never writes (not plain names, see ``coci.checkpoint.remote.store.check_key``)
#: are left alone by retention; a ``remote_ignored`` event names at most this many of them.
_REMOTE_IGNORED_KEYS_RECORDED: int = 20

#: Node-local run directories: how long rank 0 waits for the other nodes' objects of a promoted
#: checkpoint to be listed remotely before it writes the commit marker (else the promotion fails
#: and the checkpoint is never restored from the remote), and how often it lists meanwhile.
_REMOTE_NODES_WAIT_SECONDS: float = 600.0
_REMOTE_NODES_POLL_SECONDS: float = 0.2

_STEP_KEY = re.compile(r"^step_(\d+)/")


#: What the tier reports promotions to (the session's profiler): any level's transfer listener.
UploadListener = TransferListener


@dataclass(frozen=True)
class NodeRole:
    """A node-local run directory's share of each promotion: its leader uploads the files of its
    own ranks (``node``); the node that ``commits`` (rank 0's) then waits until every node's
    objects are listed at their recorded sizes and only then writes the commit marker (the record
    of the whole checkpoint). Each node records its upload throughput (a ``node_upload`` event)."""

    node: int
    commits: bool

    @classmethod
    def of(cls, context: DistributedContext | None) -> NodeRole | None:
        """This process's share of promotions on node-local run directories (None otherwise)."""
        if context is None or not context.node_local:
            return None
        return cls(context.node, context.is_coordinator)


class _NodesMissing(Exception):
    """Another node's objects of a promotion did not arrive (or a newer promotion superseded it)."""


class _Stopped(Exception):
    """The session closed with this promotion unfinished (``RemoteTier.stop``)."""


@dataclass
class _Job:
    step: int
    manifest: bytes  # the commit marker
    record: CommitRecord
    handles: list[BinaryIO]
    files: list[FileEntry]  # what this process uploads (a node's own part, or every file)

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


class RemoteTier:
    """Level 2 of a run: promotes, retains, lists and fetches checkpoints in one [``RemoteStore``][coci.checkpoint.remote.store.RemoteStore]."""

    def __init__(
        self,
        store: RemoteStore,
        retention: RetentionPolicy | None,
        events: EventLog,
        listener: UploadListener | None = None,
        clock: Callable[[], float] = time.perf_counter,
        role: NodeRole | None = None,
    ) -> None:
        self.store = store
        self.retention = retention
        self.events = events
        self.listener = listener
        self.clock = clock
        self.role = role
        self._lock = threading.Lock()
        self._waiting: _Job | None = None
        self._current: _Job | None = None  # the promotion being uploaded
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._trusted: set[int] = set()
        self.last_promoted_step = 0  # newest step committed remotely by this process or restored from it
        self.identity: RunIdentity | None = None  # the run on the prefix (Session sets it): see .identity
        self.claim: Callable[[], RunIdentity] | None = None  # where the store was unreachable at the start
        # the wait for the claim Session() began and went on without (StartClaim.wait); None: none running
        self.start_claim: Callable[[float], bool] | None = None
        self._claim_lock = threading.Lock()  # one claim at a time (the upload worker, the mirror, a restore)
        self._claim_problem: str | None = None  # the last failed claim's, recorded once
        self.after_promotion: Callable[[int], None] | None = None  # the history mirror's cue
        self.failures = 0
        self._ignored: set[str] = set()  # remote keys coci never writes, recorded once (retention skips them)

    # -- promotion (training thread hands over, the worker uploads) -----------------------------

    def promote(self, step: int, path: Path) -> bool:
        """Queue the committed checkpoint in ``path`` for upload; False (logged) when it cannot be
        opened. Its files are opened here, so local retention may delete the directory meanwhile."""
        try:
            job = _open_job(step, path, self.role is not None)
        except (OSError, CorruptCheckpointError) as exc:
            logger.warning("checkpoint step_%d not promoted: %s", step, exc)
            self.events.emit("error", step=step, phase="promote", message=f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            superseded, self._waiting = self._waiting, job
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._drain, name="coci-upload", daemon=True)
                self._worker.start()
        if superseded is not None:
            superseded.close()
            self.events.emit("promote_skip", step=superseded.step, reason=f"superseded by step {step}")
        elif self.listener is not None:
            self.listener.upload_started()
        return True

    @property
    def in_flight(self) -> bool:
        worker = self._worker
        return worker is not None and worker.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Block until every queued promotion finished (or failed), or ``timeout`` seconds passed."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def stop(self) -> list[int]:
        """Give up the promotions still queued or uploading (``close()``'s limit passed): the
        worker ends at its next request instead of retrying; the steps it did not commit, oldest
        first. Their local checkpoints are untouched."""
        with self._lock:
            self._stopping = True
            unfinished = [job.step for job in (self._current, self._waiting) if job is not None]
        return sorted(set(unfinished))

    def trust(self, step: int) -> None:
        """Count remote ``step`` (verified: restored from) as good for retention."""
        self._trusted.add(step)
        self.last_promoted_step = max(self.last_promoted_step, step)

    def _drain(self) -> None:
        while True:
            with self._lock:
                job, self._waiting = self._waiting, None
                self._current = job
                if job is None or self._stopping:
                    self._worker = None
                    if job is not None:
                        job.close()
                    return
            try:
                self._promote_with_retries(job)
            finally:
                with self._lock:
                    self._current = None
                job.close()

    def _promote_with_retries(self, job: _Job) -> None:
        began = self.clock()
        for attempt in range(1, knobs.UPLOAD_ATTEMPTS + 1):
            try:
                nbytes = self._upload(job)
                break
            except _Stopped:
                logger.warning("promotion of step_%d stopped unfinished: the session closed", job.step)
                return
            except (CorruptCheckpointError, ConfigError, _NodesMissing) as exc:  # the local copy is damaged, or the prefix is
                # another run's now, or another node's part did not arrive: never promoted, not retried
                self._give_up(job, exc, attempt)
                return
            except Exception as exc:
                logger.warning("promotion of step_%d failed (attempt %d of %d): %s", job.step, attempt, knobs.UPLOAD_ATTEMPTS, exc)
                if attempt == knobs.UPLOAD_ATTEMPTS or self._stopping:
                    self._give_up(job, exc, attempt)
                    return
                time.sleep(knobs.UPLOAD_RETRY_SECONDS * 2 ** (attempt - 1))
        seconds = self.clock() - began
        if self.role is not None and not self.role.commits:  # rank 0's node commits what every node uploaded
            if self.listener is not None:
                self.listener.upload_finished(seconds, nbytes)
            return
        self._trusted.add(job.step)
        self.last_promoted_step = max(self.last_promoted_step, job.step)
        if self.listener is not None:
            self.listener.upload_finished(seconds, nbytes)
        self.events.emit("promoted", step=job.step, bytes=nbytes, seconds=seconds, remote=self.store.url, attempts=attempt)
        self._retain_safely(job.step)
        if self.after_promotion is not None:
            self.after_promotion(job.step)

    def _give_up(self, job: _Job, exc: BaseException, attempt: int) -> None:
        self.failures += 1
        if self.listener is not None:
            self.listener.upload_aborted()
        logger.error("checkpoint step_%d not promoted: %s", job.step, exc)
        self.events.emit("error", step=job.step, phase="promote", attempts=attempt, message=f"{type(exc).__name__}: {exc}")

    def claimed(self) -> RunIdentity | None:
        """This run's identity on the prefix, claimed now where ``Session()`` could not read the
        owner record (ConfigError: another run's prefix; the store's own error: still unreachable).
        None only for a tier no session claimed (a tool's)."""
        with self._claim_lock:
            if self.identity is None and self.claim is not None:
                self.identity = self.claim()
            return self.identity

    def owned(self) -> RunIdentity | None:
        """``claimed``, or None (logged, an ``error`` event with ``phase: "remote_owner"``
        once per distinct problem) while the prefix's owner is unknown or another run: with no
        identity nothing of the prefix is restored as this run's and nothing is written there."""
        try:
            identity = self.claimed()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._claim_problem:
                self._claim_problem = problem
                logger.warning("remote %s: no run identity (%s): the remote tier is not used until it is claimed", self.store.url, problem)
                self.events.emit("error", step=self.last_promoted_step, phase="remote_owner", message=problem)
            return None
        return identity

    def _upload(self, job: _Job) -> int:
        """Data objects (each one's crc32c checked against the record), then the manifest: the commit."""
        prefix = f"{layout.step_dirname(job.step)}/"
        self._check_stopping()
        self._await_start_claim()
        if self.claimed() is not None:
            assert self.identity is not None  # the checkpoint's run record first: a partial upload is ours too
            self.identity.claim_step(self.store, job.step)
        began = self.clock()
        for entry, handle in zip(job.files, job.handles):
            self._check_stopping()
            handle.seek(0)
            crc = self.store.put_file(prefix + entry.name, handle, entry.size)
            if entry.algorithm == "crc32c" and crc != entry.checksum:
                raise CorruptCheckpointError(f"step_{job.step}/{entry.name}: local bytes do not match its recorded crc32c")
        if self.role is not None:
            self._node_uploaded(job, self.clock() - began)
            if not self.role.commits:
                _check_listed(self.store.list_objects(prefix), prefix, job.files)
                return sum(entry.size for entry in job.files)
            self._await_nodes(job)
        _check_listed(self.store.list_objects(prefix), prefix, job.record.files)
        self._check_stopping()
        faults.fault("before_remote_commit")
        self.store.put_bytes(prefix + layout.MANIFEST_FILENAME, job.manifest)
        faults.fault("after_remote_commit")
        return sum(entry.size for entry in job.record.files) + len(job.manifest)

    def _await_start_claim(self) -> None:
        """The upload worker (never the training thread) waits for the claim ``Session()`` went on
        without, so a checkpoint committed while the owner record is slow is promoted once it
        answers; in slices, so that ``close()`` stops it. Bounded: the claim's own requests are
        (the remote request limits of ``coci.knobs``)."""
        while self.start_claim is not None and not self.start_claim(0.5):
            self._check_stopping()

    def _check_stopping(self) -> None:
        if self._stopping:
            raise _Stopped()

    def _node_uploaded(self, job: _Job, seconds: float) -> None:
        assert self.role is not None
        nbytes = sum(entry.size for entry in job.files)
        self.events.emit(
            "node_upload", step=job.step, node=self.role.node, files=len(job.files), bytes=nbytes, seconds=seconds,
            bytes_per_second=nbytes / seconds if seconds > 0 else None,
        )
        faults.fault("node_upload")

    def _await_nodes(self, job: _Job) -> None:
        """Wait until every node's objects of ``job`` are listed at their recorded sizes
        (``_REMOTE_NODES_WAIT_SECONDS``); _NodesMissing naming the absent ones otherwise, or
        when a newer promotion is waiting and no other node has begun this one (they may have
        skipped it for the newer one)."""
        prefix = f"{layout.step_dirname(job.step)}/"
        mine = {entry.name for entry in job.files}
        deadline = time.monotonic() + _REMOTE_NODES_WAIT_SECONDS
        while True:
            listed = self.store.list_objects(prefix)
            absent = [e.name for e in job.record.files if listed.get(prefix + e.name) != e.size]
            if not absent:
                return
            others_begun = any(prefix + e.name in listed for e in job.record.files if e.name not in mine)
            self._check_stopping()
            superseded = self._waiting is not None and not others_begun
            if superseded or time.monotonic() > deadline:
                why = "superseded by a newer promotion" if superseded else "not uploaded in time"
                raise _NodesMissing(f"remote {prefix}: the other nodes' objects {absent[:8]} are missing ({why}): not committed")
            time.sleep(_REMOTE_NODES_POLL_SECONDS)

    # -- retention ---------------------------------------------------------------------------------

    def _retain_safely(self, step: int) -> None:
        try:
            removed = self.retain()
        except Exception as exc:  # retention never fails a promotion that committed
            logger.warning("remote retention after step_%d failed: %s", step, exc)
            self.events.emit("error", step=step, phase="remote_retention", message=f"{type(exc).__name__}: {exc}")
            return
        if removed:
            self.events.emit("remote_retention", step=step, removed=removed)


    def retain(self) -> list[int]:
        """Delete the trusted remote checkpoints the retention policy does not keep and everything
        (committed or partial) older than the oldest kept (``.retention.doomed_steps``), each
        one's manifest first so it never stays half-committed."""
        if self.retention is None:
            return []
        listing = self._coci_objects(self.store.list_objects())
        committed = committed_steps(listing)
        trusted = [step for step in committed if step in self._trusted]
        doomed = doomed_steps(self.retention, trusted, steps_of(listing))
        if self.identity is not None:  # only this run's own checkpoints, and only while it owns the prefix
            self.identity.check_owner(self.store)
            doomed = self.identity.own_steps(self.store, doomed)
        for step in doomed:
            prefix = f"{layout.step_dirname(step)}/"
            manifest = prefix + layout.MANIFEST_FILENAME
            self.store.delete([manifest])
            faults.fault("remote_retention")
            record = prefix + OWNER_KEY  # last: a checkpoint half deleted still names its run
            self.store.delete([key for key in listing if key.startswith(prefix) and key not in (manifest, record)])
            self.store.delete([record])
        self._trusted.difference_update(doomed)
        return [step for step in doomed if step in committed]

    def _coci_objects(self, listing: Mapping[str, int]) -> dict[str, int]:
        """``listing`` without the keys coci never writes (not plain names: a space, ``..``; see
        ``.store.check_key``): retention neither deletes nor stumbles on them. Each such key
        is recorded once per process in a ``remote_ignored`` event."""
        foreign = sorted(key for key in listing if not is_plain_key(key))
        new = [key for key in foreign if key not in self._ignored]
        if new:
            self._ignored.update(new)
            logger.warning("remote %s: %d object(s) coci did not write are ignored, e.g. %r", self.store.url, len(new), new[0])
            self.events.emit("remote_ignored", step=self.last_promoted_step, keys=new[: _REMOTE_IGNORED_KEYS_RECORDED], count=len(new))
        return {key: size for key, size in listing.items() if key not in self._ignored}

    # -- listing and fetching --------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Remote steps holding a commit marker, oldest first (not yet verified), of this run and
        of the runs it adopted (``step_<n>/run.json``); none while the run has no identity on the
        prefix (``owned``): never another run's checkpoint."""
        identity = self.owned()
        if identity is None:
            return []
        steps = committed_steps(self.store.list_objects())
        return [step for step in steps if identity.may_restore(step_owner(self.store, step))]

    def fetch(self, step: int, root: Path, context: DistributedContext | None = None) -> Path:
        """Download remote ``step`` into ``root/step_<n>`` (committed there like a local write) and
        return that directory; CorruptCheckpointError when anything about it is off. Collective
        under ``torch.distributed``: each rank downloads its own files (``.fetch``)."""
        return fetch_checkpoint(self.store, step, root, context, self.events)

    def fetch_node_parts(self, step: int, root: Path, context: DistributedContext, fetching: bool) -> Path:
        """Node-local run directories: the nodes that are ``fetching`` download their own part of
        remote ``step`` (``coci.checkpoint.remote.fetch.fetch_node_parts``; collective)."""
        return fetch_node_parts(self.store, step, root, context, fetching, self.events)


def _check_listed(listed: Mapping[str, int], prefix: str, files: list[FileEntry]) -> None:
    for entry in files:
        if listed.get(prefix + entry.name) != entry.size:
            raise OSError(f"remote {prefix}{entry.name} is {listed.get(prefix + entry.name)} bytes, expected {entry.size}")


def committed_steps(listing: Mapping[str, int]) -> list[int]:
    """Steps of a listing holding ``step_<n>/manifest.json``, oldest first."""
    steps = []
    for key in listing:
        match = _STEP_KEY.match(key)
        if match and key == f"{match.group(0)}{layout.MANIFEST_FILENAME}":
            steps.append(int(match.group(1)))
    return sorted(steps)


def steps_of(listing: Mapping[str, int]) -> set[int]:
    """Every step a listing holds objects of, committed or not."""
    return {int(m.group(1)) for key in listing if (m := _STEP_KEY.match(key))}


def _open_job(step: int, path: Path, node_part: bool = False) -> _Job:
    """Read the committed record of ``path`` and open every file it lists (links refused); for a
    node's part (``node_part``), the files of its ranks, and the record of the whole checkpoint
    as the commit marker."""
    manifest = record_reads.read_record_bytes(path)
    try:
        record = CommitRecord.model_validate_json(manifest)
    except ValueError as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is unreadable ({type(exc).__name__})") from exc
    record_reads.check_file_names(path, [entry.name for entry in record.files], also=frozenset({".metadata"}))
    files = list(record.files)
    if node_part:
        from coci.checkpoint.dcp import read_dcp_manifest
        from coci.checkpoint.dcp_manifest import full_record

        part = read_dcp_manifest(path)
        files, manifest = part.present_files(), full_record(part).model_dump_json().encode()
    handles: list[BinaryIO] = []
    try:
        for entry in files:
            handles.append(os.fdopen(record_reads.open_no_follow(path / entry.name, os.O_RDONLY), "rb"))
    except BaseException:
        for handle in handles:
            handle.close()
        raise
    return _Job(step, manifest, record, handles, files)
