"""One writer per run directory: an exclusive ``fcntl.flock`` on ``<run_dir>/coci.lock``.

Two sessions writing one run directory replace each other's checkpoints and restore each other's
state, so a :class:`coci.Session` takes this lock before it touches the directory and holds it
until ``close()``. The kernel releases a ``flock`` when its process dies, SIGKILL included, so a
crash never leaves a stale lock. The file records the holder (pid, host) for the error message;
its content is informational, the lock is the ``flock``. Locks are per open file, so a second
session in the same process is refused too. Under ``torch.distributed`` rank 0 holds the lock for
the whole job (the other ranks share its run directory and hear its verdict).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from coci.errors import ConfigError, RunDirLockedError

#: The lock file inside a run directory.
LOCK_FILENAME = "coci.lock"


class RunLock:
    """A held lock on a run directory; :meth:`release` (or process exit) lets it go."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Lock ``run_dir``; RunDirLockedError naming the holder when another session has it."""
        path = run_dir / LOCK_FILENAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot open the lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirLockedError(
                f"run directory {str(run_dir)!r} is in use by another coci session ({holder}); "
                "one session writes a run directory at a time (close the other, or use another run_dir)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        return cls(fd, path)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let the lock go (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file releases the flock

    def __del__(self) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
