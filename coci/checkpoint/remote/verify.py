"""Check every checkpoint of a remote tier without loading it (``coci verify RUN --remote URL``).

Each committed remote checkpoint is downloaded into a temporary directory exactly as a restore
fetches it (names, sizes and crc32c checked) and then verified by its format's reader; data objects
of a step without a commit marker are reported as an interrupted promotion.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coci.checkpoint import layout
from coci.checkpoint.checkpointer import reader_for
from coci.checkpoint.remote.schemes import RemoteLike
from coci.checkpoint.remote.tier import RemoteTier, committed_steps, open_store, steps_of
from coci.checkpoint.verify import CheckpointStatus
from coci.errors import CheckpointError
from coci.events import EventLog

__all__ = ["verify_remote"]


def verify_remote(remote: RemoteLike, storage_options: Mapping[str, Any] | None = None, *, check: bool = True) -> list[CheckpointStatus]:
    """One status per remote step, oldest first; ``check=False`` only lists (no download)."""
    store = open_store(remote, storage_options)
    listing = store.list_objects()
    committed = set(committed_steps(listing))
    statuses = []
    with tempfile.TemporaryDirectory(prefix="coci-remote-verify-") as scratch:
        tier = RemoteTier(store, None, EventLog(scratch))
        for step in sorted(steps_of(listing)):
            prefix = f"{layout.step_dirname(step)}/"
            size = sum(nbytes for key, nbytes in listing.items() if key.startswith(prefix))
            where = f"{store.url}/{layout.step_dirname(step)}"
            if step not in committed:
                statuses.append(CheckpointStatus(step=step, path=where, ok=False, committed=False, bytes=size,
                                                 error="not committed: an interrupted promotion (no remote manifest; never restored)"))
                continue
            error = _verified(tier, step, Path(scratch)) if check else None
            statuses.append(CheckpointStatus(step=step, path=where, ok=error is None, committed=True, bytes=size, error=error))
    return statuses


def _verified(tier: RemoteTier, step: int, scratch: Path) -> str | None:
    """None when remote ``step`` downloads and verifies, else what is wrong."""
    root = scratch / "checkpoints"
    try:
        path = tier.fetch(step, root)
        reader_for(path).verify(path)
    except (CheckpointError, OSError) as exc:  # corrupt, or the remote did not answer
        return str(exc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return None
