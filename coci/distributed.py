"""Data-parallel coci: the same Session under ``torchrun`` + DDP, with a balanced DCP persist.

Where it sits: across the flow profiler -> plan -> snapshot -> **persist** -> report, for jobs of
several processes. The Session builds a :class:`DistributedContext` when ``torch.distributed`` is
initialised (any world size, so that a job keeps one checkpoint format when it shrinks to one
process and grows back) and consults it at four points; everything else (profiling, the staging
arena, the optimizer fence, the futures) is the single-process code, unchanged.

* **Groups.** coci creates two gloo groups of its own with a timeout
  (``knobs.DIST_TIMEOUT_SECONDS``): ``control`` for the training thread (profile aggregation, plan
  broadcast, restore) and ``persist`` for the background writer (DCP save, the commit vote). Never
  the training group: a background save sharing it with a barrier in the training loop deadlocks
  (ANCHORS trap 10), and two threads sharing one group would interleave their collectives.
* **Profile and plan** (at observe time only, never per step): every rank's profile is gathered and
  the slowest rank's estimates (step time, stall, persist, interference, restore) are kept, with
  rank 0's loss trace. A policy with ``state_dict``/``load_state_dict`` (every planning policy)
  observes on rank 0 only and its state, plan included, is broadcast; a stateless policy
  (``EveryN``, ``AtSteps``) decides the same on every rank from the same aggregated observation.
  Observations happen at the step cadence only: a persist finishing re-plans at once in a single
  process, but it finishes at different steps on different ranks, so here it waits for the cadence.
* **Persist** (:class:`DcpPersist`, the checkpointer's backend): the staged arena is handed to
  ``torch.distributed.checkpoint.save`` with a ``FileSystemWriter`` on ``step_<n>.tmp`` as
  zero-copy tensors (each over its own slice of the arena, so DCP neither clones nor writes the
  whole arena per tensor). The user's state is replicated under DDP and is saved under the same
  keys on every rank, so DCP's planner writes each tensor once and balances the writes across ranks
  (about 1/N of the bytes each: ``benchmarks/dp_persist.py``). coci's per-rank state (RNG streams,
  the rank's profiler) is saved under per-rank keys. Before writing, the ranks agree on the step and
  on the replicated layout (a mismatch fails the checkpoint instead of mixing two steps); after
  DCP's save (files fsynced, ``.metadata`` written) every rank checksums the files it wrote and
  votes; only when every vote arrived does rank 0 write ``manifest.json`` (``"format": "dcp"``,
  sizes and crc32 of every file) and commit with the single-process protocol (fsync, rename, fsync
  the parent), then apply retention and broadcast the outcome. A rank that dies or hangs makes the
  others' collectives fail (at the latest after the timeout): nothing is committed.
* **Restore**: rank 0 lists the committed checkpoints and reads each candidate's manifest, which
  it broadcasts: every rank uses the one commit record (ANCHORS trap 9). The ranks verify the
  files' checksums, each a 1/N share, agree on the verdict, and load through
  ``torch.distributed.checkpoint.load`` (tensors only, ``weights_only=True``: invariant 4). A new
  world size loads the same checkpoint: replicated tensors are read by every rank; a rank that did
  not exist when it was saved keeps its own RNG streams and starts from rank 0's profiler
  estimates; the loader re-partitions the rest of the epoch (``coci.loader``). A checkpoint in
  coci's single-process format is read by every rank (its RNG goes to rank 0 only), and a DCP
  checkpoint can be restored by a job without a process group.

The user's state is treated as DCP treats plain tensors: replicated. Its non-tensor values are
restored from rank 0's copy on every rank (under DDP the model, optimizer, scheduler and loader
state are the same on every rank; the loader's ``rank`` field is informational).
"""

from __future__ import annotations

import json
import logging
import pickle
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field

from coci import __version__, knobs
from coci.checkpoint import storage
from coci.checkpoint.tree import unflatten
from coci.errors import CorruptCheckpointError, PersistError

logger = logging.getLogger(__name__)

__all__ = [
    "DcpManifest",
    "DcpPersist",
    "DistributedContext",
    "LoadedCheckpoint",
    "aggregate_profile",
    "checkpoint_format",
    "load_dcp_checkpoint",
    "load_verified",
    "observe_policy",
    "restore_checkpoint",
    "verify_dcp_checkpoint",
]

#: Keys of the session's own entries in a state tree (the same as ``coci.session`` uses).
SESSION_KEY = "__coci__"
RNG_KEY = "__coci_rng__"
DCP_FORMAT = "dcp"
_DCP_METADATA = ".metadata"
#: Estimates of the aggregated profile taken from the slowest rank (largest value).
_SLOWEST_ESTIMATES = (
    "step_seconds",
    "overlapped_step_seconds",
    "stall_step_seconds",
    "stall_seconds",
    "persist_seconds",
    "interference",
    "restore_seconds",
)


# --- context and collectives -------------------------------------------------------------------


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the job and coci's own gloo groups (never the training group)."""

    rank: int
    world_size: int
    control_group: Any
    persist_group: Any
    timeout_seconds: float

    @classmethod
    def detect(cls, timeout_seconds: float | None = None) -> DistributedContext | None:
        """A context when ``torch.distributed`` is initialised, else None (single process).

        Collective: every rank must call it, in the same order (it creates two groups).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return None
        seconds = knobs.DIST_TIMEOUT_SECONDS if timeout_seconds is None else float(timeout_seconds)
        timeout = timedelta(seconds=seconds)
        control = dist.new_group(backend="gloo", timeout=timeout)
        persist = dist.new_group(backend="gloo", timeout=timeout)
        return cls(dist.get_rank(), dist.get_world_size(), control, persist, seconds)

    @property
    def is_coordinator(self) -> bool:
        """Rank 0 plans, commits, applies retention and picks the checkpoint to restore."""
        return self.rank == 0


def _all_gather(value: Any, group: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _broadcast(value: Any, group: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


# --- profile and plan (observe time) ----------------------------------------------------------


def aggregate_profile(profile: Any, context: DistributedContext) -> Any:
    """The job's profile: the slowest rank's cost estimates, rank 0's trace and counters (collective)."""
    dumps = _all_gather(profile.model_dump(mode="json"), context.control_group)
    merged = dict(dumps[0])
    for name in _SLOWEST_ESTIMATES:
        candidates = [d[name] for d in dumps if isinstance(d.get(name), dict) and d[name].get("value") is not None]
        if candidates:
            merged[name] = max(candidates, key=lambda estimate: estimate["value"])
    return type(profile).model_validate(merged)


def observe_policy(policy: Any, observation: Any, context: DistributedContext) -> None:
    """Let the policy (re-)plan on the aggregated profile so every rank decides the same steps.

    Collective. Stateful policies plan on rank 0 and their state is broadcast; stateless ones
    observe everywhere (the same input gives the same decisions).
    """
    observation = replace(observation, profile=aggregate_profile(observation.profile, context))
    save = getattr(policy, "state_dict", None)
    load = getattr(policy, "load_state_dict", None)
    if not (callable(save) and callable(load)):
        policy.observe(observation)
        return
    state = None
    if context.is_coordinator:
        policy.observe(observation)
        state = save()
    state = _broadcast(state, context.control_group)
    if not context.is_coordinator:
        load(state)


# --- manifest ----------------------------------------------------------------------------------


class DcpTensor(BaseModel):
    """One tensor of the state tree, saved through DCP under ``key``."""

    model_config = ConfigDict(frozen=True)
    index: int = Field(ge=0)  # its placeholder in the skeleton
    key: str
    dtype: str
    shape: list[int]


class DcpPart(BaseModel):
    """A sub-tree (JSON skeleton) and the DCP keys of its tensors."""

    skeleton: Any
    tensors: list[DcpTensor]


class DcpManifest(storage.CommitRecord):
    """coci's commit record of a DCP checkpoint: written last, by rank 0, once every rank voted."""

    format: Literal["dcp"]
    world_size: int = Field(ge=1)
    bytes_per_rank: list[int]
    shared: DcpPart
    ranks: list[DcpPart]


def checkpoint_format(path: Path) -> str:
    """``"dcp"`` or ``"coci"`` (the single-process format) from a checkpoint's manifest."""
    try:
        raw = json.loads((path / storage.MANIFEST_FILENAME).read_bytes())
    except (OSError, ValueError):
        return "coci"  # unreadable: the single-process reader reports it as corrupt
    return DCP_FORMAT if isinstance(raw, dict) and raw.get("format") == DCP_FORMAT else "coci"


def read_dcp_manifest(path: Path) -> DcpManifest:
    """Parse and sanity-check a DCP checkpoint's manifest; CorruptCheckpointError on anything off."""
    manifest = storage.parse_record(path, DcpManifest)
    names = [entry.name for entry in manifest.files]
    if _DCP_METADATA not in names or len(manifest.ranks) != manifest.world_size:
        raise CorruptCheckpointError(f"{path}: manifest lacks DCP's {_DCP_METADATA} or a rank's record")
    for name in names:
        if name in {".", ".."} or "/" in name or not (name == _DCP_METADATA or storage._SAFE_NAME.match(name)):
            raise CorruptCheckpointError(f"{path}: manifest names a file outside its checkpoint: {name!r}")
    storage.check_sealed(manifest, path)
    return manifest


def _verify_files(path: Path, files: list[storage.FileEntry]) -> str | None:
    """None when every file has its recorded size and crc32, else what is wrong."""
    try:
        for entry in files:
            storage._read_verified(path / entry.name, entry, keep=False)
    except CorruptCheckpointError as exc:
        return str(exc)
    return None


def verify_dcp_checkpoint(path: Path) -> DcpManifest:
    """Check a DCP checkpoint's manifest and every file's size and checksum (one process)."""
    manifest = read_dcp_manifest(path)
    problem = _verify_files(path, manifest.files)
    if problem:
        raise CorruptCheckpointError(problem)
    return manifest


# --- persist (background worker) --------------------------------------------------------------


def _tensor_indices(skeleton: Any, found: list[int]) -> list[int]:
    """Tensor placeholders of a skeleton, in walk order (the order ``flatten`` appended them)."""
    if isinstance(skeleton, list):
        for value in skeleton:
            _tensor_indices(value, found)
    elif isinstance(skeleton, dict):
        for tag in ("__tensor__", "__ndarray__"):
            if tag in skeleton:
                found.append(int(skeleton[tag]))
                return found
        for value in skeleton.values():
            _tensor_indices(value, found)
    return found


def split_skeleton(skeleton: dict[str, Any]) -> tuple[Any, Any]:
    """(replicated part, this rank's part) of a session tree's skeleton.

    The rank's part is coci's per-process state: the RNG streams and the rank's profiler.
    """
    shared = dict(skeleton)
    own = dict(shared.get(SESSION_KEY) or {})
    rank_part = {"rng": shared.pop(RNG_KEY, None), "profiler": own.pop("profiler", None)}
    shared[SESSION_KEY] = own
    return shared, rank_part


def _part(skeleton: Any, slots: list[Any], prefix: str) -> DcpPart:
    indices = _tensor_indices(skeleton, [])
    return DcpPart(
        skeleton=skeleton,
        tensors=[
            DcpTensor(index=i, key=f"{prefix}/{n}", dtype=storage._dtype_name(slots[i].dtype), shape=list(slots[i].shape))
            for n, i in enumerate(indices)
        ],
    )


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


def _file_entry(path: Path) -> storage.FileEntry:
    crc = 0
    size = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(knobs.READ_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return storage.FileEntry(name=path.name, size=size, crc32=crc)


class DcpPersist:
    """The checkpointer's persist backend under ``torch.distributed`` (runs on every rank's worker).

    ``persist`` is collective on the context's persist group; see the module docstring for the
    protocol. Fault points (``storage.set_fault_hook``): ``dcp_before_save`` and
    ``dcp_after_save`` on every rank, then ``before_manifest``, ``before_rename``,
    ``after_rename``, ``after_commit`` on rank 0.
    """

    def __init__(self, root: Path, context: DistributedContext, keep_last: int | None) -> None:
        self.root = root
        self.context = context
        self.keep_last = keep_last
        self.last_bytes_written = 0  # this rank's bytes in the last checkpoint (benchmarks read it)
        import torch.distributed.checkpoint  # noqa: F401  now, not inside the first persist's timing

    def persist(
        self,
        step: int,
        payload: memoryview,
        slots: list[Any],
        skeleton: Any,
        *,
        epoch: int | None,
        state_keys: list[str],
    ) -> tuple[Path, list[int]]:
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint import save as dcp_save

        context, group = self.context, self.context.persist_group
        tmp = self.root / (storage.step_dirname(step) + knobs.TMP_SUFFIX)
        if context.is_coordinator:
            self.root.mkdir(parents=True, exist_ok=True)
            storage.remove_stale_tmp(self.root)  # leftovers of failed persists: never checkpoints
            tmp.mkdir()
        shared_skeleton, rank_skeleton = split_skeleton(skeleton)
        shared = _part(shared_skeleton, slots, "shared")
        mine = _part(rank_skeleton, slots, f"rank{context.rank}")
        layout = [(t.key, t.dtype, t.shape) for t in shared.tensors]
        agreed = _all_gather((step, layout), group)  # also: nobody writes before rank 0 made tmp
        if any(other != (step, layout) for other in agreed):
            steps = [other[0] for other in agreed]
            raise PersistError(
                f"ranks disagree on the checkpoint (steps {steps}"
                + ("" if len(set(steps)) > 1 else ", or on the replicated state's tensors")
                + "): every rank must checkpoint the same state at the same step"
            )
        storage._fault("dcp_before_save")
        tensors = staged_tensors(payload, slots)
        state_dict = {t.key: tensors[t.index] for t in shared.tensors + mine.tensors}
        dcp_save(state_dict, storage_writer=FileSystemWriter(tmp, sync_files=True), process_group=group)
        storage._fault("dcp_after_save")
        written = [_file_entry(p) for p in sorted(tmp.glob(f"__{context.rank}_*"))]
        self.last_bytes_written = sum(entry.size for entry in written)
        votes = _all_gather((written, mine.model_dump()), group)  # every rank's files are durable
        outcome: tuple[str, Any] = ("error", "rank 0 did not commit")
        error: BaseException | None = None
        if context.is_coordinator:
            try:
                removed = self._commit(tmp, step, epoch, state_keys, shared, votes)
                outcome = ("ok", removed)
            except BaseException as exc:  # tell the others before raising
                error = exc
                outcome = ("error", f"{type(exc).__name__}: {exc}")
        outcome = _broadcast(outcome, group)
        if error is not None:
            raise error
        if outcome[0] != "ok":
            raise PersistError(f"checkpoint at step {step} was not committed: {outcome[1]}")
        return self.root / storage.step_dirname(step), list(outcome[1])

    def _commit(
        self,
        tmp: Path,
        step: int,
        epoch: int | None,
        state_keys: list[str],
        shared: DcpPart,
        votes: list[tuple[list[storage.FileEntry], dict[str, Any]]],
    ) -> list[int]:
        files = [entry for written, _ in votes for entry in written]
        files.append(_file_entry(tmp / _DCP_METADATA))
        manifest = DcpManifest(
            format=DCP_FORMAT,
            format_version=knobs.FORMAT_VERSION,
            coci_version=__version__,
            step=step,
            epoch=epoch,
            wall_time=time.time(),
            state_keys=state_keys,
            world_size=self.context.world_size,
            files=files,
            bytes_per_rank=[sum(entry.size for entry in written) for written, _ in votes],
            shared=shared,
            ranks=[DcpPart.model_validate(part) for _, part in votes],
        )
        final = self.root / storage.step_dirname(step)
        storage.publish(self.root, tmp, final, manifest)
        return storage.apply_retention(self.root, self.keep_last)


# --- restore -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint every rank agreed on, loaded into a session state tree."""

    step: int
    epoch: int | None
    state_keys: list[str]
    path: Path
    tree: dict[str, Any]
    nbytes: int
    skipped: tuple[Path, ...]


def _dtype(name: str, path: Path) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpointError(f"{path}: unknown dtype {name!r}")
    return dtype


def _by_index(part: DcpPart, loaded: dict[str, torch.Tensor]) -> list[Any]:
    tensors: list[Any] = [None] * (max((t.index for t in part.tensors), default=-1) + 1)
    for t in part.tensors:
        tensors[t.index] = loaded[t.key]
    return tensors


#: The only globals DCP's pickled ``.metadata`` may name (classes of plain records, dtypes, sizes).
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` without running code: named records and dtypes only."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CorruptCheckpointError(f"DCP metadata names a forbidden global {module}.{name}")


def _safe_reader(path: Path) -> Any:
    """DCP's FileSystemReader, reading ``.metadata`` through a restricted unpickler (invariant 4:
    DCP itself calls ``pickle.load`` on it; tensors it already loads with ``weights_only=True``)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeMetadataReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(Path(self.path) / _DCP_METADATA, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeMetadataReader(path)


def load_dcp_checkpoint(
    path: Path, manifest: DcpManifest, context: DistributedContext | None
) -> tuple[dict[str, Any], int]:
    """Load a (verified) DCP checkpoint into a session tree; collective when ``context`` is given.

    Returns the tree and the bytes this process loaded.
    """
    from torch.distributed.checkpoint import load as dcp_load

    rank = context.rank if context is not None else 0
    own = manifest.ranks[rank] if rank < len(manifest.ranks) else None
    donor = own if own is not None else manifest.ranks[0]
    wanted = {
        t.key: torch.empty(t.shape, dtype=_dtype(t.dtype, path)) for t in manifest.shared.tensors + donor.tensors
    }
    with warnings.catch_warnings():  # DCP warns on every load without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(
            wanted,
            storage_reader=_safe_reader(path),
            process_group=None if context is None else context.control_group,
            no_dist=context is None,
        )
    tree = unflatten(manifest.shared.skeleton, _by_index(manifest.shared, wanted))
    per_rank = unflatten(donor.skeleton, _by_index(donor, wanted))
    tree[SESSION_KEY]["profiler"] = per_rank["profiler"]
    if own is not None:
        tree[RNG_KEY] = per_rank["rng"]
    else:
        logger.info("rank %d is new (checkpoint saved by %d ranks): it keeps its own RNG streams", rank, manifest.world_size)
    nbytes = sum(t.numel() * t.element_size() for t in wanted.values())
    return tree, nbytes


def restore_checkpoint(
    root: Path, context: DistributedContext, on_skip: Callable[[int, Path, str], None]
) -> LoadedCheckpoint | None:
    """Every rank loads the newest committed checkpoint that verifies (collective; control group).

    Rank 0 removes stale temporaries, lists the candidates and reads each manifest once; the ranks
    verify the files (a 1/N share each) and skip a candidate together when any share fails.
    """
    group = context.control_group
    candidates: list[tuple[int, str]] = []
    if context.is_coordinator:
        storage.remove_stale_tmp(root)
        candidates = [(step, str(path)) for step, path in reversed(storage.committed_steps(root))]
    candidates = _broadcast(candidates, group)
    skipped: list[Path] = []
    for step, raw_path in candidates:
        path = Path(raw_path)
        record: tuple[str, str | None, str | None] = ("coci", None, None)
        if context.is_coordinator:
            try:
                if checkpoint_format(path) == DCP_FORMAT:
                    record = (DCP_FORMAT, read_dcp_manifest(path).model_dump_json(), None)
            except CorruptCheckpointError as exc:
                record = (DCP_FORMAT, None, str(exc))
        kind, manifest_json, problem = _broadcast(record, group)
        if kind == DCP_FORMAT and problem is None:
            manifest = DcpManifest.model_validate_json(manifest_json)  # the one record rank 0 read
            problems = _all_gather(_verify_files(path, manifest.files[context.rank :: context.world_size]), group)
            problem = "; ".join(p for p in problems if p) or None
            if problem is None:
                tree, nbytes = load_dcp_checkpoint(path, manifest, context)
                return LoadedCheckpoint(
                    manifest.step, manifest.epoch, manifest.state_keys, path, tree, nbytes, tuple(skipped)
                )
        elif kind != DCP_FORMAT:  # coci's single-process format: every rank reads the one data file
            loaded = None
            try:
                loaded = storage.load_checkpoint(path)
            except CorruptCheckpointError as exc:
                problem = str(exc)
            problems = _all_gather(problem, group)
            problem = "; ".join(p for p in problems if p) or None
            if problem is None and loaded is not None:
                single, tensors = loaded
                tree = unflatten(single.skeleton, tensors)
                if not context.is_coordinator:  # the saved RNG streams are one process's: rank 0's
                    tree.pop(RNG_KEY, None)
                return LoadedCheckpoint(
                    single.step, single.epoch, single.state_keys, path, tree, single.files[0].size, tuple(skipped)
                )
        on_skip(step, path, problem or "unreadable")
        skipped.append(path)
    if candidates:
        raise CorruptCheckpointError(
            f"none of the {len(candidates)} committed checkpoints in {root} verifies: "
            + ", ".join(p.name for p in skipped)
        )
    return None


def load_verified(path: Path) -> LoadedCheckpoint:
    """Restore a DCP checkpoint in a process without a process group (a job shrunk to one)."""
    manifest = verify_dcp_checkpoint(path)
    tree, nbytes = load_dcp_checkpoint(path, manifest, None)
    return LoadedCheckpoint(manifest.step, manifest.epoch, manifest.state_keys, path, tree, nbytes, ())
