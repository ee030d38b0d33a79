"""Kill a real training process with SIGKILL and resume it: the result must be bitwise identical.

The job (tests/jobs/train_job.py) trains an MLP with dropout, Adam and a LambdaLR schedule, consuming
Python, NumPy and torch RNG every step, checkpointing every 5 steps. Kills land at a step, inside
a persist (mid-write, before the rename, after the rename) and at random wall-clock instants. coci's
resume self-check runs on each resume (tests/conftest.py fails a test whose run directory holds a
``resume_mismatch`` event); the job made inexact on purpose warns at its first redone step.

Each run of the job is a real process forked by one server per module (``tests/jobs/script_forks.py``)
that imported torch and coci once: a process costs a fraction of a second instead of ~4 CPU s of imports.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_job import compare_final
from script_forks import ScriptForks

pytestmark = pytest.mark.slow  # real training processes, SIGKILLed and resumed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "train_job.py"
STEPS = 40


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptForks]:
    forks = ScriptForks(tmp_path_factory.mktemp("jobs"))
    yield forks
    forks.close()


def run(jobs: ScriptForks, run_dir: Path, *extra: str) -> int:
    return jobs.run(JOB, str(run_dir), "--steps", str(STEPS), "--every", "5", *extra)


def finish(jobs: ScriptForks, run_dir: Path, *extra: str) -> None:
    for _ in range(5):
        code = run(jobs, run_dir, *extra)
        if code == 0:
            return
        assert code == -signal.SIGKILL
    raise AssertionError("job did not finish after 5 restarts")


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    assert compare_final(run_dir, reference, STEPS) == []  # final state bitwise; each step's loss as uninterrupted


@pytest.fixture(scope="module", params=[False, True], ids=["randint-data", "resumable-loader"])
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, jobs: ScriptForks) -> tuple[Path, tuple[str, ...], float]:
    """The uninterrupted run: its folder, its options and its wall seconds."""
    extra = ("--loader",) if request.param else ()
    path = tmp_path_factory.mktemp("reference")
    began = time.monotonic()
    assert run(jobs, path, *extra) == 0
    return path, extra, time.monotonic() - began


# Session(persist=...): the same kills, the same result. The data source and the persist mode are
# independent axes: the thread persist runs with both, the process persist with the loader (the
# fuller state: the loader's position too), not the whole cross product.
PERSIST_MODES = [
    pytest.param(False, "thread", id="randint-data-thread"),
    pytest.param(True, "thread", id="resumable-loader-thread"),
    pytest.param(True, "process", id="resumable-loader-process"),
]


@pytest.mark.parametrize(("reference", "persist"), PERSIST_MODES, indirect=["reference"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_at_random_step(tmp_path: Path, jobs: ScriptForks, reference: tuple[Path, tuple[str, ...], float], seed: int, persist: str) -> None:
    ref, extra, _ = reference
    extra = (*extra, "--persist", persist)
    die_at = random.Random(seed).randint(3, STEPS - 2)
    assert run(jobs, tmp_path, *extra, "--die-at", str(die_at)) == -signal.SIGKILL
    finish(jobs, tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


@pytest.mark.parametrize(("reference", "persist"), PERSIST_MODES, indirect=["reference"])
@pytest.mark.parametrize("point", ["mid_write", "before_rename", "after_rename", "retention"])
def test_kill_inside_persist(tmp_path: Path, jobs: ScriptForks, reference: tuple[Path, tuple[str, ...], float], point: str, persist: str) -> None:
    """With ``persist="process"`` the helper stops at the fault point and the training process dies
    there (the helper with it)."""
    ref, extra, _ = reference
    extra = (*extra, "--persist", persist)
    assert run(jobs, tmp_path, *extra, "--die-in-persist", point) == -signal.SIGKILL
    finish(jobs, tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


@pytest.mark.parametrize(("reference", "persist"), PERSIST_MODES, indirect=["reference"])
def test_kill_at_a_checkpoint_step_while_persist_in_flight(tmp_path: Path, jobs: ScriptForks, reference: tuple[Path, tuple[str, ...], float], persist: str) -> None:
    ref, extra, _ = reference
    extra = (*extra, "--persist", persist)
    assert run(jobs, tmp_path, *extra, "--die-at", "15", "--state-mb", "0") == -signal.SIGKILL
    finish(jobs, tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


def test_kill_at_random_instants_from_outside(tmp_path: Path, jobs: ScriptForks, reference: tuple[Path, tuple[str, ...], float]) -> None:
    """SIGKILL from the test at instants drawn over the uninterrupted run's wall time (inside a
    restore, a step, a persist). A resumed run is shorter than the reference, so it may end before
    the instant drawn: then nothing is killed and it has finished (exit 0)."""
    ref, extra, seconds = reference
    rng = random.Random(42)
    for _ in range(3):
        pid = jobs.start(JOB, str(tmp_path), "--steps", str(STEPS), "--every", "5", *extra)
        time.sleep(rng.uniform(0.0, seconds))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended (and the fork server reaped it) before the instant
            assert jobs.wait() == 0
            continue
        assert jobs.wait() in (0, -signal.SIGKILL)
    finish(jobs, tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


def resume_events(run_dir: Path) -> dict[str, list[dict[str, object]]]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return {name: [e for e in events if e["event"] == name] for name in ("restore", "resume_check", "resume_mismatch")}


def kill_at_75_and_resume(jobs: ScriptForks, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    """Checkpoints at 40 and 80 of 90 steps; killed at 75 once the checkpoint of 40 committed, so the
    resume redoes 41..75, of which at least the steps to 60 were logged (a host batch holds at most
    16 steps; reading the trace, as a re-plan does, logs those pending sooner)."""
    args = ("--steps", "90", "--every", "40", *extra)
    assert jobs.run(JOB, str(run_dir), *args, "--die-at", "75", "--wait-before-kill") == -signal.SIGKILL
    code = jobs.run(JOB, str(run_dir), *args)
    return subprocess.CompletedProcess(args, code, jobs.stdout.read_bytes(), jobs.stderr.read_bytes())


@pytest.mark.inexact_resume
def test_a_loop_with_noise_coci_does_not_restore_warns_at_its_first_redone_step(tmp_path: Path, jobs: ScriptForks) -> None:
    resumed = kill_at_75_and_resume(jobs, tmp_path, "--unrestored-noise")
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    stderr = resumed.stderr.decode()
    assert "ResumeMismatchWarning" in stderr and "step 41 was redone" in stderr, stderr[-3000:]
    events = resume_events(tmp_path)
    assert [e["step"] for e in events["restore"]] == [40]
    [mismatch] = events["resume_mismatch"]
    assert (mismatch["step"], mismatch["restored_step"]) == (41, 40) and mismatch["logged"] != mismatch["resumed"]
    assert any("'NOISE' is a random.Random coci does not restore" in str(cause) for cause in mismatch["causes"])  # type: ignore[attr-defined]
    [check] = events["resume_check"]
    assert 20 <= check["checked"] == check["mismatches"] <= 35  # type: ignore[operator]


def test_the_same_loop_without_that_noise_checks_its_redone_steps_silently(tmp_path: Path, jobs: ScriptForks) -> None:
    resumed = kill_at_75_and_resume(jobs, tmp_path)
    assert resumed.returncode == 0 and b"ResumeMismatchWarning" not in resumed.stderr, resumed.stderr.decode()[-3000:]
    events = resume_events(tmp_path)
    assert events["resume_mismatch"] == []
    [check] = events["resume_check"]
    assert (check["restored_step"], check["mismatches"]) == (40, 0) and 20 <= check["checked"] <= 35  # type: ignore[operator]
