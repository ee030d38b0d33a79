"""Retention: which committed checkpoints are kept, and the crash-safe removal of the others."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from coci.checkpoint.commit import _discard
from coci.checkpoint.layout import committed_steps


def apply_retention(root: Path, keep_last: int | None, trusted: Collection[int]) -> list[int]:
    """Keep the newest ``keep_last`` of the ``trusted`` checkpoints; delete every committed one
    older than the oldest kept; return the steps deleted.

    ``trusted`` are the steps known to load: those this run committed and the one it restored
    from. Only they are counted, so an unloadable, planted or foreign ``step_<n>`` (however large
    its ``n``) never makes a good checkpoint look old: it is left in place (restore reports it).
    The newest trusted checkpoint is never deleted.
    """
    if keep_last is None:
        return []
    kept = [step for step, _ in committed_steps(root) if step in trusted][-max(keep_last, 1) :]
    if not kept:
        return []
    doomed = [(step, path) for step, path in committed_steps(root) if step < kept[0]]
    for _, path in doomed:
        _discard(path)
    return [step for step, _ in doomed]
