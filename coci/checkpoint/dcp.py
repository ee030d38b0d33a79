"""The checkpoint format of jobs under ``torch.distributed``: DCP's files plus coci's commit record.

Writing (``DcpWriter``, collective on coci's persist group): the staged arena is handed to
``torch.distributed.checkpoint.save`` with a ``FileSystemWriter`` on ``step_<n>.tmp`` as zero-copy
tensors, each over its own slice of the arena. The user's state is replicated under DDP and saved
under the same keys on every rank, so DCP writes each tensor once and balances the writes across
ranks; coci's per-rank state (RNG streams, the rank's profiler) is saved under per-rank keys.
The ranks agree on the step and the replicated layout before writing; after the save every rank
checksums the files it wrote and votes, and only once every vote arrived does the coordinator
write the commit record (``"format": "dcp"``, sizes and crc32c of every file) and publish it.

Reading (``DcpReader``): the ranks check ``.metadata`` (its checksum, then through a restricted
unpickler that only builds DCP's plain records, against the record), agree on the verdict and load
through ``torch.distributed.checkpoint.load``, whose reads of the data files coci serves: each file
read once and checksummed on the bytes loaded (``coci.checkpoint.dcp_reads``). A rank that did
not exist when the checkpoint was saved keeps its own RNG streams and takes rank 0's profiler.
Without a process group the same checkpoint is read by one process.

Sharded state (DTensors, ``coci.checkpoint.sharded``) goes through the same writer and reader:
its staged local shards are saved as DTensors (each rank writes its own shards, the manifest
records global shapes) and loaded into fresh DTensors of the reader's mesh (resharding).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from coci import distributed
from coci.checkpoint import commit, dcp_checks, dcp_reads, faults, fileio, layout, record_reads, records, retention
from coci.checkpoint.dcp_checks import read_dcp_metadata
from coci.checkpoint.dcp_manifest import (
    DCP_FORMAT,
    DcpManifest,
    DcpPart,
    DcpTensor,
    check_nodes,
    node_key,
)
from coci.checkpoint.local import dtype_name, torch_dtype
from coci.checkpoint.records import CommitRecord, FileEntry, LoadedCheckpoint
from coci.checkpoint.retention import RetentionPolicy
from coci.checkpoint.sharded import ShardSpec, as_dtensors, local_nbytes, spec_whole_on_every_node, targets_by_index
from coci.checkpoint.snapshot import StagedCheckpoint
from coci.checkpoint.tree import tensor_refs, unflatten
from coci.distributed import DistributedContext
from coci.errors import CorruptCheckpointError, PersistError, StateError

logger = logging.getLogger(__name__)

#: How long rank 0 lists a checkpoint's ``.tmp`` directory again for the files the other ranks
#: wrote before it refuses to commit: a network file system's cache may show a new name late; a
#: few seconds spent once per checkpoint only when a file is missing (a node-local disk under
#: ``run_dir_layout="shared"``).
_COMMIT_VISIBLE_SECONDS = 5.0

_DCP_METADATA = dcp_checks.DCP_METADATA


def read_dcp_manifest(path: Path) -> DcpManifest:
    """Parse and sanity-check a DCP checkpoint's manifest; CorruptCheckpointError on anything off."""
    manifest = record_reads.parse_record(path, DcpManifest)
    names = [entry.name for entry in manifest.files]
    if _DCP_METADATA not in names or len(manifest.ranks) != manifest.world_size:
        raise CorruptCheckpointError(f"{path}: manifest lacks DCP's {_DCP_METADATA} or a rank's record")
    record_reads.check_file_names(path, names, also=frozenset({_DCP_METADATA}))
    check_nodes(path, manifest)
    dcp_checks.check_dcp_manifest(path, manifest)
    record_reads.check_sealed(manifest, path)
    return manifest


def verify_dcp_checkpoint(path: Path) -> DcpManifest:
    """Check a DCP checkpoint's manifest and every file's size and checksum (one process)."""
    manifest = read_dcp_manifest(path)
    problem = _verify_files(path, manifest.present_files())
    if problem:
        raise CorruptCheckpointError(problem)
    read_dcp_metadata(path, manifest)
    return manifest


def check_dcp_sizes(path: Path) -> DcpManifest:
    """Check a DCP checkpoint's record, ``.metadata`` (checksum and contents, ``read_dcp_metadata``)
    and that every data file it names here is a regular file of its recorded size, without reading
    the data: their checksums are checked by the load, on the bytes it reads (``coci.checkpoint.dcp_reads``)."""
    manifest = read_dcp_manifest(path)
    for entry in manifest.present_files():
        try:
            fd = record_reads.open_no_follow(path / entry.name, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"{path / entry.name}: data file is missing") from exc
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != entry.size:
            raise CorruptCheckpointError(f"{path / entry.name}: size {size} != manifest size {entry.size}")
    read_dcp_metadata(path, manifest)
    return manifest


def _metadata_problem(path: Path, manifest: DcpManifest) -> str | None:
    """None when ``.metadata`` is safe to hand to DCP (``read_dcp_metadata``), else why not."""
    try:
        read_dcp_metadata(path, manifest)
    except (CorruptCheckpointError, OSError) as exc:
        return str(exc)
    return None


def _verify_files(path: Path, files: list[FileEntry]) -> str | None:
    """None when every file has its recorded size and checksum, else what is wrong."""
    try:
        for entry in files:
            fileio.read_verified(path / entry.name, entry, keep=False)
    except CorruptCheckpointError as exc:
        return str(exc)
    return None


# --- writing -----------------------------------------------------------------------------------


def split_skeleton(skeleton: dict[str, Any]) -> tuple[Any, Any]:
    """(replicated part, this rank's part) of a session tree's skeleton.

    The rank's part is coci's per-process state: the RNG streams and the rank's profiler.
    """
    shared = dict(skeleton)
    own = dict(shared.get(layout.SESSION_KEY) or {})
    rank_part = {"rng": shared.pop(layout.RNG_KEY, None), "profiler": own.pop("profiler", None), "level_steps": own.pop("level_steps", None)}
    shared[layout.SESSION_KEY] = own
    return shared, rank_part


def _part(skeleton: Any, slots: list[Any], prefix: str) -> DcpPart:
    indices = [int(ref) for ref in tensor_refs(skeleton)]
    return DcpPart(
        skeleton=skeleton,
        tensors=[
            DcpTensor(index=i, key=f"{prefix}/{n}", dtype=dtype_name(slots[i].dtype), shape=list(slots[i].shape))
            for n, i in enumerate(indices)
        ],
    )


def _with_global_shapes(part: DcpPart, shards: Mapping[int, ShardSpec]) -> DcpPart:
    """``part`` with each sharded tensor's global shape (its slot holds this rank's shard only), so
    that the ranks agree on one layout and a reader of any world size knows the full tensor."""
    if not shards:
        return part
    tensors = [t.model_copy(update={"shape": list(shards[t.index].shape)}) if t.index in shards else t for t in part.tensors]
    return part.model_copy(update={"tensors": tensors})


def staged_tensors(payload: memoryview, slots: list[Any]) -> list[torch.Tensor]:
    """One tensor per slot over the arena's bytes, each owning exactly its slice (zero copy)."""
    tensors = []
    for slot in slots:
        if slot.nbytes == 0:
            tensors.append(torch.empty(slot.shape, dtype=slot.dtype))
            continue
        raw = torch.frombuffer(payload[slot.offset : slot.offset + slot.nbytes], dtype=torch.uint8)
        tensors.append(raw.view(slot.dtype).view(slot.shape))
    return tensors


def _node_copies(shards: Mapping[int, ShardSpec], shared: DcpPart, nodes: Sequence[Sequence[int]]) -> set[int]:
    """The indices of the replicated tensors of ``shared`` that each node of node-local run
    directories saves as its own copy (``node_key``), so that no rank loads another node's files:
    every plain tensor (replicated under DDP) and every DTensor of which each node holds a whole
    replica (HSDP's replicate dimension across nodes); DCP deduplicates the rest across the job."""
    whole: dict[tuple[int, tuple[Any, ...]], bool] = {}  # one answer per mesh and placements
    copies = set()
    for t in shared.tensors:
        spec = shards.get(t.index)
        if spec is not None:
            layout_key = (id(spec.mesh), spec.placements)
            if layout_key not in whole:
                whole[layout_key] = spec_whole_on_every_node(spec, nodes)
            if not whole[layout_key]:
                continue
        copies.add(t.index)
    return copies


class DcpWriter:
    """The checkpoint writer under ``torch.distributed`` (runs on every rank's worker).

    ``write`` and ``retain`` are collective on the context's persist group. Fault points
    (``faults.set_fault_hook``): ``dcp_before_save`` and ``dcp_after_save`` on every rank, then
    ``before_manifest``, ``before_rename``, ``after_rename``, ``after_commit`` on rank 0.

    Node-local run directories (``_write_node_local``): each node's leader makes its own
    ``step_<n>.tmp``, every rank writes its files there (DCP's ``.metadata`` lands on rank 0's
    node and is sent to the others), each leader *prepares* its node's part (``.metadata`` and a
    record naming the node and the checkpoint's ``commit_id``, fsynced, still ``*.tmp``), the
    ranks agree, and only then does each leader rename its part into place. Fault points there:
    ``node_prepared`` (a node's part durable, before the agreement), ``before_node_publish`` and
    ``after_node_publish`` on each leader.
    """

    def __init__(self, root: Path, context: DistributedContext) -> None:
        self.root = root
        self.context = context
        self.last_bytes_written = 0  # this rank's bytes in the last checkpoint (benchmarks read it)
        import torch.distributed.checkpoint  # noqa: F401  now, not inside the first persist's timing

    def write(self, staged: StagedCheckpoint) -> Path:
        if self.context.node_local:
            return self._write_node_local(staged)
        step, slots, skeleton = staged.step, staged.slots, staged.skeleton
        tmp = layout.tmp_dir(self.root, step)

        def prepare() -> None:
            layout.make_root(self.root)  # a link in its place: every rank raises, none waits on rank 0
            layout.remove_stale_tmp(self.root)  # leftovers of failed persists: never checkpoints
            tmp.mkdir()

        self._coordinated(prepare, f"checkpoint at step {step} could not be started")
        shared_skeleton, rank_skeleton = split_skeleton(skeleton)
        shared = _with_global_shapes(_part(shared_skeleton, slots, "shared"), staged.shards)
        mine = _part(rank_skeleton, slots, f"rank{self.context.rank}")
        self._agree_on_layout(step, shared)  # also: nobody writes before rank 0 made tmp
        written = self._save(tmp, as_dtensors(staged_tensors(staged.payload, slots), staged.shards), shared, mine)
        votes = distributed.gather_objects((written, mine.model_dump()), self.context.persist_group)
        self._coordinated(
            lambda: self._commit(tmp, step, staged.epoch, staged.state_keys, shared, votes), f"checkpoint at step {step} was not committed"
        )
        return self.root / layout.step_dirname(step)

    def retain(self, policy: RetentionPolicy | None, trusted: frozenset[int]) -> list[int]:
        """Rank 0 applies retention (each node's leader in its own directory); every rank learns
        which steps it removed."""
        if self.context.node_local:
            return list(self._on_leaders(lambda: retention.apply_retention(self.root, policy, trusted), "retention failed"))
        return list(
            self._coordinated(lambda: retention.apply_retention(self.root, policy, trusted), "retention failed on rank 0")
        )

    def _agree_on_layout(self, step: int, shared: DcpPart) -> None:
        layout = [(t.key, t.dtype, t.shape) for t in shared.tensors]
        agreed = distributed.gather_objects((step, layout), self.context.persist_group)
        if any(other != (step, layout) for other in agreed):
            steps = [other[0] for other in agreed]
            raise PersistError(
                f"ranks disagree on the checkpoint (steps {steps}"
                + ("" if len(set(steps)) > 1 else ", or on the replicated state's tensors")
                + "): every rank must checkpoint the same state at the same step"
            )

    def _save(
        self, tmp: Path, tensors: list[torch.Tensor], shared: DcpPart, mine: DcpPart, node_keys: frozenset[str] = frozenset()
    ) -> list[FileEntry]:
        """DCP's save of this rank's share (files fsynced); returns the files this rank wrote.
        The ``node_keys`` of ``shared`` are saved as this node's copy (``node_key``)."""
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint import save as dcp_save

        faults.fault("dcp_before_save")
        node = self.context.node
        state_dict = {node_key(node, t.key) if t.key in node_keys else t.key: tensors[t.index] for t in shared.tensors}
        state_dict.update((t.key, tensors[t.index]) for t in mine.tensors)  # after: DCP balances the replicated ones in this order
        group = self.context.persist_group
        dcp_save(state_dict, storage_writer=FileSystemWriter(tmp, sync_files=True), process_group=group)
        faults.fault("dcp_after_save")
        written = [fileio.describe_file(p) for p in sorted(tmp.glob(f"__{self.context.rank}_*"))]
        self.last_bytes_written = sum(entry.size for entry in written)
        return written

    def _write_node_local(self, staged: StagedCheckpoint) -> Path:
        """Write, prepare on every node, agree, publish on every node (see the class)."""
        step, slots, context = staged.step, staged.slots, self.context
        tmp, final = layout.tmp_dir(self.root, step), self.root / layout.step_dirname(step)

        def prepare_dir() -> None:
            layout.make_root(self.root)  # a link in its place: every rank raises, none waits on a leader
            layout.remove_stale_tmp(self.root)  # leftovers of failed persists: never checkpoints
            tmp.mkdir()

        self._on_leaders(prepare_dir, f"checkpoint at step {step} could not be started")
        shared_skeleton, rank_skeleton = split_skeleton(staged.skeleton)
        shared = _with_global_shapes(_part(shared_skeleton, slots, "shared"), staged.shards)
        mine = _part(rank_skeleton, slots, f"rank{context.rank}")
        copies = _node_copies(staged.shards, shared, context.nodes or ())
        node_keys = [t.key for t in shared.tensors if t.index in copies]  # replicated: a copy per node
        self._agree_on_layout(step, shared)  # also: nobody writes before its leader made tmp
        tensors = as_dtensors(staged_tensors(staged.payload, slots), staged.shards)
        written = self._save(tmp, tensors, shared, mine, frozenset(node_keys))
        coordinator = context.is_coordinator
        ours = (written, mine.model_dump(), (tmp / _DCP_METADATA).read_bytes() if coordinator else None, secrets.token_hex(16))
        votes = distributed.gather_objects(ours, context.persist_group)
        record = DcpManifest(
            **records.record_header(step, epoch=staged.epoch, state_keys=staged.state_keys, files=[]),
            format=DCP_FORMAT,
            world_size=context.world_size,
            bytes_per_rank=[sum(entry.size for entry in files) for files, *_ in votes],
            shared=shared,
            ranks=[DcpPart.model_validate(part) for _, part, *_ in votes],
            nodes=[list(ranks) for ranks in context.nodes or ()],
            node=context.node,
            commit_id=votes[0][3],
            node_keys=node_keys,
        )
        files = [entry for written_by_rank, *_ in votes for entry in written_by_rank]
        prepared = self._agree(self._on_leader(lambda: self._prepare(tmp, record, files, votes[0][2])))
        if prepared is not None:  # a node's part is not durable: no node publishes, each removes its own
            if context.is_node_leader:
                shutil.rmtree(tmp, ignore_errors=True)
            raise PersistError(f"checkpoint at step {step} was not committed: {prepared}")
        problem = self._on_leader(lambda: self._publish_node(tmp, final))
        agreed = self._agree(problem)
        if agreed is not None:
            raise PersistError(f"checkpoint at step {step} was not published on every node (never restored): {agreed}")
        return final

    def _prepare(self, tmp: Path, record: DcpManifest, files: list[FileEntry], metadata: bytes) -> None:
        """This node's part made durable in ``tmp`` (``.metadata`` and the record), not yet visible."""
        if not self.context.is_coordinator:
            commit.write_durably(tmp / _DCP_METADATA, metadata)
        files = [*files, fileio.describe_file(tmp / _DCP_METADATA)]
        commit.prepare(self.root, tmp, record.model_copy(update={"files": files}))
        faults.fault("node_prepared")

    def _publish_node(self, tmp: Path, final: Path) -> None:
        faults.fault("before_node_publish")
        commit.rename_into_place(self.root, tmp, final)
        faults.fault("after_node_publish")

    def _on_leader(self, action: Callable[[], Any]) -> str | None:
        """Run ``action`` on this node's leader; None, or what went wrong (naming the node)."""
        if not self.context.is_node_leader:
            return None
        try:
            action()
        except Exception as exc:
            return f"node {self.context.node}: {type(exc).__name__}: {exc}"
        return None

    def _agree(self, problem: str | None) -> str | None:
        """Every rank's problem joined, None when none has one (collective on the persist group)."""
        problems = distributed.gather_objects(problem, self.context.persist_group)
        return "; ".join(dict.fromkeys(p for p in problems if p)) or None

    def _on_leaders(self, action: Callable[[], Any], failure: str) -> Any:
        """``action`` run by each node's leader in its directory; rank 0's outcome on every rank,
        and every rank raises when any leader failed (collective on the persist group)."""
        outcome: tuple[str, Any] = ("ok", None)
        if self.context.is_node_leader:
            try:
                outcome = ("ok", action())
            except Exception as exc:
                outcome = ("error", f"node {self.context.node}: {type(exc).__name__}: {exc}")
        outcomes = distributed.gather_objects(outcome, self.context.persist_group)
        errors = [message for kind, message in outcomes if kind != "ok"]
        if errors:
            raise PersistError(f"{failure}: {'; '.join(errors)}")
        return outcomes[0][1]

    def _coordinated(self, action: Callable[[], Any], failure: str) -> Any:
        """Run ``action`` on rank 0 and broadcast its outcome; every rank raises when it failed."""
        outcome: tuple[str, Any] = ("error", "rank 0 did not report")
        error: BaseException | None = None
        if self.context.is_coordinator:
            try:
                outcome = ("ok", action())
            except BaseException as exc:  # tell the others before raising
                error = exc
                outcome = ("error", f"{type(exc).__name__}: {exc}")
        outcome = distributed.broadcast_object(outcome, self.context.persist_group)
        if error is not None:
            raise error
        if outcome[0] != "ok":
            raise PersistError(f"{failure}: {outcome[1]}")
        return outcome[1]

    def _commit(
        self,
        tmp: Path,
        step: int,
        epoch: int | None,
        state_keys: list[str],
        shared: DcpPart,
        votes: list[tuple[list[FileEntry], dict[str, Any]]],
    ) -> None:
        files = [entry for written, _ in votes for entry in written]
        unseen = _unseen_files(tmp, [(rank, entry) for rank, (written, _) in enumerate(votes) for entry in written])
        if unseen:
            raise PersistError(
                f"rank 0 cannot see {unseen} in {tmp}, so it never commits it "
                "(the files other ranks wrote): the ranks do not share one run directory, but run_dir_layout "
                "resolved to 'shared'. Give each node its own directory with Session(run_dir_layout='node-local') "
                "(or 'auto'), or point every rank at one shared file system"
            )
        files.append(fileio.describe_file(tmp / _DCP_METADATA))
        manifest = DcpManifest(
            **records.record_header(step, epoch=epoch, state_keys=state_keys, files=files),
            format=DCP_FORMAT,
            world_size=self.context.world_size,
            bytes_per_rank=[sum(entry.size for entry in written) for written, _ in votes],
            shared=shared,
            ranks=[DcpPart.model_validate(part) for _, part in votes],
        )
        commit.publish(self.root, tmp, self.root / layout.step_dirname(step), manifest)


def _unseen_files(tmp: Path, written: list[tuple[int, FileEntry]]) -> str:
    """The files other ranks reported writing into ``tmp`` that this process does not see at
    their size (``"rank 1's __1_0.distcp, ..."``), after listing ``tmp`` again for at most
    ``_COMMIT_VISIBLE_SECONDS`` (a shared file system's cache may show a new name late);
    empty when every one is there. A commit never lists a file its writer cannot see."""
    deadline = time.monotonic() + _COMMIT_VISIBLE_SECONDS
    while True:
        missing = [(rank, entry.name) for rank, entry in written if not _has_size(tmp / entry.name, entry.size)]
        if not missing or time.monotonic() >= deadline:
            shown = ", ".join(f"rank {rank}'s {name}" for rank, name in missing[:8])
            return shown + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        os.listdir(tmp)  # a fresh listing revalidates a network file system's cached directory
        time.sleep(0.2)


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


# --- reading -----------------------------------------------------------------------------------


class DcpReader:
    """Reads DCP checkpoints, collectively under a context, or in one process without one."""

    record_type = DcpManifest

    def read_record(self, path: Path) -> DcpManifest:
        return read_dcp_manifest(path)

    def verify(self, path: Path) -> DcpManifest:
        return verify_dcp_checkpoint(path)

    def load(
        self,
        path: Path,
        record: CommitRecord,
        context: DistributedContext | None,
        targets: Mapping[str, Any] | None = None,
        keys: frozenset[str] | None = None,
    ) -> LoadedCheckpoint:
        """Check ``.metadata`` (its checksum, its tensors, its items' bounds), agree with the others,
        then load (collective): each data file DCP reads is checksummed on the bytes it loads
        (``coci.checkpoint.dcp_reads``), so the state never holds a byte that was not verified and no
        file is read twice. ``keys``: only these state keys are read (``load_dcp_checkpoint``)."""
        assert isinstance(record, DcpManifest)
        problem = distributed.agree(_metadata_problem(path, record), context)  # the data files: checksummed as DCP reads them
        if problem is not None:
            raise CorruptCheckpointError(problem)
        tree, nbytes = load_dcp_checkpoint(path, record, context, targets, keys)
        return LoadedCheckpoint(record.step, record.epoch, record.state_keys, path, tree, nbytes)

    def load_entry(self, path: Path, record: CommitRecord, keys: tuple[str, ...]) -> Any | None:
        """Loads the whole checkpoint in this process (DCP plans reads per tensor key, not per
        subtree; a selective plan would read less) and returns the entry."""
        loaded = self.load(path, record, None)
        return records.subtree(loaded.tree, keys)


def _first_line(exc: BaseException) -> str:
    return next(iter(str(exc).splitlines()), type(exc).__name__)


def _by_index(part: DcpPart, loaded: dict[str, torch.Tensor], manifest: DcpManifest, chosen: list[DcpTensor] | None = None) -> list[Any]:
    """The loaded tensors of ``part`` (or of its ``chosen`` ones) at their skeleton index."""
    tensors: list[Any] = [None] * (max((t.index for t in part.tensors), default=-1) + 1)
    for t in part.tensors if chosen is None else chosen:
        tensors[t.index] = loaded[manifest.key_of(t)]
    return tensors


def _tensor_only_planner() -> Any:
    """DCP's default load planner, except that a bytes item (which it would ``torch.load`` with
    ``weights_only=False``) is refused: a second guard behind ``read_dcp_metadata``."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorOnlyLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            raise CorruptCheckpointError(f"DCP checkpoint holds a bytes item {read_item.dest_index.fqn!r}: never loaded")

    return TensorOnlyLoadPlanner()


def _safe_reader(path: Path, manifest: DcpManifest, checked: Any = None, verify_reads: bool = True, reads: dcp_reads.OnePassReads | None = None) -> Any:
    """DCP's FileSystemReader, reading ``.metadata`` through ``read_dcp_metadata``: nothing a
    checkpoint holds may run code when loaded (DCP itself would call ``pickle.load`` on it; it
    loads the tensors with ``weights_only=True``) or make DCP read outside the checkpoint.
    ``checked``: the metadata ``read_dcp_metadata`` returned already (a reader of several batches reads it once).
    ``verify_reads``: the data files are read once and checksummed on the bytes loaded
    (``coci.checkpoint.dcp_reads``); False: DCP's own reads (the caller verified the files itself).
    ``reads``: the files stay open across loads, read on where the last load stopped (its ``finish`` checks them)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.futures import Future

    files = {entry.name: entry for entry in manifest.files if entry.name != _DCP_METADATA}

    class SafeMetadataReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = checked if checked is not None else read_dcp_metadata(Path(self.path), manifest)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            self.chunk_bytes = dcp_reads.chunk_bytes_of(metadata)
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            if reads is not None:
                reads.read(self.storage_data, self.chunk_bytes, plan, planner)
            elif not verify_reads:
                return super().read_data(plan, planner)
            else:
                dcp_reads.read_verified_items(Path(self.path), files, self.storage_data, self.chunk_bytes, plan, planner)
            done: Future[None] = Future()
            done.set_result(None)
            return done

    return SafeMetadataReader(path)


def load_dcp_checkpoint(
    path: Path,
    manifest: DcpManifest,
    context: DistributedContext | None,
    targets: Mapping[str, Any] | None = None,
    keys: frozenset[str] | None = None,
) -> tuple[dict[str, Any], int]:
    """Load a (verified) DCP checkpoint into a session tree; collective when ``context`` is given.

    Tensors at the place of a DTensor in ``targets`` are loaded as fresh DTensors like it (this
    rank's shard, resharded by DCP from however the checkpoint was sharded); all others in full.
    ``keys``: only these state keys are read (the tree holds them alone, without the session's own
    entries); None: the whole checkpoint. Returns the tree and the bytes this process loaded.
    """
    rank = context.rank if context is not None else 0
    if context is None and manifest.node is not None and manifest.nodes is not None:
        rank = manifest.nodes[manifest.node][0]  # one process reading a node's part: its first rank's
    own = manifest.ranks[rank] if rank < len(manifest.ranks) else None
    donor = own if own is not None else manifest.ranks[0]
    sharded = _sharded_targets(path, manifest.shared, targets)  # never a full tensor for those
    chosen = manifest.shared.tensors if keys is None else entry_tensors(manifest.shared, keys)
    wanted = {
        manifest.key_of(t): sharded[t.key] if t.key in sharded else torch.empty(t.shape, dtype=torch_dtype(t.dtype, path))
        for t in chosen + (donor.tensors if keys is None else [])
    }
    read_dcp_tensors(path, manifest, wanted, context)
    nbytes = sum(local_nbytes(t) for t in wanted.values())
    if keys is not None:
        skeleton = {key: manifest.shared.skeleton[key] for key in keys}
        return unflatten(skeleton, _by_index(manifest.shared, wanted, manifest, chosen)), nbytes
    tree = unflatten(manifest.shared.skeleton, _by_index(manifest.shared, wanted, manifest))
    per_rank = unflatten(donor.skeleton, _by_index(donor, wanted, manifest))
    tree[layout.SESSION_KEY]["profiler"] = per_rank["profiler"]
    if per_rank.get("level_steps") is not None:  # what this rank sent each level (only the ranks that copy send)
        tree[layout.SESSION_KEY]["level_steps"] = per_rank["level_steps"]
    if own is not None:
        tree[layout.RNG_KEY] = per_rank["rng"]
    else:
        logger.info("rank %d is new (checkpoint saved by %d ranks): it keeps its own RNG streams", rank, manifest.world_size)
    return tree, nbytes


def entry_tensors(part: DcpPart, keys: frozenset[str]) -> list[DcpTensor]:
    """The tensors of ``part`` under the state keys ``keys`` of its skeleton (a key it lacks: none)."""
    skeleton = part.skeleton if isinstance(part.skeleton, dict) else {}
    indices = {int(ref) for key in keys if key in skeleton for ref in tensor_refs(skeleton[key])}
    return [t for t in part.tensors if t.index in indices]


def read_dcp_tensors(
    path: Path,
    manifest: DcpManifest,
    wanted: dict[str, torch.Tensor],
    context: DistributedContext | None,
    metadata: Any = None,
    verify_reads: bool = True,
    reads: dcp_reads.OnePassReads | None = None,
) -> None:
    """Fill ``wanted`` (DCP key -> a fresh tensor or DTensor of the saved shape) from the DCP
    checkpoint in ``path``: DCP reads only the chunks those keys need. Collective under ``context``.
    ``metadata``: what ``read_dcp_metadata`` returned for ``path`` (else read again here).
    ``verify_reads``: each data file read is checksummed on the bytes loaded (its whole file is
    read); False only for files the caller verified itself. ``reads``: served by this reader of
    several loads instead (``dcp_reads.OnePassReads``: its ``finish`` verifies). On CorruptCheckpointError ``wanted``
    holds unverified bytes: the caller drops it. Fault point ``dcp_before_read`` (before DCP opens a file)."""
    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint import load as dcp_load

    faults.fault("dcp_before_read")
    with warnings.catch_warnings():  # DCP warns on every load without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp_load(
                wanted,
                storage_reader=_safe_reader(path, manifest, metadata, verify_reads, reads),
                planner=_tensor_only_planner(),
                process_group=None if context is None else context.control_group,
                no_dist=context is None,
            )
        except CheckpointException as exc:  # a BaseException: every failure of DCP's load ends here
            refused = _refusal(exc)
            if refused is not None:  # a rank's checks refused a file: say which and why
                raise CorruptCheckpointError(str(refused)) from exc
            raise CorruptCheckpointError(f"{path}: DCP could not load the checkpoint ({_first_line(exc)})") from exc


def _refusal(exc: Any) -> CorruptCheckpointError | None:
    """The first CorruptCheckpointError a rank raised inside DCP's load (``exc.failures``), if any."""
    failures = getattr(exc, "failures", None)
    for _, wrapped in sorted(failures.items()) if isinstance(failures, dict) else ():
        error = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
        if isinstance(error, CorruptCheckpointError):
            return error
    return None


def _sharded_targets(path: Path, part: DcpPart, targets: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """A fresh DTensor (this rank's shard only) for each tensor of ``part`` that the live state
    holds sharded, by DCP key; a tensor whose global shape or dtype differs from the live one's is
    an error naming it (the checkpoint does not fit this model)."""
    if not targets:
        return {}
    by_index = targets_by_index(part.skeleton, targets)
    fresh: dict[str, torch.Tensor] = {}
    for t in part.tensors:
        like = by_index.get(t.index)
        if like is None:
            continue
        if list(like.shape) != t.shape or dtype_name(like.dtype) != t.dtype:
            raise StateError(
                f"{path}: sharded tensor {t.key} is {t.dtype}{t.shape} in the checkpoint but "
                f"{dtype_name(like.dtype)}{list(like.shape)} in the live state"
            )
        fresh[t.key] = torch.empty_like(like)
    return fresh
