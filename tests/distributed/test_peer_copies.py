"""Peer copies (``Session(peer_copies=1)``): each node's part of a checkpoint also kept on the next
node, over a side-channel socket. Two ``torchrun`` agents on this machine, each with its own run
directory (the multi-node set-up of tests/distributed/test_multinode.py), killed and restarted as whole nodes:

a lost node's checkpoints come back from its peer's copy, bitwise; with the peer copies lost too
(two nodes lost) from the remote tier (a real SeaweedFS); a tampered peer copy is refused by its
holder and skipped for an older one. The one-process checks are in tests/unit/test_peer_server.py.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torchrun_helpers

from coci.analysis.report.read import read_run
from coci.checkpoint import commit, layout
from coci.checkpoint.dcp_manifest import DcpManifest
from coci.checkpoint.peers import peer_dir
from tests.distributed.test_multinode import (  # noqa: F401 (the reference fixture)
    STEPS,
    assert_bitwise,
    assert_clean,
    assert_ok,
    node_dir,
    node_events,
    reference,
    restored,
    run_nodes,
)
from tests.integration.test_remote import s3_remote, s3_server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.distributed, torchrun_helpers.needs_gloo]

def peer_copy(base: Path, holder: int, node: int, step: int) -> Path:
    return peer_dir(node_dir(base, holder), node) / layout.step_dirname(step)


def test_a_lost_node_is_recovered_from_its_peer_copy_bitwise(tmp_path: Path, reference: Path) -> None:  # noqa: F811
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1", "--stop-at", "8"))  # close() waits for the last copy
    sent = node_events(tmp_path, 1, "peer_send")
    assert [(e["step"], e["to_node"]) for e in sent] == [(4, 0), (8, 0)] and all(e["bytes"] > 0 for e in sent)
    profile = json.loads((node_dir(tmp_path, 0) / "profile.json").read_text())  # rank 0 leads node 0: its copies
    peer = next(level for level in profile["levels"] if level["name"] == "peer")
    assert peer["seconds"]["count"] == 2 and peer["bytes"]["value"] > 0
    kill_at = random.Random(3).randint(9, STEPS - 1)  # before step 12's checkpoint
    outcomes = run_nodes(tmp_path, "--peer-copies", "1", "--kill-at", str(kill_at), survivor_grace=10.0)
    assert all(o.code != 0 for o in outcomes)  # both nodes SIGKILLed
    assert peer_copy(tmp_path, 0, 1, 8).is_dir()  # node 0 still holds node 1's part of step 8
    shutil.rmtree(layout.checkpoints_dir(node_dir(tmp_path, 1)))  # node 1's checkpoints are gone
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1"))
    assert restored(tmp_path) == [[(8, "local"), (8, "local")], [(8, "local"), (8, "peer")]]  # the killed run, this one
    fetched = node_events(tmp_path, 1, "peer_fetch")
    assert [(e["step"], e["holder"]) for e in fetched] == [(8, 0)] and fetched[0]["bytes"] > 0
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)
    for node in range(2):  # the report, on either node's directory: every restore, each node's source, the steps the kill lost
        rows = read_run(node_dir(tmp_path, node)).restores
        assert [(r.step, r.failure, r.node_tiers) for r in rows] == [
            (8, False, {0: "local", 1: "local"}), (8, True, {0: "local", 1: "peer"})
        ], (node, rows)
        assert (rows[1].reached_step, rows[1].lost_steps, rows[1].lost_exact) == (kill_at, kill_at - 8, True), (node, rows[1])


def test_a_tampered_peer_copy_is_refused_and_an_older_copy_restores(tmp_path: Path, reference: Path) -> None:  # noqa: F811
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1", "--stop-at", "8"))  # close() waits for the last copy
    shutil.rmtree(layout.checkpoints_dir(node_dir(tmp_path, 1)))
    shard = peer_copy(tmp_path, 0, 1, 8) / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    shard.write_bytes(bytes(data))
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1"))
    assert restored(tmp_path) == [[(4, "local")], [(4, "peer")]]
    skips = node_events(tmp_path, 1, "peer_skip")
    assert [(e["step"], e["holder"], e["reason"]) for e in skips] == [(8, 0, "corrupt")]
    assert "checksum mismatch" in skips[0]["message"] and "__1_0.distcp" in skips[0]["message"]
    assert [e["step"] for e in node_events(tmp_path, 0, "restore_skip")] == [8]  # every rank skipped step 8 together
    assert_bitwise(tmp_path, reference)


def test_a_part_of_another_checkpoint_of_the_step_is_replaced_by_its_peer_copy(tmp_path: Path, reference: Path) -> None:  # noqa: F811
    """Finding 12: node 1's step_8 is a verified part of another checkpoint of step 8 (as an earlier
    attempt at the step leaves one: another commit id, resealed); the nodes' parts disagree. Each
    commit is tried: node 0's peer copy of the stale one does not exist (its holder's copy is of the
    other commit, refused before it replaces anything), node 1's copy of the good one does, and
    step 8 restores instead of the older step 4."""
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1", "--stop-at", "8"))
    record_path = layout.checkpoints_dir(node_dir(tmp_path, 1)) / layout.step_dirname(8) / layout.MANIFEST_FILENAME
    record = DcpManifest.model_validate_json(record_path.read_text())
    stale = record.model_copy(update={"commit_id": "0-an-earlier-attempt"}).sealed()  # sorts first: tried first
    commit.write_durably(record_path, stale.model_dump_json().encode())
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1"))
    assert restored(tmp_path) == [[(8, "local")], [(8, "peer")]]
    skips = node_events(tmp_path, 0, "peer_skip")
    assert [(e["step"], e["holder"]) for e in skips] == [(8, 1)] and "commit id" in skips[0]["message"]
    assert [(e["step"], e["holder"]) for e in node_events(tmp_path, 1, "peer_fetch")] == [(8, 0)]
    assert not node_events(tmp_path, 0, "restore_skip")
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)


def test_the_peer_copies_lost_too_the_node_is_recovered_from_s3(tmp_path: Path, reference: Path, s3_remote: str) -> None:  # noqa: F811
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1", "--remote", s3_remote, "--stop-at", "8"))
    assert peer_copy(tmp_path, 0, 1, 8).is_dir()
    shutil.rmtree(node_dir(tmp_path, 1))  # node 1's disk is gone (with the copies of node 0 it held)
    shutil.rmtree(node_dir(tmp_path, 0) / "peer")  # and node 0's copies of node 1: two nodes lost
    assert_ok(run_nodes(tmp_path, "--peer-copies", "1", "--remote", s3_remote))
    assert restored(tmp_path) == [[(8, "local")], [(8, "remote")]]
    assert [(e["step"], e["holder"]) for e in node_events(tmp_path, 1, "peer_skip")] == [(8, 0)]  # asked first
    assert [e["step"] for e in node_events(tmp_path, 1, "remote_fetch")] == [8]
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)
