"""The wire format of peer copies (``coci.checkpoint.peers``): framed headers and one node's
part of a checkpoint sent over a TCP socket, received, verified and committed.

A header is a 4-byte big-endian length and a JSON object (at most
``_PEER_HEADER_MAX_BYTES``). A part is a listing (``[[name, size], ...]``, ``manifest.json``
first) followed by the files' bytes in that order: the sender streams each file with
``socket.sendfile`` (no copy through Python), the receiver writes each chunk as it arrives and
checksums it on the way. What a peer sends is untrusted input, as any checkpoint: the record is
parsed and checked like a local one (``coci.checkpoint.dcp.read_dcp_manifest``), the listing
must name exactly the files the record says this part holds, at their recorded sizes, each file's
checksum must match, DCP's ``.metadata`` is checked before anything loads it, nothing is written
outside the ``*.tmp`` directory the caller names, and a part larger than the free disk is refused.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from coci import knobs, safe_files
from coci.checkpoint import commit, layout, record_reads, records
from coci.checkpoint.dcp import read_dcp_manifest
from coci.checkpoint.dcp_checks import read_dcp_metadata
from coci.checkpoint.dcp_manifest import DcpManifest
from coci.checkpoint.fileio import ChunkChecksum
from coci.errors import CorruptCheckpointError

__all__ = ["Deadline", "PeerProtocolError", "open_part", "receive_part", "recv_header", "send_header", "send_part"]

#: Largest request or reply header a peer may send (its commit record is bounded by
#: ``MAX_MANIFEST_BYTES``); a listing of more than ``_PEER_MAX_FILES`` files is refused.
_PEER_HEADER_MAX_BYTES: int = 1 << 20
_PEER_MAX_FILES: int = 100_000

#: Bytes received per ``recv_into`` (and checksummed, written) at a time (``knobs.PEER_BUFFERS`` of them rotate).
_PEER_CHUNK_BYTES: int = 4 << 20

_LENGTH_BYTES = 4


class PeerProtocolError(CorruptCheckpointError):
    """A peer sent something that is not a well-formed header or part (or closed mid-way)."""


class Deadline:
    """When a whole exchange on a socket must be over: each read waits at most what is left of it
    (and at most ``knobs.PEER_SOCKET_TIMEOUT_SECONDS``); past it, PeerProtocolError naming ``what``."""

    def __init__(self, seconds: float, what: str) -> None:
        self.at = time.monotonic() + seconds
        self.what = what

    def extend(self, seconds: float) -> None:
        self.at += seconds

    def arm(self, sock: socket.socket) -> None:
        left = self.at - time.monotonic()
        if left <= 0:
            raise PeerProtocolError(f"{self.what} did not end in time (coci.knobs.PEER_HEADER_SECONDS, PEER_TRANSFER_SECONDS)")
        sock.settimeout(min(knobs.PEER_SOCKET_TIMEOUT_SECONDS, left))


def transfer_seconds(nbytes: int) -> float:
    """How long a transfer of ``nbytes`` may take (``knobs.PEER_TRANSFER_SECONDS``)."""
    return knobs.PEER_TRANSFER_SECONDS + nbytes / knobs.PEER_TRANSFER_BYTES_PER_SECOND


def send_header(sock: socket.socket, header: dict[str, Any]) -> None:
    """One framed JSON header."""
    data = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(len(data).to_bytes(_LENGTH_BYTES, "big") + data)


def recv_header(sock: socket.socket, deadline: Deadline | None = None) -> dict[str, Any]:
    """The next framed header: a JSON object of at most ``_PEER_HEADER_MAX_BYTES``, whole by ``deadline``."""
    length = int.from_bytes(recv_exact(sock, _LENGTH_BYTES, deadline), "big")
    if length > _PEER_HEADER_MAX_BYTES:
        raise PeerProtocolError(f"peer header of {length} bytes (at most {_PEER_HEADER_MAX_BYTES})")
    try:
        header = json.loads(recv_exact(sock, length, deadline))
    except ValueError as exc:
        raise PeerProtocolError(f"peer header is not JSON ({type(exc).__name__})") from exc
    if not isinstance(header, dict):
        raise PeerProtocolError("peer header is not a JSON object")
    return header


def recv_exact(sock: socket.socket, size: int, deadline: Deadline | None = None) -> bytes:
    """Exactly ``size`` bytes (a small frame); PeerProtocolError when the peer closes first or
    ``deadline`` passes."""
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        count = _recv_into(sock, view[got:], size - got, deadline)
        if count == 0:
            raise PeerProtocolError(f"peer closed the connection after {got} of {size} bytes")
        got += count
    return bytes(data)


def _recv_into(sock: socket.socket, view: memoryview, size: int, deadline: Deadline | None) -> int:
    """One ``recv_into``, waiting at most what is left of ``deadline`` (PeerProtocolError once it passed)."""
    if deadline is None:
        return sock.recv_into(view, size)
    deadline.arm(sock)
    try:
        return sock.recv_into(view, size)
    except TimeoutError:
        deadline.arm(sock)  # raises when the deadline passed; else the per-read timeout did
        raise


# --- sending -----------------------------------------------------------------------------------


def open_part(path: Path, record: DcpManifest) -> list[tuple[str, int, int]]:
    """``(name, size, fd)`` of the record and every file of the part in ``path``, opened without
    following links and at their recorded sizes (a later deletion by retention does not matter)."""
    entries = [(layout.MANIFEST_FILENAME, None), *((e.name, e.size) for e in record.present_files())]
    opened: list[tuple[str, int, int]] = []
    try:
        for name, size in entries:
            fd = record_reads.open_no_follow(path / name, os.O_RDONLY)
            opened.append((name, os.fstat(fd).st_size, fd))
            if size is not None and opened[-1][1] != size:
                raise CorruptCheckpointError(f"{path / name}: size {opened[-1][1]} != manifest size {size}")
    except BaseException:
        for _, _, fd in opened:
            os.close(fd)
        raise
    return opened


def send_part(sock: socket.socket, header: dict[str, Any], opened: list[tuple[str, int, int]]) -> int:
    """``header`` with the part's listing, then every file's bytes (closed once sent); the bytes sent."""
    try:
        send_header(sock, {**header, "files": [[name, size] for name, size, _ in opened]})
        for _, size, fd in opened:
            with os.fdopen(os.dup(fd), "rb") as handle:
                sent = sock.sendfile(handle, 0, size)
            if sent != size:
                raise OSError(f"sent {sent} of {size} bytes: the file shrank while being sent")
    finally:
        for _, _, fd in opened:
            os.close(fd)
    return sum(size for _, size, _ in opened)


# --- receiving ---------------------------------------------------------------------------------


def receive_part(sock: socket.socket, listing: Any, tmp: Path, node: int, step: int, deadline: Deadline | None = None) -> DcpManifest:
    """Receive node ``node``'s part of ``step`` into the fresh directory ``tmp``: every file
    checked against the record as it arrives, fsynced, and the directory fsynced; its record.
    CorruptCheckpointError (``tmp`` left for the caller to remove) on anything off, or once
    ``deadline`` passes (extended by ``transfer_seconds`` of the listed bytes)."""
    files = _checked_listing(listing, tmp)
    need = sum(size for _, size in files)
    if deadline is not None:
        deadline.extend(transfer_seconds(need))
    free = shutil.disk_usage(tmp.parent).free
    if need > free:
        raise CorruptCheckpointError(f"{tmp}: a peer part of {need} bytes does not fit ({free} bytes free)")
    layout.fresh_dir(tmp)
    commit.write_durably(tmp / layout.MANIFEST_FILENAME, recv_exact(sock, files[0][1], deadline))
    record = read_dcp_manifest(tmp)
    _check_part(record, files, tmp, node, step)
    entries = {entry.name: entry for entry in record.present_files()}
    chunk = min(_PEER_CHUNK_BYTES, max((size for _, size in files[1:]), default=1)) or 1
    buffers = [memoryview(bytearray(chunk)) for _ in range(knobs.PEER_BUFFERS)]
    for name, _ in files[1:]:
        _receive_file(sock, tmp / name, entries[name], buffers, deadline)
    read_dcp_metadata(tmp, record)  # DCP's pickled metadata checked before anything may load it
    commit.fsync_dir(tmp)
    return record


def _checked_listing(listing: Any, tmp: Path) -> list[tuple[str, int]]:
    """The listing as ``(name, size)`` pairs: bounded, plain names, the record first."""
    if not isinstance(listing, list) or not listing or len(listing) > _PEER_MAX_FILES:
        raise PeerProtocolError(f"{tmp}: a peer part's listing must hold 1 to {_PEER_MAX_FILES} files")
    files: list[tuple[str, int]] = []
    for item in listing:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and type(item[1]) is int and item[1] >= 0):
            raise PeerProtocolError(f"{tmp}: a peer part's listing holds {str(item)[:80]!r}, not [name, size]")
        files.append((item[0], item[1]))
    if files[0][0] != layout.MANIFEST_FILENAME or files[0][1] > knobs.MAX_MANIFEST_BYTES:
        raise PeerProtocolError(f"{tmp}: a peer part must begin with its {layout.MANIFEST_FILENAME} (at most {knobs.MAX_MANIFEST_BYTES} bytes)")
    return files


def _check_part(record: DcpManifest, files: list[tuple[str, int]], tmp: Path, node: int, step: int) -> None:
    """The record is node ``node``'s part of ``step`` and the listing names exactly its files."""
    if record.step != step or record.node != node or record.nodes is None:
        raise CorruptCheckpointError(f"{tmp}: holds step {record.step} of node {record.node}, expected step {step} of node {node}")
    expected = {entry.name: entry.size for entry in record.present_files()}
    listed = dict(files[1:])
    if len(listed) != len(files) - 1 or listed != expected:
        raise CorruptCheckpointError(f"{tmp}: the peer sent files {sorted(listed.items())}, its record lists {sorted(expected.items())}")


def _receive_file(sock: socket.socket, path: Path, entry: records.FileEntry, buffers: list[memoryview], deadline: Deadline | None) -> None:
    """Write ``entry.size`` bytes from ``sock`` into the new file ``path``, checksummed; fsynced.

    The socket is read on this thread while a writer thread checksums and writes the chunks
    already received (``buffers`` rotate between the two), so receiving overlaps writing."""
    checksum = ChunkChecksum(entry.algorithm, threaded=False)
    fd = record_reads.open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    writer = _ChunkWriter(fd, checksum, buffers)
    try:
        left = entry.size
        while left:
            view = writer.free_buffer()
            count = _recv_into(sock, view, min(left, len(view)), deadline)
            if count == 0:
                raise PeerProtocolError(f"{path}: the peer closed the connection {left} bytes short")
            writer.put(view, count)
            left -= count
        writer.finish()
        os.fsync(fd)
    finally:
        writer.stop()
        os.close(fd)
    crc = checksum.result()
    if crc != entry.checksum:
        raise CorruptCheckpointError(f"{path}: checksum mismatch ({entry.algorithm} {crc:#010x} != {entry.checksum:#010x})")


class _ChunkWriter:
    """A thread that checksums and writes the chunks handed to it, in order, and hands their
    buffers back; its first error is raised on the receiving thread."""

    def __init__(self, fd: int, checksum: ChunkChecksum, buffers: list[memoryview]) -> None:
        self._fd = fd
        self._checksum = checksum
        self._free: queue.Queue[memoryview] = queue.Queue()
        for buffer in buffers:
            self._free.put(buffer)
        self._full: queue.Queue[tuple[memoryview, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="coci-peer-write", daemon=True)
        self._thread.start()

    def free_buffer(self) -> memoryview:
        buffer = self._free.get()
        self._raise()
        return buffer

    def put(self, buffer: memoryview, count: int) -> None:
        """Write the first ``count`` bytes of ``buffer`` (a buffer of ``free_buffer``)."""
        self._full.put((buffer, count))

    def finish(self) -> None:
        """Wait until every chunk is written."""
        self._full.put(None)
        self._thread.join()
        self._raise()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._full.put(None)
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _drain(self) -> None:
        while (item := self._full.get()) is not None:
            buffer, count = item
            try:
                if self._error is None:
                    self._checksum.submit(buffer[:count])
                    safe_files.write_all(self._fd, buffer[:count])
            except BaseException as exc:
                self._error = exc
            self._free.put(buffer)
