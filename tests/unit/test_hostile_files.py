"""What a hostile or broken file system does to a run directory, a checkpoint and a shared-directory
remote: real FIFOs, real symbolic and hard links, a real full disk (a 30 MB tmpfs), a real
interpreter exit with a checkpoint in flight. Every reader and writer goes through
:mod:`coci.safe_files`; these tests plant each thing where coci reads or writes, and check that
nothing is followed, nothing blocks, and each refusal is a typed coci error naming the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import build_state, events_of, make_run, restore_fresh, step_dir, train

import coci
from coci import cli
from coci.checkpoint import layout
from coci.checkpoint.remote.filesystem import DirectoryStore

#: How long an operation may take before it counts as hung (generous: a loaded 2-core machine).
HANG_SECONDS = 60

REPO = Path(__file__).parents[2]


def finishes(action: Callable[[], Any], fifos: list[Path]) -> tuple[Any, BaseException | None]:
    """Run ``action`` in a thread; fail the test when it is still blocked after HANG_SECONDS. The
    FIFOs are opened read-write afterwards either way, which frees an opener stuck on them."""
    outcome: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            outcome.append((action(), None))
        except BaseException as exc:  # the test inspects it
            outcome.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=HANG_SECONDS)
    for fifo in fifos:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    assert outcome, f"{action} blocked on a FIFO for {HANG_SECONDS} s"
    return outcome[0]


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


def test_a_process_forked_while_the_lock_is_held_does_not_hold_it(tmp_path: Path) -> None:
    """A DataLoader worker forked from the trainer outlives a SIGKILLed trainer by seconds: its copies
    of the lock's descriptors must not keep the restarted run out."""
    from coci.checkpoint.run_lock import RunLock

    lock = RunLock.acquire(tmp_path)
    read_end, write_end = os.pipe()
    started_read, started_write = os.pipe()
    child = os.fork()
    if child == 0:  # a worker: says it runs, then waits, holding whatever descriptors it kept
        os.write(started_write, b"x")
        os.read(read_end, 1)
        os._exit(0)
    try:
        os.read(started_read, 1)
        lock.release()  # the trainer is gone; its worker is not
        RunLock.acquire(tmp_path).release()
    finally:
        os.write(write_end, b"x")
        os.waitpid(child, 0)
        for fd in (read_end, write_end, started_read, started_write):
            os.close(fd)


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


# --- a full disk (finding 2) ---------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 30 MB tmpfs (skipped where this process may not mount one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; return the filler."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * (1 << 16))
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_raises_persist_errors_keeps_counting_and_never_hangs(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    state = {"model": torch.nn.Linear(512, 1024), "optimizer": None}
    state["optimizer"] = torch.optim.SGD(state["model"].parameters(), lr=0.01)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(3), keep_last=1)
    filler = fill(small_disk)
    raised: list[BaseException] = []

    def steps(count: int) -> None:
        for _ in range(count):
            state["optimizer"].zero_grad()
            state["model"](torch.randn(4, 512)).sum().backward()
            state["optimizer"].step()
            try:
                session.step()
            except coci.PersistError as exc:
                raised.append(exc)

    _, error = finishes(lambda: steps(20), [])
    assert error is None, f"step() raised {error!r}, not a PersistError"
    # Whether the error events were refused too depends on what a failed checkpoint's clean-up frees;
    # the RLIMIT_FSIZE test below refuses them for certain.
    assert session.steps == 20 and raised
    _, error = finishes(session.wait, [])
    assert error is None or isinstance(error, coci.PersistError)
    filler.unlink()  # space again: the next checkpoint commits
    _, error = finishes(lambda: steps(3), [])
    assert error is None and session.steps == 23
    _, error = finishes(session.wait, [])
    assert error is None
    _, error = finishes(session.close, [])
    assert error is None or isinstance(error, coci.PersistError)
    session2 = coci.Session(run_dir, state=state, policy=coci.EveryN(1000))
    assert session2.restore().step == 21  # type: ignore[union-attr]
    session2.close()


FILE_SIZE_LIMIT = r"""
import json, os, resource, signal, sys
import torch
import coci

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
model = torch.nn.Linear(512, 1024)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
session = coci.Session(sys.argv[1], state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(3), keep_last=1)
events = os.path.join(sys.argv[1], "events.jsonl")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(events) + 64, hard))  # no file may grow much more
raised, other = 0, []

def steps(count):
    global raised
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(4, 512)).sum().backward()
        optimizer.step()
        try:
            session.step()
        except coci.PersistError:
            raised += 1
        except Exception as exc:
            other.append(repr(exc))

steps(20)
try:
    session.wait()
except coci.PersistError:
    raised += 1
full = {"steps": session.steps, "raised": raised, "other": other, "lost": getattr(session.events, "lost", 0)}
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
steps(3)
session.wait()
session.close()
print(json.dumps({**full, "after": session.steps}))
"""


@pytest.mark.slow  # a new Python process importing torch
def test_files_that_may_not_grow_raise_persist_errors_and_never_hang(tmp_path: Path) -> None:
    """The full disk of the test above where no tmpfs can be mounted: ``RLIMIT_FSIZE`` in a real
    process refuses every write that grows a file (data files and the event log alike)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["other"] == [] and outcome["steps"] == 20 and outcome["raised"] > 0 and outcome["lost"] > 0
    assert outcome["after"] == 23
    assert [step for step, _ in layout.committed_steps(layout.checkpoints_dir(tmp_path))] == [21]


# --- an interpreter exit with a checkpoint in flight (finding 17) -------------------------------------

EXIT_MID_PERSIST = r"""
import signal, sys, time
import torch
import coci
from coci import knobs
from coci.checkpoint import faults, layout

knobs.WRITE_CHUNK_BYTES = 1 << 20  # several chunks, each checksummed on the checksum thread
faults.set_fault_hook(lambda point: time.sleep(2) if point == "mid_write" else None)  # the exit comes mid-write
state = {"weights": torch.arange(8 << 20, dtype=torch.float32)}
session = coci.Session(sys.argv[1], state=state, policy=coci.EveryN(1000))
session.checkpoint()
signal.raise_signal(signal.SIGINT)  # KeyboardInterrupt: the interpreter exits without close()
"""


@pytest.mark.slow  # a new Python process importing torch
def test_a_checkpoint_persisting_when_the_interpreter_exits_is_finished(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", EXIT_MID_PERSIST, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert "KeyboardInterrupt" in done.stderr, done.stderr
    weights = torch.zeros(8 << 20)
    with coci.Session(tmp_path, state={"weights": weights}, policy=coci.EveryN(1000)) as session:
        result = session.restore()
    assert result is not None and result.step == 0, done.stderr
    assert torch.equal(weights, torch.arange(8 << 20, dtype=torch.float32))
