"""A word-language-model style job (``tests/jobs/rnn_job.py``: an index walk, a carried hidden
state, scalars) SIGKILLed and restarted ends bitwise equal to an uninterrupted run. The in-process
patterns: ``tests/unit/test_own_state.py``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_job import losses

RNN_JOB = Path(__file__).resolve().parents[1] / "jobs" / "rnn_job.py"


def _run_rnn(run_dir: Path, *extra: str) -> int:
    command = [sys.executable, str(RNN_JOB), str(run_dir), "--epochs", "3", "--every", "4", *extra]
    return subprocess.run(command, timeout=300, capture_output=True).returncode


@pytest.mark.slow
def test_sigkilled_index_walk_rnn_job_is_bitwise_equal_to_uninterrupted(tmp_path: Path) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    assert _run_rnn(reference) == 0
    for die_at in (3, 14, 29):  # mid-epoch, epoch 2 (after an evaluation), epoch 3
        assert _run_rnn(killed, "--die-at", str(die_at)) == -signal.SIGKILL
    assert _run_rnn(killed) == 0
    want = torch.load(reference / "final.pt", weights_only=True)
    got = torch.load(killed / "final.pt", weights_only=True)
    assert got["steps"] == want["steps"] == 42
    assert got["scalars"] == want["scalars"]
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    reference_losses = {step: values.pop() for step, values in losses(reference).items()}
    resumed = losses(killed)
    assert set(resumed) == set(reference_losses)
    for step, values in resumed.items():  # steps recomputed after a resume give the same loss
        assert values == {reference_losses[step]}, step
    _assert_restart_cost_includes_start_up(killed, restarts=2)  # the kill at step 3 left no checkpoint


def _assert_restart_cost_includes_start_up(run_dir: Path, restarts: int) -> None:
    """Each restarted process reports a restart cost from its own start (interpreter, imports,
    model build, restore) to its first step, and the profile keeps every one across restarts."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    startup = {e["pid"]: e["startup_seconds"] for e in events if e["event"] == "session"}
    restores = [e for e in events if e["event"] == "restore"]
    measured = [e for e in events if e["event"] == "restart"]
    assert len(measured) == len(restores) == restarts
    for restart, restore in zip(measured, restores):
        assert restart["seconds"] >= startup[restart["pid"]] > 0.0  # start-up is part of it
        assert restart["seconds"] > restore["seconds"]
    profile = json.loads((run_dir / "profile.json").read_text())
    assert profile["restart_seconds"]["count"] == restarts
