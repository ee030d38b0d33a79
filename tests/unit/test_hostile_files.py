"""What a hostile or broken file system does to a run directory, a checkpoint and a shared-directory
remote: real FIFOs, real symbolic and hard links (a real full disk, an interpreter exit with a
checkpoint in flight and a forked worker start processes: ``tests/integration/test_hostile_processes.py``).
Every reader and writer goes through
:mod:`coci.safe_files`; these tests plant each thing where coci reads or writes, and check that
nothing is followed, nothing blocks, and each refusal is a typed coci error naming the path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import build_state, events_of, make_run, restore_fresh, step_dir, train
from hang_checks import finishes

import coci
from coci import cli
from coci.checkpoint import layout
from coci.checkpoint.remote.filesystem import DirectoryStore


def plant_fifo(path: Path) -> Path:
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished single-process run with checkpoints 2 and 4 (and its run files)."""
    base = tmp_path_factory.mktemp("hostile_files")
    make_run(base / "run", steps=4, every=2)
    return base / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path / "run")
    return tmp_path / "run"


# --- FIFOs: nothing blocks (finding 5) and each is a typed error (finding 19) ----------------------


@pytest.mark.parametrize("name", [layout.MANIFEST_FILENAME, layout.DATA_FILENAME])
def test_a_fifo_in_a_checkpoint_is_skipped_by_restore_and_reported_by_verify_and_ls(
    run: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = plant_fifo(step_dir(run, 4) / name)

    def restore() -> Any:
        session, _, result = restore_fresh(run)
        session.close()
        return result

    result, error = finishes(restore, [fifo])
    assert error is None and result.step == 2 and [p.name for p in result.skipped] == ["step_4"]
    assert "not a regular file" in events_of(run, "restore_skip")[-1]["message"]
    status, error = finishes(lambda: cli.main(["verify", str(run)]), [fifo])
    assert error is None and status == (cli.EXIT_CORRUPT if name == layout.DATA_FILENAME else cli.EXIT_OK)  # no manifest: not committed
    assert any("step_4" in line and "not a regular file" in line for line in capsys.readouterr().out.splitlines())
    status, error = finishes(lambda: cli.main(["ls", str(run)]), [fifo])
    assert error is None and status in (cli.EXIT_OK, cli.EXIT_CORRUPT)


def test_a_fifo_event_log_refuses_the_session_with_a_coci_error(tmp_path: Path) -> None:
    fifo = plant_fifo(tmp_path / "events.jsonl")
    _, error = finishes(lambda: coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000)), [fifo])
    assert isinstance(error, coci.ConfigError) and "events.jsonl is not a regular file" in str(error)


@pytest.mark.parametrize("name", ["profile.json", "loss_curve.json"])
def test_a_fifo_run_file_fails_close_with_a_coci_error_not_a_hang(tmp_path: Path, name: str) -> None:
    state = build_state()
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(1000))
    train(session, state, 3)
    fifo = plant_fifo(tmp_path / name)
    _, error = finishes(session.close, [fifo])
    assert isinstance(error, coci.ConfigError) and f"{name} is not a regular file" in str(error)
    assert events_of(tmp_path, "close")  # the rest of close() ran: its event, the lock released
    fifo.unlink()
    coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000)).close()


def test_a_fifo_lock_file_or_a_directory_event_log_is_a_coci_error(tmp_path: Path) -> None:
    plant_fifo(tmp_path / "coci.lock")
    with pytest.raises(coci.ConfigError, match="coci.lock is not a regular file"):
        coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000))
    other = tmp_path / "other"
    (other / "events.jsonl").mkdir(parents=True)
    with pytest.raises(coci.ConfigError, match="events.jsonl is not a regular file"):
        coci.Session(other, state=build_state(), policy=coci.EveryN(1000))


# --- symbolic and hard links: never followed (findings 6, 15, 18) --------------------------------------


@pytest.mark.parametrize("name", ["report.json", "report.html", "report_loss.png"])
@pytest.mark.slow  # renders the report's figures per case
def test_report_files_are_never_written_through_a_planted_link(run: Path, tmp_path: Path, name: str) -> None:
    from coci.analysis.report import report
    from coci.analysis.report.figures import FIGURES

    assert name in {"report.json", "report.html", *FIGURES.values()}
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (run / name).symlink_to(victim)
    with pytest.raises(coci.ConfigError, match=f"{name} is a symbolic link"):
        report(run, simulate_trials=10).write()
    assert victim.read_text() == "mine"


@pytest.mark.slow  # renders every figure
def test_report_files_are_never_written_into_a_hard_linked_file(run: Path, tmp_path: Path) -> None:
    from coci.analysis.report import report

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    os.link(victim, run / "report.json")
    report(run, simulate_trials=10).write()  # replaced by a new file: the shared inode is not written
    assert victim.read_text() == "mine" and (run / "report.json").stat().st_ino != victim.stat().st_ino


def test_the_write_probe_never_creates_a_file_through_a_planted_link(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = tmp_path / "created_through_the_link"
    (run_dir / f".coci-write-test-{os.getpid()}").symlink_to(target)
    coci.Session(run_dir, state=build_state(), policy=coci.EveryN(1000)).close()
    assert not target.exists()


@contextlib.contextmanager
def process_group(kind: str, store: Path) -> Iterator[None]:
    """``"dcp"``: a real one-process gloo group (the session writes DCP checkpoints, as every
    multi-process job does); ``"local"``: none."""
    import torch.distributed as dist

    if kind == "dcp":
        dist.init_process_group("gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        if kind == "dcp":
            dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["local", "dcp"])
def test_a_symlinked_checkpoints_directory_is_never_written_read_or_pruned(tmp_path: Path, kind: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    make_run(elsewhere, steps=4, every=2)  # step_2 and step_4 of another run: retention must not touch them
    kept = sorted(p.name for p in layout.checkpoints_dir(elsewhere).iterdir())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    layout.checkpoints_dir(run_dir).symlink_to(layout.checkpoints_dir(elsewhere), target_is_directory=True)
    state = build_state()
    with process_group(kind, tmp_path / "store"):
        session = coci.Session(run_dir, state=state, policy=coci.EveryN(1), keep_last=1)
        with pytest.raises(coci.CorruptCheckpointError, match="checkpoints is a symbolic link"):
            session.restore()
        with pytest.raises(coci.PersistError, match="checkpoints is a symbolic link"):
            train(session, state, 6)
            session.wait()
        with contextlib.suppress(coci.PersistError):
            session.close()
    assert sorted(p.name for p in layout.checkpoints_dir(elsewhere).iterdir()) == kept


# --- the run lock cannot be unlinked away (finding 12) ------------------------------------------------


def test_deleting_the_lock_file_does_not_let_a_second_session_in(tmp_path: Path) -> None:
    first = coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000))
    (tmp_path / "coci.lock").unlink()
    with pytest.raises(coci.RunDirLockedError, match="in use by another coci session"):
        coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000))
    first.close()
    coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000)).close()


# --- a shared-directory remote (findings 3, 5) ---------------------------------------------------------


def test_a_planted_partial_link_never_truncates_the_file_it_points_to(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "remote")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    (tmp_path / "remote" / "step_5").mkdir(parents=True)
    (tmp_path / "remote" / "step_5" / f"manifest.json.{os.getpid()}.partial").symlink_to(victim)
    store.put_bytes("step_5/manifest.json", b"{}")
    assert victim.read_text() == "the user's file"
    assert store.get_bytes("step_5/manifest.json", 100) == b"{}"


def test_a_symlinked_step_directory_of_the_remote_is_never_written_read_or_deleted(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "remote")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.bin").write_bytes(b"someone else's")
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "step_7").symlink_to(outside, target_is_directory=True)
    with pytest.raises(coci.CorruptCheckpointError, match="step_7 is a symbolic link"):
        store.put_bytes("step_7/manifest.json", b"{}")
    with pytest.raises(coci.CorruptCheckpointError, match="step_7 is a symbolic link"):
        store.get_bytes("step_7/data.bin", 100)
    assert not store.exists("step_7/data.bin") and store.list_objects() == {}
    store.delete(["step_7/data.bin"])
    assert sorted(p.name for p in outside.iterdir()) == ["data.bin"] and (outside / "data.bin").read_bytes() == b"someone else's"


def test_a_fifo_object_in_the_remote_is_refused_not_waited_on(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "remote")
    store.put_bytes("step_3/data.bin", b"x" * 10)
    fifo = plant_fifo(tmp_path / "remote" / "step_3" / "manifest.json")
    _, error = finishes(lambda: store.get_bytes("step_3/manifest.json", 100), [fifo])
    assert isinstance(error, coci.CorruptCheckpointError) and "not a regular file" in str(error)
    _, error = finishes(lambda: store.get_file("step_3/manifest.json", tmp_path / "dest", 100), [fifo])
    assert isinstance(error, coci.CorruptCheckpointError)
    assert store.list_objects() == {"step_3/data.bin": 10} and not store.exists("step_3/manifest.json")


def test_a_remote_fifo_manifest_lets_restore_fall_back(run: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    store = DirectoryStore(remote)
    store.put_bytes("step_9/data.bin", b"x")
    fifo = plant_fifo(remote / "step_9" / layout.MANIFEST_FILENAME)

    def restore() -> Any:
        with coci.Session(run, state=build_state(seed=5), policy=coci.EveryN(1000), remote=remote) as session:
            return session.restore()

    result, error = finishes(restore, [fifo])
    assert error is None and result.step == 4
