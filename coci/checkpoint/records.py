"""The commit record every checkpoint format writes, and what a load returns.

Everything here is part of the on-disk contract: a change to a name (``coci.checkpoint.layout``), a
field of ``CommitRecord`` or the commit order (``coci.checkpoint.commit``) makes existing
checkpoints unreadable or unsafe, so it must come with a new ``coci.checkpoint.layout.FORMAT_VERSION``.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from coci import knobs
from coci._version import __version__
from coci.checkpoint.layout import FORMAT_VERSION

#: ``format`` of coci's own single-process records, which carry no ``format`` field.
LOCAL_FORMAT = "coci"


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
