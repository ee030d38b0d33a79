"""The remote tier's storage protocol and what its implementations share.

A [``RemoteStore``][coci.checkpoint.remote.store.RemoteStore] is a flat namespace of immutable objects under one prefix (an S3 bucket
prefix or a shared directory): put a file or bytes, get them back bounded in size, list, delete,
test existence, create an object only where none exists ([``RemoteStore.put_bytes_if_absent``][coci.checkpoint.remote.store.RemoteStore.put_bytes_if_absent],
the run identity's claim). Callers never branch on which store they hold (``coci.checkpoint.remote.open_store``
picks it from the URL). Every key is ``/``-separated plain names (``check_key``): nothing is
ever read or written outside the prefix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

import crc32c

from coci import safe_files
from coci.checkpoint import faults
from coci.errors import CorruptCheckpointError

__all__ = ["RemoteStore", "check_key", "read_chunks"]

_SAFE_PART = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")  # a leading dot: DCP's .metadata


@runtime_checkable
class RemoteStore(Protocol):
    """Objects under one prefix. Keys are relative to it; a put is atomic (all or nothing).

    Any object with these methods is a store: pass it as ``Session(remote=store)`` (a subclass or
    a wrapper of ``coci.checkpoint.remote.filesystem.DirectoryStore`` included), or register a
    URL scheme that opens it (``coci.checkpoint.remote.schemes``). Keys coci hands a store are
    already checked (``check_key``); a store must still never read or write outside its prefix,
    bound every read by ``max_bytes`` and make each put all-or-nothing.
    """

    @property
    def url(self) -> str: ...

    def put_file(self, key: str, source: BinaryIO, size: int) -> int:
        """Upload ``size`` bytes read from ``source`` (multipart when large); return their crc32c.
        ValueError when ``source`` holds fewer bytes."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` only where no object has that key (an S3 ``If-None-Match``
        put, an exclusive link on a directory): of two racing writers exactly one gets True."""
        ...

    def get_file(self, key: str, dest: Path, max_bytes: int) -> int:
        """Download into ``dest`` (created); return its crc32c. CorruptCheckpointError when the object
        is larger than ``max_bytes``."""
        ...

    def get_bytes(self, key: str, max_bytes: int) -> bytes: ...

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        """Every object whose key starts with ``prefix``: key -> size."""
        ...

    def delete(self, keys: list[str]) -> None:
        """Delete ``keys`` (absent ones are ignored)."""
        ...

    def exists(self, key: str) -> bool: ...


def check_key(key: str) -> str:
    """``key`` when it is plain names joined by ``/`` (no ``..``, no leading dot or slash)."""
    if not is_plain_key(key):
        raise CorruptCheckpointError(f"remote key {key!r} is not a plain path inside the remote prefix")
    return key


def is_plain_key(key: str) -> bool:
    """Whether ``key`` is plain names joined by ``/``: the only keys coci writes or deletes."""
    return bool(key) and all(part not in (".", "..") and _SAFE_PART.match(part) for part in key.split("/"))


def read_chunks(source: BinaryIO, size: int, chunk_bytes: int, crc: list[int]) -> Iterator[bytes]:
    """Exactly ``size`` bytes of ``source`` in chunks; ``crc[0]`` accumulates their crc32c.
    ValueError when ``source`` ends early (a truncated local file is never uploaded as whole)."""
    remaining = size
    while remaining > 0:
        piece = source.read(min(chunk_bytes, remaining))
        if not piece:
            raise ValueError(f"local file ended {remaining} bytes before its recorded size {size}")
        crc[0] = crc32c.crc32c(piece, crc[0])
        first = remaining == size
        remaining -= len(piece)
        yield piece
        if first and remaining > 0:
            faults.fault("mid_upload")  # one part handed to the client, more to come


def bounded_chunks(chunks: Iterator[bytes], max_bytes: int, key: str) -> Iterator[bytes]:
    """Pass ``chunks`` through, refusing more than ``max_bytes`` in all (a hostile object never fills
    the disk or memory)."""
    seen = 0
    for piece in chunks:
        seen += len(piece)
        if seen > max_bytes:
            raise CorruptCheckpointError(f"remote object {key!r} is larger than the {max_bytes} bytes expected")
        yield piece


def download_to(chunks: Iterator[bytes], dest: Path, max_bytes: int, key: str) -> int:
    """Write ``chunks`` (at most ``max_bytes`` in all) to ``dest``, fsynced; the crc32c of the bytes."""
    crc = 0
    with safe_files.opened_dir(dest.parent, error=CorruptCheckpointError) as dir_fd:
        fd = safe_files.create_at(dir_fd, dest.name, path=dest, error=CorruptCheckpointError)
    try:
        for piece in bounded_chunks(chunks, max_bytes, key):
            crc = crc32c.crc32c(piece, crc)
            safe_files.write_all(fd, piece)
        os.fsync(fd)
    finally:
        os.close(fd)
    return crc
