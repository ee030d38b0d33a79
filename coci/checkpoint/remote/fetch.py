"""Fetching a remote checkpoint back into the local tier, by one process or by every rank of a job.

A fetch is three pieces, composed by ``fetch``: ``open_fetch`` (rank 0) downloads the
manifest into ``root/step_<n>.fetch.tmp`` and checks it as untrusted input (parsed by its format's
reader: names inside the directory, sealed; the step; every object listed at its recorded size;
room on disk); ``download_files`` fetches some of its files, each bounded by its recorded size
and checked against its crc32c while it downloads; ``publish_fetch`` (rank 0) commits the
directory the way a local write does, so the next failure restores locally.

Under ``torch.distributed`` every rank downloads the files it owns (``owner_of``), the ranks
agree, and only then does rank 0 commit; any rank's failure removes the directory and every rank
skips the checkpoint together. What goes wrong is either the checkpoint's fault
(CorruptCheckpointError) or not (RemoteUnavailableError: the remote did not answer, the local disk
is full), whichever rank saw it (``UNAVAILABLE`` marks the latter in the ranks' agreed
message). The run directory is shared by the ranks of a job on one node, as
the local tier assumes (rank 0 lists and commits there).

Node-local run directories (``fetch_node_parts``): only the nodes whose own part of the step
is missing or corrupt fetch, each into its own directory: its leader downloads the manifest and
``.metadata``, each of its ranks its own files, and the leader commits the part as its node's.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from coci import distributed, knobs
from coci.checkpoint import commit, layout
from coci.checkpoint.records import CommitRecord, FileEntry
from coci.checkpoint.remote.store import RemoteStore
from coci.distributed import DistributedContext
from coci.errors import CorruptCheckpointError, RemoteUnavailableError
from coci.events import EventLog

__all__ = [
    "FETCH_SUFFIX",
    "UNAVAILABLE",
    "OpenedFetch",
    "download_files",
    "fetch",
    "fetch_node_parts",
    "files_of",
    "open_fetch",
    "owner_of",
    "publish_fetch",
]

FETCH_SUFFIX = ".fetch" + layout.TMP_SUFFIX
#: In the message of every failure of a fetch that is not the checkpoint's fault (RemoteUnavailableError).
UNAVAILABLE = "remote unavailable"
_DCP_RANK_FILE = re.compile(r"^__(\d{1,9})_\d+\.distcp$")  # DCP's FileSystemWriter: __<rank>_<n>.distcp

T = TypeVar("T")


@dataclass(frozen=True)
class OpenedFetch:
    """A fetch under way: its ``.fetch.tmp`` directory (manifest in place) and the checked record."""

    step: int
    tmp: Path
    record: CommitRecord


def owner_of(name: str, world_size: int) -> int:
    """The rank that downloads file ``name``: the rank that wrote a DCP ``__<w>_<n>.distcp`` file
    (``w`` modulo the world size, so a job that shrank still fetches every file); rank 0 for the
    files no rank owns (DCP's small ``.metadata``, coci's single-process ``data.bin``: one file,
    not split by byte ranges)."""
    match = _DCP_RANK_FILE.match(name)
    return int(match.group(1)) % world_size if match else 0


def files_of(record: CommitRecord, rank: int, world_size: int) -> list[FileEntry]:
    """The files of ``record`` that ``rank`` downloads."""
    return [entry for entry in record.files if owner_of(entry.name, world_size) == rank]


def open_fetch(store: RemoteStore, step: int, root: Path) -> OpenedFetch:
    """A fresh ``root/step_<n>.fetch.tmp`` holding remote ``step``'s checked manifest (removed again
    when anything about it is off: CorruptCheckpointError)."""
    layout.make_root(root)
    tmp = root / (layout.step_dirname(step) + FETCH_SUFFIX)
    layout.fresh_dir(tmp)
    try:
        return OpenedFetch(step, tmp, _checked_manifest(store, step, tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _checked_manifest(store: RemoteStore, step: int, tmp: Path) -> CommitRecord:
    """Remote ``step``'s manifest, written into ``tmp`` and parsed by its format's reader."""
    from coci.checkpoint.checkpointer import reader_for

    prefix = f"{layout.step_dirname(step)}/"
    try:
        manifest = store.get_bytes(prefix + layout.MANIFEST_FILENAME, knobs.MAX_MANIFEST_BYTES)
    except CorruptCheckpointError:
        raise
    except Exception as exc:
        raise _unavailable(f"remote step_{step}: manifest cannot be read", exc) from exc
    commit.write_durably(tmp / layout.MANIFEST_FILENAME, manifest)
    record = reader_for(tmp).read_record(tmp)  # parsed and checked: names inside the directory, sealed
    if record.step != step:
        raise CorruptCheckpointError(f"remote step_{step}: its manifest says step {record.step}")
    _check_objects(store, record, tmp)
    return record


def _check_objects(store: RemoteStore, record: CommitRecord, tmp: Path) -> None:
    """Every file of ``record`` is listed remotely at its recorded size, and they fit on disk."""
    step, prefix = record.step, f"{layout.step_dirname(record.step)}/"
    try:
        listing = store.list_objects(prefix)
    except Exception as exc:
        raise _unavailable(f"remote {prefix}: cannot be listed", exc) from exc
    for entry in record.files:
        if listing.get(prefix + entry.name) != entry.size:
            raise CorruptCheckpointError(
                f"remote {prefix}{entry.name}: {listing.get(prefix + entry.name)} bytes, the manifest records {entry.size} (missing or truncated)"
            )
    needed = sum(entry.size for entry in record.files)
    if needed > shutil.disk_usage(tmp).free:
        raise CorruptCheckpointError(f"remote step_{step}: declares {needed} bytes, more than the free space of {tmp}")


def download_files(store: RemoteStore, opened: OpenedFetch, entries: list[FileEntry]) -> int:
    """Download ``entries`` of the fetch into its directory, each at most its recorded size and
    checked (size, crc32c) before it counts; the bytes downloaded."""
    for entry in entries:
        _download_one(store, opened, entry)
    return sum(entry.size for entry in entries)


def _download_one(store: RemoteStore, opened: OpenedFetch, entry: FileEntry) -> None:
    key = f"{layout.step_dirname(opened.step)}/{entry.name}"
    dest = opened.tmp / entry.name
    try:
        crc = store.get_file(key, dest, entry.size)
    except CorruptCheckpointError:
        raise
    except Exception as exc:
        raise _unavailable(f"remote {key}: cannot be downloaded", exc) from exc
    if dest.stat().st_size != entry.size:
        raise CorruptCheckpointError(f"remote {key}: {dest.stat().st_size} bytes arrived, the manifest records {entry.size}")
    if entry.algorithm == "crc32c" and crc != entry.checksum:
        raise CorruptCheckpointError(f"remote {key}: crc32c mismatch (the object was altered)")


def publish_fetch(root: Path, opened: OpenedFetch) -> Path:
    """Commit the fully downloaded fetch as ``root/step_<n>`` (removed when that fails)."""
    final = root / layout.step_dirname(opened.step)
    try:
        commit.publish(root, opened.tmp, final, opened.record)
    except BaseException:
        shutil.rmtree(opened.tmp, ignore_errors=True)
        raise
    return final


def fetch(store: RemoteStore, step: int, root: Path, context: DistributedContext | None, events: EventLog) -> Path:
    """Download remote ``step`` into ``root/step_<n>``, committed there, and return that directory.

    Collective under ``torch.distributed``: each rank downloads its own files and emits a
    ``remote_fetch`` event naming them; the ranks raise the same CorruptCheckpointError together
    when any of them failed (RemoteUnavailableError when any failure was not the checkpoint's
    fault), and the ``.fetch.tmp`` directory is gone by then.
    """
    opened = _on_coordinator(lambda: open_fetch(store, step, root), step, context)
    rank, world = (0, 1) if context is None else (context.rank, context.world_size)
    mine = files_of(opened.record, rank, world)
    began = time.perf_counter()
    problem = _problem_of(lambda: download_files(store, opened, mine), step)
    if problem is None:
        events.emit("remote_fetch", step=step, rank=rank, files=[entry.name for entry in mine],
                    bytes=sum(entry.size for entry in mine), seconds=time.perf_counter() - began)
    problem = distributed.agree(problem, context)
    if problem is not None:
        if rank == 0:  # every rank is done with the directory: agree() waited for all of them
            shutil.rmtree(opened.tmp, ignore_errors=True)
        raise _agreed_error(problem)
    return _on_coordinator(lambda: publish_fetch(root, opened), step, context)


def _on_coordinator(compute: Callable[[], T], step: int, context: DistributedContext | None) -> T:
    """``compute()`` on rank 0, its result on every rank; the same CorruptCheckpointError on every
    rank when it failed (collective)."""

    def attempt() -> tuple[T | None, str | None]:
        try:
            return compute(), None
        except Exception as exc:
            return None, _describe(exc, step)

    value, problem = distributed.from_coordinator(attempt, context)
    if problem is not None:
        raise _agreed_error(problem)
    return value  # type: ignore[return-value]


def _problem_of(action: Callable[[], object], step: int) -> str | None:
    """None when ``action()`` succeeds, else what went wrong."""
    try:
        action()
    except Exception as exc:
        return _describe(exc, step)
    return None


def _describe(exc: Exception, step: int) -> str:
    """What went wrong, marked ``UNAVAILABLE`` unless it is the checkpoint's fault."""
    if isinstance(exc, (CorruptCheckpointError, RemoteUnavailableError)):
        return str(exc)
    return str(_unavailable(f"remote step_{step}", exc))


def _unavailable(what: str, exc: BaseException) -> RemoteUnavailableError:
    return RemoteUnavailableError(f"{what}: {UNAVAILABLE} ({type(exc).__name__}: {exc})")


def _agreed_error(problem: str) -> CorruptCheckpointError | RemoteUnavailableError:
    """The error every rank raises for the ranks' agreed ``problem``: not the checkpoint's fault
    when any rank's was not."""
    return RemoteUnavailableError(problem) if UNAVAILABLE in problem else CorruptCheckpointError(problem)


def fetch_node_parts(
    store: RemoteStore, step: int, root: Path, context: DistributedContext, fetching: bool, events: EventLog
) -> Path:
    """Remote ``step``'s part of this node committed in ``root/step_<n>`` when ``fetching`` (this
    node's own part is missing or corrupt), and that directory on every rank. Collective on the
    control group: the ranks raise the same CorruptCheckpointError together when any node failed
    (RemoteUnavailableError when any failure was not the checkpoint's fault), and no
    ``.fetch.tmp`` is left.

    A checkpoint saved by the same nodes: each rank downloads its own files, the leader also
    ``.metadata``, and the part is committed as this node's. Saved by other nodes or ranks (or in
    one shared directory): the node downloads every file, its ranks a share each, and commits the
    whole checkpoint (``node`` None), which any world size can load (DCP reshards)."""
    opened, problem = None, None
    if fetching and context.is_node_leader:
        try:
            opened = open_fetch(store, step, root)
        except Exception as exc:
            problem = _describe(exc, step)
    shared = distributed.gather_objects(None if opened is None else opened.record.model_dump_json(), context.control_group)
    if fetching and problem is None:
        problem = _problem_of(lambda: _download_share(store, step, root, context, shared[context.node_ranks[0]], events), step)
    problem = distributed.agree(problem, context)
    if problem is not None:
        if opened is not None:
            shutil.rmtree(opened.tmp, ignore_errors=True)
        raise _agreed_error(problem)
    if opened is not None:
        problem = _problem_of(lambda: publish_fetch(root, _as_node_part(opened, context)), step)
    problem = distributed.agree(problem, context)
    if problem is not None:
        raise _agreed_error(problem)
    return root / layout.step_dirname(step)


def same_nodes(record: CommitRecord, context: DistributedContext) -> bool:
    """True when ``record`` was saved by this job's nodes (each holds its own ranks' files)."""
    return getattr(record, "nodes", None) == [list(ranks) for ranks in context.nodes or ()]


def _download_share(store: RemoteStore, step: int, root: Path, context: DistributedContext, record_json: str, events: EventLog) -> None:
    """This rank's share of the fetch its node's leader opened: its own files (its leader also
    ``.metadata``), or, for a checkpoint of another layout, every ``n``-th of all its files."""
    from coci.checkpoint.dcp_manifest import DcpManifest, file_rank

    record = DcpManifest.model_validate_json(record_json)
    tmp = root / (layout.step_dirname(step) + FETCH_SUFFIX)
    if same_nodes(record, context):
        mine = [e for e in record.files if file_rank(e.name) == context.rank or (file_rank(e.name) is None and context.is_node_leader)]
    else:
        mine = record.files[context.node_ranks.index(context.rank) :: len(context.node_ranks)]
    began = time.perf_counter()
    download_files(store, OpenedFetch(step, tmp, record), mine)
    events.emit("remote_fetch", step=step, rank=context.rank, node=context.node, files=[e.name for e in mine],
                bytes=sum(e.size for e in mine), seconds=time.perf_counter() - began)


def _as_node_part(opened: OpenedFetch, context: DistributedContext) -> OpenedFetch:
    """The fetch with its record naming this node's part, or the whole checkpoint when it is one
    of another layout (re-sealed when committed)."""
    node = context.node if same_nodes(opened.record, context) else None
    record = opened.record.model_copy(update={"node": node, "checksum": None})
    return OpenedFetch(opened.step, opened.tmp, record)
