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

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coci import distributed
from coci.checkpoint import layout
from coci.checkpoint.dcp import check_dcp_sizes, verify_dcp_checkpoint
from coci.checkpoint.dcp_manifest import checkpoint_id, file_rank
from coci.checkpoint.sharded import whole_on_every_node
from coci.distributed import DistributedContext
from coci.errors import ConfigError, CorruptCheckpointError

__all__ = [
    "ELSEWHERE",
    "NodePart",
    "check_parts",
    "check_replicas_within_nodes",
    "commits_by_holders",
    "local_steps",
    "missing_pieces",
    "node_tiers",
    "replicas_across_nodes",
]


#: What is wrong with a node's part (``NodePart.kind``): absent (never published there, or its
#: disk lost), saved by another layout of nodes (a world-size change), bytes that fail a check, or
#: the directory holds another node's part of the same layout (the nodes joined in another order:
#: ``coci.checkpoint.node_exchange`` sends it to that node).
MISSING, OTHER_LAYOUT, CORRUPT, ELSEWHERE = "missing", "other_layout", "corrupt", "elsewhere"


@dataclass(frozen=True)
class NodePart:
    """One node's part of a step: its commit id when it verifies, else the problem and its kind
    (``MISSING``, ``OTHER_LAYOUT``, ``CORRUPT``, ``ELSEWHERE``); and the names of the checkpoint's
    files as its record lists them (empty when it has no record). ``ELSEWHERE``: the directory
    holds node ``holds``'s verified part, of commit id ``held_id``."""

    node: int
    commit_id: str | None
    problem: str | None
    files: tuple[str, ...] = ()
    kind: str | None = None
    holds: int | None = None
    held_id: str | None = None


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


def check_parts(root: Path, step: int, context: DistributedContext, checksums: bool = True) -> list[NodePart]:
    """Each node's verdict on its part of ``step``, by node (collective). ``checksums`` False: the
    record, ``.metadata`` and the data files' sizes only (``dcp.check_dcp_sizes``; the load checksums
    the bytes it reads, so a restore reads each byte once)."""
    part = _check_own_part(root, step, context, checksums) if context.is_node_leader else None
    gathered = distributed.gather_objects(part, context.control_group)
    nodes = context.nodes or (tuple(range(context.world_size)),)
    return [gathered[ranks[0]] for ranks in nodes]


def _check_own_part(root: Path, step: int, context: DistributedContext, checksums: bool = True) -> NodePart:
    path = root / layout.step_dirname(step)
    if not path.is_dir():
        return NodePart(context.node, None, f"absent from {root}", kind=MISSING)
    try:
        record = verify_dcp_checkpoint(path) if checksums else check_dcp_sizes(path)
    except (CorruptCheckpointError, OSError) as exc:
        return NodePart(context.node, None, str(exc), kind=CORRUPT)
    names = tuple(entry.name for entry in record.files)
    whole = record.node is None  # every file present (fetched onto another layout): loads on any
    now = [list(r) for r in context.nodes or ()]
    if not whole and record.nodes == now and record.node != context.node:
        return NodePart(
            context.node, None, f"{path} holds node {record.node}'s part, but this directory is node {context.node}'s now (the "
            "nodes joined in another order than when it was written: torchrun's c10d rendezvous numbers nodes by arrival "
            "or host name and ignores --node-rank)", names, kind=ELSEWHERE, holds=record.node, held_id=checkpoint_id(record),
        )
    if not whole and (record.node != context.node or record.nodes != now):
        return NodePart(
            context.node, None, f"{path} holds node {record.node}'s part of a checkpoint saved on nodes {record.nodes}; "
            f"this job runs on nodes {now}", names, kind=OTHER_LAYOUT,
        )
    return NodePart(context.node, checkpoint_id(record), None, names)


def commits_by_holders(parts: list[NodePart]) -> list[str]:
    """The commit ids of the verified ``parts``, held by the most nodes first (then by id): the
    order in which a restore tries to make one of them whole from the peer copies."""
    counts = Counter(part.commit_id for part in parts if part.problem is None and part.commit_id is not None)
    return sorted(counts, key=lambda commit_id: (-counts[commit_id], commit_id))


def skip_kind(parts: list[NodePart]) -> str:
    """The ``restore_skip`` reason of a step whose ``parts`` do not all verify: ``"corrupt"``
    only when a part's bytes fail a check; else ``"other_layout"`` or ``"incomplete"``."""
    kinds = {part.kind for part in parts if part.problem is not None}
    if CORRUPT in kinds:
        return CORRUPT
    return OTHER_LAYOUT if OTHER_LAYOUT in kinds else "incomplete"


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
    return f"step_{step} ({_LABELS[skip_kind(parts)]}): " + "; ".join(pieces)


_LABELS = {"incomplete": "not on every node", OTHER_LAYOUT: "saved by another layout of nodes", CORRUPT: "a part fails its checks"}


def node_tiers(context: DistributedContext | None, tier: str) -> dict[str, Any]:
    """Node-local run directories: where each node's part of the restored step came from (``tier``
    is this node's), as ``node_tiers`` of the ``restore`` event (collective), so rank 0's log lists
    every node's source; nothing otherwise."""
    if context is None or not context.node_local:
        return {}
    gathered = distributed.gather_objects((context.node, tier), context.control_group)
    return {"node_tiers": {str(node): source for node, source in sorted(dict(gathered).items())}}


def check_replicas_within_nodes(tensors: Iterable[torch.Tensor], context: DistributedContext) -> None:
    """ConfigError, before any checkpoint, when a DTensor of the state is replicated over a mesh
    dimension whose ranks sit on different nodes of node-local run directories while some node
    does not hold a whole replica of it (a tensor-parallel bias across nodes, replicas sharded
    across nodes too): DCP writes a replicated chunk once in the whole job, so a node's part would
    lack chunks its ranks load and no restart could load the checkpoint. Where every node holds a
    whole replica (HSDP's replicate dimension across nodes, its shard dimension within each node),
    each node saves its own copy (``coci.checkpoint.dcp.DcpWriter``) and nothing is refused. The
    message names the mesh dimension and the fixes."""
    if not context.node_local:
        return
    seen: set[tuple[int, tuple[Any, ...]]] = set()
    for tensor in tensors:
        mesh, placements = getattr(tensor, "device_mesh", None), tuple(getattr(tensor, "placements", ()))
        if mesh is None or (id(mesh), placements) in seen:
            continue
        seen.add((id(mesh), placements))
        names = getattr(mesh, "mesh_dim_names", None) or ()
        replicated = [placement.is_replicate() or placement.is_partial() for placement in placements]
        ranks, nodes = mesh.mesh.tolist(), context.nodes or ()
        problem = replicas_across_nodes(ranks, replicated, tuple(names), nodes)
        if problem is not None and not whole_on_every_node(ranks, [not p.is_replicate() for p in placements], nodes):
            raise ConfigError(
                f"{problem}, and not every node holds a whole replica: on node-local run directories DCP would write each "
                "replicated chunk on one node only, and no node could restore its part. Use one shared run directory for "
                "every node (run_dir_layout='shared' on a shared file system), or a mesh whose replicas of each chunk all "
                "sit on one node (the replicate dimension within a node), or one where each node holds a whole replica "
                "(HSDP: the replicate dimension across nodes, the shard dimension within each node)"
            )


def replicas_across_nodes(
    ranks: Any, replicated: Sequence[bool], names: tuple[str, ...], nodes: Sequence[Sequence[int]]
) -> str | None:
    """Which replicated dimension of a device mesh spans nodes: ``ranks`` is the mesh's global
    ranks (nested lists, one level per dimension), ``replicated[d]`` whether the tensor is
    replicated (or partial) over dimension ``d``, ``names`` the dimensions' names, ``nodes`` the
    ranks of each node. None when every group of replicas is on one node."""
    node_of = {rank: index for index, members in enumerate(nodes) for rank in members}
    grid = torch.tensor(ranks, dtype=torch.long)
    for dim, is_replicated in enumerate(replicated):
        if not is_replicated or grid.shape[dim] < 2:
            continue
        for group in grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist():
            spanned = sorted({node_of.get(rank, -1) for rank in group})
            if len(spanned) > 1:
                name = repr(names[dim]) if dim < len(names) else str(dim)
                return (
                    f"the state's DTensors are replicated over mesh dimension {name} (size {grid.shape[dim]}), whose ranks "
                    f"{group} sit on nodes {spanned}"
                )
    return None
