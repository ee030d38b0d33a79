"""Phase two of a checkpoint: durable files and the crash-safe commit (the persist stage).

profiler -> plan -> snapshot -> **persist** -> report. Layout of a run directory::

    <run_dir>/checkpoints/step_<n>/data.bin       every tensor's raw bytes, at manifest offsets
    <run_dir>/checkpoints/step_<n>/manifest.json  the commit record: written last
    <run_dir>/checkpoints/step_<n>.tmp/           a checkpoint being written: never read

Commit protocol (invariant 1): write ``data.bin`` into ``step_<n>.tmp/`` and fsync it, write
``manifest.json`` (sizes, crc32 checksums, tensor table, JSON skeleton of the state) and fsync it,
fsync the temporary directory, rename it to ``step_<n>`` inside the same parent (never across
filesystems: pytorch #2883), fsync the parent. A reader lists only ``step_<n>`` directories with
a parseable manifest, and verifies sizes and checksums before loading. Nothing is unpickled:
tensors are raw bytes, everything else JSON (invariant 4). Retention renames an old checkpoint to
``*.tmp`` (atomic) before deleting it, and only ever after a newer commit.

``set_fault_hook`` installs a callback invoked at named points of the protocol; the fault-injection
tests use it to SIGKILL the writer at exact instants. It is a no-op by default.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coci import __version__, knobs
from coci.checkpoint.snapshot import TensorSlot, aligned_empty
from coci.errors import CorruptCheckpointError

try:  # ISA-L's crc32 computes the same checksum as zlib's, ~5x faster (SIMD); optional
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the environment
    _crc32 = zlib.crc32

logger = logging.getLogger(__name__)

DATA_FILENAME = "data.bin"
MANIFEST_FILENAME = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

FaultHook = Callable[[str], None]
_fault_hook: FaultHook | None = None


def set_fault_hook(hook: FaultHook | None) -> None:
    """Install ``hook(point)`` called at each named point of the commit protocol (tests only)."""
    global _fault_hook
    _fault_hook = hook


def _fault(point: str) -> None:
    if _fault_hook is not None:
        _fault_hook(point)


class TensorEntry(BaseModel):
    """One tensor in ``data.bin``."""

    model_config = ConfigDict(frozen=True)
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class FileEntry(BaseModel):
    """One data file of a checkpoint, with what verification checks."""

    model_config = ConfigDict(frozen=True)
    name: str
    size: int = Field(ge=0)
    crc32: int


class CommitRecord(BaseModel):
    """What every checkpoint's ``manifest.json`` holds, whatever wrote its files (this module, or
    DCP under torch.distributed): its presence makes the checkpoint exist.

    ``checksum`` is the crc32 of the record's own JSON without that field, so a flipped bit inside
    a value (an lr of 0.1 read as 0.3) is caught, not only damage to the data files. NaN and
    infinities in the state are written as JSON constants, never silently as null.
    """

    model_config = ConfigDict(ser_json_inf_nan="constants")
    format_version: int
    coci_version: str
    step: int = Field(ge=0)
    epoch: int | None = None
    wall_time: float
    state_keys: list[str]
    files: list[FileEntry]
    checksum: int | None = None

    def body_checksum(self) -> int:
        return zlib.crc32(self.model_dump_json(exclude={"checksum"}).encode())

    def sealed(self) -> Self:
        """This record with its checksum filled in (what is written to disk)."""
        return self.model_copy(update={"checksum": self.body_checksum()})


class Manifest(CommitRecord):
    """The commit record of a single-process checkpoint: one ``data.bin`` and its tensor table."""

    tensors: list[TensorEntry]
    skeleton: Any


RecordT = TypeVar("RecordT", bound=CommitRecord)


def publish(root: Path, tmp: Path, final: Path, record: CommitRecord) -> None:
    """The commit: seal and write the record last, fsync the directory, rename it into place in
    the same parent (replacing a checkpoint of this step that failed verification), fsync the parent.
    """
    _fault("before_manifest")
    _write_file(tmp / MANIFEST_FILENAME, memoryview(record.sealed().model_dump_json().encode()))
    _fsync_dir(tmp)
    _fault("before_rename")
    if final.exists():
        _discard(final)
    os.rename(tmp, final)
    _fault("after_rename")
    _fsync_dir(root)
    _fault("after_commit")


def parse_record(path: Path, model: type[RecordT]) -> RecordT:
    """Read ``path/manifest.json`` as ``model``: present, parseable, not from a newer coci.
    CorruptCheckpointError on anything off; format-specific checks, then :func:`check_sealed`, follow."""
    try:
        record = model.model_validate_json((path / MANIFEST_FILENAME).read_bytes())
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is missing") from exc
    except (ValidationError, ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is unreadable ({exc.__class__.__name__})") from exc
    if record.format_version > knobs.FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{path}: format_version {record.format_version} is newer than this coci supports "
            f"({knobs.FORMAT_VERSION})"
        )
    return record


def check_sealed(record: CommitRecord, path: Path) -> None:
    """Last check of a reader (after the specific ones, which name the damage more precisely)."""
    if record.checksum is not None and record.checksum != record.body_checksum():
        raise CorruptCheckpointError(f"{path}: manifest.json checksum mismatch (a value in it was altered)")


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / knobs.CHECKPOINT_DIRNAME


def step_dirname(step: int) -> str:
    return f"step_{step}"


def write_checkpoint(
    root: Path,
    step: int,
    payload: memoryview,
    slots: list[TensorSlot],
    skeleton: Any,
    *,
    epoch: int | None,
    state_keys: list[str],
) -> tuple[Path, Manifest]:
    """Write and commit one checkpoint under ``root``; return its final path and manifest."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dirname(step)
    tmp = root / (step_dirname(step) + knobs.TMP_SUFFIX)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        return _commit(root, tmp, final, step, payload, slots, skeleton, epoch, state_keys)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # free the space; a kill leaves it to remove_stale_tmp
        raise


def _commit(
    root: Path,
    tmp: Path,
    final: Path,
    step: int,
    payload: memoryview,
    slots: list[TensorSlot],
    skeleton: Any,
    epoch: int | None,
    state_keys: list[str],
) -> tuple[Path, Manifest]:
    size, crc = _write_file(tmp / DATA_FILENAME, payload, fault_point="mid_write")
    manifest = Manifest(
        format_version=knobs.FORMAT_VERSION,
        coci_version=__version__,
        step=step,
        epoch=epoch,
        wall_time=time.time(),
        state_keys=state_keys,
        files=[FileEntry(name=DATA_FILENAME, size=size, crc32=crc)],
        tensors=[
            TensorEntry(dtype=_dtype_name(s.dtype), shape=list(s.shape), offset=s.offset, nbytes=s.nbytes)
            for s in slots
        ],
        skeleton=skeleton,
    )
    publish(root, tmp, final, manifest)
    return final, manifest


def _write_file(path: Path, payload: memoryview, fault_point: str | None = None) -> tuple[int, int]:
    """Write ``payload`` in chunks, fsync, and return (size, crc32); ``fault_point`` fires after the first chunk.

    Large page-aligned payloads (the staging arena) are written with ``O_DIRECT`` where the
    filesystem allows it: the device reads the arena itself, so the persist does not memcpy every
    byte into the page cache and leave the kernel to write it back, which on a 2-core machine costs
    the training loop several times the write (benchmarks/README.md, P2/P3). The unaligned tail
    goes through the page cache. The checksum of each chunk is computed on a helper thread while
    the next chunk is written (both release the GIL), so it costs no persist time.
    """
    size = len(payload)
    fd, direct = _open_for_write(path, payload)
    checksum = _ChunkChecksum(threaded=direct and knobs.WRITE_CHECKSUM_THREAD)
    try:
        chunk = _write_chunk_bytes(direct)
        aligned_end = size - size % knobs.DIRECT_IO_ALIGN_BYTES if direct else size
        start = 0
        while start < size:
            if direct and start >= aligned_end:
                _set_direct(fd, False)  # the tail is shorter than one block: page cache
                direct = False
            end = min(start + chunk, aligned_end) if direct else min(start + chunk, size)
            piece = payload[start:end]
            checksum.submit(piece)
            view = piece
            while len(view):
                view = view[os.write(fd, view) :]
            if start == 0 and fault_point:
                _fault(fault_point)
            start = end
        crc = checksum.result()
        os.fsync(fd)
    finally:
        checksum.close()
        os.close(fd)
    return size, crc


def _open_for_write(path: Path, payload: memoryview) -> tuple[int, bool]:
    """Open ``path`` for writing, with O_DIRECT when the payload and filesystem allow it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if _direct_eligible(payload):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as exc:  # tmpfs and some network filesystems refuse O_DIRECT
            logger.debug("O_DIRECT refused for %s (%s); writing through the page cache", path, exc)
    return os.open(path, flags, 0o644), False


def _direct_eligible(payload: memoryview) -> bool:
    if not knobs.WRITE_DIRECT or not hasattr(os, "O_DIRECT") or len(payload) < knobs.DIRECT_IO_MIN_BYTES:
        return False
    address = np.frombuffer(payload, dtype=np.uint8).ctypes.data
    return address % knobs.DIRECT_IO_ALIGN_BYTES == 0


def _write_chunk_bytes(direct: bool, chunk_bytes: int | None = None) -> int:
    """The I/O size per call: ``knobs.WRITE_CHUNK_BYTES`` (or ``chunk_bytes``), whole blocks for O_DIRECT."""
    chunk = max(int(knobs.WRITE_CHUNK_BYTES if chunk_bytes is None else chunk_bytes), 1)
    if direct:  # O_DIRECT transfers are whole blocks
        align = knobs.DIRECT_IO_ALIGN_BYTES
        chunk = max(chunk - chunk % align, align)
    return chunk


def _set_direct(fd: int, enabled: bool) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if enabled else flags & ~os.O_DIRECT)


class _ChunkChecksum:
    """crc32 over consecutive chunks, optionally on a helper thread that overlaps the I/O.

    Chunks are checksummed strictly in order (one worker, FIFO), each continuing the previous
    value. The buffers must stay unchanged until :meth:`result` returns (the arena does: the next
    snapshot waits for this persist).
    """

    def __init__(self, threaded: bool) -> None:
        self._crc = 0
        self._futures: list[Future[None]] = []
        self._executor = _checksum_executor() if threaded else None

    def submit(self, piece: memoryview) -> None:
        if self._executor is None:
            self._crc = _crc32(piece, self._crc)
        else:
            self._futures.append(self._executor.submit(self._update, piece))

    def _update(self, piece: memoryview) -> None:
        self._crc = _crc32(piece, self._crc)

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
            _CHECKSUM_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coci-crc32")
        return _CHECKSUM_EXECUTOR


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    """Atomically hide a checkpoint directory (rename to *.tmp), then delete it."""
    doomed = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}{knobs.TMP_SUFFIX}")
    os.rename(path, doomed)
    _fsync_dir(path.parent)
    _fault("retention")
    shutil.rmtree(doomed, ignore_errors=True)


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints (a ``step_<n>`` directory holding a manifest), oldest first."""
    return [(step, path) for step, path in step_dirs(root) if (path / MANIFEST_FILENAME).is_file()]


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_<n>`` directory, committed or damaged (restore reports the damaged ones)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), e) for e in root.iterdir() if (m := _STEP_DIR.match(e.name)) and e.is_dir()]
    return sorted(found)


def remove_stale_tmp(root: Path) -> list[Path]:
    """Delete leftovers of interrupted writes and deletions; they are never checkpoints."""
    removed = []
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.endswith(knobs.TMP_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def apply_retention(root: Path, keep_last: int | None) -> list[int]:
    """Delete the oldest committed checkpoints beyond ``keep_last`` (never the newest)."""
    if keep_last is None:
        return []
    committed = committed_steps(root)
    doomed = committed[: max(len(committed) - max(keep_last, 1), 0)]
    for _, path in doomed:
        _discard(path)
    return [step for step, _ in doomed]


def read_manifest(path: Path) -> Manifest:
    """Parse and sanity-check a manifest; CorruptCheckpointError on anything off."""
    manifest = parse_record(path, Manifest)
    for entry in manifest.files:
        if not _SAFE_NAME.match(entry.name) or entry.name in {".", ".."}:
            raise CorruptCheckpointError(f"{path}: manifest names a file outside its checkpoint: {entry.name!r}")
    if [f.name for f in manifest.files] != [DATA_FILENAME]:
        raise CorruptCheckpointError(f"{path}: manifest must list exactly {DATA_FILENAME!r}")
    size = manifest.files[0].size
    for index, tensor in enumerate(manifest.tensors):
        if tensor.offset + tensor.nbytes > size or _dtype(tensor.dtype, path).itemsize * _numel(tensor.shape) != tensor.nbytes:
            raise CorruptCheckpointError(f"{path}: tensor {index} does not fit its declared bytes")
    check_consistent(manifest, path)
    check_sealed(manifest, path)
    return manifest


def check_consistent(manifest: Manifest, path: Path) -> None:
    """Structural checks of a parsed manifest: its step matches the directory, the skeleton refers
    to each stored tensor exactly once, and every state key (and the session's own) is present.
    """
    match = _STEP_DIR.match(path.name)
    if match and manifest.step != int(match.group(1)):
        raise CorruptCheckpointError(f"{path}: manifest says step {manifest.step} but the directory is {path.name}")
    count = len(manifest.tensors)
    refs = _tensor_refs(manifest.skeleton)
    for ref in refs:
        if isinstance(ref, bool) or not isinstance(ref, int) or not 0 <= ref < count:
            raise CorruptCheckpointError(f"{path}: manifest skeleton refers to tensor {ref!r} of {count}")
    if sorted(refs) != list(range(count)):  # flatten() stores each tensor once, in walk order
        raise CorruptCheckpointError(f"{path}: manifest skeleton does not refer to each of its {count} tensors once")
    keys = set(manifest.skeleton) if isinstance(manifest.skeleton, dict) else set()
    missing = sorted(set(manifest.state_keys) - keys)
    if missing:
        raise CorruptCheckpointError(f"{path}: manifest skeleton lacks the state keys {missing}")


def _tensor_refs(skeleton: Any) -> list[Any]:
    refs: list[Any] = []
    stack = [skeleton]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for tag in ("__tensor__", "__ndarray__"):
                if tag in node:
                    refs.append(node[tag])
            stack.extend(v for k, v in node.items() if k not in ("__tensor__", "__ndarray__"))
    return refs


def load_checkpoint(path: Path) -> tuple[Manifest, list[torch.Tensor]]:
    """Read, verify (size and crc32) and return the tensors of a committed checkpoint."""
    manifest = read_manifest(path)
    entry = manifest.files[0]
    buffer = _read_verified(path / entry.name, entry)
    tensors = []
    for tensor in manifest.tensors:
        dtype = _dtype(tensor.dtype, path).torch
        raw = buffer[tensor.offset : tensor.offset + tensor.nbytes]
        tensors.append(raw.view(dtype).view(tensor.shape) if tensor.nbytes else torch.empty(tensor.shape, dtype=dtype))
    return manifest, tensors


def verify_checkpoint(path: Path) -> Manifest:
    """Check a checkpoint's manifest, sizes and checksums without building tensors."""
    manifest = read_manifest(path)
    for entry in manifest.files:
        _read_verified(path / entry.name, entry, keep=False)
    return manifest


def _read_verified(path: Path, entry: FileEntry, keep: bool = True) -> torch.Tensor:
    """Read a data file and check its size and crc32; return its bytes (``keep``) or a scratch buffer.

    Large files are read with ``O_DIRECT`` into a block-aligned buffer where the filesystem allows
    it (the device fills the buffer; no page-cache copy), and the checksum of each chunk runs on the
    checksum thread while the next chunk is read, so a verified restore costs about what the read
    costs (benchmarks/README.md, P4). With ``keep=False`` two chunk buffers alternate through the
    page cache, each reused only once its checksum is done.
    """
    try:
        actual = path.stat().st_size
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: data file is missing") from exc
    if actual != entry.size:
        raise CorruptCheckpointError(f"{path}: size {actual} != manifest size {entry.size}")
    size = entry.size
    fd, direct = _open_for_read(path, size if keep else 0)
    align = knobs.DIRECT_IO_ALIGN_BYTES
    chunk = _write_chunk_bytes(direct, knobs.READ_CHUNK_BYTES)
    threaded = knobs.WRITE_CHECKSUM_THREAD and size > chunk
    if keep:
        buffer = aligned_empty(size + (-size % align), False) if direct else torch.empty(size, dtype=torch.uint8)
    else:
        buffer = torch.empty(min(size, chunk) * (2 if threaded else 1), dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    checksum = _ChunkChecksum(threaded=threaded)
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
    if crc != entry.crc32:
        raise CorruptCheckpointError(f"{path}: checksum mismatch (crc32 {crc:#010x} != {entry.crc32:#010x})")
    return buffer[:size] if keep else buffer


def _open_for_read(path: Path, size: int) -> tuple[int, bool]:
    """Open ``path`` for reading, with O_DIRECT for a large file read into an aligned buffer."""
    if knobs.WRITE_DIRECT and hasattr(os, "O_DIRECT") and size >= knobs.DIRECT_IO_MIN_BYTES:
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT), True
        except OSError as exc:
            logger.debug("O_DIRECT refused for %s (%s); reading through the page cache", path, exc)
    return os.open(path, os.O_RDONLY), False


class _DType:
    def __init__(self, torch_dtype: torch.dtype) -> None:
        self.torch = torch_dtype
        self.itemsize = torch.empty(0, dtype=torch_dtype).element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str, path: Path) -> _DType:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpointError(f"{path}: unknown dtype {name!r}")
    return _DType(dtype)


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            return -1
        count *= dim
    return count

