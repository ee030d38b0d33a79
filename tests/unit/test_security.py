"""Security and integrity of a run directory against a hostile or careless writer.

Each test plants what an attacker with write access to the run directory (or a shared object
store) could plant, re-seals the manifest the way the library does (a checksum guards against
accidents, not people) and checks that loading never runs code, never reads outside the
checkpoint, never deletes the last good checkpoint, never applies half of a rejected checkpoint,
and that limits end in a clear error. The DCP checkpoints are written by a real one-process gloo
job (the format of every multi-process job) and planted into an ordinary single-process run.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import zlib
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch
import torch.distributed as dist
from ckpt_helpers import build_state, make_run, restore_fresh, step_dir, train
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coci
from coci import cli
from coci.checkpoint import layout
from coci.checkpoint.dcp import DcpManifest
from coci.checkpoint.verify import verify_run


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def write_dcp_run(run_dir: Path, store: Path) -> None:
    """A run written under a real (one-process, gloo) process group: DCP checkpoints 5 and 10."""
    dist.init_process_group("gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1)
    try:
        make_run(run_dir, steps=10, every=5)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a single-process run with checkpoints 2 and 4, a DCP checkpoint of the same state)."""
    base = tmp_path_factory.mktemp("security")
    make_run(base / "local", steps=4, every=2)
    write_dcp_run(base / "dcp", base / "store")
    return base / "local", step_dir(base / "dcp", 10)


@pytest.fixture
def run(pristine: tuple[Path, Path], tmp_path: Path) -> Path:
    shutil.copytree(pristine[0], tmp_path / "run")
    return tmp_path / "run"


def reseal_dcp(path: Path, edit: Any = None) -> None:
    """Recompute the manifest's file sizes, crc32s and checksum (``edit(raw)`` may change it first)."""
    raw = json.loads((path / layout.MANIFEST_FILENAME).read_text())
    if edit is not None:
        edit(raw)
    for entry in raw["files"]:
        data = (path / entry["name"]).read_bytes()
        algorithm = "crc32" if "crc32" in entry else "crc32c"  # the key names the algorithm
        entry["size"], entry[algorithm] = len(data), zlib.crc32(data) if algorithm == "crc32" else crc32c.crc32c(data)
    sealed = DcpManifest.model_validate(raw).sealed()
    (path / layout.MANIFEST_FILENAME).write_text(sealed.model_dump_json())


def plant_dcp(run_dir: Path, dcp_step: Path, step: int = 99) -> Path:
    """The DCP checkpoint planted as ``step_<step>`` of ``run_dir`` (re-sealed, loads as is)."""
    target = step_dir(run_dir, step)
    shutil.copytree(dcp_step, target)

    def renumber(raw: dict) -> None:
        raw["step"] = step
        own = raw["shared"]["skeleton"]["__coci__"]  # the session's own count is the checkpoint's step
        own["steps"], own["checkpoint_steps"] = step, [*own["checkpoint_steps"][:-1], step]

    reseal_dcp(target, renumber)
    return target


def rewrite_metadata(path: Path, change: Any) -> None:
    """Unpickle DCP's ``.metadata`` (trusted here: the test wrote it), ``change(metadata)``, pickle it back."""
    metadata_file = path / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    change(metadata)
    metadata_file.write_bytes(pickle.dumps(metadata))


def point_key_at(metadata: Any, key: str, relative_path: str, length: int, *, as_bytes: bool) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    if as_bytes:
        metadata.state_dict_metadata[key] = BytesStorageMetadata()
        for index in [i for i in metadata.storage_data if i.fqn == key]:
            del metadata.storage_data[index]
        metadata.storage_data[MetadataIndex(key)] = _StorageInfo(relative_path, 0, length)
    else:
        for index in [i for i in metadata.storage_data if i.fqn == key]:
            metadata.storage_data[index] = _StorageInfo(relative_path, 0, length)


def plant_payload(target: Path, marker: Path, *, listed: bool) -> None:
    """The exploit of finding 1: a bytes item of ``.metadata`` pointing at a ``torch.save``'d
    object whose unpickling runs ``touch marker`` (optionally listed in the re-sealed manifest)."""
    payload = target / "payload.bin"
    torch.save(Payload(marker), payload)
    size = payload.stat().st_size
    rewrite_metadata(target, lambda md: point_key_at(md, "shared/0", "payload.bin", size, as_bytes=True))

    def add_payload(raw: dict) -> None:
        if listed:
            raw["files"].append({"name": "payload.bin", "size": 0, "crc32c": 0})

    reseal_dcp(target, add_payload)


def test_payload_runs_when_unpickled(tmp_path: Path) -> None:
    """Liveness: the payload really creates the marker when loaded the unsafe way."""
    marker = tmp_path / "PWNED"
    torch.save(Payload(marker), tmp_path / "p.bin")
    torch.load(tmp_path / "p.bin", weights_only=False)
    assert marker.exists()


def test_planted_dcp_checkpoint_loads_in_a_plain_process(run: Path, pristine: tuple[Path, Path]) -> None:
    """Baseline: a re-sealed planted DCP checkpoint is a valid checkpoint (so the refusals below
    are about the payload, not about the planting)."""
    plant_dcp(run, pristine[1])
    session, _, result = restore_fresh(run)
    session.close()
    assert result is not None and result.step == 99


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "listed-in-manifest"])
def test_dcp_bytes_item_never_runs_code(run: Path, pristine: tuple[Path, Path], tmp_path: Path, listed: bool) -> None:
    marker = tmp_path / "PWNED"
    target = plant_dcp(run, pristine[1])
    plant_payload(target, marker, listed=listed)
    session, _, result = restore_fresh(run)
    session.close()
    assert not marker.exists()
    assert result is not None and result.step == 4 and target in result.skipped
    statuses = {Path(s.path).name: s for s in verify_run(run)}
    assert not statuses["step_99"].ok and not marker.exists()
    assert cli.main(["verify", str(run)]) == 1
    assert not marker.exists()


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_dcp_storage_outside_the_checkpoint_is_refused(run: Path, pristine: tuple[Path, Path], tmp_path: Path, where: str) -> None:
    """Finding 3: ``_StorageInfo.relative_path`` leaving the step directory."""
    target = plant_dcp(run, pristine[1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    info = next(v for k, v in pickle.loads((target / ".metadata").read_bytes()).storage_data.items() if k.fqn == "shared/0")
    stored = (target / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
    (elsewhere / "x.distcp").write_bytes(stored)  # the very tensor, only somewhere else
    outside = str(elsewhere / "x.distcp") if where == "absolute" else os.path.relpath(elsewhere / "x.distcp", target)
    size = len(stored)
    rewrite_metadata(target, lambda md: point_key_at(md, "shared/0", outside, size, as_bytes=False))
    reseal_dcp(target)
    session, _, result = restore_fresh(run)
    session.close()
    assert result is not None and result.step == 4 and target in result.skipped
    status = {Path(s.path).name: s for s in verify_run(run)}["step_99"]
    assert not status.ok and "outside" in str(status.error)


# --- retention counts only checkpoints that verify (finding 2) ----------------------------------


def flip_byte(path: Path, at: int = 17) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x40
    path.write_bytes(bytes(raw))


def resume_and_checkpoint(run_dir: Path, steps: int, keep_last: int | None = 1) -> coci.RestoreResult | None:
    """A restarted run: restore, train ``steps`` more steps checkpointing every 2, close."""
    state = build_state(seed=7)
    with coci.Session(run_dir, state=state, policy=coci.EveryN(2), keep_last=keep_last) as session:
        result = session.restore()
        train(session, state, steps)
    return result


def committed(run_dir: Path) -> list[int]:
    return [step for step, _ in layout.committed_steps(layout.checkpoints_dir(run_dir))]


@pytest.mark.parametrize("newer", ["flipped", "planted-huge", "symlinked-huge"])
def test_retention_never_deletes_the_last_good_checkpoint(tmp_path: Path, newer: str) -> None:
    run_dir = tmp_path / "run"
    make_run(run_dir, steps=20, every=10)  # checkpoints 10 and 20
    if newer == "flipped":
        flip_byte(step_dir(run_dir, 20) / layout.DATA_FILENAME)
    elif newer == "planted-huge":
        shutil.copytree(step_dir(run_dir, 20), step_dir(run_dir, 10**12))  # its manifest says 20: never loads
    else:
        elsewhere = tmp_path / "elsewhere"
        shutil.copytree(step_dir(run_dir, 20), elsewhere)
        step_dir(run_dir, 10**12).symlink_to(elsewhere, target_is_directory=True)
    first = resume_and_checkpoint(run_dir, 2)  # restores the newest good one, commits 2 steps later
    expected = 10 if newer == "flipped" else 20
    assert first is not None and first.step == expected
    assert expected + 2 in committed(run_dir)
    second = resume_and_checkpoint(run_dir, 2)  # the next start still finds a good checkpoint
    assert second is not None and second.step == expected + 2


def test_restored_checkpoint_survives_until_a_newer_one_commits(tmp_path: Path) -> None:
    """A run that restores and fails before its first commit leaves the restored checkpoint alone,
    even with newer unloadable ones around and ``keep_last=1``."""
    run_dir = tmp_path / "run"
    make_run(run_dir, steps=20, every=10)
    flip_byte(step_dir(run_dir, 20) / layout.DATA_FILENAME)
    result = resume_and_checkpoint(run_dir, 1)  # no checkpoint of its own
    assert result is not None and result.step == 10
    assert 10 in committed(run_dir)


# --- restore is all-or-nothing; any failure falls back (findings 5, 6, 8) -----------------------


def edit_local(run_dir: Path, step: int, edit: Any) -> None:
    """``edit(raw manifest)`` then re-seal, as a forger would."""
    path = step_dir(run_dir, step) / layout.MANIFEST_FILENAME
    raw = json.loads(path.read_text())
    edit(raw)
    sealed = coci.checkpoint.local.Manifest.model_validate(raw).sealed()
    path.write_text(sealed.model_dump_json())


def set_session_steps(raw: dict) -> None:
    raw["skeleton"]["__coci__"]["steps"] = float("inf")


def set_np_overflow(raw: dict) -> None:
    raw["skeleton"]["__coci__"]["steps"] = {"__np__": "<i1", "value": 10**30}


def set_void_scalar(raw: dict) -> None:
    """An extra optimizer hyper-parameter that numpy would build as a 300 MB void scalar."""
    raw["skeleton"]["optimizer"]["param_groups"][0]["extra"] = {"__np__": "V8", "value": 300_000_000}


def drop_optimizer_param(raw: dict) -> None:
    raw["skeleton"]["optimizer"]["param_groups"][0]["params"].pop()


def shrink_model_tensor(raw: dict) -> None:
    """The model's bias saved as a shorter tensor (the table stays consistent)."""
    bias = raw["skeleton"]["model"]["bias"]["__tensor__"]
    entry = raw["tensors"][bias]
    entry["shape"] = [entry["shape"][0] - 1]
    entry["nbytes"] -= 4


EDITS = {
    "steps-infinity": set_session_steps,
    "np-overflow": set_np_overflow,
    "np-void-300MB": set_void_scalar,
    "optimizer-layout": drop_optimizer_param,
    "model-shape": shrink_model_tensor,
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_rejected_checkpoint_falls_back_and_applies_nothing(tmp_path: Path, edit: str) -> None:
    run_dir = tmp_path / "run"
    weights = make_run(run_dir, steps=4, every=2)
    edit_local(run_dir, 4, EDITS[edit])
    session, state, result = restore_fresh(run_dir)
    session.close()
    assert result is not None and result.step == 2 and step_dir(run_dir, 4) in result.skipped
    assert all(torch.equal(state["model"].state_dict()[k], v) for k, v in weights[2].items())
    shutil.rmtree(step_dir(run_dir, 2))  # the only candidate is the rejected one: nothing applied
    fresh = build_state(seed=123)["model"].state_dict()
    session2 = coci.Session(run_dir, state=(state := build_state(seed=123)), policy=coci.EveryN(1000))
    with pytest.raises(coci.CorruptCheckpointError):
        session2.restore()
    session2.close()
    assert all(torch.equal(state["model"].state_dict()[k], v) for k, v in fresh.items())
    assert session2.steps == 0


def test_dcp_failures_fall_back(run: Path, pristine: tuple[Path, Path]) -> None:
    """A DCP index of 2**40 (MemoryError before) and a storage range DCP cannot load (its
    CheckpointException is a BaseException) are both skipped."""
    huge = plant_dcp(run, pristine[1], step=98)

    def huge_index(raw: dict) -> None:
        raw["shared"]["tensors"][0]["index"] = 2**40

    reseal_dcp(huge, huge_index)
    short = plant_dcp(run, pristine[1], step=99)

    def truncate_range(metadata: Any) -> None:
        for index, info in metadata.storage_data.items():
            if index.fqn == "shared/0":
                info.length = 8

    rewrite_metadata(short, truncate_range)
    reseal_dcp(short)
    session, _, result = restore_fresh(run)
    session.close()
    assert result is not None and result.step == 4 and result.skipped == (short, huge)


# --- one writer per run directory (finding 4) ---------------------------------------------------


def test_second_session_in_one_process_is_refused(tmp_path: Path) -> None:
    first = coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000))
    with pytest.raises(coci.RunDirLockedError, match=f"pid={os.getpid()} host="):
        coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000))
    first.close()
    coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000)).close()  # free again after close


def test_a_session_whose_restore_raised_holds_its_lock_until_closed(run: Path) -> None:
    """A failed restore leaves the session open (the user may retry with ``strict=False`` or train
    from scratch), so it stays the run directory's writer; ``close()`` or a ``with`` block frees it."""
    for step in (2, 4):  # no committed checkpoint loads
        data = step_dir(run, step) / "data.bin"
        damaged = bytearray(data.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        data.write_bytes(bytes(damaged))

    def session() -> coci.Session:
        return coci.Session(run, state=build_state(), policy=coci.EveryN(1000))

    first = session()
    with pytest.raises(coci.CorruptCheckpointError):
        first.restore()
    with pytest.raises(coci.RunDirLockedError):
        session()
    first.close()
    with pytest.raises(coci.CorruptCheckpointError), session() as second:
        second.restore()
    session().close()  # the with block closed the session whose restore raised


# --- property: any re-sealed manifest mutation restores the previous good checkpoint or is refused


def leaf_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path of keys/indices into a JSON document (containers included)."""
    paths = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += leaf_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            paths += leaf_paths(value, (*prefix, index))
    return paths


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**40, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["float32", "object", "V8", "../data.bin", "/etc/passwd", ".metadata", "__coci__", "qint8"]),
    st.none(),
    st.booleans(),
    st.builds(nested, st.sampled_from([2, 150, 900])),
    st.sampled_from([{"__np__": "V8", "value": 10**8}, {"__tensor__": 0}, {"__ndarray__": 10**9}, {"__dtype__": "Tensor"}]),
    st.lists(st.integers(min_value=0, max_value=2**40), max_size=4),
)


def reseal_local(path: Path, raw: Any) -> None:
    """Write ``raw`` as the manifest, sealed the library's way when it still parses as one."""
    try:
        text = coci.checkpoint.local.Manifest.model_validate(raw).sealed().model_dump_json()
    except Exception:  # not a manifest any more: written unsealed, as damage
        text = json.dumps(raw)
    (path / layout.MANIFEST_FILENAME).write_text(text)


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("property") / "run"
    make_run(run_dir, steps=4, every=2)
    return run_dir, json.loads((step_dir(run_dir, 4) / layout.MANIFEST_FILENAME).read_text())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.slow  # restores once per mutation
def test_any_resealed_mutation_restores_the_previous_good_or_refuses(two_checkpoints: tuple[Path, dict], data: Any) -> None:
    import copy
    import resource

    run_dir, manifest = two_checkpoints
    paths = leaf_paths(manifest)
    target = data.draw(st.sampled_from(paths[1:]), label="field")
    value = data.draw(HOSTILE_VALUES, label="value")
    mutated = copy.deepcopy(manifest)
    node = mutated
    for key in target[:-1]:
        node = node[key]
    node[target[-1]] = value
    saved = (step_dir(run_dir, 4) / layout.MANIFEST_FILENAME).read_text()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        reseal_local(step_dir(run_dir, 4), mutated)
        try:
            session, state, result = restore_fresh(run_dir)
            session.close()
        except coci.CorruptCheckpointError:
            result = None
        if result is not None and result.step == 4:  # harmless: the mutation changed nothing loaded
            assert result.skipped == ()
        elif result is not None:
            assert result.step == 2 and result.skipped == (step_dir(run_dir, 4),)
    finally:
        (step_dir(run_dir, 4) / layout.MANIFEST_FILENAME).write_text(saved)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert grown_kib < 256 * 1024, f"restore's peak memory grew by {grown_kib} KiB"


# --- clear errors instead of tracebacks (finding 7) and the low ones (finding 8) ----------------

PLAN_ARGS = ["plan", "--step-seconds", "0.25", "--stall-seconds", "0.4", "--persist-seconds", "6"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mtbf", "1e300", "--total-steps", "10000"], "at most"),
        (["--mtbf", "8h", "--weibull-shape", "1e-9", "--total-steps", "10000"], "shape must lie in"),
        (["--mtbf", "8h", "--total-steps", "1000000000000"], "PLAN_MAX_CHECKPOINTS"),
    ],
    ids=["mtbf-1e300", "weibull-shape-1e-9", "total-steps-1e12"],
)
def test_plan_refuses_overflowing_inputs_clearly(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert cli.main(PLAN_ARGS + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_verify_and_ls_report_a_deeply_nested_manifest(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = step_dir(run, 4) / layout.MANIFEST_FILENAME
    manifest.write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(["verify", str(run)]) == 1
    assert cli.main(["ls", str(run)]) == 0
    assert cli.main(["ls", "--no-verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "step_4" in out or "4" in out


def test_oversized_manifest_is_refused_before_parsing(run: Path) -> None:
    with coci.knobs.override(MAX_MANIFEST_BYTES=4096):
        manifest = step_dir(run, 4) / layout.MANIFEST_FILENAME
        manifest.write_text(manifest.read_text()[:-1] + ', "padding": "' + "x" * 8192 + '"}')
        status = {Path(s.path).name: s for s in verify_run(run)}["step_4"]
        assert not status.ok and "MAX_MANIFEST_BYTES" in str(status.error)


def test_session_refuses_huge_mtbf_meta_loss_and_sparse_state_up_front(tmp_path: Path) -> None:
    with pytest.raises(coci.ConfigError, match="at most"):
        coci.Session(tmp_path / "a", state=build_state(), mtbf=1e300)
    with pytest.raises(coci.StateError, match="dense"):
        coci.Session(tmp_path / "b", state={"s": torch.eye(3).to_sparse()}, policy=coci.EveryN(5))
    with coci.Session(tmp_path / "c", state=build_state(), policy=coci.EveryN(5)) as session, pytest.raises(coci.StateError, match="meta"):
        session.step(torch.empty((), device="meta"))


@pytest.mark.parametrize("name", ["profile.json", "events.jsonl", "plan.json"])
def test_run_files_are_not_written_through_symlinks(tmp_path: Path, name: str) -> None:
    with coci.knobs.override(PLAN_IN_BACKGROUND=False):  # the plan is written at step 25, not a second of training later
        outside = tmp_path / "outside.txt"
        outside.write_text("untouched")
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / name).symlink_to(outside)
        with pytest.raises(coci.ConfigError, match="symbolic link"):
            state = build_state()
            with coci.Session(run_dir, state=state, policy="young", mtbf="1h", total_steps=100) as session:
                train(session, state, 25)  # past the warm-up: a plan is written
        assert outside.read_text() == "untouched"


def test_symlinked_stale_tmp_is_unlinked_not_followed(run: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    link = layout.checkpoints_dir(run) / "step_9.tmp"
    link.symlink_to(elsewhere, target_is_directory=True)
    assert layout.remove_stale_tmp(layout.checkpoints_dir(run)) == [link]
    assert not link.is_symlink() and (elsewhere / "keep").read_text() == "mine"


def test_restored_tensor_of_another_shape_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with coci.Session(run_dir, state={"t": torch.ones(3)}, policy=coci.EveryN(1)) as session:
        session.step()
    target = torch.zeros(4)
    with coci.Session(run_dir, state={"t": target}, policy=coci.EveryN(1)) as session, pytest.raises(coci.CorruptCheckpointError, match="'t'"):
        session.restore()
    assert torch.equal(target, torch.zeros(4))


@pytest.mark.parametrize("name", ["events.jsonl", "plan.json", "profile.json", "loss_curve.json"])
def test_report_never_reads_run_files_through_symlinks(run: Path, tmp_path: Path, name: str) -> None:
    from coci.analysis.report.read import read_run

    outside = tmp_path / f"outside_{name}"
    planted = {
        "events.jsonl": json.dumps({"time": 1.0, "event": "commit", "step": 777, "seconds": 1.0}) + "\n",
        "loss_curve.json": json.dumps({"steps": [1, 2, 3], "losses": [3.0, 2.0, 1.0]}),
    }
    if (run / name).exists():
        shutil.move(run / name, outside)  # the run's own valid file, now reachable only through a link
    else:
        outside.write_text(planted.get(name, "{}"))
    (run / name).symlink_to(outside)
    data = read_run(run)
    assert any(note.startswith(name) and "symbolic link" in note for note in data.notes), data.notes
    assert 777 not in [row.step for row in data.checkpoints]
    assert data.loss_steps != [1.0, 2.0, 3.0]


def test_a_fifo_or_an_oversized_line_in_place_of_the_event_log_never_blocks_or_swells(run: Path) -> None:
    import threading

    from coci.analysis.report.read import read_run
    from coci.events import MAX_EVENT_LINE_BYTES, read_events
    from coci.preemption import last_event_time

    events = run / "events.jsonl"
    kept = events.read_text()
    events.unlink()
    os.mkfifo(events)  # opening a FIFO for reading blocks until a writer comes: none will
    outcome: list[Any] = []
    reader = threading.Thread(target=lambda: outcome.append((list(read_events(run)), last_event_time(events))), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert outcome == [([], None)]
    events.unlink()
    huge = json.dumps({"time": 2.0, "event": "note", "message": "x" * (MAX_EVENT_LINE_BYTES + 10)})
    events.write_text(huge + "\n" + kept)
    assert len(list(read_events(run))) == len(kept.splitlines())  # the long line is skipped, the rest read
    assert read_run(run).checkpoints
