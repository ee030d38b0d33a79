"""The step mark: a process SIGKILLed between events still tells the next process, and the report,
the exact step it reached; a mark that coci did not write is ignored, never trusted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coci.analysis.report import read_run, report
from coci.events import STEP_MARK_FILENAME, StepMark, read_events, read_step_mark

JOB = Path(__file__).resolve().parents[1] / "jobs" / "train_job.py"


def run_job(run_dir: Path, *extra: str) -> int:
    command = [sys.executable, str(JOB), str(run_dir), "--steps", "20", "--every", "5", *extra]
    return subprocess.run(command, timeout=600, capture_output=True).returncode  # generous under load


@pytest.mark.slow
def test_a_kill_between_checkpoints_is_counted_to_the_step_the_process_reached(tmp_path: Path) -> None:
    assert run_job(tmp_path, "--die-at", "13") == -signal.SIGKILL  # checkpoints at 5 and 10; killed at 13
    killed = read_run(tmp_path)
    assert killed.observed.steps == 13  # no event says 13: the last ones are the checkpoint's at 10
    assert max(e.get("step", 0) for e in read_events(tmp_path)) < 13
    # its overhead totals ride on its stall events: the report counts the killed process's time
    assert killed.observed.processes == 1 and killed.observed.step_work_seconds > 0

    assert run_job(tmp_path) == 0
    (restore,) = read_run(tmp_path).restores
    assert restore.failure and restore.reached_step == 13 and restore.lost_exact
    assert restore.lost_steps == 13 - restore.step  # 3 when step 10 had committed, 8 when only 5 had
    summary = report(tmp_path).summary()
    assert f"after a failure, {13 - restore.step} steps lost" in summary, summary
    assert "(counted up to the step each killed process reached)" in summary
    assert read_run(tmp_path).observed.processes == 2


@pytest.mark.slow
def test_a_step_done_before_its_late_step_call_is_counted_lost(tmp_path: Path) -> None:
    """The Hugging Face callback calls ``step()`` for a step at the next one's start; it marks the
    step reached at its end, so a kill in between (an evaluation, an epoch's end) loses that step too."""
    assert run_job(tmp_path, "--die-at", "13", "--mark-next-before-kill") == -signal.SIGKILL
    assert run_job(tmp_path) == 0
    (restore,) = read_run(tmp_path).restores
    assert restore.reached_step == 14 and restore.lost_exact and restore.lost_steps == 14 - restore.step


@pytest.mark.slow
def test_the_restart_after_a_kill_is_measured_from_the_killed_process_not_from_its_step_mark(tmp_path: Path) -> None:
    """The restore event's ``restart_seconds`` is the downtime from the killed process's last event;
    the ``reached`` event the new process writes for the step mark is its own, not the killed one's."""
    assert run_job(tmp_path, "--die-at", "13") == -signal.SIGKILL
    killed_last = max(e["time"] for e in read_events(tmp_path))
    time.sleep(2.0)  # the restart's downtime: at least this long
    assert run_job(tmp_path) == 0
    events = list(read_events(tmp_path))
    reached = [e for e in events if e["event"] == "reached"]
    (restore,) = [e for e in events if e["event"] == "restore"]
    assert reached and reached[0]["step"] == 13 and reached[0]["time"] > killed_last + 2.0
    assert restore["restart_seconds"] >= 2.0, restore


def test_a_mark_round_trips_and_a_planted_one_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / STEP_MARK_FILENAME
    mark = StepMark(path)
    mark.set(12345)
    assert read_step_mark(path) == (os.getpid(), 12345)
    mark.close()
    assert read_step_mark(path) == (os.getpid(), 12345)  # the file keeps the last step

    data = path.read_bytes()
    for planted in (b"", data[:-1], data + b"x", b"x" * len(data), data[:16] + (2**62).to_bytes(8, "little"),
                    data[:16] + (-1 & (2**64 - 1)).to_bytes(8, "little")):
        path.write_bytes(planted)
        assert read_step_mark(path) is None, planted
    path.unlink()
    outside = tmp_path / "outside"
    outside.write_bytes(data)
    path.symlink_to(outside)
    assert read_step_mark(path) is None  # never read through a link
    path.unlink()
    os.mkfifo(path)
    assert read_step_mark(path) is None  # never blocks on a planted FIFO


@pytest.mark.parametrize("planted", ["directory", "symlink", "fifo"])
def test_a_step_mark_that_cannot_be_made_never_stops_training(tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    """The mark is a reporting aid: where it cannot be made the session trains and checkpoints on,
    and the report counts lost work up to the last event (a lower bound), as it says."""
    import torch

    import coci

    path = tmp_path / STEP_MARK_FILENAME
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"\0" * 24)
    {"directory": path.mkdir, "symlink": lambda: path.symlink_to(outside), "fifo": lambda: os.mkfifo(path)}[planted]()
    model = torch.nn.Linear(2, 1)
    session = coci.Session(tmp_path, state={"model": model}, policy=coci.EveryN(2))
    for _ in range(4):
        session.step(model(torch.ones(1, 2)).sum())
    session.close()
    assert session.checkpoint_steps == (2, 4)
    assert "no step mark" in caplog.text
    assert outside.read_bytes() == b"\0" * 24  # never written through the link
