"""``coci export``: one state key of a checkpoint as full tensors in a file the ecosystem loads.

Formats: ``safetensors`` (one ``.safetensors`` file: a JSON header and the raw bytes, nothing
pickled), ``torch`` (a ``torch.save`` file of the state dict, provenance beside it in
``OUT.coci.json``), ``hf`` (a folder ``transformers``' ``from_pretrained`` loads: ``config.json``
from the model config the Trainer integration recorded with the run, ``model.safetensors`` with
tied weights written once).

The checkpoint is verified as a restore verifies it (sizes, checksums, record; a corrupt
newest step is passed over and named in the result, as ``coci.load`` does), on the bytes the
export streams: the safetensors header is built from the commit record's tensor table, and the
tensors are read one at a time (coci's format, in offset order) or in batches of at most
``knobs.EXPORT_BUFFER_BYTES`` (DCP's, full tensors assembled from every rank's shards, the
batches in the data files' order), each written and dropped before the next is read. Each data
file is read once, checksummed as it passes; its checksum is checked at its end, before the
output is put in place (a refused file leaves no output). Peak memory is about the largest tensor plus that
buffer; the ``torch`` format alone holds the whole state dict (``torch.save`` takes one dict).
Every output carries its provenance: run, run id, step, commit id, coci version.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch

from coci import knobs, safe_files
from coci._version import __version__
from coci.checkpoint import dcp_reads
from coci.checkpoint.checkpointer import reader_for
from coci.checkpoint.dcp import read_dcp_tensors
from coci.checkpoint.dcp_checks import DCP_METADATA, read_dcp_metadata
from coci.checkpoint.dcp_manifest import DcpManifest, checkpoint_id
from coci.checkpoint.fileio import ChunkChecksum
from coci.checkpoint.local import Manifest, torch_dtype
from coci.checkpoint.read_only import DEFAULT_KEY, candidate_steps
from coci.checkpoint.record_reads import open_no_follow
from coci.checkpoint.records import CommitRecord
from coci.checkpoint.run_source import RunSource, SourceLike, open_source, refuse_newer
from coci.errors import ConfigError, CorruptCheckpointError, StateMismatchError

__all__ = [
    "EXPORT_FORMATS",
    "MODEL_RECORD_FILENAME",
    "ExportResult",
    "ExportedTensor",
    "export",
    "exportable",
    "read_model_record",
    "record_hf_model",
    "write_model_record",
]

logger = logging.getLogger(__name__)

EXPORT_FORMATS: Final = ("safetensors", "torch", "hf")
#: The run file holding the model's config (``config.to_dict()``, JSON) and its tied weights,
#: written by the Trainer integration; what ``--format hf`` builds ``config.json`` from.
MODEL_RECORD_FILENAME: Final = "hf_model.json"
_MODEL_RECORD_MAX_BYTES = 4 << 20
#: The bytes of a coci data file between the exported tensors (other keys' tensors) are read and
#: checksummed through a buffer of this size (at most ``knobs.EXPORT_BUFFER_BYTES``).
_SCRATCH_BYTES = 8 << 20
#: safetensors' dtype names (https://github.com/huggingface/safetensors, the format's spec).
_SAFETENSORS_DTYPES: Final = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}  # fmt: skip


@dataclass(frozen=True)
class ExportedTensor:
    """One tensor of the exported entry: its name (the state dict's key), dtype, shape, bytes, and
    where the checkpoint holds it (an index into its tensor table)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    index: int


@dataclass(frozen=True)
class ExportResult:
    """What ``export`` wrote."""

    path: Path
    step: int
    key: str
    format: str
    tensors: int
    nbytes: int
    seconds: float
    skipped: tuple[str, ...] = ()  # corrupt newer steps passed over


def export(
    source: SourceLike,
    out: str | os.PathLike[str],
    *,
    step: int | None = None,
    key: str = DEFAULT_KEY,
    format: str = "safetensors",
    model_config: Mapping[str, Any] | None = None,
) -> ExportResult:
    """Write state key ``key`` (default: the model) of ``source``'s newest verified checkpoint (or of
    ``step``) to ``out`` as full tensors, in ``format`` (see the module).

    ``source``: as ``coci.load`` takes it. ``model_config``: for ``hf``, the model's
    ``config.to_dict()`` when the run has none recorded (a run of the Trainer integration has).
    ConfigError naming the format, the step or an ``hf`` export without a model config;
    StateMismatchError naming an unknown key; CorruptCheckpointError when no candidate verifies.
    """
    began = time.perf_counter()
    if format not in EXPORT_FORMATS:
        raise ConfigError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {format!r}")
    run = open_source(source)
    candidates = candidate_steps(run, step)
    refuse_newer(run, candidates[0])
    record = _hf_model(run, model_config) if format == "hf" else None
    skipped: list[str] = []
    problems: list[str] = []
    for candidate in candidates:
        try:
            with run.opened(candidate) as path:
                written, count, nbytes = _export_verified(path, Path(out), key, format, record, _provenance(run, path))
            return ExportResult(written, candidate, key, format, count, nbytes, time.perf_counter() - began, tuple(skipped))
        except CorruptCheckpointError as exc:
            logger.warning("coci export: passing over %s step_%d: %s", run.label, candidate, exc)
            skipped.append(f"{run.label}/step_{candidate}")
            problems.append(str(exc))
    raise CorruptCheckpointError(f"{run.label}: none of the {len(candidates)} committed checkpoints verifies: " + " | ".join(problems))


def exportable(path: Path) -> dict[str, int]:
    """The state keys of the checkpoint in ``path`` that hold tensors, with their tensor bytes (what
    ``coci ls`` shows; the record is read, not the data)."""
    record = reader_for(path).read_record(path)
    return {key: sum(t.nbytes for t in _tensors_of(record, key, path)) for key in record.state_keys if _tensors_of(record, key, path)}


def _export_verified(
    path: Path, out: Path, key: str, format: str, model: Mapping[str, Any] | None, provenance: dict[str, str]
) -> tuple[Path, int, int]:
    """Verify ``path`` (CorruptCheckpointError) and write its ``key`` to ``out``: (path written, tensors, bytes)."""
    reader = reader_for(path)
    record = reader.read_record(path)
    if key not in record.state_keys:
        raise StateMismatchError(f"{path}: holds no state key {key!r} (it holds {', '.join(map(repr, record.state_keys))}): choose one with key=")
    tensors = _tensors_of(record, key, path)
    metadata, one_pass = None, True
    if isinstance(record, Manifest):  # verified while streamed: one pass over the data file
        tensors.sort(key=lambda t: record.tensors[t.index].offset)
    elif isinstance(record, DcpManifest) and tensors:
        metadata = read_dcp_metadata(path, record)  # checked once, used by every batch
        ordered = _one_pass_order(record, metadata, tensors)
        one_pass = ordered is not None
        if ordered is None:
            logger.warning("coci export: %s holds a tensor's items on both sides of another's in one file: verifying every file first, then reading", path)
            reader.verify(path)
        else:
            tensors = ordered  # verified while streamed: each data file read once, in its order
    if not tensors:
        raise StateMismatchError(f"{path}: state key {key!r} holds no tensors to export")
    stream = _stream(path, record, tensors, reuse=format != "torch", metadata=metadata, one_pass=one_pass)
    if format == "torch":
        return _write_torch(out, tensors, stream, provenance)
    if format == "safetensors":
        return out, len(tensors), _write_safetensors(out, tensors, stream, provenance)
    assert model is not None
    return _write_hf(out, tensors, stream, provenance, model)


# --- the tensor table --------------------------------------------------------------------------


def _tensors_of(record: CommitRecord, key: str, path: Path) -> list[ExportedTensor]:
    """The tensors under state key ``key``, named by their path in its state dict (``a.b.0``)."""
    if isinstance(record, Manifest):
        table = {i: (t.dtype, tuple(t.shape), t.nbytes) for i, t in enumerate(record.tensors)}
        skeleton = record.skeleton
    elif isinstance(record, DcpManifest):
        table = {t.index: (t.dtype, tuple(t.shape), _nbytes(t.dtype, t.shape, path)) for t in record.shared.tensors}
        skeleton = record.shared.skeleton
    else:
        raise ConfigError(f"{path}: format {type(record).__name__} cannot be exported (coci's and DCP's can)")
    entry = skeleton.get(key) if isinstance(skeleton, dict) else None
    found = []
    for name, index in _named_refs(entry, ""):
        if index not in table:
            raise CorruptCheckpointError(f"{path}: state key {key!r} refers to tensor {index}, not in the record")
        dtype, shape, nbytes = table[index]
        found.append(ExportedTensor(name, dtype, shape, nbytes, index))
    return found


def _nbytes(dtype: str, shape: list[int], path: Path) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * torch_dtype(dtype, path).itemsize


def _named_refs(skeleton: Any, prefix: str) -> Iterator[tuple[str, int]]:
    """(dotted name, tensor index) of every tensor under ``skeleton``, in walk order."""
    def child(name: object) -> str:
        return f"{prefix}.{name}" if prefix else str(name)

    if isinstance(skeleton, list):
        for i, value in enumerate(skeleton):
            yield from _named_refs(value, child(i))
    elif isinstance(skeleton, dict):
        ref = skeleton.get("__tensor__", skeleton.get("__ndarray__"))
        if ref is not None:
            if isinstance(ref, int):
                yield prefix, ref
        elif "__tuple__" in skeleton:
            yield from _named_refs(skeleton["__tuple__"], prefix)
        elif "__dict__" in skeleton:
            for pair in skeleton["__dict__"] if isinstance(skeleton["__dict__"], list) else ():
                if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (str, int, float, bool)):
                    yield from _named_refs(pair[1], child(pair[0]))
        elif "__np__" not in skeleton and "__dtype__" not in skeleton:
            for name, value in skeleton.items():
                yield from _named_refs(value, child(name))


# --- reading, one tensor (or one buffer) at a time --------------------------------------------


def _stream(path: Path, record: CommitRecord, tensors: list[ExportedTensor], reuse: bool, metadata: Any, one_pass: bool) -> Iterator[torch.Tensor]:
    """The full tensors of ``tensors``, in order, each read when the previous was consumed;
    ``reuse``: each may be overwritten by the next (the caller wrote it out first). DCP's:
    ``metadata`` as ``read_dcp_metadata`` returned it, ``one_pass`` as ``_dcp_stream`` takes it."""
    if isinstance(record, Manifest):
        return _local_stream(path, record, tensors, reuse)
    assert isinstance(record, DcpManifest)
    return _dcp_stream(path, record, tensors, metadata, one_pass, reuse)


def _local_stream(path: Path, record: Manifest, tensors: list[ExportedTensor], reuse: bool) -> Iterator[torch.Tensor]:
    """One pass over ``data.bin`` (``tensors`` in offset order): each tensor read into its own
    buffer (with ``reuse``, one buffer of the largest, allocated once), the bytes between them through a small scratch buffer, all of it checksummed; the size
    and checksum are checked once the last tensor was taken (CorruptCheckpointError: the caller
    drops what it wrote)."""
    entry = record.files[0]
    checksum = ChunkChecksum(entry.algorithm, threaded=False)
    scratch = torch.empty(max(min(_SCRATCH_BYTES, knobs.EXPORT_BUFFER_BYTES, entry.size), 1), dtype=torch.uint8).numpy().data
    with open(path / entry.name, "rb", buffering=0, opener=open_no_follow) as handle:
        if os.fstat(handle.fileno()).st_size != entry.size:
            raise CorruptCheckpointError(f"{path / entry.name}: size {os.fstat(handle.fileno()).st_size} != manifest size {entry.size}")
        position = 0
        shared = torch.empty(max((t.nbytes for t in tensors), default=0), dtype=torch.uint8) if reuse else None
        for tensor in tensors:
            table = record.tensors[tensor.index]
            if table.offset < position:
                raise CorruptCheckpointError(f"{path}: tensor {tensor.name!r} overlaps another in {entry.name} (never written so)")
            position = _read_into(handle, checksum, scratch, position, table.offset - position, path)
            raw = shared[: table.nbytes] if shared is not None else torch.empty(table.nbytes, dtype=torch.uint8)
            if table.nbytes:
                _read_exactly(handle, raw.numpy().data, path)
                checksum.submit(raw.numpy().data)
            position += table.nbytes
            yield raw.view(torch_dtype(table.dtype, path)).view(table.shape) if table.nbytes else torch.empty(table.shape, dtype=torch_dtype(table.dtype, path))
        _read_into(handle, checksum, scratch, position, entry.size - position, path)
    if checksum.result() != entry.checksum:
        raise CorruptCheckpointError(f"{path / entry.name}: checksum mismatch ({entry.algorithm} of the file != the manifest's)")


def _read_into(handle: Any, checksum: ChunkChecksum, scratch: memoryview, position: int, length: int, path: Path) -> int:
    """Read and checksum ``length`` bytes through ``scratch``; the position after them."""
    while length > 0:
        piece = scratch[: min(len(scratch), length)]
        _read_exactly(handle, piece, path)
        checksum.submit(piece)
        position += len(piece)
        length -= len(piece)
    return position


def _read_exactly(handle: Any, target: memoryview, path: Path) -> None:
    done = 0
    while done < len(target):
        count = handle.readinto(target[done:])
        if not count:
            raise CorruptCheckpointError(f"{path}: data file ended early")
        done += count


def _one_pass_order(record: DcpManifest, metadata: Any, tensors: list[ExportedTensor]) -> list[ExportedTensor] | None:
    """``tensors`` reordered so that each DCP data file's stored items are asked for in offset order
    (the given order wherever the files leave a choice), or None when no order does (a file holds
    one tensor's items on both sides of another's; DCP's writer stores a rank's items in its state
    dict's order, so in practice one exists). A topological order of "precedes in some file"."""
    by_index = {t.index: t for t in record.shared.tensors}
    position = {record.key_of(by_index[t.index]): i for i, t in enumerate(tensors)}
    per_file: dict[str, list[tuple[int, int]]] = {}
    for index, info in metadata.storage_data.items():
        if index.fqn in position:
            per_file.setdefault(info.relative_path, []).append((info.offset, position[index.fqn]))
    after: list[set[int]] = [set() for _ in tensors]
    waiting = [0] * len(tensors)
    for items in per_file.values():
        items.sort()
        for (_, first), (_, second) in zip(items, items[1:]):
            if first != second and second not in after[first]:
                after[first].add(second)
                waiting[second] += 1
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        order.append(heapq.heappop(ready))
        for later in after[order[-1]]:
            waiting[later] -= 1
            if waiting[later] == 0:
                heapq.heappush(ready, later)
    return [tensors[i] for i in order] if len(order) == len(tensors) else None


def _dcp_stream(path: Path, record: DcpManifest, tensors: list[ExportedTensor], metadata: Any, one_pass: bool, reuse: bool) -> Iterator[torch.Tensor]:
    """DCP reads a batch of at most ``knobs.EXPORT_BUFFER_BYTES`` (a larger tensor alone), each
    tensor whole, assembled from every rank's shards; ``reuse``: every batch is read into one
    buffer of the largest batch, allocated once (the caller wrote each tensor out before it takes
    the next batch), else each tensor is its own.

    ``one_pass`` (``tensors`` in ``_one_pass_order``): every data file is opened once and read front
    to back across the batches, each byte checksummed as it passes (``dcp_reads.OnePassReads``);
    a file's checksum is checked at its end, after the last batch, so the tensors yielded before
    hold bytes not yet verified: the stream checks every file once the last tensor was taken
    (CorruptCheckpointError naming the file), before it ends, and the writers run every stream to
    its end before they put their output in place (``_drain``): a refused file leaves no output.
    Otherwise the caller verified every file first and DCP reads the batches itself."""
    by_index = {t.index: t for t in record.shared.tensors}
    files = {entry.name: entry for entry in record.files if entry.name != DCP_METADATA}
    batches = _batches(tensors)
    arena = torch.empty(max(sum(_aligned(t.nbytes) for t in batch) for batch in batches), dtype=torch.uint8) if reuse and batches else None
    reads = dcp_reads.OnePassReads(path, files) if one_pass else None
    try:
        for batch in batches:
            wanted = {record.key_of(by_index[t.index]): _target(t, arena, offset, path) for t, offset in zip(batch, _offsets(batch))}
            read_dcp_tensors(path, record, wanted, None, metadata, verify_reads=False, reads=reads)
            for t in batch:
                yield wanted.pop(record.key_of(by_index[t.index]))
        if reads is not None:
            reads.finish([entry for entry in record.present_files() if entry.name != DCP_METADATA])
    finally:
        if reads is not None:
            reads.close()


def _batches(tensors: list[ExportedTensor]) -> list[list[ExportedTensor]]:
    """``tensors`` in order, cut into batches of at most ``knobs.EXPORT_BUFFER_BYTES`` (a larger tensor alone)."""
    batches: list[list[ExportedTensor]] = []
    for tensor in tensors:
        if batches and sum(t.nbytes for t in batches[-1]) + tensor.nbytes <= knobs.EXPORT_BUFFER_BYTES:
            batches[-1].append(tensor)
        else:
            batches.append([tensor])
    return batches


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to 64 (each tensor of a batch starts aligned for every dtype)."""
    return -(-nbytes // 64) * 64


def _offsets(batch: list[ExportedTensor]) -> list[int]:
    starts = [0]
    for t in batch[:-1]:
        starts.append(starts[-1] + _aligned(t.nbytes))
    return starts


def _target(tensor: ExportedTensor, arena: torch.Tensor | None, offset: int, path: Path) -> torch.Tensor:
    """Where DCP loads ``tensor``: its bytes of ``arena`` from ``offset``, else a tensor of its own."""
    dtype = torch_dtype(tensor.dtype, path)
    if arena is None or not tensor.nbytes:
        return torch.empty(tensor.shape, dtype=dtype)
    return arena[offset : offset + tensor.nbytes].view(dtype).view(tensor.shape)


# --- writing -----------------------------------------------------------------------------------


def _write_safetensors(out: Path, tensors: list[ExportedTensor], stream: Iterator[torch.Tensor], metadata: Mapping[str, str]) -> int:
    """Write ``out`` in the safetensors format, the header from the table, then each tensor's bytes
    as it arrives (written to ``out.tmp``, renamed once whole; not fsynced, as ``torch.save`` does
    not: an export is written again, not recovered); returns the bytes of tensors."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for t in tensors:
        code = _SAFETENSORS_DTYPES.get(t.dtype)
        if code is None:
            raise ConfigError(f"tensor {t.name!r} is {t.dtype}, which the safetensors format cannot hold: export with format='torch'")
        header[t.name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    tmp = out.with_name(out.name + ".tmp")
    try:
        _stream_safetensors(tmp, encoded, tensors, stream)
        _check_header(tmp, [t.name for t in tensors])
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return offset


def _check_header(path: Path, names: list[str]) -> None:
    """The file as the reference reader (the ``safetensors`` package) opens it: every tensor listed
    (its header only is read)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        listed = set(handle.keys())
    if listed != set(names):
        raise ConfigError(f"{path}: the safetensors reader lists {len(listed)} tensors, {len(names)} were written")


def _stream_safetensors(tmp: Path, encoded: bytes, tensors: list[ExportedTensor], stream: Iterator[torch.Tensor]) -> None:
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for t, value in zip(tensors, stream):
            if tuple(value.shape) != t.shape:
                raise CorruptCheckpointError(f"tensor {t.name!r} read as {tuple(value.shape)}, the record says {t.shape}")
            if t.nbytes:
                handle.write(value.contiguous().view(-1).view(torch.uint8).numpy().data)
            del value
        _drain(stream)


def _drain(stream: Iterator[Any]) -> None:
    """Run ``stream`` to its end, where its final checks are (the data file's checksum)."""
    for _ in stream:
        raise CorruptCheckpointError("the checkpoint holds more tensors than its record lists")


def _write_torch(out: Path, tensors: list[ExportedTensor], stream: Iterator[torch.Tensor], provenance: Mapping[str, str]) -> tuple[Path, int, int]:
    """``torch.save`` of the state dict (whole, in memory); its provenance in ``OUT.coci.json``."""
    state = {t.name: value for t, value in zip(tensors, stream)}
    _drain(stream)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, out)
    out.with_name(out.name + ".coci.json").write_text(json.dumps(dict(provenance), indent=2) + "\n")
    return out, len(state), sum(t.nbytes for t in tensors)


def _write_hf(
    out: Path, tensors: list[ExportedTensor], stream: Iterator[torch.Tensor], provenance: Mapping[str, str], model: Mapping[str, Any]
) -> tuple[Path, int, int]:
    """A ``from_pretrained`` folder: ``config.json`` and ``model.safetensors`` (each tied weight once)."""
    tied = set(model.get("tied", {}))
    kept = [t for t in tensors if t.name not in tied]
    out.mkdir(parents=True, exist_ok=True)
    config = dict(model["config"])
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    stream_kept = _without(tensors, stream, tied)
    nbytes = _write_safetensors(out / "model.safetensors", kept, stream_kept, {"format": "pt", **provenance})
    return out, len(kept), nbytes


def _without(tensors: list[ExportedTensor], stream: Iterator[torch.Tensor], names: set[str]) -> Iterator[torch.Tensor]:
    """``stream`` without the tensors named ``names`` (run to its end: its final checks included)."""
    for t, value in zip(tensors, stream):
        if t.name not in names:
            yield value
    _drain(stream)


# --- provenance and the model record -----------------------------------------------------------


def _provenance(run: RunSource, path: Path) -> dict[str, str]:
    """Where the export comes from: the run, its id (when it has one), the step, the checkpoint's
    commit id, the coci versions that wrote and exported it."""
    record = reader_for(path).read_record(path)
    run_id = None
    if run.run_dir is not None:
        from coci.checkpoint.remote.identity import read_local_id

        try:
            run_id = read_local_id(run.run_dir)
        except ConfigError:
            run_id = None
    return {
        "coci_run": run.label,
        "coci_run_id": run_id or "",
        "coci_step": str(record.step),
        "coci_commit_id": checkpoint_id(record) or "",
        "coci_checkpoint_version": record.coci_version,
        "coci_version": __version__,
    }


def write_model_record(run_dir: Path, config: Mapping[str, Any], tied: Mapping[str, str]) -> None:
    """Record the model's config (``config.to_dict()``, JSON) and its tied weights (name -> the name
    it is tied to) with the run: what ``--format hf`` writes ``config.json`` from."""
    data = json.dumps({"config": dict(config), "tied": dict(tied)}, indent=2, sort_keys=True, default=str)
    safe_files.replace_file(run_dir / MODEL_RECORD_FILENAME, data.encode(), durable=True, error=ConfigError)


def record_hf_model(run_dir: Path, model: Any) -> None:
    """Record a ``transformers`` model's config (``config.to_dict()`` as JSON, ``architectures`` its
    class as ``save_pretrained`` sets it) and its tied weights (a state-dict entry holding the same
    tensor as an earlier one: written once by ``--format hf``, tied again by ``from_pretrained``)."""
    config = json.loads(model.config.to_json_string(use_diff=False))
    if not config.get("architectures"):
        config["architectures"] = [type(model).__name__]
    seen: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
    tied: dict[str, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        identity = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if tensor.numel() and identity in seen:
            tied[name] = seen[identity]
        else:
            seen.setdefault(identity, name)
    write_model_record(run_dir, config, tied)


def read_model_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's model record (``write_model_record``); None without one; ConfigError naming the
    file when it is not one (untrusted JSON: a config object and a name -> name map)."""
    path = run_dir / MODEL_RECORD_FILENAME
    try:
        data = safe_files.read_bytes(path, _MODEL_RECORD_MAX_BYTES, error=ConfigError, limit_name="_MODEL_RECORD_MAX_BYTES")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not a model record ({type(exc).__name__})") from exc
    config, tied = (record.get("config"), record.get("tied", {})) if isinstance(record, dict) else (None, None)
    if not isinstance(config, dict) or not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise ConfigError(f"{path}: not a model record (a config object and a map of tied weights)")
    return {"config": config, "tied": tied}


def _hf_model(run: RunSource, given: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The model record an ``hf`` export writes ``config.json`` from: ``given``, else the run's."""
    if given is not None:
        return {"config": dict(given), "tied": {}}
    record = read_model_record(run.run_dir) if run.run_dir is not None else None
    if record is None:
        raise ConfigError(
            f"format 'hf' needs the model's config, and {run.label} has none recorded ({MODEL_RECORD_FILENAME}, written by "
            "coci.integrations.transformers.attach); pass model_config=model.config.to_dict(), or export format='safetensors'"
        )
    return record

