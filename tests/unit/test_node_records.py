"""The records of node-local checkpoints as untrusted input (in one process): a node's part
verifies with only its own ranks' files, a record whose node fields do not describe a partition of
the ranks is refused naming them, a record without node fields serializes as before, and the
record of the whole checkpoint (the remote's commit marker) asks for every node's files."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from coci.checkpoint import commit, fileio, layout, records
from coci.checkpoint.dcp import read_dcp_manifest, verify_dcp_checkpoint
from coci.checkpoint.dcp_manifest import DcpManifest, DcpPart, full_record
from coci.checkpoint.nodes import MISSING, NodePart, commits_by_holders
from coci.errors import CorruptCheckpointError


def empty_dcp_metadata() -> bytes:
    """DCP's ``.metadata`` of a checkpoint without tensors (what the records below declare)."""
    from torch.distributed.checkpoint.metadata import Metadata

    return pickle.dumps(Metadata(state_dict_metadata={}, storage_data={}))


FILES = {"__0_0.distcp": os.urandom(1000), "__1_0.distcp": os.urandom(700), ".metadata": empty_dcp_metadata()}


def whole_record() -> DcpManifest:
    """A 2-rank record of FILES (empty tensor tables: what the node checks look at is the files)."""
    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    entries = []
    for name, data in FILES.items():
        path = scratch / f"coci-node-record-{os.getpid()}-{name}"
        path.write_bytes(data)
        entries.append(fileio.describe_file(path).model_copy(update={"name": name}))
        path.unlink()
    empty = DcpPart(skeleton={}, tensors=[])
    return DcpManifest(
        **records.record_header(4, epoch=None, state_keys=[], files=entries), format="dcp", world_size=2,
        bytes_per_rank=[1000, 700], shared=DcpPart(skeleton={layout.SESSION_KEY: {}}, tensors=[]), ranks=[empty, empty],
    )


def node_part(root: Path, part_of: int, **changes: object) -> Path:
    """Node ``part_of``'s part of step 4 in ``root``: its rank's file, ``.metadata`` and its record."""
    path = root / f"node{part_of}" / "step_4"
    path.mkdir(parents=True)
    for name in (f"__{part_of}_0.distcp", ".metadata"):
        (path / name).write_bytes(FILES[name])
    update = {"nodes": [[0], [1]], "node": part_of, "commit_id": "c0ffee", "node_keys": [], **changes}
    record = whole_record().model_copy(update=update).sealed()
    commit.write_durably(path / layout.MANIFEST_FILENAME, record.model_dump_json().encode())
    return path


def test_a_node_part_verifies_with_its_own_ranks_files_only(tmp_path: Path) -> None:
    for node in (0, 1):
        record = verify_dcp_checkpoint(node_part(tmp_path, node))
        assert record.node == node and [e.name for e in record.present_files()] == [f"__{node}_0.distcp", ".metadata"]


def test_a_node_part_missing_its_own_shard_is_corrupt(tmp_path: Path) -> None:
    path = node_part(tmp_path, 1)
    (path / "__1_0.distcp").unlink()
    with pytest.raises(CorruptCheckpointError, match="__1_0.distcp"):
        verify_dcp_checkpoint(path)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"nodes": [[0], [0]]}, "nodes"),
        ({"nodes": [[0, 1], []]}, "nodes"),
        ({"nodes": [[0], [1], [2]]}, "nodes"),
        ({"node": 2}, "node 2"),
        ({"commit_id": None}, "commit_id"),
        ({"node_keys": ["shared/0"]}, "node_keys"),
        ({"nodes": None}, "names a node but no nodes"),
    ],
)
def test_node_fields_that_describe_no_partition_are_refused(tmp_path: Path, changes: dict[str, object], field: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=field):
        read_dcp_manifest(node_part(tmp_path, 0, **changes))


def test_a_record_without_node_fields_serializes_as_before() -> None:
    record = whole_record().sealed()
    written = json.loads(record.model_dump_json())
    assert not {"nodes", "node", "commit_id", "node_keys"} & set(written)
    assert DcpManifest.model_validate_json(record.model_dump_json()).body_checksum() == record.checksum


def test_the_remote_marker_is_the_whole_checkpoints_record(tmp_path: Path) -> None:
    part = read_dcp_manifest(node_part(tmp_path, 1))
    whole = full_record(part)
    assert whole.node is None and whole.commit_id == part.commit_id and whole.checksum == whole.body_checksum()
    assert [e.name for e in whole.present_files()] == list(FILES)


def test_an_unknown_run_dir_layout_is_refused_naming_it(tmp_path: Path) -> None:
    import coci
    from coci.errors import ConfigError

    with pytest.raises(ConfigError, match="run_dir_layout must be one of auto, shared, node-local, got 'nfs'"):
        coci.Session(tmp_path / "run", {"x": [1]}, policy=coci.EveryN(2), run_dir_layout="nfs")


def test_a_replicated_mesh_dimension_across_node_local_directories_is_named() -> None:
    from coci.checkpoint.nodes import replicas_across_nodes

    two_nodes = [[0, 1], [2, 3]]
    hsdp = [[0, 1], [2, 3]]  # (replicate, shard): replicas {0, 2} and {1, 3} sit on both nodes
    problem = replicas_across_nodes(hsdp, [True, False], ("replicate", "shard"), two_nodes)
    assert problem is not None and "mesh dimension 'replicate' (size 2)" in problem and "[0, 2]" in problem and "[0, 1]" in problem
    assert replicas_across_nodes(hsdp, [False, True], ("replicate", "shard"), two_nodes) is None  # replicas within a node
    assert replicas_across_nodes(hsdp, [False, False], ("a", "b"), two_nodes) is None  # sharded on both: each rank its own chunk
    assert replicas_across_nodes([[0], [1]], [True, False], (), [[0], [1]]) is not None  # (2, 1): every replica on its own node
    assert "dimension 0" in (replicas_across_nodes([[0], [1]], [True, False], (), [[0], [1]]) or "")
    assert replicas_across_nodes(hsdp, [True, False], ("replicate", "shard"), [[0, 1, 2, 3]]) is None  # one node


def test_hsdp_across_nodes_holds_a_whole_replica_on_every_node_and_a_split_replica_does_not() -> None:
    from coci.checkpoint.sharded import whole_on_every_node

    two_nodes = [[0, 1], [2, 3]]
    assert whole_on_every_node([[0, 1], [2, 3]], [False, True], two_nodes)  # HSDP: replicate across nodes, shard within each
    assert not whole_on_every_node([[0, 2], [1, 3]], [False, True], two_nodes)  # replicas within a node: it holds one shard
    assert whole_on_every_node([[0], [1]], [False, False], [[0], [1]])  # (2, 1): a whole tensor on each node
    assert not whole_on_every_node([[0, 1], [2, 3]], [True, True], two_nodes)  # sharded on both: a node holds half
    assert not whole_on_every_node([[0, 1, 2, 3]], [False, True], [[0], [1], [2], [3]])  # FSDP across nodes
    assert not whole_on_every_node([[0, 2], [1, 3]], [False, True], [[0, 1, 2, 3]])  # one node: nothing to copy
    assert not whole_on_every_node([[0, 1], [2, 3]], [False, True], [[0, 2], [1, 3], [4]])  # a node outside the mesh


def test_session_accepts_replicas_across_nodes_only_where_every_node_holds_a_whole_replica() -> None:
    from types import SimpleNamespace

    from torch.distributed.tensor import Partial, Replicate, Shard

    from coci.checkpoint.nodes import check_replicas_within_nodes
    from coci.distributed import DistributedContext
    from coci.errors import ConfigError

    def dtensor(ranks: list, placements: tuple) -> SimpleNamespace:  # what the check reads of a DTensor: its mesh and placements
        return SimpleNamespace(device_mesh=SimpleNamespace(mesh=torch.tensor(ranks), mesh_dim_names=("replicate", "shard")), placements=placements)

    def context(nodes: tuple) -> DistributedContext:
        return DistributedContext(rank=0, world_size=4, groups={}, timeout_seconds=30.0, nodes=nodes)

    hsdp = dtensor([[0, 1], [2, 3]], (Replicate(), Shard(0)))
    check_replicas_within_nodes([hsdp], context(((0, 1), (2, 3))))  # each node a whole replica: a copy per node
    with pytest.raises(ConfigError, match=r"mesh dimension 'replicate' \(size 2\).*not every node holds a whole replica"):
        check_replicas_within_nodes([hsdp], context(((0,), (1,), (2,), (3,))))  # a replica split over nodes 0 and 1
    with pytest.raises(ConfigError, match="not every node holds a whole replica"):  # partial sums: never one node's copy
        check_replicas_within_nodes([dtensor([[0, 1], [2, 3]], (Partial(), Shard(0)))], context(((0, 1), (2, 3))))


def test_parts_held_by_another_node_are_moved_only_when_every_lacking_part_is_held_and_of_one_commit() -> None:
    from coci.checkpoint.node_exchange import exchange_sources
    from coci.checkpoint.nodes import ELSEWHERE, MISSING, NodePart

    def held(node: int, holds: int, commit_id: str = "c1") -> NodePart:
        return NodePart(node, None, "elsewhere", kind=ELSEWHERE, holds=holds, held_id=commit_id)

    own = NodePart(2, "c1", None)
    assert exchange_sources([held(0, 1), held(1, 0)]) == {0: 1, 1: 0}  # two nodes joined in the other order
    assert exchange_sources([held(0, 1), held(1, 0), own]) == {0: 1, 1: 0}
    assert exchange_sources([held(0, 1), NodePart(1, None, "absent", kind=MISSING)]) is None  # node 0's part is nowhere
    assert exchange_sources([held(0, 1), held(1, 0, "c2")]) is None  # parts of two checkpoints of the step
    assert exchange_sources([held(0, 1), held(1, 0), NodePart(2, "c2", None)]) is None
    assert exchange_sources([NodePart(0, "c1", None), NodePart(1, "c1", None)]) is None  # nothing lacking


def test_the_commits_of_disagreeing_parts_are_tried_most_held_first() -> None:
    """Finding 12: the restore makes a step whole from the peer copies of each commit its verified
    parts hold, the one most nodes hold first (then by id); a failing part names no commit."""
    parts = [
        NodePart(0, "b", None), NodePart(1, "a", None), NodePart(2, "b", None),
        NodePart(3, None, "absent", kind=MISSING), NodePart(4, "c", None),
    ]
    assert commits_by_holders(parts) == ["b", "a", "c"]
    assert commits_by_holders([NodePart(0, "x", None), NodePart(1, "w", None)]) == ["w", "x"]
