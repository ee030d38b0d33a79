"""Check every checkpoint of a run directory without loading it (``coci verify RUN_DIR``).

[``verify_run``][coci.verify_run] walks
``<run_dir>/checkpoints/`` and returns one [``CheckpointStatus``][coci.CheckpointStatus] per entry, newest step last:

* every ``step_<n>`` directory is checked the way ``Session.restore()`` checks it before loading:
  the manifest parses and is sane (format version, file names inside the directory, tensor table
  inside the declared bytes), the data file has the declared size and checksum. On top of that the
  manifest's ``step`` must equal the directory's ``<n>``, its JSON skeleton must refer to each
  tensor of the manifest's table exactly once (as ``flatten`` writes it) and hold every state key. A ``step_<n>`` directory without a manifest is reported as
  uncommitted-and-broken (``Session.restore()`` never considers it).
* every ``*.tmp`` entry (an interrupted write, or a deletion by retention that was cut short) is
  reported as not committed, with its size; its contents are never opened.
* anything else in ``checkpoints/`` is reported as unknown and not a checkpoint.

Nothing is unpickled or executed; data files are read in chunks only to checksum them.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from coci.checkpoint import layout
from coci.checkpoint.checkpointer import reader_for
from coci.errors import ConfigError, CorruptCheckpointError

__all__ = ["CheckpointStatus", "verify_run"]

logger = logging.getLogger(__name__)

_STEP_NAME = re.compile(r"^step_(\d+)")


class CheckpointStatus(BaseModel):
    """The verdict on one entry of ``<run_dir>/checkpoints/``.

    ``step`` is parsed from the name (None when the name carries none); ``ok`` is True only for a
    committed checkpoint that verifies; ``committed`` says whether ``Session.restore()`` would
    consider the entry at all (a ``step_<n>`` directory holding a ``manifest.json``); ``bytes``
    is the size on disk of the entry's files; ``error`` says what is wrong, None when ``ok``.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    step: int | None
    path: str
    ok: bool
    committed: bool
    bytes: int
    error: str | None = None


def verify_run(run_dir: str | os.PathLike[str]) -> list[CheckpointStatus]:
    """Verify every checkpoint and stray ``.tmp`` entry of ``run_dir``, ordered by step.

    Raises [``coci.ConfigError``][coci.ConfigError] when ``run_dir`` is not a directory. A run without a
    ``checkpoints/`` directory yields an empty list.
    """
    run_path = Path(run_dir)
    if not run_path.is_dir():
        raise ConfigError(f"run_dir {str(run_path)!r} is not a directory")
    root = layout.checkpoints_dir(run_path)
    if not root.is_dir():
        return []
    statuses = [_status(entry) for entry in root.iterdir()]
    statuses.sort(key=lambda s: (s.step if s.step is not None else -1, s.committed, s.path))
    for status in statuses:
        if not status.ok:
            logger.info("checkpoint %s: %s", status.path, status.error)
    return statuses


def _status(entry: Path) -> CheckpointStatus:
    match = _STEP_NAME.match(entry.name)
    step = int(match.group(1)) if match else None
    size = _disk_bytes(entry)
    if entry.name.endswith(layout.TMP_SUFFIX):
        return CheckpointStatus(
            step=step, path=str(entry), ok=False, committed=False, bytes=size,
            error="not committed: left by an interrupted write or deletion (never loaded; "
            "Session.restore() removes it)",
        )
    if match is None or match.group(0) != entry.name or entry.is_symlink() or not entry.is_dir():
        return CheckpointStatus(
            step=None, path=str(entry), ok=False, committed=False, bytes=size,
            error="not a checkpoint: unexpected entry in the checkpoints directory",
        )
    committed = True  # an unreadable directory is reported as a damaged checkpoint
    try:
        committed = (entry / layout.MANIFEST_FILENAME).is_file()
        reader_for(entry).verify(entry)
    except CorruptCheckpointError as exc:
        return CheckpointStatus(step=step, path=str(entry), ok=False, committed=committed, bytes=size, error=str(exc))
    except OSError as exc:  # unreadable file (permissions, I/O error): as bad as corrupt
        return CheckpointStatus(
            step=step, path=str(entry), ok=False, committed=committed, bytes=size,
            error=f"{entry}: cannot be read ({type(exc).__name__}: {exc})",
        )
    return CheckpointStatus(step=step, path=str(entry), ok=True, committed=True, bytes=size)


def _disk_bytes(entry: Path) -> int:
    """Total size of the regular files under ``entry`` (links are not followed)."""
    try:
        if entry.is_symlink() or entry.is_file():
            return entry.lstat().st_size
        total = 0
        for dirpath, _, filenames in os.walk(entry):
            for name in filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except OSError:
                    continue
        return total
    except OSError:
        return 0
