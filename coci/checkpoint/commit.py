"""The crash-safe commit every checkpoint format goes through: the data written into a temporary
directory, made durable, then the record published and the directory renamed into place."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from coci import safe_files
from coci.checkpoint.faults import fault
from coci.checkpoint.layout import MANIFEST_FILENAME, TMP_SUFFIX, has_root
from coci.checkpoint.records import CommitRecord
from coci.errors import CorruptCheckpointError


def publish(root: Path, tmp: Path, final: Path, record: CommitRecord) -> None:
    """Commit the checkpoint written in ``tmp`` (its data files already fsynced) as ``final``.

    A checkpoint is visible only after its commit: the sealed record is written and fsynced last,
    then the directory is fsynced and renamed into place inside the same parent (a rename is atomic
    only within one filesystem), then the parent is fsynced so the rename survives a power loss.
    A checkpoint of the same step that failed verification is replaced.
    """
    prepare(root, tmp, record)
    fault("before_rename")
    rename_into_place(root, tmp, final)
    fault("after_commit")


def prepare(root: Path, tmp: Path, record: CommitRecord) -> None:
    """The first half of ``publish``: the sealed record written and fsynced into ``tmp``
    (still a ``*.tmp`` directory, never read). Node-local run directories prepare on every node,
    agree, and only then rename (``coci.checkpoint.dcp.DcpWriter``)."""
    fault("before_manifest")
    has_root(root)  # the root is checked before the commit's rename
    write_durably(tmp / MANIFEST_FILENAME, record.sealed().model_dump_json().encode())
    fsync_dir(tmp)


def rename_into_place(root: Path, tmp: Path, final: Path) -> None:
    """The second half of ``publish``: ``tmp`` renamed to ``final`` (a checkpoint of the same
    step there is discarded first) and the rename made durable."""
    if final.exists():
        discard_checkpoint(final)
    os.rename(tmp, final)
    fault("after_rename")
    fsync_dir(root)


def discard_checkpoint(path: Path) -> None:
    """A checkpoint being deleted is never half-visible: it is atomically renamed to ``*.tmp``
    (and the rename made durable) before any of its files is removed."""
    doomed = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}{TMP_SUFFIX}")
    os.rename(path, doomed)
    fsync_dir(path.parent)
    fault("retention")
    shutil.rmtree(doomed, ignore_errors=True)


def write_durably(path: Path, data: bytes) -> None:
    """Write a small file of a checkpoint and fsync it (``coci.safe_files.replace_file``)."""
    safe_files.replace_file(path, data, durable=True, error=CorruptCheckpointError)


def fsync_dir(path: Path) -> None:
    """Make a checkpoint directory's entries durable (never through a link in its place)."""
    safe_files.fsync_dir(path, error=CorruptCheckpointError)
