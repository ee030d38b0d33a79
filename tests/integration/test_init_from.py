"""``Session(init_from=...)``: a fine-tune starts from another run's weights once, and a restart
resumes from its own checkpoints (tests/jobs/init_from_job.py, real processes, SIGKILL)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).resolve().parents[1] / "jobs" / "init_from_job.py"
REPO = JOB.parents[2]


def run(run_dir: Path, *args: str) -> int:
    return subprocess.run([sys.executable, str(JOB), str(run_dir), *args], cwd=REPO, timeout=240, capture_output=True).returncode


def events(run_dir: Path, kind: str) -> list[dict[str, object]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event["event"] == kind]


@pytest.mark.slow
def test_a_killed_fine_tune_resumes_from_its_own_checkpoint_never_init_from_again(tmp_path: Path) -> None:
    pretrain, reference, killed = tmp_path / "pretrain", tmp_path / "reference", tmp_path / "killed"
    assert run(pretrain, "--steps", "6", "--seed", "1") == 0
    assert run(reference, "--init-from", str(pretrain), "--seed", "2") == 0
    assert run(killed, "--init-from", str(pretrain), "--seed", "2", "--kill-at", "5") == -9
    assert run(killed, "--init-from", str(pretrain), "--seed", "2") == 0

    started = events(killed, "init_from")
    assert len(started) == 1 and started[0]["from_step"] == 6 and started[0]["keys"] == ["model"]
    assert [event["step"] for event in events(killed, "restore")] == [3]
    want, got = torch.load(reference / "final.pt", weights_only=True), torch.load(killed / "final.pt", weights_only=True)
    for name, value in want["model"].items():
        assert torch.equal(got["model"][name], value), name
    for index, per_param in want["optimizer"]["state"].items():
        for key, value in per_param.items():
            assert torch.equal(got["optimizer"]["state"][index][key], value), (index, key)
    pretrained = torch.load(pretrain / "final.pt", weights_only=True)["model"]
    assert not torch.equal(want["model"]["0.weight"], pretrained["0.weight"])  # it trained on from there
