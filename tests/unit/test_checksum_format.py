"""Data-file checksums across format versions: new checkpoints record crc32c, and a checkpoint
written by coci before format version 2 (its records name ``crc32``) still verifies and restores.

``tests/data/format1_run`` is a real run directory written by the format-1 code (a 4x8 Linear with
SGD momentum, :func:`ckpt_helpers.build_state`, 4 steps of :func:`ckpt_helpers.train`, checkpoint
at step 4); it is copied before use, never modified in place.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch
from ckpt_helpers import build_state, load_manifest_json, make_run, step_dir

import coci
from coci.checkpoint import layout

FORMAT1_RUN = Path(__file__).resolve().parents[1] / "data" / "format1_run"


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "format1_run"
    shutil.copytree(FORMAT1_RUN, run_dir)
    return run_dir


def _flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_new_checkpoints_record_crc32c_of_their_data_file(tmp_path: Path) -> None:
    make_run(tmp_path, steps=2, every=2)
    manifest = load_manifest_json(tmp_path, 2)
    (entry,) = manifest["files"]
    data = (step_dir(tmp_path, 2) / entry["name"]).read_bytes()
    assert manifest["format_version"] == layout.FORMAT_VERSION == 2
    assert set(entry) == {"name", "size", "crc32c"} and entry["crc32c"] == crc32c.crc32c(data)


def test_format1_checkpoint_names_crc32_and_still_verifies(old_run: Path) -> None:
    manifest = load_manifest_json(old_run, 4)
    (entry,) = manifest["files"]
    assert manifest["format_version"] == 1 and "crc32" in entry and "crc32c" not in entry
    assert entry["crc32"] == zlib.crc32((step_dir(old_run, 4) / "data.bin").read_bytes())
    (status,) = coci.verify_run(old_run)
    assert status.ok and status.step == 4, status.error


def _stored_tensor(run_dir: Path, step: int, skeleton_path: tuple[str | int, ...]) -> torch.Tensor:
    """One tensor exactly as the checkpoint stores it, read from ``data.bin`` by its manifest
    record (dtype, shape, offset) without coci's loader."""
    manifest = load_manifest_json(run_dir, step)
    node: Any = manifest["skeleton"]
    for key in skeleton_path:
        node = node[key]
    record = manifest["tensors"][node["__tensor__"]]
    raw = (step_dir(run_dir, step) / "data.bin").read_bytes()[record["offset"] : record["offset"] + record["nbytes"]]
    dtype = getattr(torch, record["dtype"])
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(record["shape"])


def _momentum_buffers(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [optimizer.state[p]["momentum_buffer"] for group in optimizer.param_groups for p in group["params"]]


def test_format1_checkpoint_restores_bitwise(old_run: Path) -> None:
    """The weights and optimizer state restored from the old checkpoint are bit for bit the tensors
    its data file holds (read here independently of coci), whatever CPU computed them."""
    state = build_state(seed=123)  # different initial weights: only a real restore makes them equal
    with coci.Session(old_run, state=state, policy=coci.EveryN(1000)) as session:
        result = session.restore()
        assert result is not None and result.step == 4 and session.steps == 4
    for name, tensor in state["model"].state_dict().items():
        stored = _stored_tensor(old_run, 4, ("model", name))
        assert tensor.dtype == stored.dtype and torch.equal(tensor, stored), name
    stored_momentum = [_stored_tensor(old_run, 4, ("optimizer", "state", "__dict__", i, 1, "momentum_buffer")) for i in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(_momentum_buffers(state["optimizer"]), stored_momentum, strict=True))


@pytest.mark.parametrize("which", ["format1", "new"])
def test_a_flipped_data_byte_is_caught_with_either_checksum(which: str, old_run: Path, tmp_path: Path) -> None:
    if which == "format1":
        run_dir, step = old_run, 4
    else:
        run_dir, step = tmp_path / "new", 2
        make_run(run_dir, steps=2, every=2)
    data = step_dir(run_dir, step) / "data.bin"
    _flip_byte(data, data.stat().st_size // 3)
    (status,) = coci.verify_run(run_dir)
    algorithm = "crc32" if which == "format1" else "crc32c"
    assert not status.ok and status.error is not None and f"checksum mismatch ({algorithm}" in status.error
    with (
        coci.Session(run_dir, state=build_state(), policy=coci.EveryN(1000)) as session,
        pytest.raises(coci.CorruptCheckpointError, match=f"checksum mismatch \\({algorithm}"),
    ):
        session.restore()  # the only checkpoint is corrupt: refused, never loaded


def test_a_record_naming_both_or_no_checksum_is_refused(tmp_path: Path) -> None:
    make_run(tmp_path, steps=2, every=2)
    path = step_dir(tmp_path, 2) / layout.MANIFEST_FILENAME
    manifest = json.loads(path.read_text())
    for files in ([{**manifest["files"][0], "crc32": 1}], [{"name": "data.bin", "size": manifest["files"][0]["size"]}]):
        path.write_text(json.dumps({**manifest, "files": files}))
        (status,) = coci.verify_run(tmp_path)
        assert not status.ok and status.error is not None and "unreadable" in status.error
