"""The remote tier under torch.distributed (2 gloo ranks, DCP format, a shared-directory remote):
rank 0 promotes each committed checkpoint; after the local checkpoints are lost, the job resumes
from the remote bitwise equal to the uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coci.checkpoint import format
from coci.checkpoint.remote.tier import committed_steps, open_store
from tests.test_distributed import assert_same_as_reference, launch, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reference")
    assert torchrun(path, 2) == 0
    return path


def test_two_ranks_resume_from_the_remote_after_losing_local_checkpoints(tmp_path: Path, reference: Path) -> None:
    run_dir, remote = tmp_path / "run", tmp_path / "shared"
    assert launch(run_dir, 2, "--remote", str(remote), "--stop-at", "8") == [0, 0]  # close() waits for the promotion
    assert committed_steps(open_store(str(remote)).list_objects()) == [4, 8]
    shutil.rmtree(format.checkpoints_dir(run_dir))  # the node's local disk is gone; the sample logs stay
    assert launch(run_dir, 2, "--remote", str(remote)) == [0, 0]
    restores = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    restores = [event for event in restores if event["event"] == "restore"]
    assert [(event["step"], event["tier"]) for event in restores] == [(8, "remote")]
    assert_same_as_reference(run_dir, reference)
