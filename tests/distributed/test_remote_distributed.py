"""The remote tier under torch.distributed (2 gloo ranks, DCP format): rank 0 promotes each
committed checkpoint; after the local checkpoints are lost, each rank downloads its own files of
the remote checkpoint (rank 0 also the unowned ``.metadata``) and the job resumes bitwise equal to
the uninterrupted run; a corrupted remote object of rank 1 makes both ranks skip to the previous
promoted checkpoint (shared-directory remote, and the real S3 server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coci.checkpoint import layout
from coci.checkpoint.remote.identity import OWNER_KEY
from coci.checkpoint.remote.tier import committed_steps, open_store
from tests.distributed.test_distributed import assert_same_as_reference, launch, torchrun
from tests.integration.test_remote import s3_remote, s3_server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reference")
    assert torchrun(path, 2) == 0
    return path


def rank_events(run_dir: Path, rank: int, kind: str) -> list[dict]:
    """The ``kind`` events of one rank's log (rank 0: events.jsonl; others: events.rank<r>.jsonl)."""
    path = run_dir / ("events.jsonl" if rank == 0 else f"events.rank{rank}.jsonl")
    return [event for event in map(json.loads, path.read_text().splitlines()) if event["event"] == kind]


def remote_files(remote: str, step: int) -> set[str]:
    """The data objects of remote ``step`` (its manifest and its run record left out)."""
    prefix = f"step_{step}/"
    return {key[len(prefix):] for key in open_store(remote).list_objects(prefix)} - {layout.MANIFEST_FILENAME, OWNER_KEY}


def promote_to_8_and_lose_local(run_dir: Path, remote: str) -> None:
    assert launch(run_dir, 2, "--remote", remote, "--stop-at", "8") == [0, 0]  # close() waits for the promotion
    assert committed_steps(open_store(remote).list_objects()) == [4, 8]
    shutil.rmtree(layout.checkpoints_dir(run_dir))  # the node's local disk is gone; the sample logs stay


def test_each_rank_fetches_its_own_files_and_the_resume_is_bitwise(tmp_path: Path, reference: Path) -> None:
    run_dir, remote = tmp_path / "run", str(tmp_path / "shared")
    promote_to_8_and_lose_local(run_dir, remote)
    files = remote_files(remote, 8)
    rank1_files = {name for name in files if name.startswith("__1_") and name.endswith(".distcp")}
    assert rank1_files and ".metadata" in files  # DCP: __<writer rank>_<n>.distcp, rank 0's .metadata
    assert launch(run_dir, 2, "--remote", remote) == [0, 0]
    fetched = {rank: rank_events(run_dir, rank, "remote_fetch") for rank in (0, 1)}
    assert [event["step"] for event in fetched[0]] == [event["step"] for event in fetched[1]] == [8]
    assert set(fetched[1][0]["files"]) == rank1_files and fetched[1][0]["bytes"] > 0
    assert set(fetched[0][0]["files"]) == files - rank1_files  # its own __0_* files and the unowned .metadata
    for rank in (0, 1):
        assert [(event["step"], event["tier"]) for event in rank_events(run_dir, rank, "restore")] == [(8, "remote")]
    assert_same_as_reference(run_dir, reference)


@pytest.mark.parametrize("kind", ["directory", "s3"])
def test_a_corrupt_remote_object_of_rank_1_makes_both_ranks_skip_it(
    tmp_path: Path, reference: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    run_dir = tmp_path / "run"
    remote = str(tmp_path / "shared") if kind == "directory" else request.getfixturevalue("s3_remote")
    promote_to_8_and_lose_local(run_dir, remote)
    store = open_store(remote)
    victim = "step_8/" + sorted(name for name in remote_files(remote, 8) if name.startswith("__1_"))[0]
    data = bytearray(store.get_bytes(victim, 1 << 30))
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size: only the download's crc32c can tell
    store.put_bytes(victim, bytes(data))
    assert launch(run_dir, 2, "--remote", remote) == [0, 0]
    for rank in (0, 1):  # the ranks skipped step 8 together and both restored the previous promoted one
        skips = rank_events(run_dir, rank, "restore_skip")
        assert [event["step"] for event in skips] == [8] and victim in skips[0]["message"], skips
        assert "crc32c mismatch" in skips[0]["message"]
        assert [(event["step"], event["tier"]) for event in rank_events(run_dir, rank, "restore")] == [(4, "remote")]
    assert [event["step"] for event in rank_events(run_dir, 0, "remote_fetch")] == [8, 4]  # its own files were fine
    assert [event["step"] for event in rank_events(run_dir, 1, "remote_fetch")] == [4]  # rank 1 found the damage
    assert not [p for p in layout.checkpoints_dir(run_dir).iterdir() if p.name.endswith(layout.TMP_SUFFIX)]
    assert_same_as_reference(run_dir, reference)
