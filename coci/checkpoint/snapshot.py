"""Phase one of a checkpoint: copy state tensors into reused host buffers (the snapshot stage).

All tensors of a checkpoint are staged in one host *arena*: a flat uint8 buffer allocated at the
first checkpoint (pinned when CUDA tensors are staged), pre-faulted, and reused by every later
checkpoint. Each tensor gets a typed view at an aligned offset, and staging is
``view.copy_(tensor)``: no clone, no deepcopy, no per-save allocation. The arena grows only when
the state itself grows (for example when an optimizer creates its state at its first step), never
per checkpoint. The persist stage writes
the arena's bytes as they lie, so the file layout equals the memory layout.

CUDA tensors are copied with ``non_blocking=True``: those the optimizer fence protects on a side
stream that first waits for the current stream, everything else on the current stream (a later
forward may change it, and stream order puts the copy first). Completion is an event, waited on
without spinning.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import operator
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from coci import knobs
from coci.checkpoint.sharded import ShardSpec

logger = logging.getLogger(__name__)

#: The fixed part of an arena's growth, next to ``knobs.ARENA_GROWTH_FRACTION`` of the bytes needed:
#: small metadata that lengthens from checkpoint to checkpoint does not force a new allocation each time.
_ARENA_GROWTH_BYTES: int = 1 << 20


#: Byte alignment of every tensor inside the staging arena and the data file. 64 covers every
#: dtype's alignment and a cache line.
_ARENA_ALIGN_BYTES: int = 64


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the arena (and in the data file)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class StagedCheckpoint:
    """One snapshot as a [``coci.checkpoint.checkpointer.CheckpointWriter``][coci.CheckpointWriter] receives it: the
    arena's bytes, where each tensor of the flattened ``skeleton`` lies in them, and the record's
    fields. Valid until the next snapshot reuses the arena. ``shards`` holds, by tensor index, the
    DTensor each staged local shard belongs to (sharded state only)."""

    step: int
    payload: memoryview
    slots: list[TensorSlot]
    skeleton: Any
    epoch: int | None
    state_keys: list[str]
    shards: dict[int, ShardSpec] = field(default_factory=dict)


def plan_layout(tensors: Sequence[torch.Tensor], align: int | None = None) -> list[TensorSlot]:
    """Assign each tensor an offset aligned to ``align`` (default ``_ARENA_ALIGN_BYTES``, read
    at call time); a pure function of dtypes and shapes."""
    align = _ARENA_ALIGN_BYTES if align is None else align
    slots: list[TensorSlot] = []
    offset = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        slots.append(TensorSlot(tensor.dtype, tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // align) * align
    return slots


def layout_bytes(slots: Sequence[TensorSlot]) -> int:
    """Bytes the arena needs for ``slots`` (end of the last slot)."""
    return max((s.offset + s.nbytes for s in slots), default=0)


def _replan(previous: list[TensorSlot], tensors: Sequence[torch.Tensor]) -> list[TensorSlot]:
    """``plan_layout`` of ``tensors``, reusing each slot of ``previous`` that is unchanged (the
    same object, so a caller can keep its view); ``previous`` itself when every slot is."""
    align = _ARENA_ALIGN_BYTES
    slots: list[TensorSlot] = []
    offset = 0
    for index, tensor in enumerate(tensors):
        nbytes = tensor.nbytes
        old = previous[index] if index < len(previous) else None
        if old is None or old.offset != offset or old.nbytes != nbytes or old.dtype != tensor.dtype or old.shape != tensor.shape:
            old = TensorSlot(tensor.dtype, tuple(tensor.shape), offset, nbytes)
        slots.append(old)
        offset += -(-nbytes // align) * align
    if len(slots) == len(previous) and all(map(operator.is_, slots, previous)):
        return previous
    return slots


class StagingArena:
    """A host buffer allocated once and reused for every snapshot.

    ``allocations`` counts real allocations; a stable state reuses the same memory forever
    (tested through data pointers and RSS). A ``shared`` arena lies in an anonymous shared-memory
    file (``SharedBuffer``) that a persist process maps too (``Session(persist="process")``).
    """

    def __init__(self, shared: bool = False) -> None:
        self._buffer: torch.Tensor | None = None
        self._nbytes = 0
        self._slots: list[TensorSlot] = []
        self._views: list[torch.Tensor] = []
        self.allocations = 0
        self.shared = shared
        self.shared_buffer: SharedBuffer | None = None  # the shared arena's memory file (shared only)

    @property
    def capacity(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    @property
    def buffer_ptr(self) -> int:
        """Address of the arena (stable while no reallocation happens)."""
        return 0 if self._buffer is None else self._buffer.data_ptr()

    @property
    def slots(self) -> list[TensorSlot]:
        return self._slots

    def prepare(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Return one staging view per tensor, reallocating only if the state outgrew the arena.

        A tensor whose slot is unchanged (same index, offset, dtype and shape) keeps its view: a
        state whose small arrays grow between checkpoints (the profiler's history) rebuilds the
        views of those arrays only, not of everything after them.
        """
        slots = _replan(self._slots, tensors)
        if slots is self._slots:
            return self._views
        needed = layout_bytes(slots)
        pin = any(t.is_cuda for t in tensors) and torch.cuda.is_available()
        buffer = self._buffer
        if buffer is None or buffer.numel() < needed or (pin and not buffer.is_pinned()):
            buffer = self._allocate(arena_bytes(needed, pin), pin)
            buffer.fill_(0)  # fault the pages in now, not during the first snapshot's copy
            self.allocations += 1
            logger.debug("staging arena allocated: %d bytes (pinned=%s)", needed, pin)
        old = dict(zip(map(id, self._slots), self._views)) if buffer is self._buffer else {}
        self._buffer = buffer
        self._views = [_reused(old.get(id(slot)), buffer, slot) for slot in slots]
        self._slots = slots
        self._nbytes = needed
        return self._views

    def _allocate(self, size: int, pin: bool) -> torch.Tensor:
        if not self.shared:
            return aligned_empty(size, pin)
        if self.shared_buffer is not None:
            self.shared_buffer.close()  # the old views keep their mapping; only the file handle goes
        self.shared_buffer = SharedBuffer(size, pin)
        return self.shared_buffer.tensor

    def close(self) -> None:
        """Release the shared memory file's handle (the buffer lives on while views of it do)."""
        if self.shared_buffer is not None:
            self.shared_buffer.close()

    @property
    def nbytes(self) -> int:
        """Bytes the current layout takes (``layout_bytes`` of ``slots``)."""
        return self._nbytes

    def payload(self) -> memoryview:
        """The staged bytes, as they will be written."""
        if self._buffer is None:
            return memoryview(b"")
        return self._buffer.numpy().data[: self._nbytes]


def arena_bytes(needed: int, pin: bool = False) -> int:
    """Bytes to allocate for a layout of ``needed`` bytes, with room to grow
    (``knobs.ARENA_GROWTH_FRACTION`` plus ``_ARENA_GROWTH_BYTES``). Where that size puts the
    arena on huge pages (``aligned_empty``'s rule), it is resident in whole huge pages, so the
    room is rounded to them instead: every huge-page arena is a whole number of huge pages, and its
    staging memory stays within 1.1x of ``needed`` (``tests/unit/test_perf_paths.py``)."""
    grown = int(needed * (1 + knobs.ARENA_GROWTH_FRACTION))
    if not _uses_huge_pages(grown + _ARENA_GROWTH_BYTES, pin):
        return grown + _ARENA_GROWTH_BYTES
    return max(_whole_huge_pages(grown), _whole_huge_pages(knobs.HUGE_PAGE_MIN_BYTES))


def _whole_huge_pages(size: int) -> int:
    return -(-size // knobs.HUGE_PAGE_BYTES) * knobs.HUGE_PAGE_BYTES


def _uses_huge_pages(size: int, pin: bool) -> bool:
    return not pin and knobs.ARENA_HUGE_PAGES and size >= knobs.HUGE_PAGE_MIN_BYTES and _HUGE_PAGES_ADVISABLE


def aligned_empty(size: int, pin: bool = False) -> torch.Tensor:
    """A uint8 buffer of ``size`` bytes starting at a ``knobs.DIRECT_IO_ALIGN_BYTES`` boundary, so the
    persist stage can hand it to O_DIRECT writes and reads (pinned memory is page-aligned already).

    A host buffer of at least ``knobs.HUGE_PAGE_MIN_BYTES`` is an anonymous mapping advised to use
    transparent huge pages (``knobs.ARENA_HUGE_PAGES``): the kernel then pins 2 MB pages for each
    O_DIRECT transfer instead of 4 KB ones, which cut the persist's system CPU for 192 MB from
    about 13 ms to 3 ms and the copy into the arena by a tenth (benchmarks/results/2026-11-23.md, Performance II
    and Sharded training).
    """
    if _uses_huge_pages(size, pin):
        return huge_page_empty(size)
    align = knobs.DIRECT_IO_ALIGN_BYTES
    raw = torch.empty(size + align, dtype=torch.uint8, pin_memory=pin)
    start = -raw.data_ptr() % align
    return raw[start : start + size]


_HUGE_PAGES_ADVISABLE = hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS")


def huge_page_empty(size: int) -> torch.Tensor:
    """``size`` bytes of an anonymous private mapping, starting at a ``knobs.HUGE_PAGE_BYTES``
    boundary and advised ``MADV_HUGEPAGE``; the tensor keeps the mapping alive (it is unmapped when
    the last view is freed). Where the kernel declines the advice the pages are simply small ones."""
    page = knobs.HUGE_PAGE_BYTES
    mapping = mmap.mmap(-1, size + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _advise_huge_pages(mapping)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # holds a reference to the mapping
    start = -raw.data_ptr() % page
    return raw[start : start + size]


class SharedBuffer:
    """A host buffer in an anonymous shared-memory file (``memfd_create``) that another process can
    map from the file descriptor (sent over a Unix socket): no name in ``/dev/shm``, so nothing is
    left behind when both processes die. Page-aligned, so O_DIRECT writes can read it directly.
    With ``pin`` (CUDA state) the mapping is registered with CUDA as page-locked memory, so
    device-to-host copies into it stay asynchronous."""

    def __init__(self, size: int, pin: bool = False) -> None:
        self.size = max(size, 1)
        self.fd: int | None = os.memfd_create("coci-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            mapping = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED)
        except OSError:
            os.close(self.fd)
            raise
        if knobs.ARENA_HUGE_PAGES and size >= knobs.HUGE_PAGE_MIN_BYTES and _HUGE_PAGES_ADVISABLE:
            _advise_huge_pages(mapping)  # taken where shmem huge pages are "advise" (often "never")
        self.tensor = torch.frombuffer(mapping, dtype=torch.uint8)[:size]  # holds a reference to the mapping
        if pin and size:
            _register_pinned(self.tensor)
        self.generation = next(_GENERATIONS)  # tells a persist process that holds an older one to remap

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_GENERATIONS = itertools.count(1)


def _register_pinned(buffer: torch.Tensor) -> None:
    """Page-lock ``buffer`` for CUDA (``cudaHostRegister``); where CUDA refuses, copies into it are
    synchronous, which is logged."""
    code = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0)
    if int(code) != 0:
        logger.warning("cudaHostRegister of the shared staging arena failed (%s): device copies into it block", code)


def _advise_huge_pages(mapping: mmap.mmap) -> None:
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError as exc:  # a kernel without transparent huge pages: small pages
        logger.debug("MADV_HUGEPAGE refused (%s); the arena uses small pages", exc)


def _reused(view: torch.Tensor | None, buffer: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    return _typed_view(buffer, slot) if view is None else view


def _typed_view(buffer: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    raw = buffer[slot.offset : slot.offset + slot.nbytes]
    if slot.nbytes == 0:
        return torch.empty(slot.shape, dtype=slot.dtype)
    return raw.view(slot.dtype).view(slot.shape)


class CopyJob:
    """Stage tensors into their views: CPU copies run where ``run_cpu`` is called (a background
    thread), CUDA copies are enqueued at construction and awaited through events.

    The fenced CPU copies are shared work: ``run_cpu`` (the persist worker) and ``finish_cpu_copies``
    (the training thread at the optimizer fence) both claim the next uncopied tensor until none is
    left, so a fence reached before the worker finished copies the rest itself instead of waiting
    for a thread hand-off (on a busy machine a wake-up can cost more than the copy). When the
    worker makes the last copy while a fence waits, it lets the fence go before it goes on (see
    ``run_cpu``).
    """

    def __init__(self, sources: Sequence[torch.Tensor], views: Sequence[torch.Tensor], fenced: Sequence[bool]) -> None:
        self._cpu_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._events: list[torch.cuda.Event] = []
        self.fence_event: torch.cuda.Event | None = None
        cuda_fenced: list[tuple[torch.Tensor, torch.Tensor]] = []
        cuda_eager: list[tuple[torch.Tensor, torch.Tensor]] = []
        for source, view, is_fenced in zip(sources, views, fenced):
            if source.is_cuda:
                (cuda_fenced if is_fenced else cuda_eager).append((view, source))
            elif is_fenced:
                self._cpu_pairs.append((view, source))
            else:
                view.copy_(source)  # not protected by the fence: copy before training goes on
        self._lock = threading.Lock()
        self._next_pair = 0
        self._pending_pairs = len(self._cpu_pairs)
        self._cpu_done = threading.Event()
        self._fence_waiting = False  # a fence is in finish_cpu_copies (set under the lock)
        self._fence_released = threading.Event()  # that fence holds the interpreter again
        self._cpu_error: BaseException | None = None
        if not self._cpu_pairs:
            self._cpu_done.set()
        if cuda_eager:
            for view, source in cuda_eager:
                view.copy_(source, non_blocking=True)
            event = torch.cuda.Event(blocking=True)  # synchronize() sleeps, never spins a core
            event.record()
            self._events.append(event)
        if cuda_fenced:
            side = _side_stream(cuda_fenced[0][1].device)
            side.wait_stream(torch.cuda.current_stream(cuda_fenced[0][1].device))
            with torch.cuda.stream(side):
                for view, source in cuda_fenced:
                    view.copy_(source, non_blocking=True)
                    source.record_stream(side)
                event = torch.cuda.Event(blocking=True)  # synchronize() sleeps, never spins a core
                event.record(side)
            self._events.append(event)
            self.fence_event = event

    @property
    def has_cpu_copies(self) -> bool:
        """True when fenced CPU tensors remain to copy (the fence must then wait on the host)."""
        return bool(self._cpu_pairs)

    @property
    def cpu_copies_done(self) -> bool:
        return self._cpu_done.is_set()

    def run_cpu(self) -> None:
        """Copy the fenced CPU tensors (sharing them with a fence that arrives meanwhile), then wait
        for the CUDA copies (blocking, no spin). Raises the first copy error of any thread."""
        self._copy_claimed()
        self._cpu_done.wait()
        with self._lock:
            fence_waiting = self._fence_waiting
        if fence_waiting:  # the GIL goes to the fence now, not after the write's Python (up to 5 ms)
            self._fence_released.wait()
        if self._cpu_error is not None:
            raise self._cpu_error
        for event in self._events:
            event.synchronize()

    def finish_cpu_copies(self) -> None:
        """The host side of the fence: copy the fenced CPU tensors nobody has claimed yet on the
        calling thread, then wait until every CPU copy is done. Never raises: a copy error is
        re-raised by ``run_cpu`` on the worker, which reports it through the checkpoint's futures.

        The worker waits for this call to return before it goes on to write: otherwise, having
        made the last copy, it would run the write's Python holding the GIL, and the woken fence
        would wait for the interpreter's switch interval (5 ms) for it.
        """
        with self._lock:
            self._fence_waiting = True
        try:
            self._copy_claimed()
            self._cpu_done.wait()
        finally:
            self._fence_released.set()

    def _copy_claimed(self) -> None:
        while True:
            with self._lock:
                index = self._next_pair
                if index >= len(self._cpu_pairs) or self._cpu_error is not None:
                    return
                self._next_pair = index + 1
            view, source = self._cpu_pairs[index]
            try:
                view.copy_(source)
            except BaseException as exc:  # recorded for run_cpu; the remaining copies are abandoned
                with self._lock:
                    self._cpu_error = self._cpu_error or exc
                    self._cpu_done.set()
                return
            with self._lock:
                self._pending_pairs -= 1
                if self._pending_pairs == 0:
                    self._cpu_done.set()


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = torch.cuda.Stream(device=device)
        _SIDE_STREAMS[device] = stream
    return stream
