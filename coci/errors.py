"""Typed exceptions for every part of coci: configuration, checkpointed state, checkpoint files.

Every error a user can trigger with bad input is a subclass of [``CociError``][coci.CociError], and the message
names the offending field, so a failing job says what to fix instead of crashing deep inside.
"""

from __future__ import annotations


class CociError(Exception):
    """Base class of every error coci raises on purpose."""


class ConfigError(CociError, ValueError):
    """An argument is invalid (non-positive MTBF, unknown policy, NaN cost, ...).

    Subclasses ``ValueError`` so generic callers that catch ``ValueError`` keep working.
    """


class StateError(CociError, TypeError):
    """A value in ``Session(state=...)`` cannot be checkpointed (names the key)."""


class CheckpointError(CociError):
    """A checkpoint could not be written or read."""


class PersistError(CheckpointError):
    """A background persist failed; the previous committed checkpoint is intact."""


class CorruptCheckpointError(CheckpointError):
    """A committed checkpoint fails verification (size, checksum, manifest, path escape)."""


class IncompleteCheckpointError(CheckpointError):
    """Checkpoints whose bytes verify but that cannot be loaded here: a node's part was never
    published or is lost with its disk, or they were saved by another layout of nodes (a world-size
    change on node-local run directories). The message says which and what to do."""


class StateMismatchError(CheckpointError):
    """A checkpoint's state keys differ from the session's (lists missing and unexpected keys)."""


class RunDirLockedError(ConfigError):
    """Another session (this process or another, named in the message) holds the run directory."""


class RemoteUnavailableError(CheckpointError):
    """A fetch from the remote tier failed for a reason that says nothing about the checkpoint (no
    answer within the limits, a refused connection, a server error, no room on the local disk):
    ``restore()`` falls back to the local tier and tries that checkpoint again another time."""


class NewerCheckpointError(CheckpointError):
    """A checkpoint was written by a newer coci, in a format version this one cannot read (names both)."""


class ResumeMismatchError(CociError, RuntimeError):
    """A step redone after a restore had another loss than the killed process logged for it
    (``Session(on_mismatch="raise")``): the resume was not exact. The message names the step, both
    values, the checkpoint restored and the likely causes found in the setup."""


class ResumeMismatchWarning(UserWarning):
    """As ``ResumeMismatchError``, warned (``Session(on_mismatch="warn")``, the default) once
    per restore, at the first redone step whose loss differs."""
