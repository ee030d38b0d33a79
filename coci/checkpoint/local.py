"""coci's own checkpoint format, written by a single process: one data file and its manifest.

``step_<n>/data.bin`` holds every tensor's raw bytes at the offsets of the staging arena (the file
layout is the memory layout); ``step_<n>/manifest.json`` is the commit record with the tensor table
and the JSON skeleton of the state tree. Nothing is unpickled: tensors are raw bytes, everything
else JSON. ``LocalWriter`` and ``LocalReader`` are this format's checkpoint writer and
reader; the functions below them are what they (and ``coci verify``) are made of.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from coci.checkpoint import commit, fileio, layout, record_reads, records, retention
from coci.checkpoint.records import CommitRecord, LoadedCheckpoint
from coci.checkpoint.snapshot import StagedCheckpoint, TensorSlot
from coci.checkpoint.tree import tensor_refs, unflatten
from coci.checks import is_int
from coci.errors import CorruptCheckpointError

__all__ = [
    "LocalReader",
    "LocalWriter",
    "Manifest",
    "TensorEntry",
    "ALLOWED_DTYPES",
    "check_consistent",
    "element_count",
    "load_checkpoint",
    "load_tensors",
    "read_manifest",
    "verify_checkpoint",
    "write_checkpoint",
]


class TensorEntry(BaseModel):
    """One tensor in ``data.bin``."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


class Manifest(CommitRecord):
    """The commit record of a single-process checkpoint: one ``data.bin`` and its tensor table."""

    tensors: list[TensorEntry]
    skeleton: Any


class LocalWriter:
    """Writes and commits checkpoints in coci's own format under ``root`` (one process)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, staged: StagedCheckpoint) -> Path:
        path, _ = write_checkpoint(
            self.root, staged.step, staged.payload, staged.slots, staged.skeleton, epoch=staged.epoch, state_keys=staged.state_keys
        )
        return path

    def retain(self, policy: retention.RetentionPolicy | None, trusted: frozenset[int]) -> list[int]:
        return retention.apply_retention(self.root, policy, trusted)


class LocalReader:
    """Reads checkpoints in coci's own format; under torch.distributed every rank reads the data
    file, and the saved RNG streams (one process's) go to the coordinator only."""

    record_type = Manifest

    def read_record(self, path: Path) -> Manifest:
        return read_manifest(path)

    def verify(self, path: Path) -> Manifest:
        return verify_checkpoint(path)

    def load(self, path: Path, record: CommitRecord, context: Any, targets: Any = None, keys: frozenset[str] | None = None) -> LoadedCheckpoint:
        """Load every tensor (``targets`` is not used: one process holds no sharded state); with
        ``keys``, the data file is verified in chunks and only those state keys' tensors are read."""
        assert isinstance(record, Manifest)
        if keys is not None:
            verify_checkpoint(path)
            entries = {key: self.load_entry(path, record, (key,)) for key in sorted(keys) if key in record.skeleton}
            nbytes = sum(record.tensors[int(i)].nbytes for key in entries for i in tensor_refs(record.skeleton[key]))
            return LoadedCheckpoint(record.step, record.epoch, record.state_keys, path, entries, nbytes)
        tree = unflatten(record.skeleton, load_tensors(path, record))
        if context is not None and not context.is_coordinator:
            tree.pop(layout.RNG_KEY, None)
        return LoadedCheckpoint(record.step, record.epoch, record.state_keys, path, tree, record.files[0].size)

    def load_entry(self, path: Path, record: CommitRecord, keys: tuple[str, ...]) -> Any | None:
        """Read only the tensors the entry refers to, each at its offset in the data file."""
        assert isinstance(record, Manifest)
        entry = records.subtree(record.skeleton, keys)
        if entry is None:
            return None
        tensors: list[Any] = [None] * len(record.tensors)
        with open(path / record.files[0].name, "rb", opener=record_reads.open_no_follow) as handle:
            for index in tensor_refs(entry):  # indices checked against the table by read_manifest
                table = record.tensors[index]
                handle.seek(table.offset)
                raw = handle.read(table.nbytes)
                if len(raw) != table.nbytes:
                    raise CorruptCheckpointError(f"{path}: tensor {index} is truncated")
                dtype = torch_dtype(table.dtype, path)
                empty = torch.empty(table.shape, dtype=dtype)
                tensors[index] = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(table.shape) if raw else empty
        return unflatten(entry, tensors)


# --- writing -----------------------------------------------------------------------------------


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
    layout.make_root(root)
    final = root / layout.step_dirname(step)
    tmp = layout.tmp_dir(root, step)
    layout.fresh_dir(tmp)
    try:
        data_file = fileio.write_file(tmp / layout.DATA_FILENAME, payload, fault_point="mid_write")
        manifest = Manifest(
            **records.record_header(step, epoch=epoch, state_keys=state_keys, files=[data_file]),
            tensors=[
                TensorEntry(dtype=dtype_name(s.dtype), shape=list(s.shape), offset=s.offset, nbytes=s.nbytes) for s in slots
            ],
            skeleton=skeleton,
        )
        commit.publish(root, tmp, final, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # free the space; a kill leaves it to remove_stale_tmp
        raise
    return final, manifest


# --- reading -----------------------------------------------------------------------------------


def read_manifest(path: Path) -> Manifest:
    """Parse and sanity-check a manifest; CorruptCheckpointError on anything off."""
    manifest = record_reads.parse_record(path, Manifest)
    record_reads.check_file_names(path, [entry.name for entry in manifest.files])
    if [f.name for f in manifest.files] != [layout.DATA_FILENAME]:
        raise CorruptCheckpointError(f"{path}: manifest must list exactly {layout.DATA_FILENAME!r}")
    size = manifest.files[0].size
    for index, tensor in enumerate(manifest.tensors):
        if tensor.offset + tensor.nbytes > size or _itemsize(tensor.dtype, path) * element_count(tensor.shape) != tensor.nbytes:
            raise CorruptCheckpointError(f"{path}: tensor {index} does not fit its declared bytes")
    check_consistent(manifest, path)
    record_reads.check_sealed(manifest, path)
    return manifest


def check_consistent(manifest: Manifest, path: Path) -> None:
    """Structural checks of a parsed manifest: its step matches the directory, the skeleton refers
    to each stored tensor exactly once, and every state key (and the session's own) is present.
    """
    record_reads.check_step(manifest, path)
    count = len(manifest.tensors)
    refs = tensor_refs(manifest.skeleton)
    for ref in refs:
        if not is_int(ref) or not 0 <= ref < count:
            raise CorruptCheckpointError(f"{path}: manifest skeleton refers to tensor {ref!r} of {count}")
    if sorted(refs) != list(range(count)):  # flatten() stores each tensor once, in walk order
        raise CorruptCheckpointError(f"{path}: manifest skeleton does not refer to each of its {count} tensors once")
    record_reads.check_state_keys(manifest.state_keys, manifest.skeleton, path)


def load_tensors(path: Path, manifest: Manifest) -> list[torch.Tensor]:
    """Read ``data.bin`` (its size and checksum checked against ``manifest``) into one tensor per
    entry, each owning its storage (objects may keep them without a clone: ``adopt_or_clone``).

    Tensors whose bytes overlap in the file (never written so; an altered manifest) are read as
    views of one buffer instead, as ``load_tensor_views`` does."""
    entry = manifest.files[0]
    order = sorted(range(len(manifest.tensors)), key=lambda i: manifest.tensors[i].offset)
    spans = [(manifest.tensors[i].offset, manifest.tensors[i].nbytes) for i in order if manifest.tensors[i].nbytes]
    if any(offset < end for (offset, _), end in zip(spans[1:], [o + n for o, n in spans])):
        return load_tensor_views(path, manifest)
    raws: list[torch.Tensor] = []

    def allocate() -> list[tuple[int, memoryview]]:  # after the size check: at most the file's bytes (no overlaps)
        raws.extend(torch.empty(tensor.nbytes, dtype=torch.uint8) for tensor in manifest.tensors)
        return [(manifest.tensors[i].offset, raws[i].numpy().data) for i in order if manifest.tensors[i].nbytes]

    fileio.read_verified_into(path / entry.name, entry, allocate)
    return [as_tensor(raw, tensor, path) for raw, tensor in zip(raws, manifest.tensors)]


def load_tensor_views(path: Path, manifest: Manifest) -> list[torch.Tensor]:
    """Read ``data.bin`` (size and checksum checked) into one buffer and view its tensors."""
    entry = manifest.files[0]
    buffer = fileio.read_verified(path / entry.name, entry)
    return [as_tensor(buffer[tensor.offset : tensor.offset + tensor.nbytes], tensor, path) for tensor in manifest.tensors]


def as_tensor(raw: torch.Tensor, tensor: TensorEntry, path: Path) -> torch.Tensor:
    """``raw`` bytes as the dtype and shape of ``tensor`` (sizes checked by ``read_manifest``)."""
    dtype = torch_dtype(tensor.dtype, path)
    return raw.view(dtype).view(tensor.shape) if tensor.nbytes else torch.empty(tensor.shape, dtype=dtype)


def load_checkpoint(path: Path) -> tuple[Manifest, list[torch.Tensor]]:
    """Read, verify (size and checksum) and return the tensors of a committed checkpoint."""
    manifest = read_manifest(path)
    return manifest, load_tensors(path, manifest)


def verify_checkpoint(path: Path) -> Manifest:
    """Check a checkpoint's manifest, sizes and checksums without building tensors."""
    manifest = read_manifest(path)
    for entry in manifest.files:
        fileio.read_verified(path / entry.name, entry, keep=False)
    return manifest


# --- dtypes ------------------------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    """How a dtype is written in a commit record (``float32``, ``bfloat16``...)."""
    return str(dtype).removeprefix("torch.")


#: The dtypes a checkpoint may hold: dense numeric ones (no quantized or other exotic types).
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "bfloat16",
     "float32", "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
)


def torch_dtype(name: str, path: Path) -> torch.dtype:
    """The dtype a commit record names; CorruptCheckpointError for anything not on ``ALLOWED_DTYPES``."""
    dtype = getattr(torch, name, None) if isinstance(name, str) and name in ALLOWED_DTYPES else None
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpointError(f"{path}: unknown dtype {name!r} (not on the allow-list)")
    return dtype


def _itemsize(name: str, path: Path) -> int:
    return torch_dtype(name, path).itemsize


def element_count(shape: list[int]) -> int:
    """Elements of a tensor of ``shape``; -1 for a negative dimension."""
    count = 1
    for dim in shape:
        if dim < 0:
            return -1
        count *= dim
    return count
