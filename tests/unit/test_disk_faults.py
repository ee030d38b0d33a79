"""A full or failing disk during persist: training goes on and no partial checkpoint is ever visible.

ENOSPC / EIO come from an injected writer fault (``faults.set_fault_hook`` raising OSError at a
commit point); a real tmpfs that fills up is ``tests/integration/test_full_disk.py`` (it mounts one).
Training continues; the failure is an ``error`` event and a :class:`coci.PersistError` at the
next ``step`` (or only a log line with ``on_error="log"``); no partial checkpoint becomes visible;
the last good checkpoint stays and verifies; the next planned checkpoint is attempted again.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ckpt_helpers import build_state, events_of, restore_fresh

import coci
from coci.checkpoint import faults, layout
from coci.checkpoint.verify import verify_run

MESSAGES = {errno.ENOSPC: "No space left on device", errno.EIO: "Input/output error"}


@pytest.fixture
def fault_hook() -> Iterator[list]:
    """A list of (point, occurrence, error, delay) faults; the hook raises each once."""
    planned: list[tuple[str, int, OSError, float]] = []
    seen: dict[str, int] = {}

    def hook(point: str) -> None:
        seen[point] = seen.get(point, 0) + 1
        for name, occurrence, error, delay in planned:
            if name == point and seen[point] == occurrence:
                time.sleep(delay)
                raise error

    faults.set_fault_hook(hook)
    try:
        yield planned
    finally:
        faults.set_fault_hook(None)


def one_step(session: coci.Session, state: dict, generator: torch.Generator) -> coci.PendingCheckpoint | None:
    model, optimizer = state["model"], state["optimizer"]
    optimizer.zero_grad()
    loss = model(torch.randn(16, model.in_features, generator=generator)).pow(2).mean()
    loss.backward()
    optimizer.step()
    return session.step(loss.detach())


def assert_nothing_partial(run_dir: Path, committed: list[int]) -> None:
    root = layout.checkpoints_dir(run_dir)
    assert [s for s, _ in layout.committed_steps(root)] == committed
    assert list(root.glob("*.tmp")) == []  # the failed write's directory was removed
    statuses = verify_run(run_dir)
    assert [(s.step, s.ok) for s in statuses] == [(s, True) for s in committed]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("point", ["mid_write", "before_manifest", "before_rename"])
def test_injected_write_error_raises_at_next_step_and_training_goes_on(
    tmp_path: Path, fault_hook: list, code: int, point: str
) -> None:
    fault_hook.append((point, 2, OSError(code, os.strerror(code)), 0.0))  # the 2nd checkpoint (step 4) fails
    state = build_state()
    generator = torch.Generator().manual_seed(0)
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(2), keep_last=2)
    for _ in range(3):
        one_step(session, state, generator)
    pending = one_step(session, state, generator)  # step 4: its persist fails in the background
    assert pending is not None and isinstance(pending.upload_completion.exception(timeout=30), OSError)
    with pytest.raises(coci.PersistError, match=MESSAGES[code]):
        one_step(session, state, generator)  # step 5 surfaces it
    assert session.steps == 5  # the step itself was recorded: training state is consistent
    assert_nothing_partial(tmp_path, [2])
    errors = events_of(tmp_path, "error")
    assert [(e["step"], e["phase"]) for e in errors] == [(4, "persist")]
    assert MESSAGES[code] in errors[0]["message"]
    for _ in range(5):  # steps 6..10: the next planned checkpoints are attempted and commit
        one_step(session, state, generator)
    session.close()  # the error was surfaced once; nothing more to raise
    assert [e["step"] for e in events_of(tmp_path, "snapshot_start")] == [2, 4, 6, 8, 10]
    assert [e["step"] for e in events_of(tmp_path, "commit")] == [2, 6, 8, 10]
    assert_nothing_partial(tmp_path, [8, 10])


def test_on_error_log_only_logs(tmp_path: Path, fault_hook: list, caplog: pytest.LogCaptureFixture) -> None:
    fault_hook.append(("mid_write", 1, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 0.0))
    state = build_state()
    generator = torch.Generator().manual_seed(0)
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(2), keep_last=2, on_error="log")
    with caplog.at_level(logging.ERROR, logger="coci"):
        one_step(session, state, generator)
        pending = one_step(session, state, generator)
        assert pending is not None and pending.upload_completion.exception(timeout=30) is not None
        for _ in range(4):  # nothing is raised
            one_step(session, state, generator)
        session.close()
    assert any("No space left on device" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert [e["step"] for e in events_of(tmp_path, "error")] == [2]
    assert_nothing_partial(tmp_path, [4, 6])


def test_a_caller_that_catches_persist_error_trains_to_the_end(tmp_path: Path, fault_hook: list) -> None:
    for occurrence in (1, 2):  # the first two checkpoints fail
        fault_hook.append(("before_rename", occurrence, OSError(errno.EIO, os.strerror(errno.EIO)), 0.0))
    state = build_state()
    generator = torch.Generator().manual_seed(0)
    caught = 0
    with coci.Session(tmp_path, state=state, policy=coci.EveryN(2), keep_last=2) as session:
        for _ in range(9):
            try:
                pending = one_step(session, state, generator)
                if pending is not None:  # let it finish: the failure then surfaces at the next step
                    pending.upload_completion.exception(timeout=30)
            except coci.PersistError:
                caught += 1
    assert session.steps == 9
    assert caught == 2
    assert [e["step"] for e in events_of(tmp_path, "error")] == [2, 4]
    assert_nothing_partial(tmp_path, [6, 8])
    restored_session, restored, result = restore_fresh(tmp_path)
    restored_session.close()
    assert result is not None and result.step == 8


def test_slow_failure_is_not_lost_when_the_next_checkpoint_starts(tmp_path: Path, fault_hook: list) -> None:
    """The failing persist of step 2 is still running at step 3 and 4; step 4 starts the next
    checkpoint, which waits for it. Its failure must still reach the caller exactly once."""
    fault_hook.append(("mid_write", 1, OSError(errno.EIO, os.strerror(errno.EIO)), 0.5))
    state = build_state()
    generator = torch.Generator().manual_seed(0)
    raised: list[str] = []
    session = coci.Session(tmp_path, state=state, policy=coci.EveryN(2), keep_last=2)
    for _ in range(8):
        try:
            one_step(session, state, generator)
        except coci.PersistError as exc:
            raised.append(str(exc))
    try:
        session.close()
    except coci.PersistError as exc:
        raised.append(str(exc))
    assert [e["step"] for e in events_of(tmp_path, "error")] == [2]
    assert len(raised) == 1 and "Input/output error" in raised[0]
