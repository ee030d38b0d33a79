"""The commit record of a DCP checkpoint (``format: "dcp"``): the JSON skeleton of each sub-tree and
the DCP keys of its tensors. Both the writer and reader (``coci.checkpoint.dcp``) and the checks
of untrusted records (``coci.checkpoint.dcp_checks``) build on it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from coci.checkpoint.records import CommitRecord, FileEntry
from coci.errors import CorruptCheckpointError

__all__ = [
    "DCP_FORMAT",
    "DcpManifest",
    "DcpPart",
    "DcpTensor",
    "check_nodes",
    "checkpoint_id",
    "file_rank",
    "full_record",
    "node_key",
]

DCP_FORMAT: Final = "dcp"
_DCP_METADATA: Final = ".metadata"  # the name DCP gives its metadata file (dcp_checks.DCP_METADATA)
_DCP_RANK_FILE = re.compile(r"^__(\d{1,9})_\d+\.distcp$")  # DCP's FileSystemWriter: __<rank>_<n>.distcp
#: The node-local fields of a record, left out of its JSON when absent (older records re-serialize
#: byte for byte, so their sealed checksum still matches).
_NODE_FIELDS = ("nodes", "node", "commit_id", "node_keys")


class DcpTensor(BaseModel):
    """One tensor of the state tree, saved through DCP under ``key``."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    index: int = Field(ge=0)  # its placeholder in the skeleton
    key: str
    dtype: str
    shape: list[int]


class DcpPart(BaseModel):
    """A sub-tree (JSON skeleton) and the DCP keys of its tensors."""

    skeleton: Any
    tensors: list[DcpTensor]


class DcpManifest(CommitRecord):
    """coci's commit record of a DCP checkpoint: written last, by rank 0, once every rank voted.

    Node-local run directories (``coci.distributed.DistributedContext.nodes``) add: ``nodes``,
    the ranks of each node when it was saved; ``node``, the node whose part this directory holds
    (its ranks' files and ``.metadata``; None: every node's files, as on the remote tier);
    ``commit_id``, the same random id in every node's part of one checkpoint (a restore loads a
    step only where every node holds a part with the same id); ``node_keys``, the replicated
    tensors saved once per node, as ``node<g>/<key>``, so that no rank reads another node's files.
    """

    format: Literal["dcp"]
    world_size: int = Field(ge=1)
    bytes_per_rank: list[int]
    shared: DcpPart
    ranks: list[DcpPart]
    nodes: list[list[int]] | None = None
    node: int | None = Field(default=None, ge=0)
    commit_id: str | None = None
    node_keys: list[str] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_node_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if not (key in _NODE_FIELDS and value is None)}

    def saved_tensors(self) -> dict[str, DcpTensor]:
        """Every tensor DCP holds, by its DCP key (a per-node copy once per node)."""
        copies = set(self.node_keys or ())
        found = {t.key: t for part in self.ranks for t in part.tensors}
        for t in self.shared.tensors:
            keys = [node_key(g, t.key) for g in range(len(self.nodes or ()))] if t.key in copies else [t.key]
            found.update((key, t) for key in keys)
        return found

    def present_files(self) -> list[FileEntry]:
        """The files this directory holds: every one, or a node's ranks' files and ``.metadata``."""
        if self.node is None or self.nodes is None:
            return list(self.files)
        ranks = set(self.nodes[self.node])
        return [entry for entry in self.files if file_rank(entry.name) in ranks or entry.name == _DCP_METADATA]

    def key_of(self, tensor: DcpTensor) -> str:
        """The DCP key a reader of this directory loads ``tensor`` from (its node's copy)."""
        if tensor.key in (self.node_keys or ()):
            return node_key(self.node or 0, tensor.key)
        return tensor.key


def checkpoint_id(record: CommitRecord) -> str | None:
    """What makes node-local parts one checkpoint: the ``commit_id`` of a node-local record, else
    its sealed checksum (a whole checkpoint fetched onto every node: the same record on each)."""
    commit_id = getattr(record, "commit_id", None)
    return commit_id if commit_id is not None else (None if record.checksum is None else f"sealed:{record.checksum}")


def node_key(node: int, key: str) -> str:
    """The DCP key of node ``node``'s copy of a replicated tensor."""
    return f"node{node}/{key}"


def file_rank(name: str) -> int | None:
    """The rank that wrote a DCP storage file ``__<rank>_<n>.distcp``; None for other names."""
    match = _DCP_RANK_FILE.match(name)
    return int(match.group(1)) if match else None


def full_record(manifest: DcpManifest) -> DcpManifest:
    """A node's record as the record of the whole checkpoint (every node's files present, as the
    remote tier holds it once every node uploaded its part)."""
    return manifest.model_copy(update={"node": None, "checksum": None}).sealed()


def check_nodes(path: Path, manifest: DcpManifest) -> None:
    """The node-local fields describe a partition of the ranks and replicated tensors."""
    if manifest.nodes is None:
        if manifest.node is not None or manifest.node_keys:
            raise CorruptCheckpointError(f"{path}: manifest names a node but no nodes")
        return
    ranks = sorted(rank for node in manifest.nodes for rank in node)
    if ranks != list(range(manifest.world_size)) or not all(manifest.nodes):
        raise CorruptCheckpointError(f"{path}: manifest nodes {manifest.nodes} are not a partition of {manifest.world_size} ranks")
    if manifest.node is not None and manifest.node >= len(manifest.nodes):
        raise CorruptCheckpointError(f"{path}: manifest node {manifest.node} of {len(manifest.nodes)}")
    if not set(manifest.node_keys or ()) <= {t.key for t in manifest.shared.tensors} or not manifest.commit_id:
        raise CorruptCheckpointError(f"{path}: manifest node_keys or commit_id are not those of its tensors")
