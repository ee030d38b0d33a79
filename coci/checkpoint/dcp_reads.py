"""DCP's reads of a checkpoint's data files, checksummed on the very bytes torch loads.

``read_verified_items`` takes the place of ``FileSystemReader.read_data``. For each data file the
load plan touches it opens the file once (never through a link), checks its size against the
commit record and reads it front to back, feeding every byte to the checksum the record names.
The bytes of each stored item the plan needs are kept as they pass (in one scratch buffer, reused
item after item), bounded by their chunk (``dcp_items.check_item``), described by
``torch.load(weights_only=True)`` onto the meta device and copied from where they lie into the
load's own tensors; the bytes between them only feed the checksum. After a file's last byte its checksum
must match the record, else ``CorruptCheckpointError``: DCP gathers every rank's read error, so the
load fails on every rank and its tensors, which then hold unverified bytes, are discarded by the
caller (they are the load's fresh tensors, never the live state).

So a file replaced or rewritten after coci's checks of the record and ``.metadata`` never reaches
the state, and each byte a restore loads is read and checksummed once (no verification pass before
DCP's own reads). Memory: one stored item (a tensor chunk) and one read chunk at a time.

``OnePassReads`` serves several DCP loads of one checkpoint in turn (an export's batches) the same
way, each file kept open and read on where the last load stopped, checked by its ``finish``.
"""

from __future__ import annotations

import io
import math
import os
import struct
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, cast

import torch

from coci import knobs
from coci.checkpoint import dcp_items, fileio, record_reads
from coci.checkpoint.records import FileEntry
from coci.errors import CorruptCheckpointError

__all__ = ["OPEN_FILES", "FileCursor", "OnePassReads", "chunk_bytes_of", "read_verified_items"]


#: The most data files ``OnePassReads`` keeps open at once (a checkpoint of many ranks has a file each).
OPEN_FILES = 64


def chunk_bytes_of(metadata: Any) -> dict[tuple[str, tuple[int, ...]], int]:
    """Each stored chunk's bytes in memory by (tensor key, chunk offsets): what its item may expand to."""
    found: dict[tuple[str, tuple[int, ...]], int] = {}
    for key, entry in metadata.state_dict_metadata.items():
        itemsize = entry.properties.dtype.itemsize
        for chunk in entry.chunks:
            found[(key, tuple(chunk.offsets))] = math.prod(chunk.sizes) * itemsize
    return found


def read_verified_items(
    path: Path, files: Mapping[str, FileEntry], storage_data: Mapping[Any, Any], chunk_bytes: Mapping[Any, int], plan: Any, planner: Any
) -> None:
    """Serve DCP's load ``plan`` (its ``ReadItem``s) to ``planner`` from the data files of ``path``,
    each file read once and checked against its entry of ``files`` (see the module)."""
    scratch = ItemScratch()
    for name, items in _items_by_file(path, files, storage_data, plan):
        cursor = FileCursor(path / name, files[name], scratch)
        try:
            cursor.take(items, chunk_bytes, planner)
            cursor.finish()
        finally:
            cursor.close()


class OnePassReads:
    """The data files of one checkpoint served to several DCP loads in turn (an export's batches),
    each file read once, front to back across the loads (opened at its first use).

    The rule, enforced by ``FileCursor.take``: the loads must ask for each file's items in offset
    order (an item before a byte already read is refused, never read again), so the caller orders
    its loads by the files (``coci.checkpoint.export``). The bytes a load receives are checksummed
    as they pass, but a file's checksum is known only at its end: ``finish`` checks every file
    (reading the rest of each, and each listed file no load touched), and until it returned the
    loaded tensors hold unverified bytes, so nothing made from them may be committed before.
    Memory: one stored item and one read chunk at a time; at most ``OPEN_FILES`` descriptors open
    (a file's cursor beyond them is suspended and opened again where it stopped).
    """

    def __init__(self, path: Path, files: Mapping[str, FileEntry]) -> None:
        self._path = path
        self._files = files
        self._cursors: dict[str, FileCursor] = {}
        self._scratch = ItemScratch()

    def read(self, storage_data: Mapping[Any, Any], chunk_bytes: Mapping[Any, int], plan: Any, planner: Any) -> None:
        """Serve one DCP load ``plan`` to ``planner`` (as ``read_verified_items``, each file read on
        where the last load stopped)."""
        for name, items in _items_by_file(self._path, self._files, storage_data, plan):
            cursor = self._cursors.pop(name, None)
            self._suspend_beyond(OPEN_FILES - 1)  # room for this one
            self._cursors[name] = cursor = cursor if cursor is not None else FileCursor(self._path / name, self._files[name], self._scratch)
            cursor.take(items, chunk_bytes, planner)
        self._suspend_beyond(OPEN_FILES)

    def _suspend_beyond(self, most: int) -> None:
        """Suspend the least recently used open cursors until at most ``most`` are open."""
        open_now = [cursor for cursor in self._cursors.values() if cursor.is_open]
        for cursor in open_now[: max(0, len(open_now) - max(most, 0))]:
            cursor.suspend()

    def finish(self, present: list[FileEntry]) -> None:
        """Read each file to its end and check its size and checksum (CorruptCheckpointError naming
        it): the files the loads read, then those of ``present`` no load touched."""
        for cursor in list(self._cursors.values()):
            cursor.finish()
        for entry in present:
            if entry.name not in self._cursors:
                self._cursors[entry.name] = cursor = FileCursor(self._path / entry.name, entry, self._scratch)
                cursor.finish()

    def close(self) -> None:
        for cursor in self._cursors.values():
            cursor.close()
        self._scratch.release()


class ItemScratch:
    """The one buffer a reader reads every stored item's bytes into, kept across items and files
    (grown to the largest item): an item's bytes cost no allocation of their own, so an export's
    resident memory is its batch, this buffer and the tensor ``torch.load`` makes of one item,
    without the heap growth a fresh buffer per item leaves behind."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def view(self, length: int) -> memoryview:
        """A writable view of ``length`` bytes (what it held before is overwritten by the caller)."""
        if len(self._buffer) < length:
            self._buffer = bytearray()  # the old one goes before the larger one comes
            self._buffer = bytearray(length)
        return memoryview(self._buffer)[:length]

    def release(self) -> None:
        self._buffer = bytearray()


def _items_by_file(path: Path, files: Mapping[str, FileEntry], storage_data: Mapping[Any, Any], plan: Any) -> list[tuple[str, list[tuple[Any, Any, list[Any]]]]]:
    """The plan's requests grouped by data file (by name) and stored item, each file's items in offset order."""
    per_file: dict[str, dict[Any, list[Any]]] = {}
    for request in plan.items:
        info = storage_data[request.storage_index]
        per_file.setdefault(info.relative_path, {}).setdefault(request.storage_index, []).append(request)
    found = []
    for name, items in sorted(per_file.items()):
        if name not in files:
            raise CorruptCheckpointError(f"{path}: DCP would read {name!r}, which the commit record does not list")
        ordered = sorted(items.items(), key=lambda pair: storage_data[pair[0]].offset)
        found.append((name, [(storage_data[index], index, requests) for index, requests in ordered]))
    return found


class FileCursor:
    """One data file read front to back (opened never through a link, its size checked at each
    opening): the items' bytes loaded as they pass, every byte checksummed in file order;
    ``finish`` checks the checksum. ``suspend`` closes the descriptor and keeps the place: the next
    read opens the file again where it stopped. The checksum runs over the bytes read, in order, so
    a file replaced or changed between two openings fails it like one changed while open."""

    def __init__(self, path: Path, entry: FileEntry, scratch: ItemScratch | None = None) -> None:
        self._path = path
        self._entry = entry
        self._scratch = scratch if scratch is not None else ItemScratch()
        self._position = 0
        self._checksum = fileio.ChunkChecksum(entry.algorithm, threaded=False)
        self._fd: int | None = None
        self._done = False
        try:
            self._opened()
        except BaseException:
            self.close()
            raise

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def _opened(self) -> int:
        """The open descriptor, opening the file (and checking its size) when suspended."""
        if self._fd is not None:
            return self._fd
        try:
            fd = record_reads.open_no_follow(self._path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"{self._path}: data file is missing") from exc
        self._fd = fd
        actual = os.fstat(fd).st_size
        if actual != self._entry.size:
            raise CorruptCheckpointError(f"{self._path}: size {actual} != manifest size {self._entry.size}")
        if hasattr(os, "posix_fadvise"):  # read once, front to back: let the kernel read ahead
            os.posix_fadvise(fd, self._position, self._entry.size - self._position, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def take(self, items: list[tuple[Any, Any, list[Any]]], chunk_bytes: Mapping[Any, int], planner: Any) -> None:
        """Load ``items`` (offset order, none before a byte already read) into ``planner``'s tensors."""
        fd = self._opened()
        for info, index, requests in items:
            if info.offset < self._position or info.offset + info.length > self._entry.size:
                raise CorruptCheckpointError(f"{self._path}: DCP stored item {index.fqn!r} overlaps another, lies before a byte already read or leaves the file")
            _checksum_span(fd, self._path, self._position, info.offset, self._checksum)
            data = self._scratch.view(info.length)
            fileio.pread_fully(fd, self._path, data, info.offset)
            self._checksum.submit(data)
            self._position = info.offset + info.length
            where = f"{self._path}: DCP stored item {index.fqn!r} at {list(index.offset)}"
            _load_item(data, requests, chunk_bytes.get((index.fqn, tuple(index.offset)), 0), where, planner)

    def finish(self) -> None:
        """Checksum the rest of the file, close it and check size and checksum against the record."""
        _checksum_span(self._opened(), self._path, self._position, self._entry.size, self._checksum)
        self._position = self._entry.size
        crc = self._checksum.result()
        self.close()
        fileio.check_checksum(self._path, self._entry, crc)

    def suspend(self) -> None:
        """Close the descriptor, keeping the place and the checksum so far."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._checksum.close()
        self.suspend()


def _checksum_span(fd: int, path: Path, start: int, end: int, checksum: fileio.ChunkChecksum) -> None:
    """Feed bytes ``start`` to ``end`` of the file (bytes no item of the plan holds) to ``checksum``."""
    if end <= start:
        return
    scratch = memoryview(bytearray(min(knobs.READ_CHUNK_BYTES, end - start)))  # small: a fresh one costs no heap growth
    while start < end:
        piece = scratch[: min(len(scratch), end - start)]
        fileio.pread_fully(fd, path, piece, start)
        checksum.submit(piece)
        start += len(piece)


def _load_item(data: memoryview, requests: list[Any], chunk_bytes: int, where: str, planner: Any) -> None:
    """Bound the item's archive by its chunk, load it once and copy each request's slice into its target."""
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint.planner import LoadItemType

    if any(request.type == LoadItemType.BYTE_IO for request in requests):
        planner.load_bytes(requests[0], io.BytesIO(bytes(data)))  # coci's planner refuses every bytes item
        return
    dcp_items.check_item(dcp_items.BufferView(data), len(data), chunk_bytes, where)
    stored = _stored_tensor(data, where)
    for request in requests:
        piece = narrow_tensor_by_index(stored, request.storage_offsets, request.lengths)
        target = planner.resolve_tensor(request).detach()
        if target.size() != piece.size():
            raise CorruptCheckpointError(f"{where}: holds {list(piece.size())} where the load expects {list(target.size())}")
        target.copy_(piece)
        planner.commit_tensor(request, target)


def _stored_tensor(data: memoryview, where: str) -> torch.Tensor:
    """The tensor of the checked item in ``data``: ``torch.load(weights_only=True)`` onto the meta
    device gives its dtype, shape, strides and its storage's place in the archive, and the tensor
    is a view of those bytes of ``data`` (no copy: an item costs no memory beyond ``data``). An
    archive of the other byte order is loaded by ``torch.load`` itself (a copy, swapped)."""
    meta = _load_tensor(data, where, "meta")
    start = getattr(meta.untyped_storage(), "_checkpoint_offset", None)
    byteorder, spans = _records_of(data)
    if not isinstance(start, int) or byteorder not in (None, sys.byteorder):
        return _load_tensor(data, where, "cpu")
    nbytes = meta.untyped_storage().nbytes()
    if (start, nbytes) not in spans or nbytes % meta.element_size():
        raise CorruptCheckpointError(f"{where}: its tensor's storage ({nbytes} bytes at {start}) is no record of the item")
    raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=start) if nbytes else torch.empty(0, dtype=torch.uint8)
    try:
        return raw.view(meta.dtype).as_strided(meta.size(), meta.stride(), meta.storage_offset())
    except RuntimeError as exc:  # sizes and strides beyond the storage
        raise CorruptCheckpointError(f"{where}: its tensor does not fit its storage ({exc})") from exc


def _records_of(data: memoryview) -> tuple[str | None, set[tuple[int, int]]]:
    """The archive's ``byteorder`` record (``torch.save`` writes the writer's; None when absent) and
    each record's data as (start, bytes) in ``data`` (``check_item`` checked the archive)."""
    spans: set[tuple[int, int]] = set()
    byteorder = None
    with zipfile.ZipFile(dcp_items.BufferView(data)) as archive:
        for record in archive.infolist():
            local = bytes(data[record.header_offset : record.header_offset + 30])
            if len(local) == 30:
                name_length, extra_length = struct.unpack("<HH", local[26:30])
                spans.add((record.header_offset + 30 + name_length + extra_length, record.file_size))
            if record.filename.rsplit("/", 1)[-1] == "byteorder":
                byteorder = archive.read(record).decode("ascii", "replace")
    return byteorder, spans


def _load_tensor(data: memoryview, where: str, device: str) -> torch.Tensor:
    """The item's tensor, ``torch.load(weights_only=True)`` onto ``device`` ("meta": described, no
    bytes copied; "cpu": a copy); CorruptCheckpointError naming ``where`` for anything else."""
    try:
        stored = torch.load(cast(IO[bytes], dcp_items.BufferView(data)), map_location=device, weights_only=True)
    except Exception as exc:  # a damaged archive fails in many ways; the checksum would refuse it too
        raise CorruptCheckpointError(f"{where}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
    if not isinstance(stored, torch.Tensor):
        raise CorruptCheckpointError(f"{where}: holds a {type(stored).__name__}, not a tensor")
    return stored
