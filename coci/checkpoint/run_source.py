"""A run's committed checkpoints, read from outside the run: by ``coci.load``, ``coci export`` and
``Session(init_from=...)``.

``open_source`` takes what a user names (a run directory, a node-local run's directories, a
remote URL ``s3://...`` or ``file://...``) and returns a ``RunSource``: the committed steps and,
for one step, a directory holding the whole checkpoint (record and files). Nothing of the run is
written, created or deleted and no lock is taken: a run directory's own ``step_<n>`` is read where it
is (beside a live ``Session``, on a read-only mount); a remote step is downloaded (sizes and crc32c
checked) into a temporary directory of this process, and the parts of a node-local run are copied
into one, under the record of the whole checkpoint; both are removed once read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coci import knobs
from coci.checkpoint import commit, layout, record_reads
from coci.checkpoint.dcp import read_dcp_manifest
from coci.checkpoint.dcp_manifest import DcpManifest, checkpoint_id, full_record
from coci.checkpoint.remote.fetch import download_files, open_fetch, publish_fetch
from coci.checkpoint.remote.store import RemoteStore
from coci.checkpoint.remote.tier import committed_steps as remote_committed_steps
from coci.errors import ConfigError, CorruptCheckpointError, NewerCheckpointError

__all__ = ["RunSource", "SourceLike", "open_source", "refuse_newer"]

logger = logging.getLogger(__name__)

#: What names a run to read: its directory, a node-local run's directories (one per node), a URL.
SourceLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass(frozen=True)
class RunSource:
    """A run's committed checkpoints, wherever they are. ``steps``: newest first (committed, not
    yet verified); ``opened`` gives one step's checkpoint as a local directory."""

    label: str  # how the run is named in messages
    run_dir: Path | None  # a single run directory (its run files: model config, run id); None otherwise
    roots: tuple[Path, ...] = ()  # the checkpoints/ of each node-local directory (or of the run directory)
    store: RemoteStore | None = None
    steps: tuple[int, ...] = field(default=())

    @contextlib.contextmanager
    def opened(self, step: int) -> Iterator[Path]:
        """The directory of ``step``'s whole checkpoint (record and files; temporary for a remote or
        node-local run, removed on exit). CorruptCheckpointError when it cannot be assembled."""
        if self.store is not None:
            with _temporary() as scratch:
                yield _fetched(self.store, step, scratch)
            return
        if len(self.roots) == 1:
            yield self.roots[0] / layout.step_dirname(step)
            return
        with _temporary() as scratch:
            yield _joined_parts(self.roots, step, scratch)

    def newest_record_json(self, step: int) -> dict[str, object] | None:
        """The raw JSON object of ``step``'s record, for the version check; None where unreadable."""
        try:
            if self.store is not None:
                data = self.store.get_bytes(f"{layout.step_dirname(step)}/{layout.MANIFEST_FILENAME}", knobs.MAX_MANIFEST_BYTES)
            else:
                data = record_reads.read_record_bytes(self.roots[0] / layout.step_dirname(step))
            raw = json.loads(data)
        except Exception:  # unreadable: the reader reports it as corrupt when the step is loaded
            return None
        return raw if isinstance(raw, dict) else None


def open_source(source: SourceLike, storage_options: dict[str, object] | None = None) -> RunSource:
    """The run ``source`` names (see the module); ConfigError naming it when it is none."""
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "://" in text:
            return _remote_source(text, storage_options)
        run_dir = Path(text)
        if not run_dir.is_dir():
            raise ConfigError(f"source {text!r} is not a run directory (nor a URL such as s3://bucket/prefix)")
        root = layout.checkpoints_dir(run_dir)
        steps = [step for step, _ in reversed(layout.committed_steps(root))]
        return RunSource(text, run_dir, (root,), None, tuple(steps))
    if isinstance(source, Sequence) and source and all(isinstance(s, (str, os.PathLike)) for s in source):
        return _node_local_source([Path(os.fspath(s)) for s in source])
    raise ConfigError(f"source must be a run directory, a list of a node-local run's directories or a URL, got {source!r}")


def refuse_newer(source: RunSource, step: int) -> None:
    """NewerCheckpointError naming the run, the step and both versions when ``step``'s record was
    written by a coci whose format this one cannot read."""
    raw = source.newest_record_json(step)
    version = raw.get("format_version") if raw is not None else None
    if isinstance(version, int) and version > layout.FORMAT_VERSION:
        from coci._version import __version__

        raise NewerCheckpointError(
            f"{source.label}: step_{step} was written by coci {raw.get('coci_version')!r} (format version {version}); "  # type: ignore[union-attr]
            f"this coci {__version__} reads format versions up to {layout.FORMAT_VERSION}: upgrade coci to read it"
        )


def _remote_source(url: str, storage_options: dict[str, object] | None) -> RunSource:
    store = _open_remote(url, storage_options)
    try:
        listing = store.list_objects()
    except Exception as exc:
        raise ConfigError(f"source {url!r}: cannot be listed ({type(exc).__name__}: {exc})") from exc
    steps = sorted(remote_committed_steps(listing), reverse=True)
    return RunSource(url, None, (), store, tuple(steps))


def _open_remote(url: str, storage_options: dict[str, object] | None) -> RemoteStore:
    """The store of ``url``: ``file://PATH`` a directory store, any other scheme as ``Session(remote=)`` opens it."""
    from coci.checkpoint.remote.schemes import open_store

    if url.startswith("file://"):
        path = url.removeprefix("file://")
        if not Path(path).is_dir():
            raise ConfigError(f"source {url!r}: {path!r} is not a directory")
        return open_store(path)
    return open_store(url, storage_options)


def _node_local_source(dirs: list[Path]) -> RunSource:
    """A node-local run: the steps whose part every directory holds."""
    for run_dir in dirs:
        if not run_dir.is_dir():
            raise ConfigError(f"source {str(run_dir)!r} (one of the node-local run's directories) is not a directory")
    roots = tuple(layout.checkpoints_dir(d) for d in dirs)
    held = [{step for step, _ in layout.committed_steps(root)} for root in roots]
    common = set.intersection(*held) if held else set()
    label = ", ".join(str(d) for d in dirs)
    return RunSource(label, dirs[0] if len(dirs) == 1 else None, roots, None, tuple(sorted(common, reverse=True)))


@contextlib.contextmanager
def _temporary() -> Iterator[Path]:
    scratch = Path(tempfile.mkdtemp(prefix="coci-read-"))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fetched(store: RemoteStore, step: int, scratch: Path) -> Path:
    """Remote ``step`` downloaded (each file's size and crc32c checked) into ``scratch``."""
    opened = open_fetch(store, step, scratch)
    download_files(store, opened, list(opened.record.files))
    return publish_fetch(scratch, opened)


def _joined_parts(roots: tuple[Path, ...], step: int, scratch: Path) -> Path:
    """The node-local parts of ``step`` copied into one directory under the whole checkpoint's
    record: every part one checkpoint (one commit id) and every node's part present."""
    parts: list[tuple[Path, DcpManifest]] = []
    for root in roots:
        path = root / layout.step_dirname(step)
        parts.append((path, read_dcp_manifest(path)))
    ids = {checkpoint_id(record) for _, record in parts}
    if len(ids) != 1:
        raise CorruptCheckpointError(f"step_{step}: the directories hold parts of different checkpoints (commit ids {sorted(map(str, ids))})")
    first = parts[0][1]
    held = {record.node for _, record in parts}
    if first.nodes is not None and held != set(range(len(first.nodes))) and None not in held:
        raise CorruptCheckpointError(f"step_{step}: the directories hold the parts of nodes {sorted(map(str, held))} of {len(first.nodes)}")
    target = scratch / layout.step_dirname(step)
    target.mkdir()
    for path, record in parts:
        for entry in record.present_files():
            if not (target / entry.name).exists():
                shutil.copyfile(path / entry.name, target / entry.name, follow_symlinks=False)
    record = full_record(first) if first.node is not None else first
    commit.write_durably(target / layout.MANIFEST_FILENAME, record.model_dump_json().encode())
    return target
