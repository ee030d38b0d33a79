"""``Session(persist="process")``: a helper process writes and commits from the shared-memory arena.

Its checkpoints are the thread's, byte for byte; a helper SIGKILLed inside a persist fails that
checkpoint with PersistError (nothing committed) and the next checkpoint starts a new helper; a
helper never outlives its SIGKILLed training process. (The kill-and-resume and corruption tests
run in both modes too: tests/integration/test_resume_kill.py, tests/unit/test_corruption.py.)
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ckpt_helpers import build_state, events_of, restore_fresh, step_dir, train

import coci
from coci import knobs
from coci.checkpoint import faults
from coci.checkpoint.checkpointer import load_entry

JOB = Path(__file__).resolve().parents[1] / "jobs" / "train_job.py"


@pytest.fixture(autouse=True)
def no_fault_hook() -> Iterator[None]:
    yield
    faults.set_fault_hook(None)


def helper_pid(session: coci.Session) -> int:
    pid = session._checkpointer.persist_pid
    assert pid is not None
    return pid


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, seconds: float = 120.0) -> bool:
    deadline = time.monotonic() + seconds  # generous: the machine may be loaded
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


@pytest.mark.parametrize("persist", ["fork", 1])
def test_an_unknown_persist_mode_is_refused(tmp_path: Path, persist: object) -> None:
    with pytest.raises(coci.ConfigError, match="persist"):
        coci.Session(tmp_path, state=build_state(), persist=persist)  # type: ignore[arg-type]


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    return a == b


def test_the_process_writes_what_the_thread_writes(tmp_path: Path) -> None:
    saved = {}
    for persist in ("thread", "process"):
        state = build_state()
        with coci.Session(tmp_path / persist, state=state, policy=coci.EveryN(3), keep_last=None, persist=persist) as session:
            train(session, state, 6)
        assert [e["mode"] for e in events_of(tmp_path / persist, "persist_mode")] == ([] if persist == "thread" else ["process"])
        saved[persist] = [load_entry(step_dir(tmp_path / persist, step), (key,)) for step in (3, 6) for key in ("model", "optimizer")]
    assert all(entry is not None for entry in saved["process"])
    assert same(saved["thread"], saved["process"])  # the profiler's entry holds timings: not compared
    session, restored, result = restore_fresh(tmp_path / "process")
    session.close()
    assert result is not None and result.step == 6


def test_a_helper_killed_inside_a_persist_fails_that_checkpoint_and_the_next_starts_a_new_one(tmp_path: Path) -> None:
    state = build_state()
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(1000), keep_last=None, persist="process", on_error="log")
    first = helper_pid(session)

    def kill_helper(point: str) -> None:
        if point == "mid_write":  # the helper has written part of data.bin and waits for us
            os.kill(first, signal.SIGKILL)
            assert wait_gone(first)

    train(session, state, 2)
    faults.set_fault_hook(kill_helper)
    failed = session.checkpoint()
    assert isinstance(failed.upload_completion.exception(), coci.PersistError)
    faults.set_fault_hook(None)
    assert not step_dir(tmp_path, 2).exists()  # never committed
    weights = train(session, state, 1)
    done = session.checkpoint().upload_completion.result()
    assert done.step == 3 and helper_pid(session) != first
    session.close()
    assert [e["step"] for e in events_of(tmp_path, "error")] == [2]
    session, restored, result = restore_fresh(tmp_path)
    session.close()
    assert result is not None and result.step == 3
    for name, value in weights[3].items():
        assert torch.equal(restored["model"].state_dict()[name], value), name


def test_a_failing_fault_hook_fails_the_checkpoint_and_keeps_the_helper(tmp_path: Path) -> None:
    state = build_state()
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(1000), keep_last=None, persist="process", on_error="log")
    pid = helper_pid(session)

    def refuse(point: str) -> None:
        if point == "before_rename":
            raise RuntimeError("injected before the rename")

    faults.set_fault_hook(refuse)
    train(session, state, 1)
    error = session.checkpoint().upload_completion.exception()
    assert isinstance(error, RuntimeError) and "injected" in str(error)
    faults.set_fault_hook(None)
    assert not step_dir(tmp_path, 1).exists()
    train(session, state, 1)
    assert session.checkpoint().upload_completion.result().step == 2
    assert helper_pid(session) == pid  # an error inside the commit is not the helper's death
    session.close()
    assert wait_gone(pid)  # close() ends the helper


def test_the_helper_ignores_sigterm_meant_for_the_process_group(tmp_path: Path) -> None:
    state = build_state()
    with coci.Session(tmp_path, state=state, policy=coci.EveryN(1000), persist="process") as session:
        pid = helper_pid(session)
        train(session, state, 1)
        session.checkpoint().upload_completion.result()  # the helper is up and serving
        os.kill(pid, signal.SIGTERM)
        train(session, state, 1)
        assert session.checkpoint().upload_completion.result().step == 2
        assert helper_pid(session) == pid


def test_a_stopped_helper_fails_its_checkpoint_within_the_deadline_and_is_replaced(tmp_path: Path) -> None:
    state = build_state()
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(1000), keep_last=None, persist="process")
    stopped = helper_pid(session)
    try:
        train(session, state, 1)
        assert session.checkpoint().upload_completion.result().step == 1  # the helper is up and serving
        with knobs.override(PERSIST_DEADLINE_SECONDS=2.0, PERSIST_DEADLINE_BYTES_PER_SECOND=1e12):
            os.kill(stopped, signal.SIGSTOP)  # as a cgroup freezer or a debugger would
            train(session, state, 1)
            failed = session.checkpoint()
            error = failed.upload_completion.exception(timeout=300)  # generous: the machine may be loaded; a hang fails here
            assert isinstance(error, coci.PersistError) and "answered nothing" in str(error)
            with pytest.raises(coci.PersistError, match="answered nothing"):
                train(session, state, 1)  # on_error="raise": the failure surfaces at the next step
        assert wait_gone(stopped)  # killed, never left stopped
        assert not step_dir(tmp_path, 2).exists()
        train(session, state, 1)
        assert session.checkpoint().upload_completion.result().step == 4
        assert helper_pid(session) != stopped
        session.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGKILL)
    assert [e["step"] for e in events_of(tmp_path, "error")] == [2]
    _, restored, result = restore_fresh(tmp_path)
    _.close()
    assert result is not None and result.step == 4


@pytest.mark.parametrize("on_error", ["log", "raise"])
def test_a_staging_arena_that_cannot_be_allocated_is_a_recorded_persist_error(tmp_path: Path, on_error: str) -> None:
    state = build_state()
    with coci.Session(tmp_path, state=state, policy=coci.EveryN(2), persist="process", on_error=on_error) as session:  # type: ignore[arg-type]
        train(session, state, 1)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no file descriptor left: memfd_create fails
        try:
            if on_error == "log":
                train(session, state, 1)  # step 2's checkpoint cannot allocate its arena: recorded, training goes on
            else:
                with pytest.raises(coci.PersistError, match="OSError"):
                    train(session, state, 1)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert [(e["step"], e["phase"]) for e in events_of(tmp_path, "error")] == [(2, "snapshot")]
        train(session, state, 2)
        session.wait()
    assert step_dir(tmp_path, 4).is_dir() and not step_dir(tmp_path, 2).exists()


@pytest.mark.parametrize("pythonpath", ["", "trailing-empty-entry"])
def test_the_helper_never_imports_modules_planted_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pythonpath: str
) -> None:
    planted, marker = tmp_path / "planted", tmp_path / "imported"
    planted.mkdir()
    for module in ("json", "crc32c", "numpy", "pickle", "sitecustomize"):
        (planted / f"{module}.py").write_text(f"open({str(marker)!r}, 'a').write({module!r} + '\\n')\n")
    monkeypatch.chdir(planted)  # training started from a folder holding planted modules
    if pythonpath:  # "$X:$PYTHONPATH" with PYTHONPATH unset: an empty entry Python reads as the working directory
        monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", "") + os.pathsep)
    state = build_state()
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(1000), persist="process") as session:
        train(session, state, 1)
        assert session.checkpoint().upload_completion.result().step == 1  # the helper ran: imported and wrote
    assert not marker.exists(), marker.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("kill", [("--die-at", "12", "--state-mb", "40"), ("--die-in-persist", "mid_write")], ids=["at-a-step", "mid-write"])
def test_no_helper_outlives_a_sigkilled_training_process(tmp_path: Path, kill: tuple[str, ...]) -> None:
    cmd = [sys.executable, str(JOB), str(tmp_path), "--steps", "40", "--every", "5", "--persist", "process", *kill]
    assert subprocess.run(cmd, timeout=600, capture_output=True).returncode == -signal.SIGKILL
    pids = [e["pid"] for e in events_of(tmp_path, "persist_mode")]
    assert len(pids) == 1 and pids[0] is not None
    assert wait_gone(pids[0])
