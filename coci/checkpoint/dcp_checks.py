"""Checks that make a DCP checkpoint safe to load: its commit record and DCP's ``.metadata``.

DCP's default load planner reads a *bytes* item with ``torch.load(..., weights_only=False)`` (code
execution), and its reader opens whatever path ``.metadata`` names. coci writes tensors only, so a
checkpoint is loaded only when ``check_dcp_metadata`` finds exactly the manifest's tensors,
each stored in a file the manifest lists and checksums, inside the range of that file, with chunks
that tile each tensor exactly, and each stored item bounded by its chunk's bytes before torch
inflates it (``coci.checkpoint.dcp_items``); ``read_dcp_metadata`` unpickles ``.metadata`` naming
plain records only and runs both checks. The manifest's own tensor table is bounded by the files it lists (``check_dcp_manifest``), so a
hostile record cannot make the loader allocate more than the checkpoint holds.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coci import knobs
from coci.checkpoint import dcp_items, fileio, record_reads
from coci.checkpoint.dcp_manifest import DcpManifest, DcpPart
from coci.checkpoint.local import element_count, torch_dtype
from coci.checkpoint.tree import tensor_refs
from coci.errors import CorruptCheckpointError

#: Most cells of the grid that a DCP tensor's chunk boundaries cut it into (the chunks must tile the
#: tensor exactly; a real sharded layout has as many cells as chunks). Bounds the check's memory.
_DCP_MAX_CHUNK_GRID_CELLS: int = 1 << 22

#: DCP's own file in a checkpoint directory (never a storage file of a tensor).
DCP_METADATA = ".metadata"


def check_dcp_manifest(path: Path, manifest: DcpManifest) -> None:
    """The tensor table of a DCP record refers to its skeletons and fits the files it lists.

    Every part's indices are distinct, bounded by the record's own tensor count and exactly the
    placeholders of its skeleton; every tensor is of an allowed dtype, and what one process
    allocates for them (the shared tensors and one rank's) fits in the data files.
    """
    metadata_bytes = sum(entry.size for entry in manifest.files if entry.name == DCP_METADATA)
    if metadata_bytes > knobs.MAX_MANIFEST_BYTES:
        raise CorruptCheckpointError(f"{path}: {DCP_METADATA} is {metadata_bytes} bytes, over knobs.MAX_MANIFEST_BYTES")
    record_reads.check_state_keys(manifest.state_keys, manifest.shared.skeleton, path)
    parts = [manifest.shared, *manifest.ranks]
    bound = sum(len(part.tensors) for part in parts)
    data_bytes = sum(entry.size for entry in manifest.files if entry.name != DCP_METADATA)
    shared_bytes = _check_part(path, manifest.shared, bound, data_bytes)
    rank_bytes = max((_check_part(path, part, bound, data_bytes) for part in manifest.ranks), default=0)
    if shared_bytes + rank_bytes > data_bytes:  # what one process allocates before reading
        raise CorruptCheckpointError(f"{path}: manifest tensors need more bytes than its data files hold")


def _check_part(path: Path, part: DcpPart, bound: int, data_bytes: int) -> int:
    """Check one part's tensor table; return the bytes its tensors take in memory."""
    indices = [tensor.index for tensor in part.tensors]
    if any(index >= bound for index in indices) or len(set(indices)) != len(indices):
        raise CorruptCheckpointError(f"{path}: manifest tensor indices are out of range or repeated")
    if sorted(indices) != sorted(ref for ref in tensor_refs(part.skeleton)):
        raise CorruptCheckpointError(f"{path}: manifest skeleton does not refer to each of its tensors once")
    total = 0
    for tensor in part.tensors:
        itemsize = torch_dtype(tensor.dtype, path).itemsize
        if element_count(tensor.shape) < 0 or element_count(tensor.shape) * itemsize > data_bytes:
            raise CorruptCheckpointError(f"{path}: tensor {tensor.key!r} of shape {tensor.shape} does not fit the data files")
        total += element_count(tensor.shape) * itemsize
    return total


def check_dcp_metadata(path: Path, metadata: Any, manifest: DcpManifest) -> dict[StorageKey, int]:
    """DCP's ``.metadata`` describes exactly the manifest's tensors, stored inside listed files.

    Refused: a bytes item (DCP would unpickle it), a key, dtype or size the manifest does not
    declare, chunks that do not tile their tensor exactly (a missing chunk would leave its part of
    the tensor uninitialized), a stored item that is no chunk's or a chunk with no stored item, a
    storage file that is not one of the manifest's data files (another path, a path outside the
    directory, ``.metadata`` itself), a byte range past the end of its file, and a storage
    transform (coci writes none). Returns each chunk's bytes (what its stored item may expand to).
    """
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    declared = manifest.saved_tensors()  # a replicated tensor of node-local directories: once per node
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict) or set(entries) != set(declared):
        raise CorruptCheckpointError(f"{path}: DCP metadata does not hold exactly the manifest's tensors")
    chunk_bytes: dict[StorageKey, int] = {}
    for key, entry in entries.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise CorruptCheckpointError(
                f"{path}: DCP metadata entry {key!r} is {type(entry).__name__}, not a tensor (bytes items are never loaded)"
            )
        expected = declared[key]
        if list(entry.size) != expected.shape or entry.properties.dtype != torch_dtype(expected.dtype, path):
            raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} differs from the manifest's dtype or shape")
        chunk_bytes.update(check_chunks(path, key, expected.shape, entry.chunks, entry.properties.dtype.itemsize))
    sizes = {f.name: f.size for f in manifest.files if f.name != DCP_METADATA}
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        raise CorruptCheckpointError(f"{path}: DCP metadata has no storage table")
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or index.fqn not in declared or not isinstance(info, _StorageInfo):
            raise CorruptCheckpointError(f"{path}: DCP storage table has an entry for {getattr(index, 'fqn', index)!r}")
        if storage_key(path, index) not in chunk_bytes:
            raise CorruptCheckpointError(f"{path}: DCP storage of {index.fqn!r} at {index.offset!r} is no chunk of that tensor")
        _check_storage(path, index.fqn, info, sizes)
    stored = {storage_key(path, index) for index in storage}
    for (key, offsets), nbytes in chunk_bytes.items():
        if nbytes and (key, offsets) not in stored:
            raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has no stored data for its chunk at {list(offsets)}")
    return chunk_bytes


#: A stored item's identity: its tensor's key and the chunk's offsets (DCP's ``MetadataIndex``).
StorageKey = tuple[str, tuple[int, ...]]


def storage_key(path: Path, index: Any) -> StorageKey:
    return index.fqn, _dims(path, index.fqn, index.offset)


def _dims(path: Path, key: str, value: Any) -> tuple[int, ...]:
    """A chunk's offsets or sizes: a sequence of non-negative integers (CorruptCheckpointError otherwise)."""
    dims = tuple(value) if isinstance(value, (tuple, list)) else None
    if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has a chunk bound {value!r}, not non-negative integers")
    return dims


def check_chunks(path: Path, key: str, shape: list[int], chunks: Any, itemsize: int) -> dict[StorageKey, int]:
    """The chunks of tensor ``key`` lie inside it and tile it exactly (no gap, no overlap); returns
    each chunk's bytes by its offsets."""
    if not isinstance(chunks, list) or len(chunks) > _DCP_MAX_CHUNK_GRID_CELLS:
        raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has no list of chunks, or too many")
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    found: dict[StorageKey, int] = {}
    for chunk in chunks:
        offsets, sizes = _dims(path, key, getattr(chunk, "offsets", None)), _dims(path, key, getattr(chunk, "sizes", None))
        if len(offsets) != len(shape) or len(sizes) != len(shape) or any(o + s > d for o, s, d in zip(offsets, sizes, shape)):
            raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has a chunk outside the tensor ({offsets}, {sizes})")
        nbytes = element_count(list(sizes)) * itemsize
        if nbytes:
            boxes.append((offsets, sizes))
            found[(key, offsets)] = nbytes
        else:
            found.setdefault((key, offsets), 0)
    if element_count(shape):
        _check_tiling(path, key, shape, boxes)
    return found


def _check_tiling(path: Path, key: str, shape: list[int], boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """Every element of the tensor lies in exactly one box: counted on the grid the boxes' own
    boundaries cut the tensor into (one cell per chunk for a real sharded layout)."""
    cuts = [sorted({0, dim, *(o[d] for o, _ in boxes), *(o[d] + s[d] for o, s in boxes)}) for d, dim in enumerate(shape)]
    grid = [len(c) - 1 for c in cuts]
    if math.prod(grid) > _DCP_MAX_CHUNK_GRID_CELLS:
        raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} is cut into over _DCP_MAX_CHUNK_GRID_CELLS pieces")
    position = [{cut: i for i, cut in enumerate(c)} for c in cuts]
    spans = [tuple(slice(position[d][o[d]], position[d][o[d] + s[d]]) for d in range(len(shape))) for o, s in boxes]
    if sum(math.prod(span.stop - span.start for span in box) for box in spans) > math.prod(grid):
        raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has overlapping chunks")
    counts = np.zeros(grid, dtype=np.int32)
    for box in spans:
        counts[box] += 1
    if counts.max() > 1:
        raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has overlapping chunks")
    if counts.min() < 1:
        raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} has chunks missing (they do not cover the tensor)")


def check_dcp_items(path: Path, storage: dict[Any, Any], chunk_bytes: dict[StorageKey, int]) -> None:
    """Each stored item (a ``torch.save`` archive) expands on load to at most its chunk's bytes
    (``coci.checkpoint.dcp_items.check_item``); only the items' zip directories are read."""
    by_file: dict[str, list[tuple[Any, Any]]] = {}
    for index, info in storage.items():
        by_file.setdefault(info.relative_path, []).append((index, info))
    for name, items in sorted(by_file.items()):
        fd = record_reads.open_no_follow(path / name, os.O_RDONLY)
        try:
            for index, info in items:
                where = f"{path}: DCP stored item {index.fqn!r} at {list(storage_key(path, index)[1])} in {name}"
                dcp_items.check_item(dcp_items.ItemView(fd, info.offset, info.length), info.length, chunk_bytes[storage_key(path, index)], where)
        finally:
            os.close(fd)


def _check_storage(path: Path, key: str, info: Any, sizes: dict[str, int]) -> None:
    name = info.relative_path
    if not isinstance(name, str) or name not in sizes:
        raise CorruptCheckpointError(
            f"{path}: DCP storage of {key!r} is {name!r}, outside the manifest's files (reads stay inside the checkpoint)"
        )
    offset, length = info.offset, info.length
    if not (isinstance(offset, int) and isinstance(length, int)) or offset < 0 or length < 0 or offset + length > sizes[name]:
        raise CorruptCheckpointError(f"{path}: DCP storage of {key!r} lies outside {name}")
    if info.transform_descriptors:
        raise CorruptCheckpointError(f"{path}: DCP storage of {key!r} declares transforms {info.transform_descriptors!r}")


#: The only globals DCP's pickled ``.metadata`` may name (classes of plain records, dtypes, sizes).
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` without running code: named records and dtypes only."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CorruptCheckpointError(f"DCP metadata names a forbidden global {module}.{name}")


def read_dcp_metadata(path: Path, manifest: DcpManifest) -> Any:
    """DCP's ``.metadata``, checksummed, read through the restricted unpickler and checked against the manifest
    (``check_dcp_metadata``), and every stored item's zip directory
    bounded by its chunk (``check_dcp_items``), before DCP may act
    on any of it."""
    entry = next((e for e in manifest.present_files() if e.name == DCP_METADATA), None)
    if entry is None:
        raise CorruptCheckpointError(f"{path}: manifest lists no {DCP_METADATA}")
    raw = fileio.read_verified(path / DCP_METADATA, entry)  # the bytes unpickled are the bytes checksummed
    try:
        metadata = _MetadataUnpickler(io.BytesIO(raw.numpy().tobytes())).load()
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # a damaged pickle fails in many ways; all of them mean corrupt
        raise CorruptCheckpointError(f"{path}: DCP metadata is unreadable ({type(exc).__name__}: {exc})") from exc
    chunk_bytes = check_dcp_metadata(path, metadata, manifest)
    here = {entry.name for entry in manifest.present_files()}  # a node's part: the items of its ranks' files
    check_dcp_items(path, {i: info for i, info in metadata.storage_data.items() if info.relative_path in here}, chunk_bytes)
    return metadata
