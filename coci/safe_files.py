"""The one way coci opens, reads and writes a file of a run directory, a checkpoint or a
shared-directory remote: every such file is untrusted, since anyone who can write the directory
can plant a symbolic link, a FIFO, a hard link or a directory in its place.

The rules, enforced here and nowhere else:

* A file is opened relative to a descriptor of its directory, with ``O_NOFOLLOW``: a symbolic
  link in a file's place is never followed. The directory itself is opened with ``O_NOFOLLOW``
  too, unless the caller names it as one the user chose (the run directory, the remote's root,
  where a report goes): a ``checkpoints/`` or ``step_<n>/`` directory is never a link.
* A file is opened with ``O_NONBLOCK`` and must be a regular file (``fstat``): a FIFO, a socket, a
  device or a directory in its place is refused at once, never waited on.
* An existing file opened for writing must have a single link (a planted hard link to a file
  elsewhere would have it overwritten); whole files are written to a fresh name created with
  ``O_EXCL`` and renamed into place, so a write never goes through anything that was there.
* Reads are bounded: ``read_bytes`` refuses a file larger than the caller's limit.

Each refusal raises the caller's error class (a [``coci.errors.CociError``][coci.CociError]: ``ConfigError``
for run files, ``CorruptCheckpointError`` for checkpoints) with a message naming the path.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from coci.errors import CociError, ConfigError

#: Flags of every open made here: no link followed, never blocking on a FIFO, not inherited.
_ALWAYS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITING = os.O_WRONLY | os.O_RDWR
#: errno of an open that met something other than a regular file: a FIFO without a reader
#: (ENXIO), a directory opened for writing (EISDIR), a path through a non-directory (ENOTDIR).
_NOT_REGULAR = {errno.ENXIO, errno.EISDIR, errno.ENOTDIR}

ErrorClass = type[CociError]


def open_dir(path: Path, *, follow: bool = False, error: ErrorClass = ConfigError) -> int:
    """A descriptor of directory ``path``; ``follow`` only for a directory the user named (a run
    directory, a remote root): coci's own directories are never symbolic links."""
    return _open_directory(path, path, follow=follow, error=error)


def _open_directory(target: str | Path, path: Path, *, follow: bool, error: ErrorClass, dir_fd: int | None = None) -> int:
    """``os.open`` of directory ``target`` (relative to ``dir_fd`` when given; ``path`` names it)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(target, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW | O_DIRECTORY meets a link: either
            link = exc.errno == errno.ELOOP or _is_link(target, dir_fd)
            what = "a symbolic link: coci never follows one inside a run directory or a remote" if link else "not a directory"
            raise error(f"{path} is {what}") from exc
        raise


def _is_link(target: str | Path, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.stat(target, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextmanager
def opened_dir(path: Path, *, follow: bool = False, error: ErrorClass = ConfigError) -> Iterator[int]:
    """``open_dir`` as a context manager (the descriptor is closed on exit)."""
    fd = open_dir(path, follow=follow, error=error)
    try:
        yield fd
    finally:
        os.close(fd)


def make_dir(path: Path, *, error: ErrorClass = ConfigError) -> None:
    """Create directory ``path`` (and its parents) where absent; refuse a link or a file in its place."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # a file, or a link to a file, under that name
        raise error(f"{path} is not a directory") from exc
    check_dir(path, error=error)


def check_dir(path: Path, *, error: ErrorClass = ConfigError) -> bool:
    """True when ``path`` is a directory (not a link to one), False when nothing is there; ``error``
    for a symbolic link or anything else in its place."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise error(f"{path} is a symbolic link: coci never follows one inside a run directory or a remote")
    if not stat.S_ISDIR(mode):
        raise error(f"{path} is not a directory")
    return True


def open_file(
    path: Path, flags: int, *, follow_dir: bool = False, error: ErrorClass = ConfigError, mode: int = 0o644
) -> int:
    """Open regular file ``path`` under the rules above; ``follow_dir`` as ``open_dir``'s ``follow``."""
    with opened_dir(path.parent, follow=follow_dir, error=error) as dir_fd:
        return open_at(dir_fd, path.name, flags, path=path, error=error, mode=mode)


def open_at(dir_fd: int, name: str, flags: int, *, path: Path, error: ErrorClass = ConfigError, mode: int = 0o644) -> int:
    """Open ``name`` in the directory ``dir_fd`` (``path`` names it in errors) under the rules above."""
    try:
        fd = os.open(name, flags | _ALWAYS, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{path} is a symbolic link: coci never follows one inside a run directory or a remote") from exc
        if exc.errno in _NOT_REGULAR:
            raise error(f"{path} is not a regular file") from exc
        raise
    try:
        check_regular(fd, path, writing=bool(flags & _WRITING), error=error)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(fd: int, path: Path, *, writing: bool, error: ErrorClass = ConfigError) -> os.stat_result:
    """``fstat(fd)`` of a regular file (with a single link when ``writing``); ``error`` otherwise."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        raise error(f"{path} is not a regular file")
    if writing and status.st_nlink > 1:
        raise error(f"{path} has {status.st_nlink} hard links: coci never writes a file shared with another place")
    return status


def read_bytes(
    path: Path, max_bytes: int, *, follow_dir: bool = False, error: ErrorClass = ConfigError, limit_name: str = ""
) -> bytes:
    """The whole of regular file ``path``; ``error`` when it holds more than ``max_bytes`` (the
    message names the knob ``limit_name`` when given)."""
    fd = open_file(path, os.O_RDONLY, follow_dir=follow_dir, error=error)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        data = read_at_most(handle, max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        knob = f" ({limit_name})" if limit_name else ""
        raise error(f"{path} is {max(size, len(data))} bytes, over the limit of {max_bytes}{knob}")
    return data


def read_at_most(handle: BinaryIO, limit: int) -> bytes:
    """Up to ``limit`` bytes, read a megabyte at a time (``read(limit)`` would allocate ``limit``
    bytes up front, whatever the file's size)."""
    parts: list[bytes] = []
    size = 0
    while size < limit and (part := handle.read(min(1 << 20, limit - size))):
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def create_at(dir_fd: int, name: str, *, path: Path, error: ErrorClass = ConfigError, flags: int = 0) -> int:
    """A new regular file ``name`` in ``dir_fd``, opened for writing (``O_EXCL``: never anything
    that was there). A planted entry of that name, link or not, is unlinked first (never followed)."""
    create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags
    try:
        return open_at(dir_fd, name, create, path=path, error=error)
    except FileExistsError:
        _unlink_at(dir_fd, name, path, error)
        return open_at(dir_fd, name, create, path=path, error=error)


def _unlink_at(dir_fd: int, name: str, path: Path, error: ErrorClass) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except IsADirectoryError as exc:
        raise error(f"{path} is a directory in place of a file") from exc
    except FileNotFoundError:
        pass


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view) :]


def replace_file(
    path: Path,
    data: bytes | bytearray | memoryview | Iterable[bytes],
    *,
    follow_dir: bool = False,
    durable: bool = False,
    error: ErrorClass = ConfigError,
) -> None:
    """Write ``data`` (bytes, or pieces of bytes written one at a time) as file ``path``
    atomically: into a fresh hidden name (``O_EXCL``), then renamed over the previous file. ``error`` when a link or anything but a regular file is in
    ``path``'s place (it is left as it is: never followed, never silently replaced)."""
    temporary = f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
    with opened_dir(path.parent, follow=follow_dir, error=error) as dir_fd:
        _check_replaceable(dir_fd, path, error)
        fd = create_at(dir_fd, temporary, path=path.parent / temporary, error=error)
        try:
            try:
                for piece in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                    write_all(fd, piece)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            _rename_into_place(dir_fd, temporary, path, error)
        except BaseException:
            _unlink_quietly(dir_fd, temporary)
            raise
        if durable:
            os.fsync(dir_fd)


def _check_replaceable(dir_fd: int, path: Path, error: ErrorClass) -> None:
    try:
        mode = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise error(f"{path} is a symbolic link: coci never follows one inside a run directory or a remote")
    if not stat.S_ISREG(mode):
        raise error(f"{path} is not a regular file")


def _rename_into_place(dir_fd: int, temporary: str, path: Path, error: ErrorClass) -> None:
    try:
        os.replace(temporary, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except IsADirectoryError as exc:
        raise error(f"{path} is a directory in place of a file") from exc


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def fsync_dir(path: Path, *, follow: bool = False, error: ErrorClass = ConfigError) -> None:
    """Make the entries of directory ``path`` durable."""
    with opened_dir(path, follow=follow, error=error) as fd:
        os.fsync(fd)


def check_writable(directory: Path) -> None:
    """Create and remove a fresh file in ``directory`` (a name of its own, ``O_EXCL``, never
    through a link planted there): OSError when the directory does not take files."""
    name = f".coci-write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with opened_dir(directory, follow=True) as dir_fd:
        os.close(create_at(dir_fd, name, path=directory / name))
        os.unlink(name, dir_fd=dir_fd)


def open_below(base: Path, parts: list[str], *, create: bool = False, error: ErrorClass = ConfigError) -> int:
    """A descriptor of directory ``base/parts[0]/parts[1]/...``: ``base`` is one the user named
    (followed), each part below it is opened with ``O_NOFOLLOW`` (created first where ``create``),
    so no link planted on the way leads outside ``base``."""
    fd = open_dir(base, follow=True, error=error)
    try:
        for index, part in enumerate(parts):
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            inner = _open_directory(part, base.joinpath(*parts[: index + 1]), follow=False, error=error, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd
