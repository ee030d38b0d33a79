"""A remote tier on a shared filesystem (NFS, Lustre, a mounted bucket): one directory of files.

Objects are files under the root; a put writes ``<key>.<pid>.partial``, fsyncs it and renames it
into place, so a reader never sees half an object (as on S3). Links are never followed, FIFOs never opened
(``coci.safe_files``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from coci import knobs, safe_files
from coci.checkpoint.remote.store import bounded_chunks, check_key, download_to, read_chunks
from coci.errors import CorruptCheckpointError

PARTIAL_SUFFIX = ".partial"


class DirectoryStore:
    """[``coci.checkpoint.remote.RemoteStore``][coci.RemoteStore] on a directory.

    Every object is opened through ``coci.safe_files`` relative to a descriptor of its directory,
    reached from the root one name at a time with ``O_NOFOLLOW``: a link planted for a ``step_<n>``
    directory, an object or a ``.partial`` file is never followed, and a FIFO is never waited on.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _dir_of(self, key: str, *, create: bool = False) -> tuple[int, str]:
        """A descriptor of ``key``'s directory and the object's name in it."""
        *parents, name = check_key(key).split("/")
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        return safe_files.open_below(self.root, parents, create=create, error=CorruptCheckpointError), name

    def put_file(self, key: str, source: BinaryIO, size: int) -> int:
        crc = [0]
        self._write(key, read_chunks(source, size, knobs.UPLOAD_PART_BYTES, crc))
        return crc[0]

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, iter([data]))

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        """The bytes go to a private partial file first, then are linked into place: ``link``
        fails when the name exists (like ``O_CREAT|O_EXCL``) and a reader never sees a partial
        object. Relative to the directory's descriptor, links never followed, as every put."""
        dir_fd, name = self._dir_of(key, create=True)
        partial = f"{name}.{os.getpid()}.{threading.get_ident()}{PARTIAL_SUFFIX}"
        try:
            fd = safe_files.create_at(dir_fd, partial, path=self._path(key).with_name(partial), error=CorruptCheckpointError)
            try:
                safe_files.write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                return False
            os.fsync(dir_fd)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(partial, dir_fd=dir_fd)
            os.close(dir_fd)

    def _write(self, key: str, chunks: Iterator[bytes]) -> None:
        dir_fd, name = self._dir_of(key, create=True)
        partial = f"{name}.{os.getpid()}{PARTIAL_SUFFIX}"
        try:
            fd = safe_files.create_at(dir_fd, partial, path=self._path(key).with_name(partial), error=CorruptCheckpointError)
            try:
                for piece in chunks:
                    safe_files.write_all(fd, piece)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial, dir_fd=dir_fd)
            raise
        finally:
            os.close(dir_fd)

    def _open(self, key: str) -> BinaryIO:
        dir_fd, name = self._dir_of(key)
        try:
            fd = safe_files.open_at(dir_fd, name, os.O_RDONLY, path=self._path(key), error=CorruptCheckpointError)
        finally:
            os.close(dir_fd)
        return os.fdopen(fd, "rb")

    def get_file(self, key: str, dest: Path, max_bytes: int) -> int:
        with self._open(key) as source:
            return download_to(iter(lambda: source.read(knobs.UPLOAD_PART_BYTES), b""), dest, max_bytes, key)

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        with self._open(key) as source:
            return b"".join(bounded_chunks(iter([source.read(max_bytes + 1)]), max_bytes, key))

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        found: dict[str, int] = {}
        if not self.root.is_dir():
            return found
        for dirpath, dirnames, filenames in os.walk(self.root):  # os.walk never follows links
            base = Path(dirpath).relative_to(self.root)
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                key = (base / name).as_posix()
                if name.endswith(PARTIAL_SUFFIX) or not key.startswith(prefix):
                    continue
                try:
                    status = os.lstat(Path(dirpath) / name)
                except OSError:
                    continue
                if stat.S_ISREG(status.st_mode):  # never a link, a FIFO, a socket
                    found[key] = status.st_size
        return found

    def delete(self, keys: list[str]) -> None:
        for key in keys:  # an object behind a planted link is not the remote's: left alone
            with contextlib.suppress(FileNotFoundError, CorruptCheckpointError):
                dir_fd, name = self._dir_of(key)
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=dir_fd)
                finally:
                    os.close(dir_fd)
        for parent in {key.rsplit("/", 1)[0] for key in keys if "/" in key}:
            with contextlib.suppress(OSError, CorruptCheckpointError):
                *above, name = parent.split("/")
                dir_fd = safe_files.open_below(self.root, above, error=CorruptCheckpointError)
                try:
                    os.rmdir(name, dir_fd=dir_fd)  # only once empty
                finally:
                    os.close(dir_fd)

    def exists(self, key: str) -> bool:
        try:
            dir_fd, name = self._dir_of(key)
        except (OSError, CorruptCheckpointError):
            return False
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            return False
        finally:
            os.close(dir_fd)
