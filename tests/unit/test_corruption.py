"""Corrupt committed checkpoints (persist stage): ``verify_run`` names each fault and
``Session.restore()`` skips the corrupt checkpoint with a ``restore_skip`` event, loading the
previous one; the corrupt one is never loaded (the restored weights are the previous step's)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ckpt_helpers import build_state, events_of, load_manifest_json, make_run, restore_fresh, step_dir, write_manifest_json

import coci
from coci import CorruptCheckpointError
from coci.checkpoint import layout
from coci.checkpoint.verify import CheckpointStatus, verify_run


@pytest.fixture(scope="module", params=["thread", pytest.param("process", marks=pytest.mark.slow)])  # process: starts a helper
def pristine(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> tuple[Path, dict[int, dict[str, torch.Tensor]]]:
    """Checkpoints written by the persist thread or by the persist process (``Session(persist=...)``)."""
    run_dir = tmp_path_factory.mktemp("pristine")
    weights = make_run(run_dir, steps=6, every=2, persist=request.param)  # checkpoints 2, 4, 6
    return run_dir, weights


@pytest.fixture
def run(pristine: tuple[Path, dict], tmp_path: Path) -> tuple[Path, dict[int, dict[str, torch.Tensor]]]:
    source, weights = pristine
    shutil.copytree(source, tmp_path / "run")
    return tmp_path / "run", weights


def flip_bit(run_dir: Path) -> None:
    data = step_dir(run_dir, 6) / "data.bin"
    manifest = load_manifest_json(run_dir, 6)
    offset = manifest["tensors"][0]["offset"] + 1  # inside the first tensor's bytes
    raw = bytearray(data.read_bytes())
    raw[offset] ^= 0x10
    data.write_bytes(bytes(raw))


def truncate(run_dir: Path) -> None:
    data = step_dir(run_dir, 6) / "data.bin"
    data.write_bytes(data.read_bytes()[:-100])


def remove_data(run_dir: Path) -> None:
    (step_dir(run_dir, 6) / "data.bin").unlink()


def remove_manifest(run_dir: Path) -> None:
    (step_dir(run_dir, 6) / "manifest.json").unlink()


def garble_manifest(run_dir: Path) -> None:
    path = step_dir(run_dir, 6) / "manifest.json"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # torn JSON


def empty_manifest(run_dir: Path) -> None:
    (step_dir(run_dir, 6) / "manifest.json").write_bytes(b"")


def binary_manifest(run_dir: Path) -> None:
    (step_dir(run_dir, 6) / "manifest.json").write_bytes(bytes(range(256)))


def escape_relative(run_dir: Path) -> None:
    manifest = load_manifest_json(run_dir, 6)
    manifest["files"][0]["name"] = "../step_4/data.bin"  # a real, valid file of another checkpoint
    write_manifest_json(run_dir, 6, manifest)


def escape_absolute(run_dir: Path) -> None:
    manifest = load_manifest_json(run_dir, 6)
    manifest["files"][0]["name"] = str((step_dir(run_dir, 4) / "data.bin").resolve())
    write_manifest_json(run_dir, 6, manifest)


def tensor_out_of_file(run_dir: Path) -> None:
    manifest = load_manifest_json(run_dir, 6)
    manifest["tensors"][0]["offset"] = manifest["files"][0]["size"]
    write_manifest_json(run_dir, 6, manifest)


def unknown_dtype(run_dir: Path) -> None:
    manifest = load_manifest_json(run_dir, 6)
    manifest["tensors"][0]["dtype"] = "Tensor"  # a torch attribute that is not a dtype
    write_manifest_json(run_dir, 6, manifest)


def newer_format(run_dir: Path) -> None:
    manifest = load_manifest_json(run_dir, 6)
    manifest["format_version"] = 999
    write_manifest_json(run_dir, 6, manifest)


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "flipped-bit": (flip_bit, "checksum mismatch"),
    "truncated-data": (truncate, "manifest size"),
    "missing-data": (remove_data, "data file is missing"),
    "garbled-manifest": (garble_manifest, "manifest.json is unreadable"),
    "empty-manifest": (empty_manifest, "manifest.json is unreadable"),
    "binary-manifest": (binary_manifest, "manifest.json is unreadable"),
    "path-escape-relative": (escape_relative, "outside its checkpoint"),
    "path-escape-absolute": (escape_absolute, "outside its checkpoint"),
    "tensor-outside-file": (tensor_out_of_file, "does not fit"),
    "unknown-dtype": (unknown_dtype, "unknown dtype"),
    "newer-format": (newer_format, "newer than this coci supports"),
}


def test_pristine_run_verifies(pristine: tuple[Path, dict]) -> None:
    statuses = verify_run(pristine[0])
    assert [(s.step, s.ok, s.committed, s.error) for s in statuses] == [(2, True, True, None), (4, True, True, None), (6, True, True, None)]
    data_sizes = {s.step: (Path(s.path) / "data.bin").stat().st_size for s in statuses}
    assert all(s.bytes > data_sizes[s.step] for s in statuses)  # data + manifest
    assert CheckpointStatus.model_validate_json(statuses[0].model_dump_json()) == statuses[0]


@pytest.mark.parametrize("case", list(CASES))
def test_verify_reports_corruption(run: tuple[Path, dict], case: str) -> None:
    run_dir, _ = run
    corrupt, fragment = CASES[case]
    corrupt(run_dir)
    statuses = {s.step: s for s in verify_run(run_dir)}
    assert statuses[2].ok and statuses[4].ok
    assert not statuses[6].ok
    assert fragment in (statuses[6].error or "")


@pytest.mark.parametrize("case", list(CASES))
def test_restore_skips_corrupt_and_loads_previous(run: tuple[Path, dict], case: str) -> None:
    run_dir, weights = run
    corrupt, fragment = CASES[case]
    corrupt(run_dir)
    session, state, result = restore_fresh(run_dir)
    try:
        assert result is not None and result.step == 4
        assert session.steps == 4
        for key, value in state["model"].state_dict().items():
            assert torch.equal(value, weights[4][key]), key  # the previous checkpoint, bitwise
        skips = events_of(run_dir, "restore_skip")
        assert [e["step"] for e in skips] == [6]
        assert fragment in skips[0]["message"]
        assert [e["step"] for e in events_of(run_dir, "restore")] == [4]
    finally:
        session.close()


def test_missing_manifest_is_reported_as_uncommitted(run: tuple[Path, dict]) -> None:
    run_dir, _ = run
    remove_manifest(run_dir)
    statuses = {s.step: s for s in verify_run(run_dir)}
    assert not statuses[6].ok and not statuses[6].committed
    assert "manifest.json is missing" in (statuses[6].error or "")


def test_restore_warns_about_a_checkpoint_whose_manifest_vanished(run: tuple[Path, dict]) -> None:
    """A ``step_<n>`` directory can only lose its manifest through outside damage (the commit renames
    a complete directory): restore must not load it, and must say so with a ``restore_skip``."""
    run_dir, weights = run
    remove_manifest(run_dir)
    session, state, result = restore_fresh(run_dir)
    try:
        assert result is not None and result.step == 4
        assert torch.equal(state["model"].weight, weights[4]["weight"])
        skips = events_of(run_dir, "restore_skip")
        assert [e["step"] for e in skips] == [6]
        assert "manifest.json is missing" in skips[0]["message"]
    finally:
        session.close()


def test_two_corrupt_checkpoints_fall_back_twice(run: tuple[Path, dict]) -> None:
    run_dir, weights = run
    flip_bit(run_dir)
    (step_dir(run_dir, 4) / "data.bin").write_bytes(b"")
    session, state, result = restore_fresh(run_dir)
    try:
        assert result is not None and result.step == 2
        assert [p.name for p in result.skipped] == ["step_6", "step_4"]
        assert torch.equal(state["model"].weight, weights[2]["weight"])
    finally:
        session.close()


def test_all_corrupt_raises_instead_of_starting_fresh(run: tuple[Path, dict]) -> None:
    run_dir, _ = run
    for step in (2, 4, 6):
        (step_dir(run_dir, step) / "data.bin").unlink()
    state = build_state(seed=123)
    fresh_weight = state["model"].weight.detach().clone()
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(1000))
    try:
        with pytest.raises(CorruptCheckpointError, match="none of the 3 committed checkpoints"):
            session.restore()
        assert torch.equal(state["model"].weight, fresh_weight)  # nothing was loaded
    finally:
        session.close()


def test_stray_tmp_is_reported_and_never_read(run: tuple[Path, dict]) -> None:
    run_dir, weights = run
    root = layout.checkpoints_dir(run_dir)
    shutil.copytree(step_dir(run_dir, 6), root / "step_8.tmp")  # complete, but never committed
    statuses = {s.path: s for s in verify_run(run_dir)}
    tmp = statuses[str(root / "step_8.tmp")]
    assert (tmp.step, tmp.ok, tmp.committed) == (8, False, False)
    assert "not committed" in (tmp.error or "")
    assert tmp.bytes == statuses[str(step_dir(run_dir, 6))].bytes
    session, _, result = restore_fresh(run_dir)
    session.close()
    assert result is not None and result.step == 6
    assert not (root / "step_8.tmp").exists()  # removed by restore, not loaded


def test_manifest_bit_flip_inside_a_value_is_detected(run: tuple[Path, dict]) -> None:
    """A flipped bit in the manifest can keep it valid JSON (here: the optimizer's learning rate
    0.1 becomes 0.3). data.bin's crc32 cannot see it, so the manifest needs its own checksum."""
    run_dir, weights = run
    path = step_dir(run_dir, 6) / "manifest.json"
    raw = path.read_bytes()
    assert raw.count(b'"lr":0.1') == 1
    index = raw.index(b'"lr":0.1') + len(b'"lr":0.')
    flipped = raw[:index] + bytes([raw[index] ^ 0x02]) + raw[index + 1 :]  # '1' (0x31) -> '3' (0x33)
    assert b'"lr":0.3' in flipped
    path.write_bytes(flipped)
    statuses = {s.step: s for s in verify_run(run_dir)}
    assert not statuses[6].ok
    session, state, result = restore_fresh(run_dir)
    try:
        assert result is not None and result.step == 4
        assert state["optimizer"].param_groups[0]["lr"] == 0.1
    finally:
        session.close()


def test_skeleton_referring_to_a_missing_tensor_is_skipped(run: tuple[Path, dict]) -> None:
    """A manifest that parses and whose files verify, but whose state skeleton points at tensor 999:
    verify reports it; restore must treat it as corrupt (skip it), not crash mid-load."""
    run_dir, weights = run
    manifest = load_manifest_json(run_dir, 6)
    manifest["skeleton"]["model"]["weight"] = {"__tensor__": 999}
    write_manifest_json(run_dir, 6, manifest, reseal=True)
    statuses = {s.step: s for s in verify_run(run_dir)}
    assert not statuses[6].ok and "tensor 999" in (statuses[6].error or "")
    session, state, result = restore_fresh(run_dir)
    try:
        assert result is not None and result.step == 4
        assert torch.equal(state["model"].weight, weights[4]["weight"])
    finally:
        session.close()


def test_manifest_step_disagreeing_with_directory_is_reported(run: tuple[Path, dict]) -> None:
    run_dir, _ = run
    manifest = load_manifest_json(run_dir, 6)
    manifest["step"] = 60
    write_manifest_json(run_dir, 6, manifest, reseal=True)
    statuses = {s.step: s for s in verify_run(run_dir)}
    assert not statuses[6].ok and "manifest says step 60" in (statuses[6].error or "")


def test_verify_run_edge_cases(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        verify_run(tmp_path / "absent")
    assert verify_run(tmp_path) == []
    root = layout.checkpoints_dir(tmp_path)
    root.mkdir()
    (root / "notes.txt").write_text("hello")
    (root / "step_3").mkdir()  # empty: never committed
    statuses = verify_run(tmp_path)
    assert [(s.step, s.ok, s.committed) for s in statuses] == [(None, False, False), (3, False, False)]
    assert "not a checkpoint" in (statuses[0].error or "")
