"""A real full disk during persist (a 2 MiB tmpfs mounted with mount(8), where allowed): training
goes on, no partial checkpoint is visible, the next planned checkpoint commits once space is back.
The injected write faults: ``tests/unit/test_disk_faults.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ckpt_helpers import build_state, events_of

import coci
from coci.checkpoint import layout
from coci.checkpoint.verify import verify_run


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at ``tmp_path/disk`` (skips where mounting is not allowed)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if shutil.which("mount") is None or (hasattr(os, "geteuid") and os.geteuid() != 0):
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@pytest.mark.slow  # runs mount(8) / umount(8) as processes
def test_real_full_disk(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    state = build_state()
    state["table"] = torch.arange(180_000, dtype=torch.float32)  # ~0.7 MB per checkpoint
    generator = torch.Generator().manual_seed(0)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(2), keep_last=1)
    one_step(session, state, generator)
    assert one_step(session, state, generator).upload_completion.result(timeout=30).step == 2
    session._profiler.wait_for_probe()  # the background bandwidth probe's scratch file is gone before
    # the disk is measured below (freed afterwards, it would make room for the next checkpoint)
    ballast = small_disk / "ballast"
    with open(ballast, "wb") as handle:  # another tenant fills the disk to ~0.2 MB free
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        handle.write(b"\0" * (free - 200_000))
    one_step(session, state, generator)
    pending = one_step(session, state, generator)  # step 4: no room for a second checkpoint
    assert isinstance(pending.upload_completion.exception(timeout=30), OSError)
    with pytest.raises(coci.PersistError, match="No space left on device"):
        one_step(session, state, generator)
    assert_nothing_partial(run_dir, [2])
    pending = one_step(session, state, generator)  # step 6: attempted again, still full
    assert pending is not None and pending.upload_completion.exception(timeout=30) is not None
    with pytest.raises(coci.PersistError):
        one_step(session, state, generator)
    assert_nothing_partial(run_dir, [2])
    ballast.unlink()  # space comes back
    pending = one_step(session, state, generator)  # step 8 commits; retention drops step 2
    assert pending.upload_completion.result(timeout=30).step == 8
    session.close()
    assert [e["step"] for e in events_of(run_dir, "error")] == [4, 6]
    assert_nothing_partial(run_dir, [8])
    weights = state["model"].weight.detach().clone()
    restored = build_state(seed=123)
    restored["table"] = torch.zeros(180_000)
    with coci.Session(run_dir, state=restored, policy=coci.EveryN(1000)) as restored_session:
        result = restored_session.restore()
    assert result is not None and result.step == 8
    assert torch.equal(restored["model"].weight, weights)
    assert torch.equal(restored["table"], torch.arange(180_000, dtype=torch.float32))



@pytest.mark.slow  # runs mount(8) / umount(8) as processes
def test_a_full_disk_at_session_start_is_a_persist_error_and_frees_the_run_directory(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    run_dir.mkdir()
    ballast = small_disk / "ballast"
    with open(ballast, "wb") as handle:  # another tenant took every byte
        handle.write(b"\0" * (os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize))
    with pytest.raises(coci.PersistError, match=f"cannot start in the run directory {run_dir}.*No space left on device"):
        coci.Session(run_dir, state=build_state(), policy=coci.EveryN(2))
    ballast.unlink()  # space comes back: the run directory is not held by the failed session
    with coci.Session(run_dir, state=build_state(), policy=coci.EveryN(2)) as session:
        assert session.restore() is None

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
