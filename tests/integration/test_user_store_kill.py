"""A remote store of the user's own (coci's directory store behind a wrapper that counts its calls),
passed as ``Session(remote=store)``, takes the uploads of a training process that is then SIGKILLed;
a node that lost its checkpoints restores from that store, bitwise, and its retention goes through it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from user_seams import CountingStore, small_state, train_to, uninterrupted

import coci
from coci.checkpoint.remote import DirectoryStore
from coci.checkpoint.remote.tier import committed_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "user_store_job.py"


def test_a_user_store_instance_is_used_for_uploads_and_restore_after_sigkill(tmp_path: Path) -> None:
    remote, run_dir = tmp_path / "shared", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers")])}
    done = subprocess.run([sys.executable, str(JOB), str(run_dir), str(remote)], env=env, capture_output=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-3000:]
    assert committed_steps(DirectoryStore(remote).list_objects()) == [2, 4]  # the user's store received the uploads
    (run_dir / "checkpoints").rename(tmp_path / "lost")  # the node's disk is lost: only the remote copy remains
    store = CountingStore(DirectoryStore(remote))
    model, optimizer = small_state()
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=store) as session:
        restored = session.restore()
        assert restored is not None and (restored.step, restored.tier) == (4, "remote")
        assert store.calls["get_file"] > 0 and store.calls["list_objects"] > 0
        train_to(session, model, optimizer, 8)
    assert model.weight.detach().equal(uninterrupted(tmp_path / "reference", 8))
    assert committed_steps(DirectoryStore(remote).list_objects()) == [6, 8]  # keep_last_remote=2, through the user's store
    assert store.calls["delete"] > 0
