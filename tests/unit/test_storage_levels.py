"""The storage levels a session drives (local, peer, remote) share one protocol,
``coci.checkpoint.storage_level.StorageLevel``: the session holds them as one tuple, local first."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

import coci
from coci.checkpoint.layout import checkpoints_dir
from coci.checkpoint.storage_level import StorageLevel


def test_each_level_is_driven_through_one_protocol(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    state = {"w": torch.zeros(3)}
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(2), remote=str(remote), keep_last=None) as session:
        levels = session._levels
        assert [level.name for level in levels] == ["local", "remote"]
        assert all(isinstance(level, StorageLevel) for level in levels)
        for _ in range(4):
            state["w"] += 1
            session.step()
        session.wait()
    assert [level.newest_step for level in levels] == [4, 4]  # committed locally, then promoted at close
    shutil.rmtree(checkpoints_dir(tmp_path / "run"))
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(2), remote=str(remote), remote_owner="adopt") as session:
        restored = session.restore()
        assert restored is not None and restored.tier == "remote" and restored.step == 4
        assert [level.newest_step for level in session._levels] == [4, 4]  # restored: it counts on every level
