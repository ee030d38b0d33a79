"""Reading a checkpoint's commit record and files as untrusted input: no symlink followed, a bounded
read, a typed error naming what is wrong."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coci import knobs, safe_files
from coci.checkpoint import layout
from coci.checkpoint.layout import FORMAT_VERSION, MANIFEST_FILENAME, RNG_KEY, SESSION_KEY
from coci.checkpoint.records import LOCAL_FORMAT, CommitRecord, RecordT
from coci.errors import CorruptCheckpointError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def open_no_follow(path: str | os.PathLike[str], flags: int) -> int:
    """Open a checkpoint file where it is (``coci.safe_files.open_file``): never through a
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
    """The ``format`` a checkpoint's record declares (``LOCAL_FORMAT`` when it names none).

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
    CorruptCheckpointError on anything off; format-specific checks, then ``check_sealed``, follow."""
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
    match = layout.STEP_DIR.match(path.name)
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
