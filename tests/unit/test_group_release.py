"""coci's own gloo groups end with the Session: a group left to the interpreter's exit is torn
down while Python finalizes, where a gloo thread that needs the GIL aborts the process."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.helpers.ckpt_helpers import make_run

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="gloo is required")


def gloo_threads() -> int:
    """This process's gloo threads (a group's run loops and its transport loop), by their names."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return sum(name.startswith(("pt_gloo", "gloo_")) for name in names)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_closed_session_leaves_no_gloo_thread_of_its_own(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        make_run(tmp_path / "first", steps=2, every=2)  # every thread the job starts has started
        before = gloo_threads()
        make_run(tmp_path / "second", steps=2, every=2)  # a Session under the group: coci's two groups
        assert before > 0 and gloo_threads() == before
    finally:
        dist.destroy_process_group()
