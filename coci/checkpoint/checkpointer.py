"""Two-phase checkpoint orchestration: snapshot, then background write and commit; and the one
entry point that loads a committed checkpoint, whatever its format.

``Checkpointer.start`` runs on the training thread: it waits for the previous persist (at most one
in flight, since the staging arena is reused), flattens the state tree, copies what the optimizer
fence does not protect, and hands the rest to a single background worker. The worker copies the
fenced tensors (overlapping the next forward/backward), resolves ``staging_completion``, has its
[``CheckpointWriter``][coci.CheckpointWriter] write and commit the files, applies retention and resolves
``upload_completion`` (the futures mirror DCP's ``async_save``).

The worker is a thread; with ``persist="process"`` its writer is a
``coci.checkpoint.persist_process.ProcessWriter``, which hands the write and the commit to a
helper process reading the (then shared-memory) arena, and the thread only waits for its answer.
``os.write``, ``crc32c``, ``os.fsync`` and ``Tensor.copy_`` release the GIL either way; what the
process takes off the training interpreter is the persist's Python (the manifest and its JSON).
Under ``torch.distributed`` the writer's DCP save is collective on the training process's groups,
so the persist stays in the thread there (recorded as the ``persist_mode`` event).
A failure in the worker is logged, written to ``events.jsonl`` and set on the futures; the
previous committed checkpoint is untouched because nothing becomes visible before its commit.

Reading goes through ``load_committed``, which picks the [``CheckpointReader``][coci.CheckpointReader] from the
format the commit record declares (``reader_named``; [``register_reader``][coci.register_reader] adds a format),
so callers never branch on the format. Which writer a session uses is ``writer_for``'s choice
unless ``Session(writer=...)`` gives a ``WriterFactory``; [``IOConfig``][coci.IOConfig] is the
session's part that chooses it, where it runs and what its failures do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import torch

from coci import distributed, knobs
from coci.checkpoint import layout, record_reads, records
from coci.checkpoint.dcp import DCP_FORMAT, DcpReader, DcpWriter
from coci.checkpoint.dcp_manifest import checkpoint_id
from coci.checkpoint.local import LocalReader, LocalWriter
from coci.checkpoint.persist_process import ProcessWriter, persist_deadline_seconds
from coci.checkpoint.records import CommitRecord, LoadedCheckpoint
from coci.checkpoint.retention import RetentionPolicy
from coci.checkpoint.sharded import local_shards
from coci.checkpoint.snapshot import CopyJob, StagedCheckpoint, StagingArena
from coci.checkpoint.storage_level import LevelPlan
from coci.checkpoint.tree import flatten
from coci.distributed import DistributedContext
from coci.errors import ConfigError, CorruptCheckpointError, IncompleteCheckpointError, PersistError
from coci.events import EventLog
from coci.resume_check import ON_MISMATCH

logger = logging.getLogger(__name__)


class CheckpointWriter(Protocol):
    """Writes and commits staged checkpoints in one format (runs on the background worker).

    For each checkpoint the ``Checkpointer`` calls, in this order:

    1. ``write(staged)``: write the files of ``staged.step`` into ``step_<n>.tmp`` and commit them
       with ``coci.checkpoint.commit.publish``; return the committed directory.
    2. ``retain(policy, trusted)``: delete the checkpoints the retention ``policy`` does not keep
       among the ``trusted`` steps (``coci.checkpoint.retention.apply_retention``: only
       trusted steps are counted, the newest is always kept; None keeps everything); return the
       steps removed.

    Under ``torch.distributed`` both calls are collective: every rank makes them in the same order.
    ``Session(writer=factory)`` plugs one in (``WriterFactory``): a wrapper of coci's own
    writers, or a format of your own whose commit record declares ``format: <name>`` and whose
    reader is registered with [``register_reader``][coci.register_reader]. A writer must make a checkpoint visible only
    through ``coci.checkpoint.commit.publish`` (never half-written) and delete only what
    retention names.
    """

    def write(self, staged: StagedCheckpoint) -> Path: ...

    def retain(self, policy: RetentionPolicy | None, trusted: frozenset[int]) -> list[int]: ...


class CheckpointReader(Protocol):
    """Reads committed checkpoints in one format; every method raises CorruptCheckpointError on
    damage, and nothing outside the checkpoint directory is read.

    To load a checkpoint directory, ``load_committed`` calls:

    1. ``read_record(path)``: parse and check the commit record (no data file is read). Under
       ``torch.distributed`` only rank 0 calls it; the other ranks rebuild the same record from its
       JSON with ``record_type``, so every rank uses the one record rank 0 read.
    2. ``load(path, record, context, targets)``: verify the data files this process reads (sizes,
       crc32) and load them into a state tree; collective when ``context`` is given. ``targets``
       is a partial state tree whose DTensors say where sharded tensors go (mesh and placements,
       ``coci.checkpoint.sharded``); the reader loads into fresh DTensors like them.

    ``verify(path)`` checks a checkpoint completely without loading it (``coci verify``), and
    ``load_entry(path, record, keys)`` returns one entry of the saved tree (``keys`` is its path
    of dict keys, e.g. ``(SESSION_KEY, "profiler")``) or None, in one process, reading no more of
    the data than the format requires (used by the report for the profiler's loss trace).
    """

    @property
    def record_type(self) -> type[CommitRecord]: ...

    def read_record(self, path: Path) -> CommitRecord: ...

    def load(
        self, path: Path, record: CommitRecord, context: DistributedContext | None, targets: Mapping[str, Any] | None = None
    ) -> LoadedCheckpoint: ...

    def verify(self, path: Path) -> CommitRecord: ...

    def load_entry(self, path: Path, record: CommitRecord, keys: tuple[str, ...]) -> Any | None: ...


#: The reader of each format, by the ``format`` its commit record declares ([``register_reader``][coci.register_reader]).
_READERS: dict[str, CheckpointReader] = {records.LOCAL_FORMAT: LocalReader(), DCP_FORMAT: DcpReader()}
#: coci's own formats: their readers are never replaced (every restore's safety rests on them).
_BUILT_IN_FORMATS = frozenset(_READERS)

#: Builds a session's writer: ``factory(checkpoints_root, context)``, with ``context`` None in one
#: process (see ``writer_for``, the default).
WriterFactory: TypeAlias = Callable[[Path, DistributedContext | None], CheckpointWriter]

#: What ``on_error`` accepts.
ON_ERROR: tuple[str, ...] = ("raise", "log")
#: Where a persist may run (``IOConfig.persist``).
PERSIST_MODES: tuple[str, ...] = ("thread", "process")


@dataclass(frozen=True)
class IOConfig:
    """How the run directory is shared, what a failed background write does and what a resume that
    is not exact does."""

    on_error: str = "raise"
    """A failed background persist: ``"raise"`` (PersistError at the next ``step``/``close``) or ``"log"`` (always in ``events.jsonl``)."""

    run_dir_layout: str = "auto"
    """Under ``torch.distributed``: ``"auto"`` (probed), ``"shared"`` (one directory for every rank) or ``"node-local"`` (each host its own)."""

    writer: WriterFactory | None = None
    """Builds each checkpoint's [``coci.CheckpointWriter``][coci.CheckpointWriter] as ``writer(checkpoints_root, context)``; None: coci's (its format, DCP under ``torch.distributed``)."""

    persist: str | None = None
    """Where checkpoint files are written: ``"thread"`` (a background thread) or ``"process"`` (a helper process, ``coci.checkpoint.persist_process``); None: ``knobs.PERSIST_MODE``."""

    peer_host: str | None = None
    """With peer copies: the address each node's peer server listens on and advertises; None: its address on the route to ``MASTER_ADDR``."""

    on_mismatch: str = "warn"
    """A step redone after a restore whose loss differs from the one logged before the failure
    (``coci.resume_check``): ``"warn"`` (a ``coci.ResumeMismatchWarning`` and a ``resume_mismatch``
    event), ``"raise"`` (``coci.ResumeMismatchError`` at that ``step()``, after the event) or ``"ignore"`` (no check)."""

    def __post_init__(self) -> None:
        if self.on_mismatch not in ON_MISMATCH:
            raise ConfigError(f"on_mismatch must be one of {', '.join(map(repr, ON_MISMATCH))}, got {self.on_mismatch!r}")
        if self.persist is not None:
            _check_persist(self.persist, "persist")
        if self.writer is not None and not callable(self.writer):
            raise ConfigError(f"writer must be a callable (root, context) -> CheckpointWriter, got {self.writer!r}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be 'raise' or 'log', got {self.on_error!r}")
        if self.run_dir_layout not in distributed.RUN_DIR_LAYOUTS:
            layouts = ", ".join(distributed.RUN_DIR_LAYOUTS)
            raise ConfigError(f"run_dir_layout must be one of {layouts}, got {self.run_dir_layout!r}")
        if self.peer_host is not None and not (isinstance(self.peer_host, str) and self.peer_host.strip()):
            raise ConfigError(f"peer_host must be a host name or address, or None, got {self.peer_host!r}")

    def persist_mode(self) -> str:
        """Where the persist runs: ``persist``, else ``knobs.PERSIST_MODE`` (checked as ``persist`` is)."""
        return self.persist or _check_persist(knobs.PERSIST_MODE, "coci.knobs.PERSIST_MODE")


def _check_persist(mode: str, field: str) -> str:
    if mode not in PERSIST_MODES:
        raise ConfigError(f"persist must be one of {PERSIST_MODES}, got {mode!r} ({field})")
    return mode


def register_reader(name: str, reader: CheckpointReader) -> None:
    """Read checkpoints whose commit record declares ``format: name`` with ``reader`` (a writer of
    a format of your own, ``Session(writer=...)``, registers its reader here). ConfigError for a
    built-in format (``coci``, ``dcp``), an empty name, or an object that is not a reader."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"reader format name must be a non-empty string, got {name!r}")
    if name in _BUILT_IN_FORMATS:
        raise ConfigError(f"reader format {name!r} is coci's own; register a reader under a name of your format")
    missing = [method for method in _READER_METHODS if not callable(getattr(reader, method, None))]
    if missing or not isinstance(getattr(reader, "record_type", None), type):
        lacks = ", ".join(missing + ([] if isinstance(getattr(reader, "record_type", None), type) else ["record_type"]))
        raise ConfigError(f"reader for format {name!r} must be a CheckpointReader; {type(reader).__name__} lacks {lacks}")
    _READERS[name] = reader


#: What [``register_reader``][coci.register_reader] checks a reader has (and ``record_type``, a class).
_READER_METHODS = ("read_record", "load", "verify", "load_entry")


def reader_for(path: Path) -> CheckpointReader:
    """The reader of the format the commit record in ``path`` declares (``coci.checkpoint.record_reads.record_format``)."""
    return reader_named(record_reads.record_format(path), path)


def reader_named(declared: str, path: Path) -> CheckpointReader:
    """The reader registered for format ``declared``; CorruptCheckpointError naming ``path`` when none is."""
    reader = _READERS.get(declared)
    if reader is None:
        raise CorruptCheckpointError(f"{path}: unknown checkpoint format {declared!r}")
    return reader


def writer_for(root: Path, context: DistributedContext | None) -> CheckpointWriter:
    """The writer for a job: coci's own format in one process, DCP's under ``torch.distributed``
    (any world size, so a job keeps one format when it shrinks to one process and grows back)."""
    return LocalWriter(root) if context is None else DcpWriter(root, context)


def restore_candidates(root: Path, context: DistributedContext | None) -> list[tuple[int, Path]]:
    """Every ``step_<n>`` directory, newest first, damaged ones included so each is reported;
    stale temporaries are removed first. Listed by rank 0 under ``torch.distributed`` (collective)."""

    def listing() -> tuple[list[tuple[int, str]], str | None]:
        try:
            layout.remove_stale_tmp(root)
            return [(step, str(path)) for step, path in reversed(layout.step_dirs(root))], None
        except CorruptCheckpointError as exc:  # a link in place of the root: every rank hears of it
            return [], str(exc)

    found, problem = distributed.from_coordinator(listing, context)
    if problem is not None:
        raise CorruptCheckpointError(problem)
    return [(step, Path(path)) for step, path in found]


def load_entry(path: Path, keys: tuple[str, ...]) -> Any | None:
    """One entry of the tree saved in ``path`` (None where it has none), in whichever format."""
    reader = reader_for(path)
    return reader.load_entry(path, reader.read_record(path), keys)


def load_committed(
    path: Path, context: DistributedContext | None, targets: Mapping[str, Any] | None = None
) -> LoadedCheckpoint:
    """Verify and load the checkpoint in ``path``, in whichever format it was written.

    Collective under ``torch.distributed``: rank 0 reads the commit record and every rank uses it.
    ``targets``: see ``CheckpointReader.load``.
    """

    def read() -> tuple[str, str | None, str | None]:
        declared = record_reads.record_format(path)
        try:
            return declared, reader_named(declared, path).read_record(path).model_dump_json(), None
        except (CorruptCheckpointError, OSError) as exc:  # every rank must hear of it
            return declared, None, str(exc)

    if context is None:
        reader = reader_for(path)
        return reader.load(path, reader.read_record(path), None, targets)
    if context.node_local:
        return _load_node_parts(path, context, targets)
    declared, record_json, problem = distributed.from_coordinator(read, context)
    if record_json is None:
        raise CorruptCheckpointError(problem or f"{path}: unreadable")
    reader = reader_named(declared, path)
    record = reader.record_type.model_validate_json(record_json)
    _check_whole(path, record, context)
    return reader.load(path, record, context, targets)


def _check_whole(path: Path, record: CommitRecord, context: DistributedContext) -> None:
    """IncompleteCheckpointError when one shared run directory holds only a node's part of a
    checkpoint saved on node-local directories (its other nodes' files are elsewhere)."""
    node, nodes = getattr(record, "node", None), getattr(record, "nodes", None)
    if node is None:
        return
    raise IncompleteCheckpointError(
        f"{path} holds only node {node}'s part of a checkpoint saved on node-local run directories (nodes {nodes}); "
        f"this job ({context.world_size} ranks) reads one shared directory and needs the whole checkpoint: restart on "
        "the same nodes and ranks per node, each with its own directory, or pass remote= with the prefix the run "
        "promoted to (the whole checkpoint is fetched and resharded)"
    )
def _load_node_parts(path: Path, context: DistributedContext, targets: Mapping[str, Any] | None) -> LoadedCheckpoint:
    """``load_committed`` on node-local run directories: each rank reads the record of its own
    node's part, and the parts must be one checkpoint (the same ``commit_id``) before any loads."""
    declared, record, problem = record_reads.record_format(path), None, None
    try:
        record = reader_named(declared, path).read_record(path)
    except (CorruptCheckpointError, OSError) as exc:
        problem = str(exc)
    commit_id = None if record is None else checkpoint_id(record)
    parts = distributed.gather_objects((declared, commit_id, problem), context.control_group)
    problems = [p for _, _, p in parts if p]
    if problems:
        raise CorruptCheckpointError("; ".join(problems))
    if len({(d, c) for d, c, _ in parts}) != 1 or commit_id is None:
        ids = sorted({str(c) for _, c, _ in parts})
        raise CorruptCheckpointError(f"{path.name}: the nodes' parts are not one checkpoint (commit ids {ids})")
    assert record is not None
    return reader_named(declared, path).load(path, record, context, targets)


@dataclass(frozen=True)
class PersistResult:
    """What one finished persist measured."""

    step: int
    path: Path
    nbytes: int
    staging_seconds: float
    persist_seconds: float
    removed_steps: tuple[int, ...]


#: Beyond a persist's own deadline, how long a wait for it goes on (the helper's kill and the
#: worker's bookkeeping take this much at most).
_PERSIST_WAIT_SLACK_SECONDS: float = 30.0


class PendingCheckpoint:
    """Handle of one asynchronous checkpoint.

    ``staging_completion`` resolves when the state is safe in host memory (weights may change);
    ``upload_completion`` resolves with a ``PersistResult`` once the checkpoint is committed.
    """

    def __init__(self, step: int, nbytes: int, fence_event: Any, host_fence: bool, job: CopyJob | None = None) -> None:
        self.step = step
        self.job = job
        self.nbytes = nbytes
        self.overdue = False  # a wait for it already ran out its deadline: later waits only look
        self.host_fence = host_fence
        self.staging_completion: Future[None] = Future()
        self.upload_completion: Future[PersistResult] = Future()
        self.fence_event = fence_event
        self.device_wait: tuple[Any, Any] | None = None  # timing events around the first GPU fence

    def done(self) -> bool:
        return self.upload_completion.done()

    def wait(self) -> BaseException | None:
        """Wait for the persist to finish, at most its deadline (``persist_deadline_seconds``
        plus ``_PERSIST_WAIT_SLACK_SECONDS``) once: a later wait only looks. Its error, or None
        once committed. PersistError when it is still running (a write stuck in the kernel, which a
        thread cannot be made to leave: the staging arena stays in use), so each checkpoint after it
        is refused at once, never held for another deadline, until the write returns."""
        seconds = 0.0 if self.overdue else persist_deadline_seconds(self.nbytes) + _PERSIST_WAIT_SLACK_SECONDS
        try:
            return self.upload_completion.exception(timeout=seconds)
        except FutureTimeout:
            self.overdue = True
            raise PersistError(
                f"the checkpoint at step {self.step} is still persisting after its deadline (a write stuck in the kernel?); "
                "no checkpoint can start until it ends (coci.knobs.PERSIST_DEADLINE_SECONDS)"
            ) from None

    def device_wait_seconds(self, *, block: bool) -> float | None:
        """GPU time the compute stream spent waiting at this snapshot's first fence (0.0 when no
        GPU fence was met); None while the GPU has not passed that fence yet, unless ``block``,
        which then waits for it (an event wait, never a device-wide sync)."""
        if self.device_wait is None:
            return 0.0
        arrived, resumed = self.device_wait
        if not resumed.query():
            if not block:
                return None
            resumed.synchronize()
        return float(arrived.elapsed_time(resumed)) / 1e3


class Checkpointer:
    """Owns the staging arena and the background worker; ``writer`` owns the checkpoint directory.

    The local [``StorageLevel``][coci.checkpoint.storage_level.StorageLevel]: the level each
    checkpoint commits to, so ``promote`` and ``promote_always`` have nothing to do."""

    #: The level's name (``StorageLevel.name``).
    name = "local"

    def __init__(
        self,
        writer: CheckpointWriter,
        events: EventLog,
        retention: RetentionPolicy | None,
        clock: Callable[[], float],
        persist: str = "thread",
    ) -> None:
        self.events = events
        self.retention = retention
        self.clock = clock
        self.persist = persist if isinstance(writer, LocalWriter) else "thread"
        self.arena = StagingArena(shared=self.persist == "process")
        self.writer: CheckpointWriter = writer
        if self.persist == "process":
            assert isinstance(writer, LocalWriter)
            self.writer = process_writer = ProcessWriter(writer.root, self.arena)
            process_writer.start()  # now: its imports overlap training, not the first checkpoint
        if persist != "thread":  # where the persist runs, and the helper's id (or why it stayed a thread)
            events.emit("persist_mode", step=0, requested=persist, mode=self.persist, pid=self.persist_pid)
        self._executor: ThreadPoolExecutor | None = None
        self.pending: PendingCheckpoint | None = None
        self._trusted: set[int] = set()  # steps known to load: committed here or restored from
        self.newest_step: int | None = None  # the newest step committed here or restored (StorageLevel.newest_step)
        self._shard_specs: dict[int, tuple[Any, ...]] = {}  # the last checkpoint's, for local_shards
        self._retention_problem: str | None = None  # the last failure of the retention policy, recorded once

    @property
    def persist_pid(self) -> int | None:
        """The persist process's id (``persist="process"``; None with the thread)."""
        return self.writer.pid if isinstance(self.writer, ProcessWriter) else None

    def trust(self, step: int) -> None:
        """Count ``step`` (the checkpoint a restore loaded) as good for retention."""
        self._trusted.add(step)
        self.newest_step = max(step, self.newest_step or step)

    def restored(self, step: int, path: Path, source: str) -> None:
        """A restore loaded ``step`` (from any level): it counts for retention (``trust``)."""
        self.trust(step)

    #: Nothing is sent to the local level: its commits are the session's ``checkpoint_steps``.
    sent_steps: Collection[int] = ()

    def promote(self, step: int, path: Path, plan: LevelPlan | None) -> None:
        """Nothing: ``step`` committed to this level."""

    def promote_always(self, step: int, plan: LevelPlan | None) -> None:
        """Nothing: every checkpoint commits to this level."""

    def start(
        self,
        step: int,
        tree: dict[str, Any],
        fenced_ptrs: set[int],
        *,
        epoch: int | None,
        state_keys: list[str],
        reason: str = "request",
    ) -> PendingCheckpoint:
        """Begin a checkpoint of ``tree`` at ``step``; returns once training may go on. ``reason``
        (why it was taken) goes into the ``snapshot_start`` event."""
        if self.pending is not None:
            self.pending.wait()  # a failure was recorded by the worker; PersistError if it never ends
        tensors: list[torch.Tensor] = []
        skeleton = flatten(tree, tensors)
        tensors, shards = local_shards(tensors, self._shard_specs)  # sharded state: this rank's shards only
        views = self.arena.prepare(tensors)
        slots = list(self.arena.slots)
        copy_began = self.clock()
        job = CopyJob(tensors, views, [t.data_ptr() in fenced_ptrs for t in tensors])  # unfenced: copied here
        eager_seconds = self.clock() - copy_began
        nbytes = self.arena.nbytes
        pending = PendingCheckpoint(step, nbytes, job.fence_event, job.has_cpu_copies, job)
        self.events.emit("snapshot_start", step=step, bytes=nbytes, reason=reason)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coci-persist")
        staged = StagedCheckpoint(step, self.arena.payload(), slots, skeleton, epoch, state_keys, shards)
        self._executor.submit(self._run, pending, job, staged, eager_seconds)
        self.pending = pending
        return pending

    def _run(self, pending: PendingCheckpoint, job: CopyJob, staged: StagedCheckpoint, eager_seconds: float) -> None:
        """Copy the fenced tensors, write, commit, retain. The snapshot's ``seconds`` are every copy
        of it: the eager ones made inside ``start()`` (training waited: part of the stall) plus these."""
        began = self.clock() - eager_seconds
        try:
            job.run_cpu()
            copied = self.clock()
            pending.staging_completion.set_result(None)
            self.events.emit(
                "snapshot_end", step=pending.step, seconds=copied - began, eager_seconds=eager_seconds, bytes=pending.nbytes
            )
            path = self.writer.write(staged)
            committed = self.clock()
            self.events.emit("commit", step=pending.step, seconds=committed - copied, bytes=pending.nbytes, path=str(path))
            self.trust(pending.step)
            removed = self._retain(pending.step)
            self._trusted.difference_update(removed)
            if removed:
                self.events.emit("retention", step=pending.step, removed=removed)
            pending.upload_completion.set_result(
                PersistResult(pending.step, path, pending.nbytes, copied - began, committed - copied, tuple(removed))
            )
        except BaseException as exc:  # recorded and surfaced by the session, never swallowed
            logger.error("checkpoint at step %d failed: %s", pending.step, exc)
            if not pending.staging_completion.done():
                pending.staging_completion.set_exception(exc)
            pending.upload_completion.set_exception(exc)  # first: whatever the log does, the checkpoint is finished
            try:
                self.events.emit("error", step=pending.step, phase="persist", message=f"{type(exc).__name__}: {exc}")
            except Exception as log_error:  # the log itself refused (a run file replaced): logged only
                logger.error("cannot record the failure of step %d: %s", pending.step, log_error)

    def _retain(self, step: int) -> list[int]:
        """Apply retention after the commit of ``step``; a policy that raises (the caller's object)
        never fails the commit: nothing is deleted, and the error is logged and recorded (an
        ``error`` event, ``phase: "retention"``) once while it stays the same."""
        try:
            return self.writer.retain(self.retention, frozenset(self._trusted))
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._retention_problem:
                self._retention_problem = problem
                logger.error("retention after step %d failed (nothing deleted; the checkpoint stands): %s", step, problem)
                self.events.emit("error", step=step, phase="retention", message=problem)
            return []

    def wait_staging(self) -> float:
        """Block until the in-flight snapshot is copied; return the seconds waited."""
        pending = self.pending
        if pending is None or pending.staging_completion.done():
            return 0.0
        began = self.clock()
        pending.staging_completion.exception()
        return self.clock() - began

    def fence(self) -> float:
        """Called before weights change: a GPU-side wait for CUDA copies, a host wait for CPU ones.
        Returns the host's wait; the GPU's is timed by events read later (``device_wait_seconds``)."""
        pending = self.pending
        if pending is None:
            return 0.0
        if pending.fence_event is not None:
            stream = torch.cuda.current_stream()
            if pending.device_wait is None:  # the first fence waits; later ones find the copy done
                arrived = torch.cuda.Event(enable_timing=True, blocking=True)
                arrived.record(stream)
                stream.wait_event(pending.fence_event)
                resumed = torch.cuda.Event(enable_timing=True, blocking=True)
                resumed.record(stream)
                pending.device_wait = (arrived, resumed)
            else:
                stream.wait_event(pending.fence_event)
        if not pending.host_fence or pending.staging_completion.done():
            return 0.0
        began = self.clock()
        if pending.job is not None:
            pending.job.finish_cpu_copies()  # copy what the worker has not reached, here; no hand-off
        else:
            pending.staging_completion.exception()
        return self.clock() - began

    def close(self, step: int | None = None, failing: bool = False) -> PersistError | None:
        """Wait for the last persist (at most its deadline: ``PendingCheckpoint.wait``) and
        stop the worker; a persist that never ends is left behind (its arena kept) and returned
        (``step`` and ``failing``: ``StorageLevel.close``'s, not needed here)."""
        stuck = None
        if self.pending is not None:
            try:
                self.pending.wait()
            except PersistError as exc:
                logger.error("%s", exc)
                stuck = exc
        if self._executor is not None:
            self._executor.shutdown(wait=stuck is None)
            self._executor = None
        if isinstance(self.writer, ProcessWriter):
            self.writer.close()
        if stuck is None:  # a write still running reads the arena
            self.arena.close()
        return stuck

    def __del__(self) -> None:  # best effort: never leave the worker thread behind
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False)
