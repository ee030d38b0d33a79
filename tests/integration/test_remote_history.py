"""What a two-level plan must promote, and the run's history that survives a lost node, against a
real S3 server (SeaweedFS): real SIGTERMs and SIGKILLs to real training processes
(tests/jobs/preempt_job.py), the run directory deleted in between (the node's disk is gone)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_remote
import torch
from fault_job import compare_final
from test_preemption import lines, wait_for_lines
from test_remote import _small_state, _train, events

import coci
from coci import knobs
from coci.checkpoint.remote import open_store
from coci.checkpoint.remote.history import HISTORY_PREFIX
from coci.checkpoint.remote.tier import committed_steps
from coci.events import read_events

s3_server = test_remote.s3_server  # the fixtures of the real S3 server
s3_remote = test_remote.s3_remote
JOB = Path(__file__).resolve().parents[1] / "jobs" / "preempt_job.py"
ROOT = Path(__file__).resolve().parents[2]
STEPS = 40
TIMEOUT = 600.0  # generous: the machine running the tests may be loaded


def job_args(remote: str, promote: str) -> list[str]:
    return ["--steps", str(STEPS), "--every", "5", "--step-sleep", "0.01", "--remote", remote, "--promote", promote,
            "--mirror-seconds", "0.2", "--grace", "120s"]


def start(run_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(JOB), str(run_dir), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen[bytes]) -> int:
    try:
        return process.wait(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def preempt_at(run_dir: Path, args: list[str], hold: int) -> int:
    """A process that holds after step ``hold`` and gets a real SIGTERM there: the step it committed."""
    process = start(run_dir, *args, "--hold-at", str(hold))
    wait_for_lines(run_dir / "held.txt", len(lines(run_dir / "held.txt")) + 1, "the job to hold")
    process.send_signal(signal.SIGTERM)
    code = finish(process)
    assert code == knobs.PREEMPTED_EXIT_CODE, process.stderr.read().decode()[-3000:] if process.stderr else code
    return int(lines(run_dir / "preempted.txt")[-1].split()[1])


@pytest.mark.slow
def test_two_level_plan_promotes_the_preemption_and_the_final_checkpoint(tmp_path: Path, s3_remote: str) -> None:
    """A two-level plan promotes only step 10; SIGTERM after step 12: the preemption checkpoint
    (13) goes to S3 within the grace anyway, so with the run directory deleted the restart resumes
    at 13 (no step redone) and ends bitwise equal to the uninterrupted run, its final step in S3."""
    reference = tmp_path / "reference"
    done = subprocess.run([sys.executable, str(JOB), str(reference), "--steps", str(STEPS), "--every", "5"], timeout=TIMEOUT, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    run = tmp_path / "run"
    args = job_args(s3_remote, "10")
    assert preempt_at(run, args, hold=12) == 13
    (preempted,) = [e for e in read_events(run) if e["event"] == "preempted"]
    assert preempted["promoted"] is True and preempted["promoted_seconds"] <= preempted["grace_seconds"]
    store = open_store(s3_remote)
    assert committed_steps(store.list_objects()) == [10, 13]  # not 5: the plan promotes only 10

    kept = tmp_path / "losses-before"
    kept.mkdir()
    for path in run.glob("losses_*.txt"):
        shutil.copy(path, kept / path.name)
    shutil.rmtree(run)  # the node is reclaimed: its disk with it
    resumed = start(run, *args)
    assert finish(resumed) == 0, resumed.stderr.read().decode()[-3000:] if resumed.stderr else ""
    (restore,) = [e for e in read_events(run) if e["event"] == "restore"]
    assert (restore["step"], restore["tier"]) == (13, "remote")
    (new_losses,) = run.glob("losses_*.txt")
    assert int(new_losses.read_text().split()[0]) == 14  # 0 steps redone
    assert committed_steps(store.list_objects()) == [10, 13, STEPS]  # the final checkpoint in S3; 15..35 never promoted
    for path in kept.iterdir():
        shutil.copy(path, run / path.name)
    assert compare_final(run, reference, STEPS) == []


def mirrored_step(remote: str, pid: int) -> int | None:
    """The step process ``pid`` last mirrored to the remote (its history mark)."""
    store = open_store(remote)
    for key in store.list_objects(HISTORY_PREFIX):
        if key.startswith(f"{HISTORY_PREFIX}mark-") and key.endswith(f"-{pid}.json"):
            return int(json.loads(store.get_bytes(key, 4096))["step"])
    return None


@pytest.mark.slow
def test_report_after_a_lost_node_counts_every_restore_its_tier_the_lost_steps_and_the_preemption(tmp_path: Path, s3_remote: str) -> None:
    """A preemption (SIGTERM after step 12, committed at 13), a restart from the local tier, a
    SIGKILL after step 27 with the run directory deleted, a restart from S3 (step 20): the final
    run directory's report lists both restores with their tiers, the preemption as one, and the 7
    steps lost as counted from outside (27 reached, 20 restored)."""
    run = tmp_path / "run"
    args = job_args(s3_remote, "10,20")
    assert preempt_at(run, args, hold=12) == 13
    second = start(run, *args, "--hold-at", "27")
    try:
        wait_for_lines(run / "held.txt", 2, "the second process to hold")
        deadline = time.monotonic() + TIMEOUT
        while mirrored_step(s3_remote, second.pid) != 27:  # its history is on the remote up to the step it holds at
            assert time.monotonic() < deadline, "the history mark never reached step 27"
            time.sleep(0.1)
        second.send_signal(signal.SIGKILL)
        assert finish(second) == -signal.SIGKILL
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    shutil.rmtree(run)  # the node is lost
    third = start(run, *args)
    assert finish(third) == 0, third.stderr.read().decode()[-3000:] if third.stderr else ""

    data = coci.report(run, compare=False).data
    rows = [(r.step, r.failure, r.preempted, r.tier, r.lost_steps) for r in data.restores]
    assert rows == [(13, False, True, "local", None), (20, True, False, "remote", 27 - 20)]
    assert [p.step for p in data.preemptions] == [13] and data.preemptions[0].promoted is True
    assert data.observed.failures == 1 and data.observed.lost_steps == 7
    summary = coci.report(run, compare=False).summary()
    assert "step 13 (after a preemption; local tier)" in summary
    assert "step 20 (after a failure, at least 7 steps lost; from the remote tier)" in summary
    assert sum(1 for e in read_events(run) if e["event"] == "session") == 3  # each process once, no duplicate


def test_a_hostile_remote_history_is_merged_only_as_checked_events(tmp_path: Path) -> None:
    """Planted history objects: torn, non-JSON, non-object and timeless lines are left out, an
    oversized segment is skipped, and a planted plan.json never replaces the run directory's."""
    shared = tmp_path / "shared"
    model, optimizer = _small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=str(shared)) as session:
        _train(session, model, optimizer, 4)
    history = shared / "history"
    (history / "events-1-7.jsonl").write_bytes(
        b'{"time": 1.0, "event": "progress", "step": 1}\n[1, 2]\nnot json\n{"event": "x"}\n{"time": 2.0, "event": "torn'
    )
    (history / "events-2-8.jsonl").write_bytes(b"x" * (knobs.HISTORY_SEGMENT_MAX_BYTES + 1))
    (history / "plan.json").write_text("{planted}")
    shutil.rmtree(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "plan.json").write_text("{}")
    model, optimizer = _small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=str(shared)) as session:
        assert session.restore() is not None
    merged = [e for e in read_events(tmp_path / "run")]
    assert [e for e in merged if e.get("time") == 1.0] == [{"time": 1.0, "event": "progress", "step": 1}]
    assert not [e for e in merged if e["event"] in ("x", "torn")]
    assert [e["step"] for e in merged if e["event"] == "commit"] == [2, 4]  # the first process's history came back
    assert (tmp_path / "run" / "plan.json").read_text() == "{}"
    assert events(tmp_path / "run", "remote_history")


def test_a_preemption_upload_that_does_not_fit_the_grace_is_recorded_and_reported(tmp_path: Path) -> None:
    """A remote slower than the grace (each commit marker takes 1.5 s; grace 0.3 s): the notice
    still stops the loop after the local commit, the ``preempted`` event and the report say the
    checkpoint was not in the remote tier within the grace, and close() finishes the upload."""
    from coci.checkpoint import faults

    model, optimizer = _small_state()
    faults.set_fault_hook(lambda point: time.sleep(1.5) if point == "before_remote_commit" else None)
    try:
        session = coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(100),
                               remote=str(tmp_path / "shared"), grace=0.3)
        for _ in range(3):
            session.step(model(torch.randn(8, 4)).square().mean().detach())
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(coci.Preempted):
            session.step()
    finally:
        faults.set_fault_hook(None)
    (preempted,) = [e for e in read_events(tmp_path / "run") if e["event"] == "preempted"]
    assert preempted["promoted"] is False and preempted["step"] == 4
    assert [e["step"] for e in read_events(tmp_path / "run") if e["event"] == "promoted"] == [4]  # finished at close
    summary = coci.report(tmp_path / "run", compare=False).summary()
    assert "NOT in the remote tier within the grace" in summary
