"""coci.checkpoint (layout, records, commit, retention) and .local: the commit protocol, verification, retention and refusal of bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from coci.checkpoint import faults, layout, local, record_reads, retention
from coci.checkpoint.retention import KeepLast
from coci.checkpoint.snapshot import StagingArena
from coci.errors import CorruptCheckpointError


def write(root: Path, step: int, tensors: list[torch.Tensor]) -> Path:
    arena = StagingArena()
    views = arena.prepare(tensors)
    for view, tensor in zip(views, tensors):
        view.copy_(tensor)
    path, _ = local.write_checkpoint(root, step, arena.payload(), arena.slots, {"t": [{"__tensor__": i} for i in range(len(tensors))]}, epoch=0, state_keys=["t"])
    return path


def test_write_then_load_round_trips_bytes(tmp_path: Path) -> None:
    tensors = [torch.randn(10, 3), torch.arange(7, dtype=torch.int64), torch.randn(4).to(torch.bfloat16), torch.tensor(True)]
    path = write(tmp_path, 3, tensors)
    assert path.name == "step_3" and not (tmp_path / "step_3.tmp").exists()
    manifest, loaded = local.load_checkpoint(path)
    assert manifest.step == 3 and manifest.epoch == 0
    for original, back in zip(tensors, loaded):
        assert back.dtype == original.dtype and torch.equal(back, original)


def test_tmp_directories_are_never_checkpoints(tmp_path: Path) -> None:
    write(tmp_path, 1, [torch.ones(2)])
    stale = tmp_path / "step_9.tmp"
    stale.mkdir()
    (stale / "manifest.json").write_text("{}")
    assert [s for s, _ in layout.committed_steps(tmp_path)] == [1]
    layout.remove_stale_tmp(tmp_path)
    assert not stale.exists()


def test_retention_keeps_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        write(tmp_path, step, [torch.full((2,), float(step))])
        retention.apply_retention(tmp_path, KeepLast(2), trusted={1, 2, 3, 4})
    assert [s for s, _ in layout.committed_steps(tmp_path)] == [3, 4]
    assert retention.apply_retention(tmp_path, KeepLast(1), trusted={3, 4}) == [3]
    assert [s for s, _ in layout.committed_steps(tmp_path)] == [4]


@pytest.mark.parametrize(
    "damage, message",
    [
        ("flip", "checksum mismatch"),
        ("truncate", "size"),
        ("missing_data", "data file is missing"),
        ("garble_manifest", "manifest.json is unreadable"),
        ("escape", "outside its checkpoint"),
        ("oversized_tensor", "does not fit"),
    ],
)
def test_damaged_checkpoints_are_refused(tmp_path: Path, damage: str, message: str) -> None:
    path = write(tmp_path, 5, [torch.randn(1000)])
    data, manifest_path = path / "data.bin", path / "manifest.json"
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[123] ^= 0x10
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-8])
    elif damage == "missing_data":
        data.unlink()
    elif damage == "garble_manifest":
        manifest_path.write_text(manifest_path.read_text()[:40])
    else:
        manifest = json.loads(manifest_path.read_text())
        if damage == "escape":
            manifest["files"][0]["name"] = "../../etc/passwd"
        else:
            manifest["tensors"][0]["shape"] = [10**6]
        manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match=message):
        local.verify_checkpoint(path)
    with pytest.raises(CorruptCheckpointError):
        local.load_checkpoint(path)


def test_fault_hook_sees_every_commit_point(tmp_path: Path) -> None:
    seen: list[str] = []
    faults.set_fault_hook(seen.append)
    try:
        write(tmp_path, 1, [torch.ones(3)])
        write(tmp_path, 2, [torch.ones(3)])
        retention.apply_retention(tmp_path, KeepLast(1), trusted={1, 2})
    finally:
        faults.set_fault_hook(None)
    assert seen[:5] == ["mid_write", "before_manifest", "before_rename", "after_rename", "after_commit"]
    assert seen[-1] == "retention"


def test_the_dcp_commit_record_is_sealed_and_nan_safe_too(tmp_path: Path) -> None:
    """Both formats' manifests share records.CommitRecord: NaN kept, an altered value refused."""
    import math

    from coci.checkpoint.dcp import DcpManifest, DcpPart

    record = DcpManifest(
        format="dcp", format_version=1, coci_version="test", step=3, wall_time=0.0, state_keys=["m"],
        files=[], world_size=1, bytes_per_rank=[0],
        shared=DcpPart(skeleton={"m": {"best": float("nan")}}, tensors=[]), ranks=[DcpPart(skeleton={}, tensors=[])],
    )
    path = tmp_path / "manifest.json"
    path.write_text(record.sealed().model_dump_json())
    back = record_reads.parse_record(tmp_path, DcpManifest)
    record_reads.check_sealed(back, tmp_path)
    assert math.isnan(back.shared.skeleton["m"]["best"])
    path.write_text(path.read_text().replace('"step":3', '"step":4'))
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        record_reads.check_sealed(record_reads.parse_record(tmp_path, DcpManifest), tmp_path)
