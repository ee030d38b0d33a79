"""What every checkpoint format shares on disk, and the crash-safe commit they all go through.

Layout of a run directory::

    <run_dir>/checkpoints/step_<n>/manifest.json  the commit record: written last
    <run_dir>/checkpoints/step_<n>/...            the format's data files (coci's: ``data.bin``)
    <run_dir>/checkpoints/step_<n>.tmp/           a checkpoint being written or deleted: never read

Everything here is part of the on-disk contract: a change to a name, a field of
:class:`CommitRecord` or the commit order makes existing checkpoints unreadable or unsafe, so it
must come with a new :data:`FORMAT_VERSION`. ``set_fault_hook`` installs a callback invoked at
named points of the commit and retention (crash tests kill the writer there); a no-op by default.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer, model_validator

from coci import knobs, safe_files
from coci._version import __version__
from coci.errors import CorruptCheckpointError

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
#: ``format`` of coci's own single-process records, which carry no ``format`` field.
LOCAL_FORMAT = "coci"

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

FaultHook = Callable[[str], None]
_fault_hook: FaultHook | None = None


def set_fault_hook(hook: FaultHook | None) -> None:
    """Install ``hook(point)`` called at each named point of the commit protocol (tests only)."""
    global _fault_hook
    _fault_hook = hook


def fault(point: str) -> None:
    """Reach the named fault point (calls the installed hook, if any)."""
    if _fault_hook is not None:
        _fault_hook(point)


# --- commit record -----------------------------------------------------------------------------


#: The checksum algorithms a record may name; new checkpoints are written with the first.
ChecksumAlgorithm = Literal["crc32c", "crc32"]
WRITE_CHECKSUM: ChecksumAlgorithm = "crc32c"


class FileEntry(BaseModel):
    """One data file of a checkpoint, with what verification checks.

    The key of its checksum names the algorithm: ``crc32c`` (what coci writes) or ``crc32`` (records
    written before format version 2). Exactly one is present, and an absent one is not serialized,
    so an old record re-serializes byte for byte (its sealed checksum still matches).
    """

    model_config = ConfigDict(frozen=True, defer_build=True)
    name: str
    size: int = Field(ge=0)
    crc32: int | None = Field(default=None, ge=0, lt=1 << 32)
    crc32c: int | None = Field(default=None, ge=0, lt=1 << 32)

    @model_validator(mode="after")
    def _one_checksum(self) -> Self:
        if (self.crc32 is None) == (self.crc32c is None):
            raise ValueError(f"file {self.name!r} must record exactly one of crc32, crc32c")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_checksum(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if not (key in ("crc32", "crc32c") and value is None)}

    @classmethod
    def of(cls, name: str, size: int, checksum: int, algorithm: ChecksumAlgorithm = WRITE_CHECKSUM) -> FileEntry:
        return cls.model_validate({"name": name, "size": size, algorithm: checksum})

    @property
    def algorithm(self) -> ChecksumAlgorithm:
        return "crc32" if self.crc32 is not None else "crc32c"

    @property
    def checksum(self) -> int:
        value = self.crc32 if self.crc32 is not None else self.crc32c
        assert value is not None  # the validator guarantees one
        return value


class CommitRecord(BaseModel):
    """What every checkpoint's ``manifest.json`` holds, whatever format wrote its files: its
    presence makes the checkpoint exist.

    ``checksum`` is the crc32 of the record's own JSON without that field, so a flipped bit inside
    a value (an lr of 0.1 read as 0.3) is caught, not only damage to the data files. NaN and
    infinities in the state are written as JSON constants, never silently as null.
    """

    model_config = ConfigDict(ser_json_inf_nan="constants", defer_build=True)
    format_version: int
    coci_version: str
    step: int = Field(ge=0, le=knobs.MAX_STEPS)
    epoch: int | None = None
    wall_time: float
    state_keys: list[str]
    files: list[FileEntry]
    checksum: int | None = None

    def body_checksum(self) -> int:
        return zlib.crc32(self.model_dump_json(exclude={"checksum"}).encode())

    def sealed(self) -> Self:
        """This record with its checksum filled in (what is written to disk)."""
        return self.model_copy(update={"checksum": self.body_checksum()})


RecordT = TypeVar("RecordT", bound=CommitRecord)


def record_header(step: int, *, epoch: int | None, state_keys: list[str], files: list[FileEntry]) -> dict[str, Any]:
    """The fields every format's commit record starts with (the one place they are filled in)."""
    return {
        "format_version": FORMAT_VERSION,
        "coci_version": __version__,
        "step": step,
        "epoch": epoch,
        "wall_time": time.time(),
        "state_keys": state_keys,
        "files": files,
    }


def open_no_follow(path: str | os.PathLike[str], flags: int) -> int:
    """Open a checkpoint file where it is (:func:`coci.safe_files.open_file`): never through a
    symbolic link (nor a checkpoint directory that is one), never a FIFO or anything else not a
    regular file (CorruptCheckpointError naming it)."""
    return safe_files.open_file(Path(path), flags, error=CorruptCheckpointError)


def read_record_bytes(path: Path) -> bytes:
    """The bytes of ``path/manifest.json``: a regular file, not a link, at most
    ``knobs.MAX_MANIFEST_BYTES`` (CorruptCheckpointError otherwise; FileNotFoundError when there is none)."""
    return safe_files.read_bytes(
        path / MANIFEST_FILENAME, knobs.MAX_MANIFEST_BYTES, error=CorruptCheckpointError, limit_name="knobs.MAX_MANIFEST_BYTES"
    )


def record_format(path: Path) -> str:
    """The ``format`` a checkpoint's record declares (:data:`LOCAL_FORMAT` when it names none).

    An unreadable record counts as the local format, whose reader reports it as corrupt.
    """
    try:
        raw = json.loads(read_record_bytes(path))
    except (OSError, ValueError, RecursionError, CorruptCheckpointError):
        return LOCAL_FORMAT
    declared = raw.get("format") if isinstance(raw, dict) else None
    return declared if isinstance(declared, str) else LOCAL_FORMAT


def parse_record(path: Path, model: type[RecordT]) -> RecordT:
    """Read ``path/manifest.json`` as ``model``: present, parseable, not from a newer coci.
    CorruptCheckpointError on anything off; format-specific checks, then :func:`check_sealed`, follow."""
    try:
        record = model.model_validate_json(read_record_bytes(path))
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is missing") from exc
    except (ValidationError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{path}: manifest.json is unreadable ({exc.__class__.__name__})") from exc
    if record.format_version > FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{path}: format_version {record.format_version} is newer than this coci supports ({FORMAT_VERSION})"
        )
    return record


def check_file_names(path: Path, names: list[str], also: frozenset[str] = frozenset()) -> None:
    """Loading never reads outside the checkpoint directory: every file a record names is a plain
    name inside it (no separator, no leading dot, except the format's own names in ``also``)."""
    for name in names:
        if name in {".", ".."} or "/" in name or not (name in also or _SAFE_NAME.match(name)):
            raise CorruptCheckpointError(f"{path}: manifest names a file outside its checkpoint: {name!r}")


def check_step(record: CommitRecord, path: Path) -> None:
    """A record describes the step its directory is named after."""
    match = _STEP_DIR.match(path.name)
    if match and record.step != int(match.group(1)):
        raise CorruptCheckpointError(f"{path}: manifest says step {record.step} but the directory is {path.name}")


def check_state_keys(state_keys: list[str], skeleton: Any, path: Path) -> None:
    """Every state key is in the skeleton, once; a session's skeleton holds nothing else besides
    the session's own entries (so a forged ``state_keys`` reads as damage, not as another model)."""
    keys = set(skeleton) if isinstance(skeleton, dict) else set()
    missing = sorted(set(state_keys) - keys)
    if missing:
        raise CorruptCheckpointError(f"{path}: manifest skeleton lacks the state keys {missing}")
    if len(set(state_keys)) != len(state_keys) or (SESSION_KEY in keys and keys - {SESSION_KEY, RNG_KEY} != set(state_keys)):
        raise CorruptCheckpointError(f"{path}: manifest state_keys {state_keys[:8]} do not match its skeleton")


def check_sealed(record: CommitRecord, path: Path) -> None:
    """Last check of a reader (after the specific ones, which name the damage more precisely)."""
    if record.checksum is not None and record.checksum != record.body_checksum():
        raise CorruptCheckpointError(f"{path}: manifest.json checksum mismatch (a value in it was altered)")


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What every format's reader returns: a verified checkpoint loaded into a state tree."""

    step: int
    epoch: int | None
    state_keys: list[str]
    path: Path
    tree: dict[str, Any]
    nbytes: int  # bytes this process read


def subtree(tree: Any, keys: tuple[str, ...]) -> Any | None:
    """The entry of nested dicts at ``keys``, or None where any level is missing or not a dict."""
    node = tree
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


# --- directories -------------------------------------------------------------------------------


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
        (int(m.group(1)), e) for e in root.iterdir() if (m := _STEP_DIR.match(e.name)) and e.is_dir() and not e.is_symlink()
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


# --- commit and retention ----------------------------------------------------------------------


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
    """The first half of :func:`publish`: the sealed record written and fsynced into ``tmp``
    (still a ``*.tmp`` directory, never read). Node-local run directories prepare on every node,
    agree, and only then rename (:class:`coci.checkpoint.dcp.DcpWriter`)."""
    fault("before_manifest")
    has_root(root)  # the root is checked before the commit's rename
    write_durably(tmp / MANIFEST_FILENAME, record.sealed().model_dump_json().encode())
    fsync_dir(tmp)


def rename_into_place(root: Path, tmp: Path, final: Path) -> None:
    """The second half of :func:`publish`: ``tmp`` renamed to ``final`` (a checkpoint of the same
    step there is discarded first) and the rename made durable."""
    if final.exists():
        _discard(final)
    os.rename(tmp, final)
    fault("after_rename")
    fsync_dir(root)


def apply_retention(root: Path, keep_last: int | None, trusted: Collection[int]) -> list[int]:
    """Keep the newest ``keep_last`` of the ``trusted`` checkpoints; delete every committed one
    older than the oldest kept; return the steps deleted.

    ``trusted`` are the steps known to load: those this run committed and the one it restored
    from. Only they are counted, so an unloadable, planted or foreign ``step_<n>`` (however large
    its ``n``) never makes a good checkpoint look old: it is left in place (restore reports it).
    The newest trusted checkpoint is never deleted.
    """
    if keep_last is None:
        return []
    kept = [step for step, _ in committed_steps(root) if step in trusted][-max(keep_last, 1) :]
    if not kept:
        return []
    doomed = [(step, path) for step, path in committed_steps(root) if step < kept[0]]
    for _, path in doomed:
        _discard(path)
    return [step for step, _ in doomed]


def _discard(path: Path) -> None:
    """A checkpoint being deleted is never half-visible: it is atomically renamed to ``*.tmp``
    (and the rename made durable) before any of its files is removed."""
    doomed = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}{TMP_SUFFIX}")
    os.rename(path, doomed)
    fsync_dir(path.parent)
    fault("retention")
    shutil.rmtree(doomed, ignore_errors=True)


def write_durably(path: Path, data: bytes) -> None:
    """Write a small file of a checkpoint and fsync it (:func:`coci.safe_files.replace_file`)."""
    safe_files.replace_file(path, data, durable=True, error=CorruptCheckpointError)


def fsync_dir(path: Path) -> None:
    """Make a checkpoint directory's entries durable (never through a link in its place)."""
    safe_files.fsync_dir(path, error=CorruptCheckpointError)
