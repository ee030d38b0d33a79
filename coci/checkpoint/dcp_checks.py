"""Checks that make a DCP checkpoint safe to load: its commit record and DCP's ``.metadata``.

DCP's default load planner reads a *bytes* item with ``torch.load(..., weights_only=False)`` (code
execution), and its reader opens whatever path ``.metadata`` names. coci writes tensors only, so a
checkpoint is loaded only when :func:`check_dcp_metadata` finds exactly the manifest's tensors,
each stored in a file the manifest lists and checksums, inside the range of that file. The
manifest's own tensor table is bounded by the files it lists (:func:`check_dcp_manifest`), so a
hostile record cannot make the loader allocate more than the checkpoint holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from coci import knobs
from coci.checkpoint import format
from coci.checkpoint.local import element_count, torch_dtype
from coci.checkpoint.tree import tensor_refs
from coci.errors import CorruptCheckpointError

if TYPE_CHECKING:
    from coci.checkpoint.dcp import DcpManifest, DcpPart

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
    format.check_state_keys(manifest.state_keys, manifest.shared.skeleton, path)
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


def check_dcp_metadata(path: Path, metadata: Any, manifest: DcpManifest) -> None:
    """DCP's ``.metadata`` describes exactly the manifest's tensors, stored inside listed files.

    Refused: a bytes item (DCP would unpickle it), a key, dtype or size the manifest does not
    declare, a storage file that is not one of the manifest's data files (another path, a path
    outside the directory, ``.metadata`` itself), a byte range past the end of its file, and a
    storage transform (coci writes none).
    """
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    declared = {t.key: t for part in (manifest.shared, *manifest.ranks) for t in part.tensors}
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict) or set(entries) != set(declared):
        raise CorruptCheckpointError(f"{path}: DCP metadata does not hold exactly the manifest's tensors")
    for key, entry in entries.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise CorruptCheckpointError(
                f"{path}: DCP metadata entry {key!r} is {type(entry).__name__}, not a tensor (bytes items are never loaded)"
            )
        expected = declared[key]
        if list(entry.size) != expected.shape or entry.properties.dtype != torch_dtype(expected.dtype, path):
            raise CorruptCheckpointError(f"{path}: DCP metadata entry {key!r} differs from the manifest's dtype or shape")
    sizes = {f.name: f.size for f in manifest.files if f.name != DCP_METADATA}
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        raise CorruptCheckpointError(f"{path}: DCP metadata has no storage table")
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or index.fqn not in declared or not isinstance(info, _StorageInfo):
            raise CorruptCheckpointError(f"{path}: DCP storage table has an entry for {getattr(index, 'fqn', index)!r}")
        _check_storage(path, index.fqn, info, sizes)


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
