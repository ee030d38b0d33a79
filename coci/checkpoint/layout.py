"""The names and directories every checkpoint format shares on disk.

Layout of a run directory:

```text
<run_dir>/checkpoints/step_<n>/manifest.json  the commit record: written last
<run_dir>/checkpoints/step_<n>/...            the format's data files (coci's: data.bin)
<run_dir>/checkpoints/step_<n>.tmp/           a checkpoint being written or deleted: never read
```

These names, and ``FORMAT_VERSION``, are part of the on-disk contract (see ``coci.checkpoint.records``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from coci import safe_files
from coci.errors import CorruptCheckpointError

logger = logging.getLogger(__name__)


#: Written into every commit record; a reader refuses a record with a newer version. Version 2
#: checksums data files with crc32c (``FileEntry.crc32c``); version 1 records (``crc32``) still read.
FORMAT_VERSION: int = 2
#: Sub-directory of the run directory that holds the checkpoints.
CHECKPOINT_DIRNAME = "checkpoints"
#: Suffix of a checkpoint directory still being written, or being deleted.
TMP_SUFFIX = ".tmp"
#: The commit record of every format.
MANIFEST_FILENAME = "manifest.json"
#: The single data file of coci's own (single-process) format.
DATA_FILENAME = "data.bin"
#: Keys of the session's own entries in a checkpointed state tree (never a user's state key).
SESSION_KEY = "__coci__"
RNG_KEY = "__coci_rng__"


STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / CHECKPOINT_DIRNAME


def has_root(root: Path) -> bool:
    """True when the checkpoints directory ``root`` exists; CorruptCheckpointError when a symbolic
    link or a file is in its place: checkpoints are never written, read or deleted through one."""
    return safe_files.check_dir(root, error=CorruptCheckpointError)


def make_root(root: Path) -> None:
    """Create the checkpoints directory ``root`` where absent (never through a link in its place)."""
    safe_files.make_dir(root, error=CorruptCheckpointError)


def fresh_dir(path: Path) -> None:
    """An empty new directory at ``path``: whatever was there (a leftover, a planted link) is
    removed first, a link itself, never what it points to."""
    if path.is_symlink() or path.exists():
        _remove_entry(path)
    path.mkdir()


def step_dirname(step: int) -> str:
    return f"step_{step}"


def tmp_dir(root: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before its commit."""
    return root / (step_dirname(step) + TMP_SUFFIX)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every ``step_<n>`` directory, committed or damaged (restore reports the damaged ones), oldest
    first. A symbolic link is never a checkpoint: nothing outside the run directory is followed."""
    if not has_root(root):
        return []
    found = [
        (int(m.group(1)), e) for e in root.iterdir() if (m := STEP_DIR.match(e.name)) and e.is_dir() and not e.is_symlink()
    ]
    return sorted(found)


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints (a ``step_<n>`` directory holding a commit record), oldest first."""
    return [(step, path) for step, path in step_dirs(root) if (path / MANIFEST_FILENAME).is_file()]


def remove_stale_tmp(root: Path) -> list[Path]:
    """Delete leftovers of interrupted writes and deletions: a ``*.tmp`` entry is never a checkpoint.

    A symbolic link is removed itself, never what it points to; only entries actually gone are returned."""
    removed = []
    if has_root(root):
        for entry in root.iterdir():
            if entry.name.endswith(TMP_SUFFIX):
                _remove_entry(entry)
                if not entry.is_symlink() and not entry.exists():
                    removed.append(entry)
    return removed


def _remove_entry(entry: Path) -> None:
    try:
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        else:
            shutil.rmtree(entry, ignore_errors=True)
    except OSError as exc:
        logger.warning("cannot remove %s: %s", entry, exc)
