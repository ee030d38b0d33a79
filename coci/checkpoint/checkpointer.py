"""Two-phase checkpoint orchestration: snapshot, then background persist and commit.

profiler -> plan -> **snapshot -> persist** -> report. ``Checkpointer.start`` runs on the training
thread: it waits for the previous persist (at most one in flight, since the staging arena is
reused), flattens the state tree, copies what the optimizer fence does not protect, and hands the
rest to a single background worker. The worker copies the fenced tensors (overlapping the next
forward/backward), resolves ``staging_completion``, writes and commits the files, applies
retention and resolves ``upload_completion`` (the futures mirror DCP's ``async_save``).

Persist runs in a thread, not a process: ``os.write``, ``zlib.crc32``, ``os.fsync`` and
``Tensor.copy_`` all release the GIL, so the thread contends for cores, not for the interpreter;
a process would add a shared-memory hand-off for the same syscalls (see benchmarks/README.md).
A failure in the worker is logged, written to ``events.jsonl`` and set on the futures; the
previous committed checkpoint is untouched because nothing becomes visible before the rename.

Persist backend seam: by default the worker writes coci's own format (``storage.write_checkpoint``,
then retention). A :class:`PersistBackend` given to the constructor replaces exactly that part
(write, commit, retention) and nothing else: the snapshot, the fence and the futures are the same.
``coci.distributed.DcpPersist`` is the one used under ``torch.distributed``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from coci.checkpoint import storage
from coci.checkpoint.snapshot import CopyJob, StagingArena, layout_bytes
from coci.checkpoint.tree import flatten
from coci.events import EventLog

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PersistResult:
    """What one finished persist measured."""

    step: int
    path: Path
    nbytes: int
    staging_seconds: float
    persist_seconds: float
    removed_steps: tuple[int, ...]


class PersistBackend(Protocol):
    """Writes and commits one staged checkpoint (runs on the background worker).

    ``payload`` is the staging arena's bytes, ``slots`` where each tensor of the flattened
    ``skeleton`` lies in it. Returns the committed path and the steps retention removed.
    """

    def persist(
        self,
        step: int,
        payload: memoryview,
        slots: list[Any],
        skeleton: Any,
        *,
        epoch: int | None,
        state_keys: list[str],
    ) -> tuple[Path, list[int]]: ...


class PendingCheckpoint:
    """Handle of one asynchronous checkpoint.

    ``staging_completion`` resolves when the state is safe in host memory (weights may change);
    ``upload_completion`` resolves with a :class:`PersistResult` once the checkpoint is committed.
    """

    def __init__(self, step: int, nbytes: int, fence_event: Any, host_fence: bool, job: CopyJob | None = None) -> None:
        self.step = step
        self.job = job
        self.nbytes = nbytes
        self.host_fence = host_fence
        self.staging_completion: Future[None] = Future()
        self.upload_completion: Future[PersistResult] = Future()
        self.fence_event = fence_event

    def done(self) -> bool:
        return self.upload_completion.done()


class Checkpointer:
    """Owns the staging arena, the background worker and the checkpoint directory."""

    def __init__(
        self,
        run_dir: Path,
        events: EventLog,
        keep_last: int | None,
        clock: Callable[[], float],
        backend: PersistBackend | None = None,
    ) -> None:
        self.root = storage.checkpoints_dir(run_dir)
        self.backend = backend  # None: coci's own single-process format
        self.events = events
        self.keep_last = keep_last
        self.clock = clock
        self.arena = StagingArena()
        self._executor: ThreadPoolExecutor | None = None
        self.pending: PendingCheckpoint | None = None

    def start(
        self,
        step: int,
        tree: dict[str, Any],
        fenced_ptrs: set[int],
        *,
        epoch: int | None,
        state_keys: list[str],
    ) -> PendingCheckpoint:
        """Begin a checkpoint of ``tree`` at ``step``; returns once training may go on."""
        if self.pending is not None:
            self.pending.upload_completion.exception()  # wait; a failure was recorded by the worker
        tensors: list[torch.Tensor] = []
        skeleton = flatten(tree, tensors)
        views = self.arena.prepare(tensors)
        slots = list(self.arena.slots)
        job = CopyJob(tensors, views, [t.data_ptr() in fenced_ptrs for t in tensors])
        nbytes = layout_bytes(slots)
        pending = PendingCheckpoint(step, nbytes, job.fence_event, job.has_cpu_copies, job)
        self.events.emit("snapshot_start", step=step, bytes=nbytes)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coci-persist")
        self._executor.submit(self._run, pending, job, slots, skeleton, epoch, state_keys)
        self.pending = pending
        return pending

    def _run(
        self,
        pending: PendingCheckpoint,
        job: CopyJob,
        slots: list[Any],
        skeleton: Any,
        epoch: int | None,
        state_keys: list[str],
    ) -> None:
        began = self.clock()
        try:
            job.run_cpu()
            staged = self.clock()
            pending.staging_completion.set_result(None)
            self.events.emit("snapshot_end", step=pending.step, seconds=staged - began, bytes=pending.nbytes)
            if self.backend is not None:  # writes, commits and applies retention itself
                path, removed = self.backend.persist(
                    pending.step, self.arena.payload(), slots, skeleton, epoch=epoch, state_keys=state_keys
                )
                committed = self.clock()
                self.events.emit("commit", step=pending.step, seconds=committed - staged, bytes=pending.nbytes, path=str(path))
            else:
                path, _ = storage.write_checkpoint(
                    self.root, pending.step, self.arena.payload(), slots, skeleton, epoch=epoch, state_keys=state_keys
                )
                committed = self.clock()
                self.events.emit("commit", step=pending.step, seconds=committed - staged, bytes=pending.nbytes, path=str(path))
                removed = storage.apply_retention(self.root, self.keep_last)
            if removed:
                self.events.emit("retention", step=pending.step, removed=removed)
            pending.upload_completion.set_result(
                PersistResult(pending.step, path, pending.nbytes, staged - began, committed - staged, tuple(removed))
            )
        except BaseException as exc:  # recorded and surfaced by the session, never swallowed
            logger.error("checkpoint at step %d failed: %s", pending.step, exc)
            self.events.emit("error", step=pending.step, phase="persist", message=f"{type(exc).__name__}: {exc}")
            if not pending.staging_completion.done():
                pending.staging_completion.set_exception(exc)
            pending.upload_completion.set_exception(exc)

    def wait_staging(self) -> float:
        """Block until the in-flight snapshot is copied; return the seconds waited."""
        pending = self.pending
        if pending is None or pending.staging_completion.done():
            return 0.0
        began = self.clock()
        pending.staging_completion.exception()
        return self.clock() - began

    def fence(self) -> float:
        """Called before weights change: a GPU-side wait for CUDA copies, a host wait for CPU ones."""
        pending = self.pending
        if pending is None:
            return 0.0
        if pending.fence_event is not None:
            torch.cuda.current_stream().wait_event(pending.fence_event)
        if not pending.host_fence or pending.staging_completion.done():
            return 0.0
        began = self.clock()
        if pending.job is not None:
            pending.job.finish_cpu_copies()  # copy what the worker has not reached, here; no hand-off
        else:
            pending.staging_completion.exception()
        return self.clock() - began

    def close(self) -> None:
        """Wait for the last persist and stop the worker."""
        if self.pending is not None:
            self.pending.upload_completion.exception()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __del__(self) -> None:  # best effort: never leave the worker thread behind
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False)
