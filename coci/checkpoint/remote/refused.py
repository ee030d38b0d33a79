"""Which remote checkpoints one ``restore()`` tries: none once the remote stopped answering, and none
that this run directory already refused while they stay unchanged.

A remote checkpoint that failed for its own fault (a checksum, a size, a manifest, a load) is
recorded in ``remote_refused.json`` of the run directory with its *identity*, a digest of its
manifest and of the names and sizes of its objects (``identity``): a later restore passes over
it without downloading it again, until it is rewritten remotely. A failure that says nothing about
the checkpoint ([``coci.errors.RemoteUnavailableError``][coci.RemoteUnavailableError]: no answer, a full disk) is never
recorded; it makes the rest of that restore skip the remote tier instead. The record is untrusted
input like every run file: read bounded, never through a link; one that does not parse counts as
empty (and is replaced at the next refusal).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from coci import knobs
from coci.checkpoint import layout
from coci.checkpoint.remote.fetch import UNAVAILABLE
from coci.checkpoint.remote.store import RemoteStore
from coci.errors import ConfigError, CorruptCheckpointError
from coci.events import read_run_file, write_run_file

__all__ = ["REFUSED_BEFORE", "REFUSED_FILENAME", "RemoteGate", "RefusedRemote", "identity"]

logger = logging.getLogger(__name__)

#: ``remote_refused.json`` (remote checkpoints this run directory refused: not downloaded again
#: while unchanged) keeps the newest this many refusals, each message cut to this many characters;
#: a record larger than ``_REMOTE_REFUSED_FILE_BYTES`` is not coci's and is ignored.
_REMOTE_REFUSED_MAX: int = 100
_REMOTE_REFUSED_MESSAGE_CHARS: int = 500
_REMOTE_REFUSED_FILE_BYTES: int = 1 << 20

#: The run file that names the remote checkpoints this run directory refused.
REFUSED_FILENAME = "remote_refused.json"
#: How the reason a refused checkpoint is passed over starts.
REFUSED_BEFORE = "refused before"


def identity(store: RemoteStore, step: int) -> str:
    """A digest of remote ``step``: its manifest's bytes and the name and size of every object
    under ``step_<n>/`` (one bounded GET and one LIST; a rewrite of any of them changes it)."""
    prefix = f"{layout.step_dirname(step)}/"
    digest = hashlib.sha256(store.get_bytes(prefix + layout.MANIFEST_FILENAME, knobs.MAX_MANIFEST_BYTES))
    for key, size in sorted(store.list_objects(prefix).items()):
        digest.update(f"\n{key}\t{size}".encode())
    return digest.hexdigest()


class RefusedRemote:
    """The refusals recorded in ``run_dir`` for the remote at ``url`` (the newest
    ``_REMOTE_REFUSED_MAX`` of them are kept)."""

    def __init__(self, run_dir: Path, url: str) -> None:
        self.path = run_dir / REFUSED_FILENAME
        self.url = url
        self._entries = _read_entries(self.path)

    def mentions(self, step: int) -> bool:
        """Whether a refusal of remote ``step`` (in any version) is recorded."""
        return any((entry["remote"], entry["step"]) == (self.url, step) for entry in self._entries)

    def find(self, step: int, digest: str) -> dict[str, Any] | None:
        """The recorded refusal of remote ``step`` as it is now (``digest``), or None."""
        for entry in self._entries:
            if (entry["remote"], entry["step"], entry["identity"]) == (self.url, step, digest):
                return entry
        return None

    def add(self, step: int, digest: str, message: str) -> None:
        """Record that remote ``step`` (``digest``) failed with ``message``."""
        entry = {"remote": self.url, "step": step, "identity": digest, "message": message[: _REMOTE_REFUSED_MESSAGE_CHARS]}
        kept = [e for e in self._entries if (e["remote"], e["step"]) != (self.url, step)]
        self._entries = [*kept, entry][-_REMOTE_REFUSED_MAX :]
        try:
            write_run_file(self.path, json.dumps({"refused": self._entries}, indent=1))
        except (OSError, ConfigError) as exc:  # the refusal still holds for this process
            logger.warning("cannot record the refused remote step_%d in %s: %s", step, self.path, exc)


def _read_entries(path: Path) -> list[dict[str, Any]]:
    """The well-formed entries of the record at ``path``; [] when there is none or it is not coci's."""
    try:
        raw = json.loads(read_run_file(path, max_bytes=_REMOTE_REFUSED_FILE_BYTES))
    except FileNotFoundError:
        return []
    except (OSError, ConfigError, ValueError, RecursionError) as exc:
        logger.warning("ignoring %s: %s", path, exc)
        return []
    entries = raw.get("refused") if isinstance(raw, dict) else None
    return [entry for entry in entries if _well_formed(entry)] if isinstance(entries, list) else []


def _well_formed(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("remote"), str)
        and type(entry.get("step")) is int
        and isinstance(entry.get("identity"), str)
        and isinstance(entry.get("message"), str)
    )


class RemoteGate:
    """Decides, for one restore, whether a remote candidate is tried (on rank 0 only). A step
    with no recorded refusal costs no request here; a recorded one costs the two of
    ``identity`` instead of a download."""

    def __init__(self, store: RemoteStore, run_dir: Path) -> None:
        self.store = store
        self.refused = RefusedRemote(run_dir, store.url)
        self.unavailable: str | None = None  # why the remote is skipped for the rest of this restore

    def skip(self, step: int) -> str | None:
        """Why remote ``step`` is passed over without a download (None: fetch it)."""
        if self.unavailable is not None:
            return f"remote step_{step} not tried: {self.unavailable}"
        if not self.refused.mentions(step):
            return None
        try:
            digest = identity(self.store, step)
        except CorruptCheckpointError:  # a manifest over the size bound: the fetch refuses it before any data
            return None
        except Exception as exc:
            self.unavailable = f"{UNAVAILABLE} ({type(exc).__name__}: {exc})"
            return f"remote step_{step}: {self.unavailable}"
        entry = self.refused.find(step, digest)
        return None if entry is None else f"{REFUSED_BEFORE}, unchanged since: {entry['message']}"

    def failed(self, step: int, problem: str, *, fetched: bool, mismatch: bool) -> None:
        """Remote ``step`` failed with ``problem``: in its download (``fetched`` False) or its load.
        A download the remote did not answer makes the rest of the restore skip the remote; any
        other failure but a state mismatch (``mismatch``: this configuration's, not the
        checkpoint's) is the checkpoint's fault and recorded as refused, with its identity."""
        if not fetched and UNAVAILABLE in problem:
            self.unavailable = problem
            return
        if mismatch:
            return
        try:
            digest = identity(self.store, step)
        except Exception as exc:  # not recorded: the next restore downloads it once more
            logger.warning("remote step_%d refused but not recorded (its identity cannot be read: %s)", step, exc)
            return
        self.refused.add(step, digest, problem)
