"""A ``persist="thread"`` write stuck in the kernel (NFS gone, a frozen device): a thread cannot be
made to leave it, so the checkpoint's wait gives up at its deadline (``PersistError``) and each
checkpoint after it is refused at once until the write returns, never held for another deadline.
The stuck write is a real commit held at its ``before_rename`` fault point (coci.checkpoint.faults).
The process mode's helper is killed instead: tests/integration/test_persist_process.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ckpt_helpers import events_of

import coci
from coci import knobs
from coci.checkpoint import checkpointer, faults


@pytest.fixture
def held_write(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The first commit waits at ``before_rename`` until the event is set (300 s at most)."""
    release, held = threading.Event(), []

    def hook(point: str) -> None:
        if point == "before_rename" and not held:
            held.append(point)
            release.wait(300)

    monkeypatch.setattr(checkpointer, "_PERSIST_WAIT_SLACK_SECONDS", 0.0)
    faults.set_fault_hook(hook)
    try:
        yield release
    finally:
        release.set()
        faults.set_fault_hook(None)


def test_after_a_stuck_write_each_checkpoint_is_refused_at_once_until_it_returns(tmp_path: Path, held_write: threading.Event) -> None:
    state = {"t": torch.zeros(4)}
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(1), persist="thread", on_error="log", keep_last=None)
    try:
        with knobs.override(PERSIST_DEADLINE_SECONDS=0.3, PERSIST_DEADLINE_BYTES_PER_SECOND=1e12):
            session.step()  # step 1's checkpoint: its write is held
            session.step()  # step 2's waits 0.3 s for it, then gives up (logged)
        # a second wait as long as the first would take 10 minutes now: each later one only looks
        with knobs.override(PERSIST_DEADLINE_SECONDS=600.0):
            later = threading.Thread(target=lambda: [session.step() for _ in range(3)], daemon=True)
            later.start()
            later.join(120)
            assert not later.is_alive(), "a checkpoint after the stuck one waited for it again"
        stuck = [e for e in events_of(tmp_path, "error") if "still persisting" in e.get("message", "")]
        assert len(stuck) == 4  # steps 2 to 5: each refused, recorded
        held_write.set()  # the write returns: step 1 commits, and checkpoints go on
        for _ in range(1200):  # 120 s at most
            if events_of(tmp_path, "commit"):
                break
            time.sleep(0.1)
        session.step()
    finally:
        held_write.set()
        session.close()
    assert [e["step"] for e in events_of(tmp_path, "commit")][:2] == [1, 6]
