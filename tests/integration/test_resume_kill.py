"""Kill a real training process with SIGKILL and resume it: the result must be bitwise identical.

The job (tests/jobs/train_job.py) trains an MLP with dropout, Adam and a LambdaLR schedule, consuming
Python, NumPy and torch RNG every step, checkpointing every 5 steps. Kills land at a step, inside
a persist (mid-write, before the rename, after the rename) and at random wall-clock instants.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_job import compare_final

pytestmark = pytest.mark.slow  # real training processes, SIGKILLed and resumed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "train_job.py"
STEPS = 40


def run(run_dir: Path, *extra: str, timeout: float = 600) -> int:  # generous under load
    cmd = [sys.executable, str(JOB), str(run_dir), "--steps", str(STEPS), "--every", "5", *extra]
    return subprocess.run(cmd, timeout=timeout, capture_output=True).returncode


def finish(run_dir: Path, *extra: str) -> None:
    for _ in range(5):
        code = run(run_dir, *extra)
        if code == 0:
            return
        assert code == -signal.SIGKILL
    raise AssertionError("job did not finish after 5 restarts")


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    assert compare_final(run_dir, reference, STEPS) == []  # final state bitwise; each step's loss as uninterrupted


@pytest.fixture(scope="module", params=[False, True], ids=["randint-data", "resumable-loader"])
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, ...]]:
    extra = ("--loader",) if request.param else ()
    path = tmp_path_factory.mktemp("reference")
    assert run(path, *extra) == 0
    return path, extra


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
def test_kill_at_random_step(tmp_path: Path, reference: tuple[Path, tuple[str, ...]], seed: int, persist: str) -> None:
    ref, extra = reference
    extra = (*extra, "--persist", persist)
    die_at = random.Random(seed).randint(3, STEPS - 2)
    assert run(tmp_path, *extra, "--die-at", str(die_at)) == -signal.SIGKILL
    finish(tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


@pytest.mark.parametrize(("reference", "persist"), PERSIST_MODES, indirect=["reference"])
@pytest.mark.parametrize("point", ["mid_write", "before_rename", "after_rename", "retention"])
def test_kill_inside_persist(tmp_path: Path, reference: tuple[Path, tuple[str, ...]], point: str, persist: str) -> None:
    """With ``persist="process"`` the helper stops at the fault point and the training process dies
    there (the helper with it)."""
    ref, extra = reference
    extra = (*extra, "--persist", persist)
    assert run(tmp_path, *extra, "--die-in-persist", point) == -signal.SIGKILL
    finish(tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


@pytest.mark.parametrize(("reference", "persist"), PERSIST_MODES, indirect=["reference"])
def test_kill_at_a_checkpoint_step_while_persist_in_flight(tmp_path: Path, reference: tuple[Path, tuple[str, ...]], persist: str) -> None:
    ref, extra = reference
    extra = (*extra, "--persist", persist)
    assert run(tmp_path, *extra, "--die-at", "15", "--state-mb", "0") == -signal.SIGKILL
    finish(tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)


def test_kill_at_random_instants_from_outside(tmp_path: Path, reference: tuple[Path, tuple[str, ...]]) -> None:
    ref, extra = reference
    rng = random.Random(42)
    cmd = [sys.executable, str(JOB), str(tmp_path), "--steps", str(STEPS), "--every", "5", *extra]
    for _ in range(3):
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 4.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
    finish(tmp_path, *extra)
    assert_same_as_reference(tmp_path, ref)
