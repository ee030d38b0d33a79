"""A remote tier on a shared filesystem (NFS, Lustre, a mounted bucket): one directory of files.

Objects are files under the root; a put writes ``<key>.<pid>.partial``, fsyncs it and renames it
into place, so a reader never sees half an object (as on S3). Links are never followed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from coci import knobs
from coci.checkpoint import format
from coci.checkpoint.remote.store import bounded_chunks, check_key, download_to, read_chunks

PARTIAL_SUFFIX = ".partial"


class DirectoryStore:
    """:class:`coci.checkpoint.remote.RemoteStore` on a directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_file(self, key: str, source: BinaryIO, size: int) -> int:
        crc = [0]
        self._write(key, read_chunks(source, size, knobs.UPLOAD_PART_BYTES, crc))
        return crc[0]

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, iter([data]))

    def _write(self, key: str, chunks: object) -> None:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f"{final.name}.{os.getpid()}{PARTIAL_SUFFIX}")
        try:
            with open(partial, "wb") as out:
                for piece in chunks:  # type: ignore[attr-defined]
                    out.write(piece)
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, final)
            format.fsync_dir(final.parent)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def get_file(self, key: str, dest: Path, max_bytes: int) -> int:
        with os.fdopen(format.open_no_follow(self._path(key), os.O_RDONLY), "rb") as source:
            return download_to(iter(lambda: source.read(knobs.UPLOAD_PART_BYTES), b""), dest, max_bytes, key)

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        with os.fdopen(format.open_no_follow(self._path(key), os.O_RDONLY), "rb") as source:
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
                path = Path(dirpath) / name
                if name.endswith(PARTIAL_SUFFIX) or path.is_symlink() or not key.startswith(prefix):
                    continue
                try:
                    found[key] = path.lstat().st_size
                except OSError:
                    continue
        return found

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        for parent in {self._path(key).parent for key in keys}:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only once empty

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return path.is_file() and not path.is_symlink()
