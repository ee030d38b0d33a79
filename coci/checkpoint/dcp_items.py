"""What a DCP storage item may expand to when torch reads it, checked before torch reads any.

DCP stores each tensor chunk as one ``torch.save`` archive (a zip file) inside a data file, and
loads it with ``torch.load``, which allocates every record at the uncompressed size its zip
directory claims. A deflated record of a few kilobytes may claim gigabytes. ``check_item``
reads only the item's zip directory and refuses an item unless every record is stored
uncompressed (``torch.save`` never compresses) and all of them together take at most the chunk's
own bytes plus ``knobs.DCP_ITEM_OVERHEAD_BYTES``. The directory is pinned to the layout both
readers (Python's ``zipfile`` here, torch's miniz there) find the same way: the end record ends the
item with no comment, and the central directory ends where the end records begin.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile

from coci import knobs
from coci.errors import CorruptCheckpointError

#: Most records one DCP storage item may hold (``torch.save`` writes 7).
_DCP_ITEM_MAX_RECORDS: int = 64

_END = struct.Struct("<4sHHHHIIH")  # end of central directory record
_LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator
_END64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory record (no extensible data)
_NOT_IN_END = 0xFFFFFFFF


class _SeekableSpan(io.RawIOBase):
    """A read-only, seekable stream of ``length`` bytes: the position and seeking that
    :class:`ItemView` and :class:`BufferView` share; a subclass reads with ``readinto``."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self._length, self._position = length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._length}[whence]
        self._position = min(max(base + position, 0), self._length)
        return self._position

    def read_at(self, position: int, size: int) -> bytes:
        self.seek(position)
        return self.read(size) or b""


class ItemView(_SeekableSpan):
    """A read-only, seekable view of ``length`` bytes at ``offset`` of an open file (positional
    reads: the file's own offset is never moved)."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__(length)
        self._fd, self._offset = fd, offset

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        wanted = min(len(buffer), self._length - self._position)
        data = os.pread(self._fd, wanted, self._offset + self._position) if wanted > 0 else b""
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)


class BufferView(_SeekableSpan):
    """A read-only, seekable view of an item already read into memory (no copy of it)."""

    def __init__(self, data: bytearray | memoryview) -> None:
        self._data = memoryview(data)
        super().__init__(len(self._data))

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        count = max(0, min(len(buffer), self._length - self._position))
        buffer[:count] = self._data[self._position : self._position + count]
        self._position += count
        return count


def check_item(view: ItemView | BufferView, length: int, chunk_bytes: int, where: str) -> None:
    """Refuse (CorruptCheckpointError naming ``where``) an item whose records could expand past
    ``chunk_bytes`` plus the overhead knob, or whose zip directory readers could see differently."""
    records = _records(view, length, where)
    if len(records) > _DCP_ITEM_MAX_RECORDS:
        raise CorruptCheckpointError(f"{where}: holds {len(records)} records, over _DCP_ITEM_MAX_RECORDS")
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            raise CorruptCheckpointError(f"{where}: record {record.filename!r} is compressed (torch.save stores records as they are)")
    expands_to = sum(record.file_size for record in records)
    if expands_to > chunk_bytes + knobs.DCP_ITEM_OVERHEAD_BYTES:
        raise CorruptCheckpointError(
            f"{where}: expands to {expands_to} bytes on load, over the {chunk_bytes} bytes of its tensor chunk"
            " (plus knobs.DCP_ITEM_OVERHEAD_BYTES)"
        )


def _records(view: ItemView | BufferView, length: int, where: str) -> list[zipfile.ZipInfo]:
    directory_start = _directory_start(view, length, where)
    try:
        archive = zipfile.ZipFile(view)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error, NotImplementedError) as exc:
        # NotImplementedError: a directory record claiming a zip version or feature zipfile lacks
        raise CorruptCheckpointError(f"{where}: is not a readable archive ({type(exc).__name__}: {exc})") from exc
    if archive.start_dir != directory_start:
        raise CorruptCheckpointError(f"{where}: its zip directory is not where its end record says")
    return archive.infolist()


def _directory_start(view: ItemView | BufferView, length: int, where: str) -> int:
    """Where the central directory begins, from the end record that ends the item (and its zip64
    record right before it, when there is one); the directory must end where those begin."""
    if length < _END.size:
        raise CorruptCheckpointError(f"{where}: {length} bytes, too short to be an archive")
    end_at = length - _END.size
    signature, _, _, _, _, size, start, comment = _END.unpack(view.read_at(end_at, _END.size))
    if signature != b"PK\x05\x06" or comment:
        raise CorruptCheckpointError(f"{where}: does not end with a zip end record")
    records_at = end_at
    locator_at = end_at - _LOCATOR.size
    if locator_at >= 0 and view.read_at(locator_at, 4) == b"PK\x06\x07":
        _, _, end64_at, _ = _LOCATOR.unpack(view.read_at(locator_at, _LOCATOR.size))
        end64 = view.read_at(end64_at, _END64.size) if end64_at == locator_at - _END64.size else b""
        if len(end64) != _END64.size or end64[:4] != b"PK\x06\x06":
            raise CorruptCheckpointError(f"{where}: its zip64 end record is not right before its locator")
        fields = _END64.unpack(end64)
        if fields[1] != _END64.size - 12:
            raise CorruptCheckpointError(f"{where}: its zip64 end record has extensible data")
        size, start, records_at = fields[8], fields[9], end64_at
    elif _NOT_IN_END in (size, start):
        raise CorruptCheckpointError(f"{where}: its end record defers to a zip64 record it lacks")
    if start + size != records_at:
        raise CorruptCheckpointError(f"{where}: its zip directory does not end where its end records begin")
    return start
