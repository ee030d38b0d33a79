"""The remote tier against what a remote may hold or do: objects coci never wrote, a checkpoint
that never loads, an endpoint that never answers (a real SeaweedFS server, a real silent socket)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import coci
from coci.checkpoint.remote import open_store
from coci.checkpoint.remote.tier import committed_steps
from tests.test_remote import s3_remote, s3_server  # noqa: F401 (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ckpt_helpers import build_state, events_of, train


@pytest.fixture
def remote(request: pytest.FixtureRequest) -> str:
    """A fresh ``s3://`` prefix on the SeaweedFS server of tests/test_remote.py."""
    return str(request.getfixturevalue("s3_remote"))


def run_with_remote(run_dir: Path, remote: str, steps: int, *, restore: bool = True, **kwargs: Any) -> coci.Session:
    """Train ``steps`` steps with a checkpoint every 2 (each committed and promoted before the next)."""
    state = build_state()
    with coci.Session(run_dir, state=state, policy=coci.EveryN(2), remote=remote, **kwargs) as session:
        if restore:
            session.restore()
        while session.steps < steps:
            train(session, state, 1)
            if session.steps % 2 == 0:
                session.wait()
                assert session._remote is not None
                session._remote.wait()
    return session


def put_raw(remote: str, key: str, data: bytes) -> None:
    """An object under any key, as another tool would write it (coci's own key check bypassed)."""
    import obstore

    store = open_store(remote)
    obstore.put(store._store, key, data)  # type: ignore[attr-defined]


# --- finding 13: a key coci never writes does not stop remote retention ---------------------------


def test_odd_remote_key_is_ignored_and_retention_goes_on(tmp_path: Path, remote: str) -> None:
    put_raw(remote, "step_2/notes from ops.txt", b"not coci's")
    run_with_remote(tmp_path / "run", remote, 8, restore=False, keep_last_remote=1)
    listing = open_store(remote).list_objects()
    assert committed_steps(listing) == [8]
    assert not [key for key in listing if key.startswith(("step_4/", "step_6/"))]
    assert "step_2/notes from ops.txt" in listing  # not coci's: left alone
    ignored = events_of(tmp_path / "run", "remote_ignored")
    assert [event["keys"] for event in ignored] == [["step_2/notes from ops.txt"]]  # recorded once
    assert not [event for event in events_of(tmp_path / "run", "error") if event["phase"] == "remote_retention"]
