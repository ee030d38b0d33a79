"""A DCP checkpoint's stored items and chunks, against a hostile writer.

DCP stores each tensor chunk as a ``torch.save`` archive inside a data file and loads it with
``torch.load``, which allocates each record at the size its zip directory claims. These tests plant
a real DCP checkpoint (written by a one-process gloo job) into an ordinary run, replace one stored
item or drop part of a tensor's chunks, re-seal it the way coci seals, and check that restore
falls back to the older good checkpoint, ``coci verify`` refuses it naming the item, and
``coci report`` never reads from it.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, cast

import pytest
import test_security
import torch
from ckpt_helpers import events_of, restore_fresh
from test_security import plant_dcp, reseal_dcp, rewrite_metadata

from coci import cli
from coci.analysis.report.read import run_loss_trace
from coci.checkpoint import faults
from coci.checkpoint.verify import verify_run

#: What the bomb's single record claims when inflated (it takes about 64 KB deflated).
BOMB_BYTES = 64 << 20


#: The fixtures: a single-process run with checkpoints 2 and 4 and a DCP checkpoint of the same state; a copy of that run.
pristine, run = test_security.pristine, test_security.run


def metadata_of(target: Path) -> Any:
    return pickle.loads((target / ".metadata").read_bytes())  # trusted here: the test wrote it


def a_matrix_key(target: Path) -> str:
    """The key of a stored tensor with at least two rows (one chunk: a one-process save)."""
    entries = metadata_of(target).state_dict_metadata
    return next(key for key, entry in entries.items() if len(entry.size) == 2 and entry.size[0] >= 2)


def stored_tensor(target: Path, key: str) -> torch.Tensor:
    ((_, info),) = [(i, v) for i, v in metadata_of(target).storage_data.items() if i.fqn == key]
    raw = (target / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
    return torch.load(io.BytesIO(raw), weights_only=True)


def replace_item(target: Path, key: str, item: bytes, chunk: tuple[list[int], list[int]] | None = None) -> None:
    """Append ``item`` to the data file of ``key``'s stored item and point the item at it
    (optionally with one new chunk, ``(offsets, sizes)``, in place of the tensor's chunks), then re-seal."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    def change(metadata: Any) -> None:
        (index,) = [i for i in metadata.storage_data if i.fqn == key]
        info = metadata.storage_data.pop(index)
        data_file = target / info.relative_path
        info.offset, info.length = data_file.stat().st_size, len(item)
        with open(data_file, "ab") as handle:
            handle.write(item)
        if chunk is not None:
            offsets, sizes = torch.Size(chunk[0]), torch.Size(chunk[1])
            metadata.state_dict_metadata[key].chunks = [ChunkStorageMetadata(offsets=offsets, sizes=sizes)]
            index = MetadataIndex(key, offsets)
        metadata.storage_data[index] = info

    rewrite_metadata(target, change)
    reseal_dcp(target)


def saved(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def deflated(archive: bytes) -> bytes:
    """The same ``torch.save`` archive with its records deflated (torch reads either)."""
    source, out = zipfile.ZipFile(io.BytesIO(archive)), io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as rebuilt:
        for name in source.namelist():
            rebuilt.writestr(name, source.read(name))
    return out.getvalue()


def bomb(like: torch.Tensor) -> bytes:
    """A tensor of ``like``'s shape and values over a storage of BOMB_BYTES, deflated: a few
    kilobytes that torch inflates to BOMB_BYTES on load."""
    storage = torch.zeros(BOMB_BYTES // like.element_size(), dtype=like.dtype)
    storage[: like.numel()] = like.reshape(-1)
    return deflated(saved(storage[: like.numel()].view(like.shape)))


def report_trace_source(run: Path) -> str:
    """Where the report reads the loss trace from with no ``loss_curve.json``: the newest
    checkpoint that loads."""
    (run / "loss_curve.json").unlink(missing_ok=True)
    return run_loss_trace(run)[2]


def assert_refused_everywhere(run: Path, target: Path, key: str, reason: str) -> None:
    """Restore falls back to step 4, verify names the item and why, the report's loss trace (read
    from the newest checkpoint that loads) comes from step 4."""
    session, _, result = restore_fresh(run)
    session.close()
    assert result is not None and result.step == 4 and target in result.skipped
    status = {Path(s.path).name: s for s in verify_run(run)}[target.name]
    assert not status.ok and key in str(status.error) and reason in str(status.error), status.error
    assert cli.main(["verify", str(run)]) == 1
    assert report_trace_source(run) == "profiler trace in checkpoint step_4"


def test_a_planted_item_of_the_right_size_still_loads(run: Path, pristine: tuple[Path, Path]) -> None:
    """Baseline: replacing an item by a fresh ``torch.save`` of the same tensor is accepted, so
    the refusals below are about the item's size and chunks, not about the planting."""
    target = plant_dcp(run, pristine[1])
    key = a_matrix_key(target)
    replace_item(target, key, saved(stored_tensor(target, key).clone()))
    session, _, result = restore_fresh(run)
    session.close()
    assert result is not None and result.step == 99
    assert all(s.ok for s in verify_run(run)) and report_trace_source(run) == "profiler trace in checkpoint step_99"


@pytest.mark.parametrize("kind", ["deflated-bomb", "oversized-storage"])
def test_an_item_that_expands_past_its_chunk_is_refused_before_torch_reads_it(
    run: Path, pristine: tuple[Path, Path], kind: str
) -> None:
    """Finding 1: a 64 MB record in a few kilobytes (or stored as is: a storage far larger than
    the chunk) was inflated by torch.load on restore, report and verify."""
    target = plant_dcp(run, pristine[1])
    key = a_matrix_key(target)
    like = stored_tensor(target, key)
    if kind == "deflated-bomb":
        item = bomb(like)
        assert len(item) < BOMB_BYTES // 100
        reason = "is compressed"
    else:
        item = saved(torch.zeros(1 << 18, dtype=like.dtype)[: like.numel()].view(like.shape))
        reason = "expands to"
    replace_item(target, key, item)
    assert_refused_everywhere(run, target, key, reason)



def test_an_item_whose_storage_record_is_shorter_than_its_tensor_is_refused(run: Path, pristine: tuple[Path, Path], tmp_path: Path) -> None:
    """The item's tensor is a view of its storage record where the item lies in memory: a record
    shorter than the storage the item's pickle claims (the rest would be the archive's other
    bytes) is refused when loaded: restore falls back to step 4, an export fails naming the item
    and leaves no output."""
    from coci.checkpoint.export import export
    from coci.errors import CorruptCheckpointError

    target = plant_dcp(run, pristine[1])
    key = a_matrix_key(target)
    source, out = zipfile.ZipFile(io.BytesIO(saved(stored_tensor(target, key).clone()))), io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as rebuilt:
        for name in source.namelist():
            data = source.read(name)
            rebuilt.writestr(name, data[: len(data) // 2] if name.rsplit("/", 2)[-2:-1] == ["data"] else data)
    replace_item(target, key, out.getvalue())
    session, _, result = restore_fresh(run)
    session.close()
    assert result is not None and result.step == 4 and target in result.skipped
    with pytest.raises(CorruptCheckpointError, match=rf"{key}.*is no record of the item"):
        export(run, tmp_path / "model.safetensors", step=99)
    assert list(tmp_path.glob("model.safetensors*")) == []


def test_a_tensor_with_a_chunk_missing_is_refused(run: Path, pristine: tuple[Path, Path]) -> None:
    """Finding 9: chunks covering only the first rows left the rest of the tensor uninitialized."""
    target = plant_dcp(run, pristine[1])
    key = a_matrix_key(target)
    like = stored_tensor(target, key)
    rows = like.shape[0] // 2
    replace_item(target, key, saved(like[:rows].clone()), chunk=([0, 0], [rows, like.shape[1]]))
    assert_refused_everywhere(run, target, key, "chunks missing")


def test_an_item_with_a_bare_archive_tail_is_refused(run: Path, pristine: tuple[Path, Path]) -> None:
    """An item whose archive does not end with its zip end record (here: trailing bytes, which
    two zip readers may resolve differently) is refused, not guessed at."""
    target = plant_dcp(run, pristine[1])
    key = a_matrix_key(target)
    replace_item(target, key, saved(stored_tensor(target, key).clone()) + b"\0" * 64)
    assert_refused_everywhere(run, target, key, "zip end record")


def test_the_bomb_inflates_when_loaded_unchecked(pristine: tuple[Path, Path]) -> None:
    """Liveness: torch.load really allocates the bomb's claimed size."""
    like = stored_tensor(pristine[1], a_matrix_key(pristine[1]))
    loaded = torch.load(io.BytesIO(bomb(like)), weights_only=True)
    assert torch.equal(loaded, like) and loaded.untyped_storage().nbytes() == BOMB_BYTES
    assert math.prod(loaded.shape) * loaded.element_size() < BOMB_BYTES


def swapped_copy(target: Path, key: str) -> tuple[Path, Path]:
    """(the data file holding ``key``, a copy of it of the same size with one byte of that
    tensor's values changed): a real file to swap in, different only where torch loads values."""
    ((_, info),) = [(i, v) for i, v in metadata_of(target).storage_data.items() if i.fqn == key]
    data_file = target / info.relative_path
    raw = bytearray(data_file.read_bytes())
    values = stored_tensor(target, key).numpy().tobytes()
    at = raw.find(values, info.offset, info.offset + info.length)
    assert at >= 0 and len(values) > 8
    raw[at + len(values) // 2] ^= 0xFF
    copy = target.parent / "swapped.bin"
    copy.write_bytes(bytes(raw))
    return data_file, copy


def test_a_data_file_swapped_after_the_checks_is_refused_where_dcp_reads_it(run: Path, pristine: tuple[Path, Path]) -> None:
    """Item 8 of issue 48: a file replaced between coci's checks (record, ``.metadata``, items)
    and DCP's opening of it is refused, because the bytes DCP loads are the bytes checksummed;
    restore falls back to step 4. Without the hook the same planted checkpoint loads."""
    target = plant_dcp(run, pristine[1])
    data_file, copy = swapped_copy(target, a_matrix_key(target))
    swaps: list[str] = []

    def swap_before_dcp_reads(point: str) -> None:
        if point == "dcp_before_read" and not swaps:
            os.replace(copy, data_file)  # a different inode, same size and name
            swaps.append(point)

    faults.set_fault_hook(swap_before_dcp_reads)
    try:
        session, _, result = restore_fresh(run)
        session.close()
    finally:
        faults.set_fault_hook(None)
    assert swaps and result is not None and result.step == 4 and target in result.skipped
    (skip,) = [e for e in events_of(run, "restore_skip") if e["path"] == str(target)]
    assert "checksum mismatch" in skip["message"] and data_file.name in skip["message"], skip


def test_a_parts_cheap_check_reads_sizes_and_metadata_and_leaves_the_bytes_to_the_load(run: Path, pristine: tuple[Path, Path]) -> None:
    """``check_dcp_sizes`` (a node-local restore's first look at each part): a flipped byte passes
    it (the load's checksum finds it), a file of another size or a damaged ``.metadata`` does not."""
    from coci.checkpoint.dcp import check_dcp_sizes, verify_dcp_checkpoint
    from coci.errors import CorruptCheckpointError

    target = plant_dcp(run, pristine[1])
    data_file, copy = swapped_copy(target, a_matrix_key(target))
    os.replace(copy, data_file)
    check_dcp_sizes(target)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        verify_dcp_checkpoint(target)
    with data_file.open("ab") as handle:
        handle.write(b"\0")
    with pytest.raises(CorruptCheckpointError, match="size"):
        check_dcp_sizes(target)
    with data_file.open("r+b") as handle:
        handle.truncate(data_file.stat().st_size - 1)
    metadata = bytearray((target / ".metadata").read_bytes())
    metadata[len(metadata) // 2] ^= 0xFF
    (target / ".metadata").write_bytes(bytes(metadata))
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata"):
        check_dcp_sizes(target)


def test_a_dcp_export_reads_each_data_file_once_and_writes_the_stored_tensors_bitwise(run: Path, pristine: tuple[Path, Path], tmp_path: Path) -> None:
    """``coci export`` of a DCP checkpoint in several batches (a buffer of one byte: a batch per
    tensor) writes every tensor of the model equal, bitwise, to the item DCP stored; and an export
    of a 4 MiB model's DCP checkpoint (a one-process gloo job) reads each data file once,
    checksummed as it streams: Linux's ``rchar`` over the export is about the files' bytes, where
    a verification pass before DCP's reads read twice."""
    from safetensors.torch import load_file

    from coci import knobs
    from coci.checkpoint.export import export

    target = plant_dcp(run, pristine[1])
    with knobs.override(EXPORT_BUFFER_BYTES=1):
        result = export(run, tmp_path / "model.safetensors", step=99)
    got = load_file(tmp_path / "model.safetensors")
    record = json.loads((target / "manifest.json").read_text())["shared"]
    keys = {t["index"]: t["key"] for t in record["tensors"]}
    stored = {name: keys[ref["__tensor__"]] for name, ref in record["skeleton"]["model"].items()}
    assert result.step == 99 and result.tensors == len(got) >= 2 and set(got) == set(stored)
    for name, key in stored.items():
        want = stored_tensor(target, key)
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name

    model = torch.nn.Sequential(torch.nn.Linear(1024, 512, bias=False), torch.nn.Linear(512, 1024, bias=False))
    one_step_under_gloo(tmp_path / "big", model, tmp_path / "store")
    data = sum(p.stat().st_size for p in (tmp_path / "big").rglob("*.distcp"))
    with knobs.override(EXPORT_BUFFER_BYTES=1):
        export(tmp_path / "big", tmp_path / "warm.safetensors")  # the libraries' lazy imports read their files once
        before = rchar()
        export(tmp_path / "big", tmp_path / "big.safetensors")
        read = rchar() - before
    got = load_file(tmp_path / "big.safetensors")
    assert all(torch.equal(got[name], value) for name, value in model.state_dict().items())
    assert data > 4 << 20 and data <= read < 1.2 * data, (read, data)  # two passes would read 2x



def test_a_dcp_export_streams_in_the_buffer_its_peak_memory_near_the_largest_tensor_plus_the_buffer(tmp_path: Path) -> None:
    """Peak resident memory of an export of a 64 MB model's DCP checkpoint (8 tensors of 8 MB, a
    one-process gloo job) in batches of 8 MB stays near its largest tensor plus the buffer (Linux:
    VmHWM reset through clear_refs, as ``test_export_streams_one_tensor_at_a_time``): every batch
    is loaded into one buffer and each stored item is read into one scratch buffer, viewed, not
    copied, by its tensor. The ``torch`` format, which holds the whole state dict, exceeds the
    bound (the measure can fail)."""
    from test_leave_run import assert_export_peak_near_largest_plus_buffer


    clear_refs = Path("/proc/self/clear_refs")
    if not clear_refs.exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident size")
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 1024, bias=False) for _ in range(8)))
    one_step_under_gloo(tmp_path / "run", model, tmp_path / "store")
    assert list((tmp_path / "run").rglob("*.distcp"))
    del model
    assert_export_peak_near_largest_plus_buffer(tmp_path, clear_refs)


def rchar() -> int:
    """This process's bytes passed by read calls so far (Linux ``/proc/self/io``)."""
    counters = Path("/proc/self/io")
    if not counters.exists():
        pytest.skip("needs Linux's /proc/self/io to count the bytes read")
    return int(next(line for line in counters.read_text().splitlines() if line.startswith("rchar:")).split()[1])


@pytest.mark.parametrize(
    ("change", "open_files"),
    [("swapped before the first batch", 64), ("rewritten in place after the first batch", 64), ("swapped after the first batch", 0)],
)
def test_a_dcp_data_file_changed_while_an_export_streams_is_refused_naming_it_and_leaves_no_output(
    run: Path, pristine: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, open_files: int
) -> None:
    """A data file replaced before the export opens it, overwritten in place (one byte of its last
    stored item, read after the model's) after the first batch was written out, or replaced then
    while no file is kept open between batches (``OPEN_FILES`` 0: it is opened again where it
    stopped), is refused by the checksum at the file's end: the export fails naming the file and
    neither its output nor the temporary file exists. Without the change the same export succeeds."""
    from coci import knobs
    from coci.checkpoint import dcp_reads
    from coci.checkpoint.export import export
    from coci.errors import CorruptCheckpointError

    monkeypatch.setattr(dcp_reads, "OPEN_FILES", open_files)
    target = plant_dcp(run, pristine[1])
    data_file, swapped = swapped_copy(target, a_matrix_key(target))
    last = max(info.offset + info.length for info in metadata_of(target).storage_data.values() if target / info.relative_path == data_file)
    if change == "swapped after the first batch":  # the changed byte after every byte the model's batches read
        raw = bytearray(data_file.read_bytes())
        raw[last - 1] ^= 0xFF
        swapped.write_bytes(bytes(raw))
    batches: list[str] = []

    def change_the_file(point: str) -> None:
        if point != "dcp_before_read":
            return
        batches.append(point)
        if change.startswith("swapped") and len(batches) == (1 if change.endswith("before the first batch") else 2):
            os.replace(swapped, data_file)  # a different inode, same size and name
        elif change.startswith("rewritten") and len(batches) == 2:
            with data_file.open("r+b") as handle:  # the same inode: the open descriptor sees it
                handle.seek(last - 1)
                byte = handle.read(1)
                handle.seek(last - 1)
                handle.write(bytes([byte[0] ^ 0xFF]))

    out = tmp_path / "model.safetensors"
    with knobs.override(EXPORT_BUFFER_BYTES=1):
        export(run, tmp_path / "before.safetensors", step=99)
        faults.set_fault_hook(change_the_file)
        try:
            with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as refused:
                export(run, out, step=99)
        finally:
            faults.set_fault_hook(None)
    assert len(batches) >= 2 and data_file.name in str(refused.value)
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


def test_an_exports_batches_follow_every_data_files_order_or_none_does() -> None:
    """The export's order of tensors asks for each file's items in offset order: tensors held in
    two files (a rank each) come in an order both files allow (the given one where they leave a
    choice); a file holding one tensor's chunks on both sides of another's allows none."""
    from types import SimpleNamespace

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    from coci.checkpoint.dcp_manifest import DcpManifest
    from coci.checkpoint.export import ExportedTensor, _one_pass_order

    record = SimpleNamespace(shared=SimpleNamespace(tensors=[SimpleNamespace(index=i) for i in range(3)]), key_of=lambda t: f"shared/{t.index}")
    tensors = [ExportedTensor(name, "float32", (2,), 8, i) for i, name in enumerate("abc")]

    def order(stored: list[tuple[int, int, str, int]]) -> list[str] | None:
        storage = {MetadataIndex(f"shared/{i}", [chunk]): _StorageInfo(name, offset, 8) for i, chunk, name, offset in stored}
        found = _one_pass_order(cast(DcpManifest, record), SimpleNamespace(storage_data=storage), tensors)
        return None if found is None else [t.name for t in found]

    assert order([(0, 0, "r0", 0), (1, 0, "r0", 8), (2, 0, "r0", 16)]) == ["a", "b", "c"]
    assert order([(2, 0, "r0", 0), (0, 0, "r0", 8), (0, 1, "r1", 0), (1, 1, "r1", 8)]) == ["c", "a", "b"]
    assert order([(1, 0, "r0", 0), (0, 0, "r1", 0), (2, 0, "r1", 8)]) == ["a", "b", "c"]
    assert order([(0, 0, "r0", 0), (1, 0, "r0", 8), (0, 1, "r0", 16)]) is None


def one_step_under_gloo(run_dir: Path, model: torch.nn.Module, store: Path) -> None:
    """One checkpointed step of ``model`` in a one-process gloo group: a DCP checkpoint in ``run_dir``."""
    import torch.distributed as dist

    import coci

    dist.init_process_group("gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1)
    try:
        with coci.Session(run_dir, state={"model": model}, policy=coci.EveryN(1)) as session:
            session.step()
    finally:
        dist.destroy_process_group()
