"""Preemption notices under torchrun (coci.preemption): 2 ranks, gloo, real signals.

(a) SIGTERM to the whole process group (torchrun and both workers, as a scheduler stopping the
    job does): one committed checkpoint, of the same step on both ranks; a later torchrun resumes
    it bitwise.
(b) ``torchrun --max-restarts 1`` and SIGTERM to one worker only: the ranks agree on the notice,
    checkpoint the same step and exit with coci.Preempted's status; the elastic agent restarts
    both workers, which restore that step and finish bitwise equal to the uninterrupted run; the
    restore event measures the restart from the preempted event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from coci.checkpoint import layout
from coci.events import read_events
from tests.distributed.test_distributed import assert_same_as_reference, committed, step_log

JOB = Path(__file__).resolve().parents[1] / "jobs" / "dist_job.py"
REPO = JOB.parents[2]
TIMEOUT = 300
ARGS = ("--step-sleep", "0.15", "--every", "1000")  # no periodic checkpoint: only the notice's

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="torch.distributed with gloo is required",
    ),
]


def torchrun_command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *extra,
            str(JOB), str(run_dir), *ARGS]


def start(run_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    # restarted workers reuse torchrun's rendezvous store and read stale gloo addresses without it
    # (pytorch/pytorch#135712; init_process_group fails after a restart, with or without coci)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return subprocess.Popen(torchrun_command(run_dir, *extra), cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for_steps(run_dir: Path, steps: int, process: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + TIMEOUT
    while True:
        done = min(len(step_log(run_dir, r)) if (run_dir / f"samples_rank{r}.txt").exists() else 0 for r in range(2))
        if done >= steps:
            return done
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.05)


def workers(agent: int) -> list[int]:
    """The worker processes torchrun started (children of its agent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == agent:
                found.append(int(entry.name))
    return found


def preempted_events(run_dir: Path) -> list[dict]:
    """Every rank's preempted events (rank 0 logs to events.jsonl, rank 1 to events.rank1.jsonl)."""
    events = []
    for name in ("events.jsonl", "events.rank1.jsonl"):
        path = run_dir / name
        lines = path.read_text().splitlines() if path.exists() else []
        events += [e for e in map(json.loads, lines) if e["event"] == "preempted"]
    return events


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reference")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    assert subprocess.run(torchrun_command(path), cwd=REPO, env=env, timeout=TIMEOUT, capture_output=True).returncode == 0
    return path


def test_sigterm_to_the_whole_group_commits_one_checkpoint_of_the_same_step(tmp_path: Path, reference: Path) -> None:
    process = start(tmp_path)
    try:
        seen = wait_for_steps(tmp_path, 3, process)
        os.killpg(process.pid, signal.SIGTERM)  # the agent and both workers, as a scheduler does
        process.wait(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    steps = committed(tmp_path)
    assert len(steps) == 1 and steps[0] >= seen, steps
    events = preempted_events(tmp_path)
    assert sorted(e["step"] for e in events) == [steps[0], steps[0]]  # both ranks, the same step
    assert all(e["within_grace"] for e in events)
    assert max(len(step_log(tmp_path, r)) for r in range(2)) == steps[0]  # nobody trained past it

    env = dict(os.environ, OMP_NUM_THREADS="1")
    finish = subprocess.run(torchrun_command(tmp_path), cwd=REPO, env=env, timeout=TIMEOUT, capture_output=True)
    assert finish.returncode == 0, finish.stderr.decode()[-2000:]
    assert_same_as_reference(tmp_path, reference)


def test_torchrun_max_restarts_resumes_after_a_notice_to_one_worker(tmp_path: Path, reference: Path) -> None:
    process = start(tmp_path, "--max-restarts=1")
    try:
        wait_for_steps(tmp_path, 3, process)
        children = workers(process.pid)
        assert len(children) == 2, children
        os.kill(max(children), signal.SIGTERM)  # one worker: the other learns it at the agreement
        code = process.wait(timeout=TIMEOUT)
        assert code == 0, process.stderr.read().decode()[-3000:] if process.stderr else code
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    events = preempted_events(tmp_path)
    assert len(events) == 2 and events[0]["step"] == events[1]["step"]
    assert sorted(e["notice_here"] for e in events) == [False, True]  # one got it, one agreed
    assert [e["signal"] for e in events] == ["SIGTERM", "SIGTERM"]  # the one that agreed records the signal too
    restores = [e for e in read_events(tmp_path) if e["event"] == "restore"]
    assert [e["step"] for e in restores] == [events[0]["step"]]
    assert restores[0]["restart_seconds"] >= restores[0]["seconds"]
    assert layout.committed_steps(layout.checkpoints_dir(tmp_path))
    assert_same_as_reference(tmp_path, reference)
