"""Fast, verified data-file I/O shared by every checkpoint format.

Large files are written and read in chunks with ``O_DIRECT`` where the filesystem allows it, and
their checksum is computed on a helper thread while the next chunk moves, so checksumming costs no
persist or restore time. New files get crc32c (hardware-accelerated by the ``crc32c`` package, about
5x zlib's crc32 here: benchmarks/results/2026-11-23.md, "Performance II"); files of older records are checked with
the crc32 they name. A file read back is checked against its recorded size and checksum before any
byte of it is used.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import crc32c
import numpy as np
import torch

from coci import knobs, safe_files
from coci.checkpoint import faults, record_reads, records
from coci.checkpoint.snapshot import aligned_empty
from coci.errors import CorruptCheckpointError

try:  # ISA-L's crc32 computes the same checksum as zlib's, ~5x faster (SIMD); optional, for old records
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the environment
    _crc32 = zlib.crc32

#: ``update(data, running_value) -> new value`` per algorithm a record may name.
_CHECKSUMS: dict[records.ChecksumAlgorithm, Callable[[memoryview | bytes, int], int]] = {
    "crc32c": crc32c.crc32c,
    "crc32": _crc32,
}

logger = logging.getLogger(__name__)


def write_file(path: Path, payload: memoryview, fault_point: str | None = None) -> records.FileEntry:
    """Write ``payload`` in chunks, fsync, and return its entry (size, crc32c); ``fault_point`` fires after the first chunk.

    Large page-aligned payloads (the staging arena) are written with ``O_DIRECT`` where the
    filesystem allows it: the device reads the arena itself, so the persist does not memcpy every
    byte into the page cache and leave the kernel to write it back, which on a 2-core machine costs
    the training loop several times the write (benchmarks/results/2026-11-22.md, P2/P3). The unaligned tail
    goes through the page cache. The checksum of each chunk is computed on a helper thread while
    the next chunk is written (both release the GIL), so it costs no persist time.
    """
    size = len(payload)
    fd, direct = open_for_write(path, payload)
    checksum = ChunkChecksum(records.WRITE_CHECKSUM, threaded=direct and knobs.WRITE_CHECKSUM_THREAD)
    try:
        chunk = io_chunk_bytes(direct)
        aligned_end = size - size % knobs.DIRECT_IO_ALIGN_BYTES if direct else size
        start = 0
        while start < size:
            if direct and start >= aligned_end:
                set_direct(fd, False)  # the tail is shorter than one block: page cache
                direct = False
            end = min(start + chunk, aligned_end) if direct else min(start + chunk, size)
            piece = payload[start:end]
            checksum.submit(piece)
            view = piece
            while len(view):
                view = view[os.write(fd, view) :]
            if start == 0 and fault_point:
                faults.fault(fault_point)
            start = end
        crc = checksum.result()
        os.fsync(fd)
    finally:
        checksum.close()
        os.close(fd)
    return records.FileEntry.of(path.name, size, crc, records.WRITE_CHECKSUM)


def open_for_write(path: Path, payload: memoryview) -> tuple[int, bool]:
    """Create ``path`` (a new file in a checkpoint directory, ``coci.safe_files``: never through
    a link) for writing, with O_DIRECT when the payload and filesystem allow it."""
    with safe_files.opened_dir(path.parent, error=CorruptCheckpointError) as dir_fd:
        fd = safe_files.create_at(dir_fd, path.name, path=path, error=CorruptCheckpointError)
    return fd, direct_eligible(payload) and _try_direct(fd, path)


def _try_direct(fd: int, path: Path) -> bool:
    """Turn O_DIRECT on for ``fd``; False where the file system refuses it (tmpfs, some network ones)."""
    try:
        set_direct(fd, True)
    except OSError as exc:
        logger.debug("O_DIRECT refused for %s (%s); through the page cache", path, exc)
        return False
    return True


def direct_eligible(payload: memoryview) -> bool:
    if not knobs.WRITE_DIRECT or not hasattr(os, "O_DIRECT") or len(payload) < knobs.DIRECT_IO_MIN_BYTES:
        return False
    address = np.frombuffer(payload, dtype=np.uint8).ctypes.data
    return address % knobs.DIRECT_IO_ALIGN_BYTES == 0


def io_chunk_bytes(direct: bool, requested: int | None = None) -> int:
    """The I/O size per call: ``knobs.WRITE_CHUNK_BYTES`` (or ``requested``), whole blocks for O_DIRECT."""
    chunk = max(int(knobs.WRITE_CHUNK_BYTES if requested is None else requested), 1)
    if direct:  # O_DIRECT transfers are whole blocks
        align = knobs.DIRECT_IO_ALIGN_BYTES
        chunk = max(chunk - chunk % align, align)
    return chunk


def set_direct(fd: int, enabled: bool) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if enabled else flags & ~os.O_DIRECT)


class ChunkChecksum:
    """A checksum over consecutive chunks, optionally on a helper thread that overlaps the I/O.

    Chunks are checksummed strictly in order (one worker, FIFO), each continuing the previous
    value. Once the interpreter is exiting the pool refuses work; the rest is checksummed inline,
    so a checkpoint still persisting at exit is finished, not lost. The buffers must stay unchanged until ``result`` returns (the arena does: the next
    snapshot waits for this persist).
    """

    def __init__(self, algorithm: records.ChecksumAlgorithm, threaded: bool) -> None:
        self._update_with = _CHECKSUMS[algorithm]
        self._crc = 0
        self._futures: list[Future[None]] = []
        self._executor = _checksum_executor() if threaded else None

    def submit(self, piece: memoryview) -> None:
        if self._executor is not None:
            try:
                self._futures.append(self._executor.submit(self._update, piece))
                return
            except RuntimeError:  # the interpreter is exiting: the pool takes no more work
                logger.debug("checksum thread refused a chunk (interpreter shutdown): checksumming inline")
                self.result()  # the chunks already queued come first (they are in order)
                self._executor = None
        self._update(piece)

    def _update(self, piece: memoryview) -> None:
        self._crc = self._update_with(piece, self._crc)

    def wait_for(self, index: int) -> None:
        """Block until chunk ``index`` (0-based, in submission order) is checksummed."""
        if 0 <= index < len(self._futures):
            self._futures[index].result()

    def result(self) -> int:
        for future in self._futures:
            future.result()
        return self._crc

    def close(self) -> None:
        for future in self._futures:  # an I/O error left chunks queued: let them finish first
            future.exception()


_CHECKSUM_EXECUTOR: ThreadPoolExecutor | None = None
_CHECKSUM_LOCK = threading.Lock()


def _checksum_executor() -> ThreadPoolExecutor:
    """One process-wide checksum thread, created on first use (no import-time side effect)."""
    global _CHECKSUM_EXECUTOR
    with _CHECKSUM_LOCK:
        if _CHECKSUM_EXECUTOR is None:
            _CHECKSUM_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coci-checksum")
        return _CHECKSUM_EXECUTOR


def read_verified(path: Path, entry: records.FileEntry, keep: bool = True) -> torch.Tensor:
    """Read a data file and check its size and checksum; return its bytes (``keep``) or a scratch buffer.

    Large files are read with ``O_DIRECT`` into a block-aligned buffer where the filesystem allows
    it (the device fills the buffer; no page-cache copy), and the checksum of each chunk runs on the
    checksum thread while the next chunk is read, so a verified restore costs about what the read
    costs (benchmarks/results/2026-11-22.md, P4). With ``keep=False`` two chunk buffers alternate through the
    page cache, each reused only once its checksum is done.
    """
    size = entry.size
    try:
        fd, direct = open_for_read(path, size if keep else 0)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: data file is missing") from exc
    actual = os.fstat(fd).st_size
    if actual != size:
        os.close(fd)
        raise CorruptCheckpointError(f"{path}: size {actual} != manifest size {size}")
    align = knobs.DIRECT_IO_ALIGN_BYTES
    chunk = io_chunk_bytes(direct, knobs.READ_CHUNK_BYTES)
    threaded = knobs.WRITE_CHECKSUM_THREAD and size > chunk
    if keep:
        buffer = aligned_empty(size + (-size % align), False) if direct else torch.empty(size, dtype=torch.uint8)
    else:
        buffer = torch.empty(min(size, chunk) * (2 if threaded else 1), dtype=torch.uint8)
    view = buffer.numpy().data
    checksum = ChunkChecksum(entry.algorithm, threaded=threaded)
    try:
        offset = 0
        index = 0
        while offset < size:
            length = min(chunk, size - offset)
            if keep:  # O_DIRECT reads whole blocks: the last one may ask past the end of the file
                target = view[offset : offset + (length + (-length % align) if direct else length)]
            else:
                base = (index % 2) * chunk if threaded else 0
                checksum.wait_for(index - 2)  # the buffer half about to be refilled is checksummed
                target = view[base : base + length]
            count = os.readv(fd, [target])
            if not count:
                raise CorruptCheckpointError(f"{path}: file ended early at byte {offset}")
            count = min(count, size - offset)
            checksum.submit(target[:count])
            offset += count
            index += 1
        crc = checksum.result()
    finally:
        checksum.close()
        os.close(fd)
    check_checksum(path, entry, crc)
    return buffer[:size] if keep else buffer


def check_checksum(path: Path, entry: records.FileEntry, crc: int) -> None:
    """CorruptCheckpointError naming ``path`` unless ``crc`` is the checksum ``entry`` records."""
    if crc != entry.checksum:
        raise CorruptCheckpointError(f"{path}: checksum mismatch ({entry.algorithm} {crc:#010x} != {entry.checksum:#010x})")


def read_verified_into(path: Path, entry: records.FileEntry, allocate: Callable[[], list[tuple[int, memoryview]]]) -> None:
    """Read a data file straight into the pieces ``allocate()`` returns (file offset, destination;
    sorted, not overlapping, each inside the file) and check its size and checksum; the bytes
    between pieces pass through one bounded scratch buffer. ``allocate`` runs only once the file's
    size matched ``entry`` (a manifest that claims more than the file holds allocates nothing). On
    any error the destinations hold unverified bytes: the caller must not use them.

    A restore reads into tensors that own their storage, so objects can keep them without a
    clone. The read goes through the page cache (destinations need not be block-aligned; the file
    is advised ``POSIX_FADV_WILLNEED`` so the kernel reads ahead in large requests), and the
    checksum of each piece runs on the checksum thread while the next one is read.
    """
    size = entry.size
    try:
        fd = record_reads.open_no_follow(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: data file is missing") from exc
    checksum = ChunkChecksum(entry.algorithm, threaded=knobs.WRITE_CHECKSUM_THREAD and size > knobs.READ_CHUNK_BYTES)
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise CorruptCheckpointError(f"{path}: size {actual} != manifest size {size}")
        if hasattr(os, "posix_fadvise"):  # the whole file is read once: let the kernel read ahead in large requests
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
        _read_pieces(fd, path, size, allocate(), checksum)
        crc = checksum.result()
    finally:
        checksum.close()
        os.close(fd)
    check_checksum(path, entry, crc)


def _read_pieces(fd: int, path: Path, size: int, pieces: list[tuple[int, memoryview]], checksum: ChunkChecksum) -> None:
    """Fill ``pieces`` and a scratch buffer for the gaps, in file order, feeding ``checksum``."""
    chunk = knobs.READ_CHUNK_BYTES
    scratch: memoryview | None = None
    scratch_index = -1  # the last chunk read into the scratch buffer: reused once it is checksummed
    index = 0
    for start, target in _file_order(size, pieces):
        length = target if isinstance(target, int) else len(target)
        for low in range(0, length, chunk):
            if isinstance(target, int):  # a gap: its bytes are checksummed, not kept
                scratch = scratch if scratch is not None else memoryview(bytearray(min(chunk, size)))
                checksum.wait_for(scratch_index)
                piece, scratch_index = scratch[: min(chunk, length - low)], index
            else:
                piece = target[low : low + chunk]
            pread_fully(fd, path, piece, start + low)
            checksum.submit(piece)
            index += 1


def _file_order(size: int, pieces: list[tuple[int, memoryview]]) -> list[tuple[int, memoryview | int]]:
    """(offset, destination) covering bytes 0 to ``size`` once, in order; a gap is its length."""
    spans: list[tuple[int, memoryview | int]] = []
    position = 0
    for offset, target in pieces:
        if offset < position or offset + len(target) > size:
            raise ValueError(f"pieces overlap or leave the file at byte {offset}")
        if offset > position:
            spans.append((position, offset - position))
        if len(target):
            spans.append((offset, target))
        position = offset + len(target)
    if position < size:
        spans.append((position, size - position))
    return spans


def pread_fully(fd: int, path: Path, piece: memoryview, offset: int) -> None:
    """Fill ``piece`` from byte ``offset``; CorruptCheckpointError if the file ends first."""
    done = 0
    while done < len(piece):
        count = os.preadv(fd, [piece[done:]], offset + done)
        if not count:
            raise CorruptCheckpointError(f"{path}: file ended early at byte {offset + done}")
        done += count


def open_for_read(path: Path, size: int) -> tuple[int, bool]:
    """Open regular file ``path`` for reading (``coci.safe_files``: never through a link, never
    a FIFO), with O_DIRECT for a large file read into an aligned buffer."""
    fd = record_reads.open_no_follow(path, os.O_RDONLY)
    wanted = knobs.WRITE_DIRECT and hasattr(os, "O_DIRECT") and size >= knobs.DIRECT_IO_MIN_BYTES
    return fd, wanted and _try_direct(fd, path)


def describe_file(path: Path) -> records.FileEntry:
    """The size and crc32c of a file already written (and fsynced) by someone else."""
    checksum = ChunkChecksum(records.WRITE_CHECKSUM, threaded=False)
    size = 0
    with os.fdopen(record_reads.open_no_follow(path, os.O_RDONLY), "rb", buffering=0) as handle:
        while chunk := handle.read(knobs.READ_CHUNK_BYTES):
            checksum.submit(memoryview(chunk))
            size += len(chunk)
    return records.FileEntry.of(path.name, size, checksum.result(), records.WRITE_CHECKSUM)
