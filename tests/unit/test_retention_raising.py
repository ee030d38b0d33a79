"""A retention policy that raises (the caller's object) never undoes a commit: each checkpoint
stands and is promoted, nothing is deleted, and the error is recorded once, not at every commit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckpt_helpers import build_state, events_of, step_dir, train

import coci
from coci.checkpoint.remote import DirectoryStore
from coci.checkpoint.remote.tier import committed_steps


class Broken:
    """A retention policy with a bug."""

    def should_keep(self, steps: Sequence[int]) -> list[bool]:
        raise ZeroDivisionError("division by zero in the user's policy")


def test_a_retention_policy_that_raises_leaves_every_commit_standing_and_promoted(tmp_path: Path) -> None:
    state = build_state()
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(1), retention=Broken(), keep_last_remote=None,
                      remote=str(tmp_path / "prefix")) as session:
        for _ in range(3):
            train(session, state, 1)  # on_error="raise": a failed persist would raise at the next step
            session.wait()
            assert session._remote is not None
            session._remote.tier.wait(timeout=300)  # each promoted before the next (none superseded)
    assert all(step_dir(tmp_path / "run", step).is_dir() for step in (1, 2, 3))
    assert committed_steps(DirectoryStore(tmp_path / "prefix").list_objects()) == [1, 2, 3]  # promotion went on
    errors = events_of(tmp_path / "run", "error")
    assert [(e["step"], e["phase"]) for e in errors] == [(1, "retention")]  # once, not at every commit
    assert "ZeroDivisionError" in errors[0]["message"]
    assert [e["step"] for e in events_of(tmp_path / "run", "commit")] == [1, 2, 3]
