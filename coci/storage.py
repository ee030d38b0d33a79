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

import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coci import __version__, knobs
from coci.errors import CorruptCheckpointError
from coci.snapshot import TensorSlot

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


class Manifest(BaseModel):
    """The commit record of one checkpoint; its presence makes the checkpoint exist."""

    format_version: int
    coci_version: str
    step: int = Field(ge=0)
    epoch: int | None = None
    wall_time: float
    state_keys: list[str]
    files: list[FileEntry]
    tensors: list[TensorEntry]
    skeleton: Any


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
    _fault("before_manifest")
    _write_file(tmp / MANIFEST_FILENAME, memoryview(manifest.model_dump_json().encode()))
    _fsync_dir(tmp)
    _fault("before_rename")
    if final.exists():  # a checkpoint of this step that failed verification earlier: replace it
        _discard(final)
    os.rename(tmp, final)
    _fault("after_rename")
    _fsync_dir(root)
    _fault("after_commit")
    return final, manifest


def _write_file(path: Path, payload: memoryview, fault_point: str | None = None) -> tuple[int, int]:
    """Write ``payload`` in chunks, fsync, and return (size, crc32); ``fault_point`` fires after the first chunk."""
    crc = 0
    chunk = knobs.WRITE_CHUNK_BYTES
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for start in range(0, len(payload), chunk):
            piece = payload[start : start + chunk]
            view = piece
            while len(view):
                written = os.write(fd, view)
                view = view[written:]
            crc = zlib.crc32(piece, crc)
            if start == 0 and fault_point:
                _fault(fault_point)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(payload), crc


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
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match and entry.is_dir() and (entry / MANIFEST_FILENAME).is_file():
            found.append((int(match.group(1)), entry))
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
    try:
        manifest = Manifest.model_validate_json((path / MANIFEST_FILENAME).read_bytes())
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is missing") from exc
    except (ValidationError, ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is unreadable ({exc.__class__.__name__})") from exc
    if manifest.format_version > knobs.FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{path}: format_version {manifest.format_version} is newer than this coci supports "
            f"({knobs.FORMAT_VERSION})"
        )
    for entry in manifest.files:
        if not _SAFE_NAME.match(entry.name) or entry.name in {".", ".."}:
            raise CorruptCheckpointError(f"{path}: manifest names a file outside its checkpoint: {entry.name!r}")
    if [f.name for f in manifest.files] != [DATA_FILENAME]:
        raise CorruptCheckpointError(f"{path}: manifest must list exactly {DATA_FILENAME!r}")
    size = manifest.files[0].size
    for index, tensor in enumerate(manifest.tensors):
        if tensor.offset + tensor.nbytes > size or _dtype(tensor.dtype, path).itemsize * _numel(tensor.shape) != tensor.nbytes:
            raise CorruptCheckpointError(f"{path}: tensor {index} does not fit its declared bytes")
    return manifest


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
    try:
        actual = path.stat().st_size
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: data file is missing") from exc
    if actual != entry.size:
        raise CorruptCheckpointError(f"{path}: size {actual} != manifest size {entry.size}")
    chunk = knobs.READ_CHUNK_BYTES
    buffer = torch.empty(entry.size if keep else min(entry.size, chunk), dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    crc = 0
    with open(path, "rb", buffering=0) as handle:
        offset = 0
        while offset < entry.size:
            target = view[offset : offset + chunk] if keep else view[: min(chunk, entry.size - offset)]
            count = handle.readinto(target)
            if not count:
                raise CorruptCheckpointError(f"{path}: file ended early at byte {offset}")
            crc = zlib.crc32(target[:count], crc)
            offset += count
    if crc != entry.crc32:
        raise CorruptCheckpointError(f"{path}: checksum mismatch (crc32 {crc:#010x} != {entry.crc32:#010x})")
    return buffer


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

