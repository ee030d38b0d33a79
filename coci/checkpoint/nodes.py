"""Restore across node-local run directories: which step every node can load.

Under ``Session(run_dir_layout=...)`` resolving to node-local directories, each node holds the part
of a checkpoint its ranks wrote (``coci.checkpoint.dcp.DcpWriter``). A step is restorable
only where every node holds a part of it that verifies (its ranks' files and ``.metadata``: sizes
and checksums) and all the parts carry the same ``commit_id``: a node killed between prepare and
publish leaves the other nodes' parts of that step, which no node ever loads. The functions here
are collective on the control group; each node's leader looks at its own directory. A node may
also hold the whole checkpoint (every node's files, ``node`` None in its record): what it fetches
from the remote when the checkpoint was saved by another layout (resharding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coci import distributed
from coci.checkpoint import layout
from coci.checkpoint.dcp import verify_dcp_checkpoint
from coci.checkpoint.dcp_manifest import checkpoint_id, file_rank
from coci.distributed import DistributedContext
from coci.errors import CorruptCheckpointError

__all__ = ["NodePart", "check_parts", "local_steps", "missing_pieces"]


@dataclass(frozen=True)
class NodePart:
    """One node's part of a step: its commit id when it verifies, else the problem; and the
    names of the checkpoint's files as its record lists them (empty when it has no record)."""

    node: int
    commit_id: str | None
    problem: str | None
    files: tuple[str, ...] = ()


def local_steps(root: Path, context: DistributedContext) -> list[int]:
    """Every step any node holds a ``step_<n>`` directory of, newest first; each leader removes
    its directory's stale ``*.tmp`` entries first (collective)."""
    mine: list[int] | str = []
    if context.is_node_leader:
        try:
            layout.remove_stale_tmp(root)
            mine = [step for step, _ in layout.step_dirs(root)]
        except CorruptCheckpointError as exc:  # a link in the root's place: every rank raises, none waits
            mine = f"node {context.node}: {exc}"
    gathered = distributed.gather_objects(mine, context.control_group)
    refused = [entry for entry in gathered if isinstance(entry, str)]
    if refused:
        raise CorruptCheckpointError("; ".join(refused))
    return sorted({step for steps in gathered for step in steps}, reverse=True)


def check_parts(root: Path, step: int, context: DistributedContext) -> list[NodePart]:
    """Each node's verdict on its part of ``step``, by node (collective)."""
    part = _check_own_part(root, step, context) if context.is_node_leader else None
    gathered = distributed.gather_objects(part, context.control_group)
    nodes = context.nodes or (tuple(range(context.world_size)),)
    return [gathered[ranks[0]] for ranks in nodes]


def _check_own_part(root: Path, step: int, context: DistributedContext) -> NodePart:
    path = root / layout.step_dirname(step)
    if not path.is_dir():
        return NodePart(context.node, None, f"{path} is missing")
    try:
        record = verify_dcp_checkpoint(path)
    except (CorruptCheckpointError, OSError) as exc:
        return NodePart(context.node, None, str(exc))
    names = tuple(entry.name for entry in record.files)
    whole = record.node is None  # every file present (fetched onto another layout): loads on any
    if not whole and (record.node != context.node or record.nodes != [list(r) for r in context.nodes or ()]):
        return NodePart(context.node, None, f"{path}: holds the part of node {record.node} of nodes {record.nodes}", names)
    return NodePart(context.node, checkpoint_id(record), None, names)


def missing_pieces(step: int, parts: list[NodePart], context: DistributedContext) -> str:
    """What keeps ``step`` from every node: each failing node, its ranks, the shard files it
    lacks (as another node's record lists them) and why."""
    names = next((part.files for part in parts if part.files), ())
    nodes = context.nodes or ()
    pieces = []
    for part in parts:
        if part.problem is None:
            continue
        ranks = nodes[part.node] if part.node < len(nodes) else ()
        shards = [name for name in names if file_rank(name) in ranks]
        lacks = f" lacks its shards {', '.join(shards)}" if shards else ""
        pieces.append(f"node {part.node} (ranks {', '.join(map(str, ranks))}){lacks}: {part.problem}")
    return f"step_{step}: " + "; ".join(pieces)
