"""One writer per run directory: an exclusive ``fcntl.flock`` on the run directory itself, and on
``<run_dir>/coci.lock``.

Two sessions writing one run directory replace each other's checkpoints and restore each other's
state, so a [``coci.Session``][coci.Session] takes this lock before it touches the directory and holds it
until ``close()``. The lock that counts is the one on the directory's own descriptor: a file can be
unlinked (or replaced) by anyone who can write the directory, which would let a second session in
beside the first, but the directory cannot be swapped under an open descriptor. ``coci.lock`` is
locked too (what coci releases before it locked the directory took; and the fallback on a file
system that cannot lock a directory, such as NFS) and records the holder (pid, host) for the error
message. The kernel releases a ``flock`` when its process dies, SIGKILL included, so a crash never
leaves a stale lock. Locks are per open file, so a second session in the same process is refused
too. A process forked while the lock is held (a DataLoader's worker) closes its copies of the lock's
descriptors: a flock is held while any descriptor of its open file is, and such a worker outlives a
SIGKILLed trainer by seconds, which kept a restart out. Under ``torch.distributed`` rank 0 holds the lock for the whole job (the other ranks share
its run directory and hear its verdict).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import weakref
from pathlib import Path

from coci import distributed, safe_files
from coci.errors import ConfigError, PersistError, RunDirLockedError

#: The lock file inside a run directory.
LOCK_FILENAME = "coci.lock"

logger = logging.getLogger(__name__)

#: The locks held in this process, let go in a forked child (registered at the first lock).
_HELD: weakref.WeakSet[RunLock] = weakref.WeakSet()
_fork_handler_registered = False


def _release_in_forked_child() -> None:
    for lock in list(_HELD):
        lock.release()
    _HELD.clear()


class RunLock:
    """A held lock on a run directory; ``release`` (or process exit) lets it go."""

    def __init__(self, fds: list[int], path: Path) -> None:
        global _fork_handler_registered
        self._fds: list[int] | None = fds
        self.path = path
        _HELD.add(self)
        if not _fork_handler_registered:
            os.register_at_fork(after_in_child=_release_in_forked_child)
            _fork_handler_registered = True

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Lock ``run_dir``; RunDirLockedError naming the holder when another session has it;
        ConfigError when the lock file cannot be one (a FIFO, a directory, a link in its place)."""
        path = run_dir / LOCK_FILENAME
        try:
            dir_fd = safe_files.open_dir(run_dir, follow=True)
        except OSError as exc:
            raise ConfigError(f"cannot open the run directory {run_dir}: {exc}") from exc
        fds = [dir_fd]
        try:
            if not _lock_directory(dir_fd, path):
                fds.remove(dir_fd)
                os.close(dir_fd)
            fds.append(_lock_file(dir_fd if fds else None, path))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        try:  # who holds it, for the next session's refusal
            os.ftruncate(fds[-1], 0)
            os.pwrite(fds[-1], f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        except OSError as exc:  # a full disk: the lock is released, the error names the run directory
            for fd in fds:
                os.close(fd)
            raise PersistError(f"Session() cannot start in the run directory {run_dir}: writing {path.name} failed ({exc}); free space there") from exc
        return cls(fds, path)

    @property
    def held(self) -> bool:
        return self._fds is not None

    def release(self) -> None:
        """Let the lock go (idempotent)."""
        fds, self._fds = self._fds, None
        for fd in fds or ():
            os.close(fd)  # closing the only descriptor of an open file releases its flock

    def __del__(self) -> None:
        self.release()


def _lock_directory(dir_fd: int, path: Path) -> bool:
    """Lock the run directory's own descriptor: True when held, False where the file system cannot
    lock a directory (the lock file alone is the lock then); RunDirLockedError when another holds it."""
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _locked(path, _holder_of(path)) from None
    except OSError as exc:  # NFS emulates flock with byte-range locks, which a directory cannot take
        logger.info("cannot lock the run directory %s itself (%s): only %s guards it", path.parent, exc, path.name)
        return False
    return True


def _lock_file(dir_fd: int | None, path: Path) -> int:
    """The lock file, opened (never through a link, never a FIFO) and locked."""
    try:
        if dir_fd is None:
            fd = safe_files.open_file(path, os.O_RDWR | os.O_CREAT, follow_dir=True)
        else:
            fd = safe_files.open_at(dir_fd, path.name, os.O_RDWR | os.O_CREAT, path=path)
    except OSError as exc:
        raise ConfigError(f"cannot open the lock file {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise _locked(path, holder) from None
    return fd


def _locked(path: Path, holder: str) -> RunDirLockedError:
    return RunDirLockedError(
        f"run directory {str(path.parent)!r} is in use by another coci session ({holder}); "
        "one session writes a run directory at a time (close the other, or use another run_dir)"
    )


def _holder_of(path: Path) -> str:
    """Who holds the lock, as its lock file says (it may be gone: then unknown)."""
    try:
        text = safe_files.read_bytes(path, 256, follow_dir=True).decode(errors="replace").strip()
    except (OSError, ConfigError):
        text = ""
    return text or "holder unknown"


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def lock_for_job(run_dir: Path, context: distributed.DistributedContext | None) -> RunLock | None:
    """The run directory's lock (``coci.checkpoint.run_lock``), held by rank 0 for a whole
    distributed job (each node's leader for its own node-local directory); every rank raises when
    one is taken (collective)."""
    lock, problem = None, None
    if context is None or context.is_node_leader:
        try:
            lock = RunLock.acquire(run_dir)
        except ConfigError as exc:
            problem = str(exc)
    problem = distributed.agree(problem, context)
    if problem is not None:
        if lock is not None:
            lock.release()
        raise RunDirLockedError(problem)
    return lock
