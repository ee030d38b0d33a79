"""A fourth storage level added as one value (``levels=(coci.DirectoryLevel(path),)``) end to end:
a training process with a local tier, a remote tier and level4 is SIGKILLed once level4 holds a
copy; the node's checkpoints and the remote tier are then lost, and the restarted run restores from
level4, trains on bitwise as an uninterrupted run, and ``coci report`` names the level and the restore."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from user_seams import small_state, train_to, uninterrupted

import coci

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "added_level_job.py"


def test_a_run_killed_after_its_fourth_level_copied_restores_from_it(tmp_path: Path) -> None:
    run_dir, remote, archive = tmp_path / "run", tmp_path / "remote", tmp_path / "archive"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers")])}
    killed = subprocess.run([sys.executable, str(JOB), str(run_dir), str(remote), str(archive)], env=env, capture_output=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    shutil.rmtree(run_dir / "checkpoints")  # the node's disk is lost ...
    shutil.rmtree(remote)  # ... and the remote tier with it (a failure of the depth level4 is planned against)
    model, optimizer = small_state()
    level = coci.DirectoryLevel(archive, keep_last=2)
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=remote, levels=(level,)) as session:
        restored = session.restore()
        assert restored is not None and (restored.step, restored.tier) == (6, "level4")
        train_to(session, model, optimizer, 10, levels=(level,))
    assert model.weight.detach().equal(uninterrupted(tmp_path / "reference", 10))
    assert level.committed_steps() == [8, 10]  # keep_last=2 on level4
    report = subprocess.run(
        [sys.executable, "-m", "coci.cli", "report", str(run_dir), "--no-files", "--trials", "0"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "level4: 5 copied" in report.stdout  # steps 2, 4, 6 before the kill; 8, 10 after
    assert "step 6 (after a failure" in report.stdout and "from level4" in report.stdout and "by source: level4 1" in report.stdout
